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

__all__ = [
    "FilterName",
    "TaperName",
    "KernelName",
    "GLOBAL_FILTERS",
    "LOCAL_FILTERS",
    "ObservationFile",
    "LocalizationSection",
    "InflationSection",
    "QCSection",
    "AnalysisSection",
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


@dataclass(frozen=True)
class LocalizationSection:
    """``analysis.localization`` — taper and support radius.

    Give exactly one of ``radius_km`` (great-circle distance on lon/lat grids)
    or ``radius`` (coordinate units; with ``periodic: N`` a 1-D periodic
    domain of N points whose coordinate is the grid index). The radius is the
    *support* radius: the taper is 0 at and beyond it. ``.inf`` is allowed
    and means no localization.
    """

    taper: TaperName = "gaspari-cohn"
    radius_km: float | None = None
    radius: float | None = None
    periodic: int | None = None
    regulated: bool = False

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
class AnalysisSection:
    """``analysis:`` — which filter and how.

    ``filter`` is required. ``seed`` keys the random streams (EnKF observation
    perturbations, random rotation); the cycle number passed at run time keys
    them per cycle. ``tile_points`` bounds the points per tile of the batched
    kernel (memory and GEMM shape) and ``threads`` is the number of threads
    working on tiles within one process (1 when every core runs an MPI rank);
    the result depends on neither.
    """

    filter: FilterName
    localization: LocalizationSection | None = None
    inflation: InflationSection = field(default_factory=InflationSection)
    rotate: bool = False
    kernel: KernelName = "batched"
    qc: QCSection = field(default_factory=QCSection)
    seed: int = 0
    tile_points: int = 128
    threads: int = 1

    def __post_init__(self) -> None:
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


@dataclass(frozen=True)
class OutputSection:
    """``output:`` — where analysis products go (relative to the config file).

    ``members`` (a pattern with ``{member}``) is used when ``io.in_place`` is
    false; ``mean`` and ``spread`` are written when given.
    """

    members: str | None = None
    mean: str | None = None
    spread: str | None = None

    def __post_init__(self) -> None:
        if self.members is not None and "{member" not in self.members:
            raise ConfigError(
                f"output.members: pattern {self.members!r} has no {{member}} placeholder"
            )
        for name in ("members", "mean", "spread"):
            v = getattr(self, name)
            if v is not None and not v.strip():
                raise ConfigError(f"output.{name}: must not be empty")
