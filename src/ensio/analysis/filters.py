"""Filters: frozen dataclasses of hyper-parameters around a variant object.

A filter is a driver (:class:`GlobalFilter`: one transform from the **full**
observation set, so every rank holding all observed anomalies gets the same
transform whatever rows it owns; :class:`LocalFilter`: one transform per
analysis point from the observations within the support radius, which needs
the row coordinates) and a :class:`~ensio.analysis.variants.Variant` (ETKF,
ESTKF, EnKF) that both drivers call the same way. ``FILTERS`` maps every
``analysis.filter`` value to its class; the classes are made from the
variant registry, so the six filters are siblings of their driver and
adding a variant adds its two filters.

Order of operations per cycle: multiplicative prior inflation (forgetting
factor or adaptive estimate) inside the transform → analysis → relaxation
(RTPP/RTPS, row by row) → multiplicative posterior inflation (row by row,
DAPPER's ``infl``) → optional mean-preserving random rotation (one rotation
for all rows, seeded by (seed, cycle)).

:func:`analyse` is the in-memory API on one process: a thin wrapper over the
one pipeline, :func:`~ensio.analysis.pipeline.analyse_rows` on
``MPI.COMM_SELF``.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..config.analysis import AnalysisSection, InflationSection, KernelName, LocalizationSection
from ..config.filters import local_name
from ..obs import ObsBatch, RegularGrid
from ..stopwatch import Stopwatch
from .inflation import adaptive_inflation_update, inflate_anomalies, rtpp, rtps
from .local import run_local
from .localization import Geometry, Localization
from .obsspace import ObsSpace
from .result import AnalysisResult, InnovationStats
from .transforms import apply_transform, obs_perturbations, random_rotation, rotate
from .variants import VARIANTS, Variant
from .winterp import WeightGrid, interpolated_local

__all__ = [
    "AnalysisResult",
    "ETKF",
    "ESTKF",
    "EnKF",
    "FILTERS",
    "Filter",
    "GlobalFilter",
    "InnovationStats",
    "LETKF",
    "LESTKF",
    "LEnKF",
    "LocalFilter",
    "analyse",
    "assimilate",
    "localization_from_config",
    "make_filter",
]


def _perturb(obs: ObsSpace, seed: int, cycle: int, center: bool) -> ObsSpace:
    z = obs_perturbations(seed, cycle, np.arange(obs.k), obs.ids)
    if center:
        z = z - z.mean(axis=0)
    return dataclasses.replace(obs, perturbations=z * obs.errors)


@dataclass(frozen=True)
class Filter(ABC):
    """What every filter shares: inflation, rotation, the random streams.

    ``center_perturbations`` matters for stochastic variants only: centring
    the observation perturbations over the members makes the analysis mean
    exactly the Kalman mean of the prior ensemble.
    """

    inflation: InflationSection = field(default_factory=InflationSection)
    rotate: bool = False
    seed: int = 0
    center_perturbations: bool = True

    variant: ClassVar[Variant]

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: AnalysisSection) -> Filter:
        """The filter for a resolved ``analysis:`` section."""

    @abstractmethod
    def _transform(
        self, X: np.ndarray, coords, obs: ObsSpace, forget: np.ndarray, sw: Stopwatch
    ) -> AnalysisResult:
        """Analysis rows, ``n_obs`` and the adaptive-inflation sums."""

    def _forget(self, n: int, inflation: np.ndarray | float | None) -> np.ndarray:
        infl = self.inflation
        if not infl.adaptive:
            return np.full(n, infl.forget)
        alpha = infl.adaptive_initial if inflation is None else inflation
        return 1.0 / np.broadcast_to(np.asarray(alpha, dtype=float), (n,))

    def analyse(
        self,
        X: np.ndarray,
        coords: np.ndarray | None,
        obs: ObsSpace,
        *,
        cycle: int = 0,
        inflation: np.ndarray | float | None = None,
        stopwatch: Stopwatch | None = None,
    ) -> AnalysisResult:
        """Analyse the rows ``X`` (k, n) with observations ``obs``.

        Parameters
        ----------
        X : ndarray, shape (k, n)
            Prior rows, member-major.
        coords : ndarray, shape (n, d), or None
            Row locations (local filters only).
        obs : ObsSpace
            Global filters: all observations. Local: at least those within
            the support radius of the rows.
        cycle : int
            Cycle number (keys the random streams together with ``seed``).
        inflation : float or ndarray, shape (n,), optional
            Previous adaptive inflation estimate (``adaptive`` only).
        stopwatch : Stopwatch, optional
            Receives the seconds per phase (see
            :func:`~ensio.analysis.local.local_analysis`), ``perturb`` and
            ``relax``.
        """
        sw = stopwatch if stopwatch is not None else Stopwatch(enabled=False)
        X = np.asarray(X, dtype=float)
        k, n = X.shape
        if k < 2:
            raise ValueError(f"an ensemble analysis needs at least 2 members, got {k}")
        forget = self._forget(n, inflation)
        if self.variant.stochastic:
            with sw("perturb"):
                obs = _perturb(obs, self.seed, cycle, self.center_perturbations)
        res = self._transform(X, coords, obs, forget, sw)
        with sw("relax"):
            Xa, new_infl = res.ensemble, None
            if self.inflation.adaptive:
                new_infl = adaptive_inflation_update(
                    1.0 / forget,
                    res.dRd,
                    res.trace,
                    res.weight_sum,
                    sigma=self.inflation.adaptive_sigma,
                )
            if self.inflation.rtpp is not None:
                Xa = rtpp(X, Xa, self.inflation.rtpp)
            elif self.inflation.rtps is not None:
                Xa = rtps(X, Xa, self.inflation.rtps)
            Xa = inflate_anomalies(Xa, self.inflation.posterior)
            if self.rotate:
                Xa = rotate(Xa, random_rotation(k, self.seed, cycle))
        return dataclasses.replace(res, ensemble=Xa, inflation=new_infl)


@dataclass(frozen=True)
class GlobalFilter(Filter):
    """One transform from all observations, applied to every row."""

    @classmethod
    def from_config(cls, cfg: AnalysisSection) -> GlobalFilter:
        return cls(inflation=cfg.inflation, rotate=cfg.rotate, seed=cfg.seed)

    def _transform(self, X, coords, obs, forget, sw) -> AnalysisResult:
        rho = float(forget[0]) if forget.size else 1.0
        if not np.all(forget == rho):
            raise ValueError("a global filter needs one inflation value for all rows")
        n = X.shape[1]
        with sw("transform"):
            G = self.variant.global_transform(obs, rho)
        with sw("update"):
            Xa = apply_transform(X, G)
        ones = np.ones(n)
        return AnalysisResult(
            ensemble=Xa,
            n_obs=np.full(n, len(obs), dtype=np.int64),
            dRd=ones * float(obs.rinv @ obs.d**2),
            trace=ones * float(obs.rinv @ obs.var),
            weight_sum=ones * float(len(obs)),
        )


@dataclass(frozen=True)
class LocalFilter(Filter):
    """R-localized: one transform per analysis point; batched or pointwise kernel."""

    localization: Localization = field(default_factory=Localization)
    kernel: KernelName = "batched"
    tile_points: int = 256
    threads: int = 1
    #: Transforms on a coarse grid, interpolated (``analysis.weight_interpolation``;
    #: set by the pipeline, which knows the grid); None: the exact analysis.
    weight_grid: WeightGrid | None = None

    @classmethod
    def from_config(cls, cfg: AnalysisSection) -> LocalFilter:
        assert cfg.localization is not None  # enforced by AnalysisSection
        return cls(
            inflation=cfg.inflation,
            rotate=cfg.rotate,
            seed=cfg.seed,
            localization=localization_from_config(cfg.localization),
            kernel=cfg.kernel,
            tile_points=cfg.tile_points,
            threads=cfg.threads,
        )

    def _transform(self, X, coords, obs, forget, sw) -> AnalysisResult:
        if coords is None:
            raise ValueError("a local filter needs the coordinates of the rows")
        loc, variant = self.localization, self.variant
        if self.weight_grid is not None:
            return interpolated_local(
                X, coords, obs, loc, variant, forget, self.kernel, self.tile_points,
                self.threads, sw, self.weight_grid,
            )  # fmt: skip
        return run_local(
            X, coords, obs, loc, variant, forget, self.kernel, self.tile_points, self.threads, sw
        )


def _filter_class(driver: type[Filter], prefix: str, variant: Variant) -> type[Filter]:
    """The filter class of ``variant`` run by ``driver`` (e.g. ``LETKF``)."""
    name = prefix + variant.title
    kind = "Local" if prefix else "Global"
    doc = f"{kind} {variant.title}: {variant.__doc__}"
    attrs = {"variant": variant, "__doc__": doc, "__module__": __name__, "__qualname__": name}
    return type(name, (driver,), attrs)


#: ``analysis.filter`` value → filter class, two per registered variant.
FILTERS: dict[str, type[Filter]] = {}
for _v in VARIANTS.values():
    FILTERS[_v.name] = _filter_class(GlobalFilter, "", _v)
    FILTERS[local_name(_v.name)] = _filter_class(LocalFilter, "L", _v)

ETKF, ESTKF, EnKF = FILTERS["etkf"], FILTERS["estkf"], FILTERS["enkf"]
LETKF, LESTKF, LEnKF = FILTERS["letkf"], FILTERS["lestkf"], FILTERS["lenkf"]


def localization_from_config(section: LocalizationSection) -> Localization:
    """Build a :class:`Localization` from ``analysis.localization``.

    ``radius_km`` → great-circle distances on lon/lat; ``radius`` with
    ``periodic: N`` → 1-D periodic with period N; ``radius`` alone → Euclidean.
    """
    if section.radius_km is not None:
        geometry = Geometry("lonlat")
    elif section.periodic is not None:
        geometry = Geometry("periodic", float(section.periodic))
    else:
        geometry = Geometry("euclidean")
    return Localization(
        geometry=geometry,
        taper=section.taper,
        radius=section.support_radius,
        regulated=section.regulated,
    )


def make_filter(cfg: AnalysisSection) -> Filter:
    """The filter object for a resolved ``analysis:`` section."""
    return FILTERS[cfg.filter].from_config(cfg)


def _row_coords(cfg: AnalysisSection, n: int, coords, grid: RegularGrid | None):
    loc = cfg.localization
    if loc is None:
        return None
    if coords is not None:
        c = np.asarray(coords, dtype=float)
        if c.shape[0] != n:
            raise ValueError(f"coords has {c.shape[0]} rows, the ensemble {n}")
        return c
    if loc.periodic is not None:
        return np.arange(n, dtype=float)
    if grid is not None and grid.offset == 0 and grid.size == n:
        return grid.coords()
    raise ValueError("a local filter needs coords= (the location of every state row)")


def analyse(
    ensemble: np.ndarray,
    observations: ObsBatch,
    config: AnalysisSection,
    *,
    coords: np.ndarray | None = None,
    grid: RegularGrid | None = None,
    cycle: int = 0,
    inflation: np.ndarray | float | None = None,
    timings: dict[str, float] | None = None,
    hx: np.ndarray | None = None,
) -> AnalysisResult:
    """In-memory analysis on one process: H, quality control, filter.

    The whole ensemble is one block of rows analysed by
    :func:`~ensio.analysis.pipeline.analyse_rows` on ``MPI.COMM_SELF``.

    Parameters
    ----------
    ensemble : ndarray, shape (k, n)
        Prior ensemble, member-major (member j is ``ensemble[j]``).
    observations : ObsBatch
    config : AnalysisSection
    coords : ndarray, shape (n, d), optional
        Row locations: (lon, lat) degrees for ``radius_km``; the grid index
        for ``periodic`` (default ``0..n-1``); any coordinates otherwise
        (observations then sit at the coordinates of the row they index).
        Defaults to ``grid.coords()`` when the grid covers the whole state.
    grid : RegularGrid, optional
        For observations without an index (bilinear H).
    cycle : int
        Cycle number (random streams).
    inflation : float or ndarray, shape (n,), optional
        Previous adaptive inflation estimate.
    timings : dict, optional
        Seconds per phase are added to it (``obs`` for H and quality control,
        the filter's phases, ``posterior``); also in ``result.timings``.
    hx : ndarray, shape (k, m), optional
        Precomputed HX of the observations, used instead of H applied to
        ``ensemble``: in a 4-D analysis member j observed at each
        observation's time slot (NaN: rejected as ``bad_prior``). H is still
        built from ``observations`` (and ``grid``) for quality control,
        localization and the posterior statistics (H of the analysis).
    """
    # the pipeline imports this module (make_filter), so it is imported here
    from mpi4py import MPI

    from ..layout.block import EnsembleBlock
    from ..layout.state import StateLayout
    from .pipeline import AnalysisSettings, analyse_rows
    from .stoo import SlotPrior

    X = np.asarray(ensemble, dtype=float)
    if X.ndim != 2:
        raise ValueError(f"ensemble must be (members, rows), got shape {X.shape}")
    n = X.shape[1]
    settings = AnalysisSettings(
        config,
        coords=_row_coords(config, n, coords, grid),
        grid=grid,
        cycle=cycle,
        inflation=inflation,
        obs_at_rows=config.localization is not None and config.localization.radius_km is None,
    )
    block = EnsembleBlock(StateLayout((), n), 0, n, X)
    prior = None
    if hx is not None:
        prior = SlotPrior(np.asarray(hx, dtype=float), np.ones(len(observations), dtype=bool))
    res = analyse_rows(block, observations, settings, MPI.COMM_SELF, prior)
    if timings is not None:
        for name, value in res.timings.items():
            timings[name] = timings.get(name, 0.0) + value
    return res


def assimilate(
    ensemble: np.ndarray,
    observations: ObsBatch,
    config: AnalysisSection,
    *,
    coords: np.ndarray | None = None,
    grid: RegularGrid | None = None,
    cycle: int = 0,
    inflation: np.ndarray | float | None = None,
    hx: np.ndarray | None = None,
) -> np.ndarray:
    """Analysis ensemble ``(k, n)`` (member-major); arguments as for :func:`analyse`."""
    res = analyse(
        ensemble, observations, config, coords=coords, grid=grid, cycle=cycle,
        inflation=inflation, hx=hx,
    )  # fmt: skip
    return res.ensemble
