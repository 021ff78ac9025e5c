"""Config sections of the analysis: ``observations``, ``analysis``, ``output``.

Frozen dataclasses converted by :mod:`ensio.config.load` from their type hints;
each ``__post_init__`` validates and names the dotted key in the message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from .errors import ConfigError
from .filters import FILTER_NAMES, GLOBAL_FILTERS, LOCAL_FILTERS
from .plain import SHORT_FORMS

__all__ = [
    "FilterName",
    "TaperName",
    "KernelName",
    "GLOBAL_FILTERS",
    "LOCAL_FILTERS",
    "ObservationFile",
    "ObsDistribution",
    "ObsDistributionSection",
    "LocalizationSection",
    "VerticalLocalizationSection",
    "InflationSection",
    "QCSection",
    "WeightInterpolationSection",
    "AnalysisSection",
    "slot_edges",
    "OutputSection",
]

#: Allowed ``analysis.filter`` values, derived from the registry in :mod:`.filters`.
FilterName = Literal[FILTER_NAMES]  # type: ignore[valid-type]
TaperName = Literal["gaspari-cohn", "gaussian", "exponential", "step"]
KernelName = Literal["batched", "pointwise"]


@dataclass(frozen=True)
class ObservationFile:
    """One entry of ``observations:`` — a netCDF observation file (DESIGN.md format).

    ``variable`` names the observed state variable (else the file's global
    attribute ``variable``, else the first state variable); for a 3-D
    variable ``level`` (a value of its level coordinate, linear
    interpolation) or ``level_index`` (0-based) applies to every observation
    of the file, unless the file has per-observation ``level`` /
    ``level_index`` variables (then neither key may be given).
    """

    file: str
    variable: str | None = None
    level: float | None = None
    level_index: int | None = None

    def __post_init__(self) -> None:
        if not self.file:
            raise ConfigError("observations.file: must not be empty")
        if self.level is not None and self.level_index is not None:
            raise ConfigError(
                f"observations.level: give level or level_index, not both ({self.file})"
            )
        if self.level_index is not None and self.level_index < 0:
            raise ConfigError(
                f"observations.level_index: must be >= 0, got {self.level_index} ({self.file})"
            )


#: How observations reach the ranks: every rank reads/holds all locations (``replicated``),
#: or each reads a slice and receives those near its rows (``regional``); ``auto`` chooses.
ObsDistribution = Literal["auto", "replicated", "regional"]


@dataclass(frozen=True)
class ObsDistributionSection:
    """``analysis.observations`` — how the observations are spread over the ranks.

    ``replicated``: every rank reads the locations of all observations and
    keeps those near its rows (small files: rank 0 reads and broadcasts).
    ``regional``: each rank reads one contiguous slice of every observation
    file and sends each observation to the ranks whose rows lie within the
    support radius of it (and to its owner); no rank holds the whole list.
    Needs a local filter. ``auto`` (default): ``regional`` for a local filter
    on more than one rank when the files hold more than ``regional_above``
    observations in all, else ``replicated``. The analysis is the same.
    """

    distribution: ObsDistribution = "auto"
    regional_above: int = 10_000_000

    def __post_init__(self) -> None:
        if self.regional_above < 0:
            raise ConfigError(
                f"analysis.observations.regional_above: must be >= 0, got {self.regional_above}"
            )


@dataclass(frozen=True)
class VerticalLocalizationSection:
    """``analysis.localization.vertical`` — a vertical taper times the horizontal one.

    ``radius`` is the support radius in the units of the state's level
    coordinate (``ensemble.coordinates.level``, e.g. metres of depth): the
    weight of an observation at level z_o for a row at level z is
    ``taper(|z - z_o|)``, 0 at and beyond ``radius``; ``taper`` is one of the
    horizontal ones. A row without a level (a 2-D variable) or an
    observation without one (of a 2-D variable, or of a variable without a
    level coordinate) gets vertical weight 1.
    """

    radius: float
    taper: TaperName = "gaspari-cohn"

    def __post_init__(self) -> None:
        if not self.radius > 0:
            raise ConfigError(
                f"analysis.localization.vertical.radius: must be > 0, got {self.radius}"
            )


@dataclass(frozen=True)
class LocalizationSection:
    """``analysis.localization`` — taper and support radius.

    Give exactly one of ``radius_km`` (great-circle distance on lon/lat grids)
    or ``radius`` (coordinate units; with ``periodic: N`` a 1-D periodic
    domain of N points whose coordinate is the grid index). The radius is the
    *support* radius: the taper is 0 at and beyond it. ``.inf`` is allowed
    and means no localization. ``vertical`` adds a vertical taper
    (:class:`VerticalLocalizationSection`).
    """

    taper: TaperName = "gaspari-cohn"
    radius_km: float | None = None
    radius: float | None = None
    periodic: int | None = None
    regulated: bool = False
    vertical: VerticalLocalizationSection | None = None

    def __post_init__(self) -> None:
        key = "analysis.localization"
        if (self.radius_km is None) == (self.radius is None):
            raise ConfigError(f"{key}: give exactly one of radius_km or radius")
        if self.radius_km is not None and not self.radius_km > 0:
            raise ConfigError(f"{key}.radius_km: must be > 0, got {self.radius_km}")
        if self.radius is not None and not self.radius > 0:
            raise ConfigError(f"{key}.radius: must be > 0, got {self.radius}")
        if self.periodic is not None:
            if self.radius is None:
                raise ConfigError(f"{key}.periodic: needs radius in index units, not radius_km")
            if self.periodic < 1:
                raise ConfigError(f"{key}.periodic: must be at least 1, got {self.periodic}")

    @property
    def support_radius(self) -> float:
        return float(self.radius_km if self.radius_km is not None else self.radius)  # type: ignore[arg-type]


@dataclass(frozen=True)
class InflationSection:
    """``analysis.inflation``.

    Attributes
    ----------
    forget : float
        Forgetting factor ρ in (0, 1]: the prior covariance is inflated to
        P/ρ (anomalies × 1/√ρ before the update).
    rtpp, rtps : float or None
        Relaxation to prior perturbations / spread, α in [0, 1].
    posterior : float
        Multiplicative posterior inflation a > 0 (1: none): the analysis
        anomalies are multiplied by a after the update and after RTPP/RTPS
        (DAPPER's ``infl = a``; ``forget = 1/a²`` inflates the prior instead,
        a different filter). Composes with every other key.
    adaptive : bool
        Adaptive multiplicative inflation (Miyoshi 2011), replaces ``forget``.
    adaptive_sigma : float
        Standard deviation of the prior inflation estimate (Miyoshi: 0.04).
    adaptive_initial : float
        Inflation of the first cycle (before any estimate exists).
    """

    forget: float = 1.0
    rtpp: float | None = None
    rtps: float | None = None
    adaptive: bool = False
    adaptive_sigma: float = 0.04
    adaptive_initial: float = 1.0
    posterior: float = 1.0

    def __post_init__(self) -> None:
        key = "analysis.inflation"
        if not (0.0 < self.forget <= 1.0):
            raise ConfigError(f"{key}.forget: must be in (0, 1], got {self.forget}")
        if not (self.posterior > 0.0 and math.isfinite(self.posterior)):
            raise ConfigError(
                f"{key}.posterior: must be a finite number > 0, got {self.posterior}"
            )
        for name in ("rtpp", "rtps"):
            v = getattr(self, name)
            if v is not None and not (0.0 <= v <= 1.0):
                raise ConfigError(f"{key}.{name}: must be in [0, 1], got {v}")
        if self.rtpp is not None and self.rtps is not None:
            raise ConfigError(f"{key}: choose one of rtpp and rtps")
        if self.adaptive and self.forget != 1.0:
            raise ConfigError(f"{key}.adaptive: replaces forget; leave forget at 1.0")
        if not self.adaptive_sigma > 0:
            raise ConfigError(f"{key}.adaptive_sigma: must be > 0, got {self.adaptive_sigma}")
        if not (self.adaptive_initial >= 1.0 and math.isfinite(self.adaptive_initial)):
            raise ConfigError(
                f"{key}.adaptive_initial: must be a finite number >= 1, got {self.adaptive_initial}"
            )


@dataclass(frozen=True)
class QCSection:
    """``analysis.qc`` — gross-error check (NaN values and errors ≤ 0 are always rejected)."""

    max_sigma: float | None = None

    def __post_init__(self) -> None:
        if self.max_sigma is not None and not self.max_sigma > 0:
            raise ConfigError(f"analysis.qc.max_sigma: must be > 0, got {self.max_sigma}")


@dataclass(frozen=True)
class WeightInterpolationSection:
    """``analysis.weight_interpolation`` — transforms on a coarser grid (Yang et al. 2009).

    With ``stride: k > 1`` a local filter on a rectilinear lon/lat grid
    computes its transforms (mean weights and square-root matrix) only on
    every k-th longitude and latitude (plus the last ones) and interpolates
    them bilinearly to the other points (periodic in longitude); ``1`` is
    the exact analysis.
    """

    stride: int = 1

    def __post_init__(self) -> None:
        s = self.stride
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ConfigError(
                f"analysis.weight_interpolation.stride: must be an integer >= 1, got {s!r}"
            )


@dataclass(frozen=True)
class AnalysisSection:
    """``analysis:`` — which filter and how.

    ``filter`` is required. ``seed`` keys the random streams (EnKF observation
    perturbations, random rotation); the cycle number passed at run time keys
    them per cycle. ``tile_points`` bounds the points per tile of the batched
    kernel (memory and GEMM shape) and ``threads`` is the number of threads
    working on tiles within one process (1 when every core runs an MPI rank);
    the result depends on neither. ``observations`` says how the observations
    are spread over the ranks (:class:`ObsDistributionSection`); the result
    does not depend on it either.

    ``time_slots`` makes the analysis four-dimensional (4-D LETKF, Hunt et
    al. 2004): observations are binned by their ``time`` into slots and each
    is compared with its member's state at its slot (``ensemble.slots``).
    Give a count, which splits ``window`` (``[start, end]``, in the unit and
    reference of the observation files' ``time``) evenly, or the slot edges
    (ascending, at least two; ``window`` is then their first and last).
    One slot without ``window`` takes every observation whatever its time.
    """

    filter: FilterName
    localization: LocalizationSection | None = None
    inflation: InflationSection = field(default_factory=InflationSection)
    rotate: bool = False
    kernel: KernelName = "batched"
    qc: QCSection = field(default_factory=QCSection)
    seed: int = 0
    tile_points: int = 256
    threads: int = 1
    time_slots: int | tuple[float, ...] | None = None
    window: tuple[float, ...] | None = None
    observations: ObsDistributionSection = field(default_factory=ObsDistributionSection)
    weight_interpolation: WeightInterpolationSection = field(
        default_factory=WeightInterpolationSection
    )

    def __post_init__(self) -> None:
        _check_slots(self.time_slots, self.window)
        self._check_weight_interpolation()
        if self.filter in LOCAL_FILTERS and self.localization is None:
            raise ConfigError(
                f"analysis.localization: required for the local filter {self.filter} "
                "(radius_km: .inf for none)"
            )
        if self.filter in GLOBAL_FILTERS and self.localization is not None:
            raise ConfigError(
                f"analysis.localization: {self.filter} is a global filter; "
                f"use l{self.filter} for a localized analysis"
            )
        if self.seed < 0:
            raise ConfigError(f"analysis.seed: must be >= 0, got {self.seed}")
        if self.tile_points < 1:
            raise ConfigError(f"analysis.tile_points: must be at least 1, got {self.tile_points}")
        if self.threads < 1:
            raise ConfigError(f"analysis.threads: must be at least 1, got {self.threads}")
        if self.observations.distribution == "regional" and self.localization is None:
            raise ConfigError(
                "analysis.observations.distribution: regional needs a local filter "
                f"(analysis.localization); {self.filter} needs every observation on every rank"
            )
        if self.observations.distribution == "regional" and self.n_slots > 1:
            raise ConfigError(
                "analysis.observations.distribution: regional is not available with "
                "analysis.time_slots (the 4-D operator needs every location on every rank)"
            )

    def _check_weight_interpolation(self) -> None:
        if self.weight_interpolation.stride == 1:
            return
        key = "analysis.weight_interpolation.stride"
        loc = self.localization
        if loc is None or loc.radius_km is None:
            raise ConfigError(f"{key}: needs a local filter with localization.radius_km (lon/lat)")
        if self.inflation.adaptive:
            raise ConfigError(f"{key}: not available with analysis.inflation.adaptive")
        if loc.vertical is not None:
            raise ConfigError(
                f"{key}: not available with analysis.localization.vertical (the transforms "
                "are interpolated horizontally, one per column)"
            )

    @property
    def n_slots(self) -> int:
        """Number of time slots (1 without ``time_slots``: the 3-D analysis)."""
        s = self.time_slots
        return 1 if s is None else (s if isinstance(s, int) else len(s) - 1)

    @property
    def edges(self) -> tuple[float, ...] | None:
        """Slot edges (:func:`slot_edges`): ``None`` when observation times are not used."""
        return slot_edges(self.time_slots, self.window)


def _check_slots(slots: int | tuple[float, ...] | None, window: tuple[float, ...] | None) -> None:
    """``analysis.time_slots`` and ``analysis.window``: one line naming the key."""
    if window is not None:
        if len(window) != 2 or not all(math.isfinite(t) for t in window):
            raise ConfigError(f"analysis.window: expected [start, end], got {list(window)}")
        if not window[0] < window[1]:
            raise ConfigError(f"analysis.window: start must be before end, got {list(window)}")
        if slots is None:
            raise ConfigError("analysis.window: only used with analysis.time_slots")
    if slots is None:
        return
    if isinstance(slots, int):
        if slots < 1:
            raise ConfigError(f"analysis.time_slots: must be at least 1, got {slots}")
        if slots > 1 and window is None:
            raise ConfigError(
                f"analysis.time_slots: {slots} slots split analysis.window, which is missing "
                "(or give the slot edges as a list)"
            )
        return
    edges = list(slots)
    if len(edges) < 2 or not all(math.isfinite(t) for t in edges):
        raise ConfigError(
            f"analysis.time_slots: slot edges must be at least two finite numbers, got {edges}"
        )
    if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise ConfigError(f"analysis.time_slots: slot edges must increase, got {edges}")
    if window is not None:
        raise ConfigError(
            "analysis.window: the slot edges of analysis.time_slots already give the window"
        )


def slot_edges(
    slots: int | tuple[float, ...] | None, window: tuple[float, ...] | None
) -> tuple[float, ...] | None:
    """Edges of the time slots (``n_slots + 1`` values), ``None`` when no time is used.

    ``None`` for no ``time_slots`` (3-D) and for one slot without a window
    (every observation in the one slot, whatever its time).
    """
    if slots is None:
        return None
    if isinstance(slots, int):
        if window is None:
            return None
        a, b = window
        return tuple(a + (b - a) * i / slots for i in range(slots)) + (b,)
    return tuple(float(t) for t in slots)


@dataclass(frozen=True)
class OutputSection:
    """``output:`` — where analysis products go (relative to the config file).

    ``members`` (a pattern with ``{member}``) is used when ``io.in_place`` is
    false; ``mean`` and ``spread`` are written when given. ``diagnostics``:
    the observation-space diagnostics file of every analysis (O−B, O−A,
    spreads, QC per observation; statistics per type); a path (``{cycle}``
    allowed), ``false`` for none, unset or ``true`` for ``diag_CCC.nc``
    (CCC the cycle) beside ``output.mean``, else in the config's directory.
    """

    members: str | None = None
    mean: str | None = None
    spread: str | None = None
    diagnostics: str | bool | None = None

    def __post_init__(self) -> None:
        if self.members is not None and "{member" not in self.members:
            raise ConfigError(
                f"output.members: pattern {self.members!r} has no {{member}} placeholder"
            )
        for name in ("members", "mean", "spread", "diagnostics"):
            v = getattr(self, name)
            if isinstance(v, str) and not v.strip():
                raise ConfigError(f"output.{name}: must not be empty")
        if isinstance(self.diagnostics, str):
            try:
                self.diagnostics.format(cycle=0)
            except (KeyError, IndexError, ValueError):
                raise ConfigError(f"output.diagnostics: {self.diagnostics!r}: only {{cycle}} "
                                  "is allowed as a placeholder") from None


SHORT_FORMS[ObservationFile] = "file"  # ``observations: [obs.nc]``
