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

The in-memory API on one process (:func:`~ensio.analysis.api.analyse`) is
in ``api``, above the pipeline that uses :func:`make_filter`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..config.analysis import AnalysisSection, InflationSection, KernelName, LocalizationSection
from ..config.filters import local_name
from ..stopwatch import Stopwatch
from .inflation import adaptive_inflation_update, inflate_anomalies, rtpp, rtps
from .local import run_local
from .localization import Geometry, Localization, VerticalLocalization
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
    ``periodic: N`` → 1-D periodic with period N; ``radius`` alone → Euclidean;
    ``vertical`` → a vertical taper (coordinates end with the level).
    """
    if section.radius_km is not None:
        geometry = Geometry("lonlat")
    elif section.periodic is not None:
        geometry = Geometry("periodic", float(section.periodic))
    else:
        geometry = Geometry("euclidean")
    v = section.vertical
    return Localization(
        geometry=geometry,
        taper=section.taper,
        radius=section.support_radius,
        regulated=section.regulated,
        vertical=None if v is None else VerticalLocalization(v.taper, float(v.radius)),
    )


def make_filter(cfg: AnalysisSection) -> Filter:
    """The filter object for a resolved ``analysis:`` section."""
    return FILTERS[cfg.filter].from_config(cfg)
