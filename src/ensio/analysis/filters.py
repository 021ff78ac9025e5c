"""Filters: frozen dataclasses of hyper-parameters that orchestrate the kernels.

``FILTERS`` maps the config name (``analysis.filter``) to its class; nothing
here dispatches on substrings. A filter's :meth:`analyse` works on whatever
rows it is given:

* global filters (``etkf``, ``estkf``, ``enkf``) compute one transform from
  the **full** observation set, so every rank that holds all observed
  anomalies gets the same transform whatever rows it owns;
* local filters (``letkf``, ``lestkf``, ``lenkf``) need, for their rows, the
  row coordinates and every observation within the support radius.

Order of operations per cycle: multiplicative prior inflation (forgetting
factor or adaptive estimate) inside the transform → analysis → relaxation
(RTPP/RTPS, row by row) → optional mean-preserving random rotation (one
rotation for all rows, seeded by (seed, cycle)).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..config.analysis import AnalysisSection, FilterName, InflationSection, KernelName
from ..obs import ObsBatch, QCCounts, RegularGrid, build_operator, quality_control
from .inflation import adaptive_inflation_update, rtpp, rtps
from .local import LocalResult, Method, ObsSpace, local_analysis
from .localization import Geometry, Localization
from .transforms import (
    apply_transform,
    enkf_transform,
    estkf_transform,
    etkf_transform,
    obs_perturbations,
    random_rotation,
    rotate,
)

__all__ = [
    "AnalysisResult",
    "ETKF",
    "ESTKF",
    "EnKF",
    "LETKF",
    "LESTKF",
    "LEnKF",
    "FILTERS",
    "make_filter",
    "localization_from_config",
    "InnovationStats",
    "Assimilation",
    "analyse",
    "assimilate",
]


@dataclass(frozen=True, eq=False)
class AnalysisResult:
    """Analysis rows and what the caller needs to keep or log.

    Attributes
    ----------
    ensemble : ndarray, shape (k, n)
    inflation : ndarray, shape (n,), or None
        Adaptive inflation estimate (multiplies P) for the next cycle; None
        when the inflation is not adaptive.
    n_obs : ndarray of int, shape (n,)
        Observations used at each row (all of them for global filters).
    """

    ensemble: np.ndarray
    inflation: np.ndarray | None
    n_obs: np.ndarray


def _perturb(obs: ObsSpace, seed: int, cycle: int, center: bool) -> ObsSpace:
    z = obs_perturbations(seed, cycle, np.arange(obs.k), obs.ids)
    if center:
        z = z - z.mean(axis=0)
    return dataclasses.replace(obs, perturbations=z * obs.errors)


@dataclass(frozen=True)
class _Filter:
    inflation: InflationSection = field(default_factory=InflationSection)
    rotate: bool = False
    seed: int = 0

    method: ClassVar[Method] = "etkf"
    stochastic: ClassVar[bool] = False

    def _forget(self, n: int, inflation: np.ndarray | float | None) -> np.ndarray:
        infl = self.inflation
        if not infl.adaptive:
            return np.full(n, infl.forget)
        alpha = infl.adaptive_initial if inflation is None else inflation
        return 1.0 / np.broadcast_to(np.asarray(alpha, dtype=float), (n,))

    def _transform(self, X, coords, obs, forget, timings) -> LocalResult:
        raise NotImplementedError

    def analyse(
        self,
        X: np.ndarray,
        coords: np.ndarray | None,
        obs: ObsSpace,
        *,
        cycle: int = 0,
        inflation: np.ndarray | float | None = None,
        timings: dict[str, float] | None = None,
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
        timings : dict, optional
            Seconds per phase are added to it (see
            :func:`~ensio.analysis.local.local_analysis`), plus ``relax``.
        """
        X = np.asarray(X, dtype=float)
        k, n = X.shape
        if k < 2:
            raise ValueError(f"an ensemble analysis needs at least 2 members, got {k}")
        forget = self._forget(n, inflation)
        if self.stochastic:
            t0 = time.perf_counter()
            obs = _perturb(obs, self.seed, cycle, getattr(self, "center_perturbations", True))
            if timings is not None:
                timings["perturb"] = timings.get("perturb", 0.0) + time.perf_counter() - t0
        res = self._transform(X, coords, obs, forget, timings)
        t0 = time.perf_counter()
        Xa = res.ensemble
        new_infl = None
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
        if self.rotate:
            Xa = rotate(Xa, random_rotation(k, self.seed, cycle))
        if timings is not None:
            timings["relax"] = timings.get("relax", 0.0) + time.perf_counter() - t0
        return AnalysisResult(ensemble=Xa, inflation=new_infl, n_obs=res.n_obs)


_GLOBAL = {"etkf": etkf_transform, "estkf": estkf_transform}


@dataclass(frozen=True)
class ETKF(_Filter):
    """Global ETKF (Hunt et al. 2007), symmetric square root."""

    method: ClassVar[Method] = "etkf"

    def _transform(self, X, coords, obs, forget, timings) -> LocalResult:
        t0 = time.perf_counter()
        rho = float(forget[0]) if forget.size else 1.0
        if not np.all(forget == rho):
            raise ValueError("a global filter needs one inflation value for all rows")
        n = X.shape[1]
        if self.method == "enkf":
            G = enkf_transform(obs.Y, obs.d, obs.rinv, obs.perturbations, rho)
        else:
            G = _GLOBAL[self.method](obs.Y, obs.d, obs.rinv, rho)
        t1 = time.perf_counter()
        Xa = apply_transform(X, G)
        if timings is not None:
            timings["transform"] = timings.get("transform", 0.0) + t1 - t0
            timings["update"] = timings.get("update", 0.0) + time.perf_counter() - t1
        ones = np.ones(n)
        return LocalResult(
            ensemble=Xa,
            n_obs=np.full(n, len(obs), dtype=np.int64),
            dRd=ones * float(obs.rinv @ obs.d**2),
            trace=ones * float(obs.rinv @ obs.var),
            weight_sum=ones * float(len(obs)),
        )


@dataclass(frozen=True)
class ESTKF(ETKF):
    """Global ESTKF (Nerger et al. 2012): ETKF analysis in the (k−1)-dim error subspace."""

    method: ClassVar[Method] = "estkf"


@dataclass(frozen=True)
class EnKF(ETKF):
    """Global stochastic EnKF with perturbed observations (Burgers et al. 1998).

    Perturbations come from per-member streams keyed on (seed, cycle, member)
    and indexed by global observation number; by default they are centred
    over the members so the analysis mean is exactly the Kalman mean of the
    prior ensemble.
    """

    center_perturbations: bool = True
    method: ClassVar[Method] = "enkf"
    stochastic: ClassVar[bool] = True


@dataclass(frozen=True)
class LETKF(_Filter):
    """Local ETKF with R-localization; batched or pointwise kernel."""

    localization: Localization = field(default_factory=Localization)
    kernel: KernelName = "batched"
    tile_points: int = 128
    threads: int = 1
    method: ClassVar[Method] = "etkf"

    def _transform(self, X, coords, obs, forget, timings) -> LocalResult:
        if coords is None:
            raise ValueError("a local filter needs the coordinates of the rows")
        return local_analysis(
            X,
            coords,
            obs,
            self.localization,
            method=self.method,
            forget=forget,
            kernel=self.kernel,
            tile_points=self.tile_points,
            timings=timings,
            threads=self.threads,
        )


@dataclass(frozen=True)
class LESTKF(LETKF):
    """Local ESTKF (Nerger et al. 2012): LETKF analysis in the error subspace."""

    method: ClassVar[Method] = "estkf"


@dataclass(frozen=True)
class LEnKF(LETKF):
    """Local stochastic EnKF: perturbed observations, R-localization per point.

    Each analysis point runs the ensemble-space EnKF update
    ``x̄ + X'[e_j/√ρ + P̃ Y R_loc⁻¹ (d + ε_j − Y_j/√ρ)]`` with the tapered R⁻¹
    of its observations (the same localization as the LETKF, batched the
    same way), rather than a Schur product on the gain. Perturbations as in
    :class:`EnKF`.
    """

    center_perturbations: bool = True
    method: ClassVar[Method] = "enkf"
    stochastic: ClassVar[bool] = True


FILTERS: dict[FilterName, type[_Filter]] = {
    "etkf": ETKF,
    "estkf": ESTKF,
    "enkf": EnKF,
    "letkf": LETKF,
    "lestkf": LESTKF,
    "lenkf": LEnKF,
}


def localization_from_config(section) -> Localization:
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


def make_filter(cfg: AnalysisSection) -> _Filter:
    """The filter object for a resolved ``analysis:`` section."""
    cls = FILTERS[cfg.filter]
    common = {"inflation": cfg.inflation, "rotate": cfg.rotate, "seed": cfg.seed}
    if issubclass(cls, LETKF):
        assert cfg.localization is not None  # enforced by AnalysisSection
        return cls(
            localization=localization_from_config(cfg.localization),
            kernel=cfg.kernel,
            tile_points=cfg.tile_points,
            threads=cfg.threads,
            **common,
        )
    return cls(**common)


@dataclass(frozen=True)
class InnovationStats:
    """Mean and root-mean-square of ``y − mean(HX)`` over the accepted observations."""

    mean: float
    rms: float
    count: int

    @staticmethod
    def of(values: np.ndarray, hx: np.ndarray) -> InnovationStats:
        d = values - hx.mean(axis=0)
        if d.size == 0:
            return InnovationStats(float("nan"), float("nan"), 0)
        return InnovationStats(float(d.mean()), float(np.sqrt(np.mean(d**2))), int(d.size))


@dataclass(frozen=True, eq=False)
class Assimilation:
    """Result of :func:`analyse`: the analysis and what the log reports."""

    ensemble: np.ndarray
    inflation: np.ndarray | None
    n_obs: np.ndarray
    qc: QCCounts
    prior: InnovationStats
    posterior: InnovationStats


def _obs_coords(cfg: AnalysisSection, obs: ObsBatch, coords: np.ndarray | None) -> np.ndarray:
    if cfg.localization is None or cfg.localization.radius_km is not None:
        return np.stack([obs.lon, obs.lat], axis=1)
    if obs.index is None or np.any(obs.index < 0):
        raise ValueError("analysis.localization.radius: observations in index units need an index")
    assert coords is not None
    return np.asarray(coords, dtype=float).reshape(coords.shape[0], -1)[obs.index]


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
) -> Assimilation:
    """In-memory analysis on one process: H, quality control, filter.

    Parameters
    ----------
    ensemble : ndarray, shape (k, n)
        Prior ensemble, member-major (member j is ``ensemble[j]``).
    observations : ObsBatch
    config : AnalysisSection
    coords : ndarray, shape (n, d), optional
        Row locations: (lon, lat) degrees for ``radius_km``; the grid index
        for ``periodic`` (default ``0..n-1``); any coordinates otherwise.
        Defaults to ``grid.coords()`` when the grid covers the whole state.
    grid : RegularGrid, optional
        For observations without an index (bilinear H).
    cycle : int
        Cycle number (random streams).
    inflation : float or ndarray, shape (n,), optional
        Previous adaptive inflation estimate.
    timings : dict, optional
        Seconds per phase are added to it (``obs`` for H and quality control,
        then the filter's phases).
    """
    t0 = time.perf_counter()
    X = np.asarray(ensemble, dtype=float)
    if X.ndim != 2:
        raise ValueError(f"ensemble must be (members, rows), got shape {X.shape}")
    k, n = X.shape
    op, inside = build_operator(observations, n, grid)
    hx = op.apply(X)
    ok, counts = quality_control(
        observations.values, observations.errors, hx, max_sigma=config.qc.max_sigma, inside=inside
    )
    rc = _row_coords(config, n, coords, grid)
    obs = observations.subset(ok)
    space = ObsSpace(
        hx=hx[:, ok],
        values=obs.values,
        errors=obs.errors,
        coords=_obs_coords(config, obs, rc),
        ids=obs.ids,
    )
    if timings is not None:
        timings["obs"] = timings.get("obs", 0.0) + time.perf_counter() - t0
    res = make_filter(config).analyse(
        X, rc, space, cycle=cycle, inflation=inflation, timings=timings
    )
    return Assimilation(
        ensemble=res.ensemble,
        inflation=res.inflation,
        n_obs=res.n_obs,
        qc=counts,
        prior=InnovationStats.of(obs.values, hx[:, ok]),
        posterior=InnovationStats.of(obs.values, op.subset(ok).apply(res.ensemble)),
    )


def assimilate(
    ensemble: np.ndarray,
    observations: ObsBatch,
    config: AnalysisSection,
    *,
    coords: np.ndarray | None = None,
    grid: RegularGrid | None = None,
    cycle: int = 0,
    inflation: np.ndarray | float | None = None,
) -> np.ndarray:
    """Analysis ensemble ``(k, n)`` (member-major); arguments as for :func:`analyse`."""
    res = analyse(
        ensemble, observations, config, coords=coords, grid=grid, cycle=cycle, inflation=inflation
    )
    return res.ensemble
