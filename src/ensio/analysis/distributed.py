"""The analysis on a row-distributed ensemble: the same result for any number of ranks.

Each rank holds rows ``[start, start + count)`` of the ensemble matrix (member-
major, ``(k, count)``). What the filters need beyond those rows is the observed
ensemble HX, and for that every observation's few state values (1 for an index
observation, 4 for bilinear) must reach every rank that uses it. Here each rank
puts the values of the rows it owns into a ``(k, m, p)`` array, zeros
elsewhere, and one ``Allreduce(SUM)`` completes it: each entry has exactly one
non-zero contributor, so the sum is exact and every rank then computes the
same HX bit for bit. Quality control therefore accepts the same observations
on every rank; global filters compute the same transform from all of them;
local filters keep only the observations within the support radius of their
own rows (a k-d tree query), which changes no weight.

Why not a sparse exchange: it needs all observations' locations on every rank
anyway, and one allreduce of ``k·m·p`` doubles is cheap next to the analysis
up to millions of observations; a neighbour exchange is the next step for
larger observation sets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI
from scipy.spatial import cKDTree
from threadpoolctl import threadpool_limits

from ..config.analysis import AnalysisSection
from ..obs import ObsBatch, QCCounts, RegularGrid, build_operator, quality_control
from .filters import InnovationStats, make_filter
from .local import ObsSpace
from .tiles import chord_radius, embed

__all__ = ["DistributedAssimilation", "analyse_rows", "observed"]


@dataclass(frozen=True, eq=False)
class DistributedAssimilation:
    """Result of :func:`analyse_rows` on one rank.

    Attributes
    ----------
    ensemble : ndarray, shape (k, count)
        This rank's analysis rows.
    inflation : ndarray, shape (count,), or None
        Adaptive inflation estimate for the next cycle.
    qc : QCCounts
        Same on every rank (all observations).
    prior, posterior : InnovationStats
        Over the accepted observations, same on every rank.
    n_local_obs : int
        Observations this rank kept for its rows.
    """

    ensemble: np.ndarray
    inflation: np.ndarray | None
    qc: QCCounts
    prior: InnovationStats
    posterior: InnovationStats
    n_local_obs: int


def observed(
    X: np.ndarray, start: int, rows: np.ndarray, weights: np.ndarray, comm: MPI.Comm
) -> np.ndarray:
    """Collective: HX of a sparse operator on a row-distributed ensemble, exact on all ranks.

    Parameters
    ----------
    X : ndarray, shape (k, count)
        This rank's rows ``[start, start + count)``.
    rows, weights : ndarray, shape (m, p)
        The operator in row form (``ObsOperator.rows`` / ``.weights``).

    Returns
    -------
    ndarray, shape (k, m)
    """
    k, count = X.shape
    m, p = rows.shape
    vals = np.zeros((k, m, p))
    mine = (rows >= start) & (rows < start + count) & (weights != 0.0)
    vals[:, mine] = X[:, rows[mine] - start]
    if comm.size > 1:
        comm.Allreduce(MPI.IN_PLACE, vals, op=MPI.SUM)
    return np.einsum("kmp,mp->km", vals, weights)


def _near_rows(geometry, row_coords: np.ndarray, obs_coords: np.ndarray, radius: float):
    """Observations within ``radius`` of at least one row (k-d tree in the chord embedding)."""
    if row_coords.shape[0] == 0:
        return np.zeros(obs_coords.shape[0], dtype=bool)
    r = chord_radius(geometry, radius)
    if not np.isfinite(r):
        return np.ones(obs_coords.shape[0], dtype=bool)
    tree = cKDTree(embed(geometry, row_coords))
    dist, _ = tree.query(embed(geometry, obs_coords), k=1, distance_upper_bound=r)
    return np.isfinite(dist)


def analyse_rows(
    X: np.ndarray,
    start: int,
    n_rows: int,
    row_lonlat: np.ndarray | None,
    observations: ObsBatch,
    config: AnalysisSection,
    comm: MPI.Comm,
    *,
    grid: RegularGrid | None = None,
    cycle: int = 0,
    inflation: np.ndarray | float | None = None,
    timings: dict[str, float] | None = None,
) -> DistributedAssimilation:
    """Collective: analyse this rank's rows of a distributed ensemble.

    Parameters
    ----------
    X : ndarray, shape (k, count)
        Prior rows ``[start, start + count)``, member-major.
    start : int
        First row of this rank.
    n_rows : int
        N_x, the length of the whole state vector.
    row_lonlat : ndarray, shape (count, 2), or None
        (lon, lat) in degrees of this rank's rows (lon/lat localization and
        Euclidean ``radius``); unused with ``periodic`` (the row index is the
        coordinate there).
    observations : ObsBatch
        All observations (the same on every rank).
    config : AnalysisSection
    comm : MPI.Comm
        The filter communicator.
    grid : RegularGrid, optional
        For observations without an index (bilinear H).
    cycle : int
        Keys the random streams (EnKF perturbations, rotation).
    inflation : float or ndarray, shape (count,), optional
        Previous adaptive inflation estimate of these rows.
    timings : dict, optional
        Seconds per phase are added (``obs`` = H, exchange and QC; the
        filter's phases; ``posterior``).
    """
    t0 = time.perf_counter()
    X = np.asarray(X, dtype=np.float64)
    k, count = X.shape
    op, inside = build_operator(observations, n_rows, grid)
    hx = observed(X, start, op.rows, op.weights, comm)
    ok, counts = quality_control(
        observations.values,
        observations.errors,
        hx,
        max_sigma=config.qc.max_sigma,
        inside=inside,
    )
    obs = observations.subset(ok)
    hx_ok = hx[:, ok]
    loc = config.localization
    filt = make_filter(config)
    row_coords: np.ndarray | None = None
    if loc is None:
        keep = np.ones(len(obs), dtype=bool)
        obs_coords = np.stack([obs.lon, obs.lat], axis=1)
    else:
        if loc.periodic is not None:
            row_coords = np.arange(start, start + count, dtype=float)[:, None]
            if obs.index is None or np.any(obs.index < 0):
                raise ValueError(
                    "analysis.localization.periodic: observations need an index (grid units)"
                )
            obs_coords = obs.index.astype(float)[:, None]
        else:
            if row_lonlat is None:
                raise ValueError("a local filter needs the lon/lat of the state rows")
            row_coords = np.asarray(row_lonlat, dtype=float)
            obs_coords = np.stack([obs.lon, obs.lat], axis=1)
        keep = _near_rows(filt.localization.geometry, row_coords, obs_coords, loc.support_radius)
    space = ObsSpace(
        hx=hx_ok[:, keep],
        values=obs.values[keep],
        errors=obs.errors[keep],
        coords=obs_coords[keep],
        ids=obs.ids[keep],
    )
    if timings is not None:
        timings["obs"] = timings.get("obs", 0.0) + time.perf_counter() - t0
    # One BLAS thread per rank: ranks already fill the cores, and the many small
    # k×k eigendecompositions of a local analysis run ~4× slower threaded.
    limit = 1 if (comm.size > 1 or loc is not None) else None
    with threadpool_limits(limits=limit, user_api="blas"):
        res = filt.analyse(X, row_coords, space, cycle=cycle, inflation=inflation, timings=timings)
    t1 = time.perf_counter()
    sub = op.subset(ok)
    hx_post = observed(res.ensemble, start, sub.rows, sub.weights, comm)
    if timings is not None:
        timings["posterior"] = timings.get("posterior", 0.0) + time.perf_counter() - t1
    return DistributedAssimilation(
        ensemble=res.ensemble,
        inflation=res.inflation,
        qc=counts,
        prior=InnovationStats.of(obs.values, hx_ok),
        posterior=InnovationStats.of(obs.values, hx_post),
        n_local_obs=int(keep.sum()),
    )
