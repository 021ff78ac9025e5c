"""The analysis on a row-distributed ensemble: the same result for any number of ranks.

Each rank holds rows ``[start, start + count)`` of the ensemble matrix (member-
major, ``(k, count)``) and a set of observations: all of them, or (local
filters) only those within the support radius of its rows plus those it
*owns*. What it needs beyond its rows is HX for its observations, i.e. the
state values of the few rows each observation reads (1 for an index
observation, 4 for bilinear). :func:`fetch_rows` gets exactly those values from
their owners with two ``Alltoallv`` (row requests, then values): a copy, so HX
is bit-identical whatever the decomposition, quality control accepts the same
observations on every rank that holds them, global filters compute the same
transform, and local filters the same weights.

Each observation has one **owner** rank (the owner of the state row it reads
with the largest weight; observations outside the state: ``id mod N_mpi``).
Counts and innovation statistics are summed over owned observations only and
all-reduced, so every observation counts once whatever the selection.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI
from scipy.spatial import cKDTree
from threadpoolctl import threadpool_limits

from ..config.analysis import AnalysisSection
from ..obs import ObsBatch, ObsOperator, QCCounts, RegularGrid, build_operator, quality_control
from ..parallel.distribution import block_distribution
from .filters import InnovationStats, localization_from_config, make_filter
from .local import ObsSpace
from .localization import Geometry
from .tiles import chord_radius, embed

__all__ = [
    "DistributedAssimilation",
    "analyse_rows",
    "fetch_rows",
    "observation_owners",
    "observations_near",
]


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
        Over all observations (summed over owners), same on every rank.
    prior, posterior : InnovationStats
        Over all accepted observations, same on every rank.
    n_local_obs : int
        Observations this rank used for its rows.
    """

    ensemble: np.ndarray
    inflation: np.ndarray | None
    qc: QCCounts
    prior: InnovationStats
    posterior: InnovationStats
    n_local_obs: int


def _starts(n_rows: int, size: int) -> np.ndarray:
    return np.array([block_distribution(n_rows, size, r)[0] for r in range(size)])


def row_owner(rows: np.ndarray, n_rows: int, size: int) -> np.ndarray:
    """Rank owning each state row under the block distribution."""
    return np.searchsorted(_starts(n_rows, size), rows, side="right") - 1


def fetch_rows(
    X: np.ndarray, start: int, n_rows: int, rows: np.ndarray, comm: MPI.Comm
) -> np.ndarray:
    """Collective: the values of arbitrary state rows, from the ranks that own them.

    Parameters
    ----------
    X : ndarray, shape (k, count)
        This rank's rows ``[start, start + count)``.
    n_rows : int
        N_x.
    rows : ndarray of int, shape (r,)
        Rows this rank wants (any order).

    Returns
    -------
    ndarray, shape (k, r)
        Exact copies of the owners' values.
    """
    k = X.shape[0]
    rows = np.asarray(rows, dtype=np.int64)
    if comm.size == 1:
        return X[:, rows - start]
    size = comm.size
    owner = row_owner(rows, n_rows, size)
    order = np.argsort(owner, kind="stable")
    send_counts = np.bincount(owner, minlength=size).astype(np.int64)
    recv_counts = np.empty(size, dtype=np.int64)
    comm.Alltoall(send_counts, recv_counts)
    sdispl = np.concatenate([[0], np.cumsum(send_counts)[:-1]])
    rdispl = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
    wanted = np.empty(int(recv_counts.sum()), dtype=np.int64)
    comm.Alltoallv(
        [rows[order], send_counts, sdispl, MPI.INT64_T], [wanted, recv_counts, rdispl, MPI.INT64_T]
    )
    reply = np.ascontiguousarray(X[:, wanted - start].T)  # (requests, k): one block per rank
    got = np.empty((rows.size, k))
    comm.Alltoallv(
        [reply, recv_counts * k, rdispl * k, MPI.DOUBLE],
        [got, send_counts * k, sdispl * k, MPI.DOUBLE],
    )
    out = np.empty((k, rows.size))
    out[:, order] = got.T
    return out


def _observe(X: np.ndarray, start: int, n_rows: int, op: ObsOperator, comm: MPI.Comm) -> np.ndarray:
    """HX for this rank's observations (collective through :func:`fetch_rows`)."""
    used = op.weights != 0.0
    need = np.unique(op.rows[used])
    vals = fetch_rows(X, start, n_rows, need, comm)
    pos = np.searchsorted(need, op.rows)
    pos[~used] = 0
    V = vals[:, pos] if need.size else np.zeros((X.shape[0], *op.rows.shape))
    V[:, ~used] = 0.0
    return np.einsum("kmp,mp->km", V, op.weights)


def observation_owners(
    op: ObsOperator, inside: np.ndarray, ids: np.ndarray, n_rows: int, size: int
) -> np.ndarray:
    """Owner rank of each observation (see the module docstring)."""
    main = op.rows[np.arange(len(op)), np.argmax(np.abs(op.weights), axis=1)]
    owner = row_owner(main, n_rows, size)
    return np.where(inside, owner, ids % size)


def observations_near(
    geometry: Geometry, row_coords: np.ndarray, obs_coords: np.ndarray, radius: float
) -> np.ndarray:
    """Mask of observations within ``radius`` of at least one row (k-d tree, chord embedding)."""
    if row_coords.shape[0] == 0:
        return np.zeros(obs_coords.shape[0], dtype=bool)
    r = chord_radius(geometry, radius)
    if not np.isfinite(r):
        return np.ones(obs_coords.shape[0], dtype=bool)
    tree = cKDTree(embed(geometry, row_coords))
    dist, _ = tree.query(embed(geometry, obs_coords), k=1, distance_upper_bound=r)
    return np.isfinite(dist)


def localization_coords(
    config: AnalysisSection, start: int, count: int, row_lonlat: np.ndarray | None, obs: ObsBatch
) -> tuple[np.ndarray | None, np.ndarray]:
    """Row and observation coordinates in the localization geometry.

    lon/lat (degrees) for ``radius_km`` and Euclidean ``radius``; the state
    row index for ``periodic`` (1-D models whose rows are the grid).
    """
    loc = config.localization
    if loc is not None and loc.periodic is not None:
        if obs.index is None or np.any(obs.index < 0):
            raise ValueError(
                "analysis.localization.periodic: observations need an index (grid units)"
            )
        return np.arange(start, start + count, dtype=float)[:, None], obs.index.astype(float)[
            :, None
        ]
    obs_coords = np.stack([obs.lon, obs.lat], axis=1)
    if loc is None:
        return None, obs_coords
    if row_lonlat is None:
        raise ValueError("a local filter needs the lon/lat of the state rows")
    return np.asarray(row_lonlat, dtype=float), obs_coords


def _stats(values: np.ndarray, hx: np.ndarray, own: np.ndarray, comm: MPI.Comm) -> InnovationStats:
    d = values[own] - hx[:, own].mean(axis=0)
    s = np.array([d.sum(), (d**2).sum(), d.size], dtype=float)
    comm.Allreduce(MPI.IN_PLACE, s, op=MPI.SUM)
    if s[2] == 0:
        return InnovationStats(float("nan"), float("nan"), 0)
    return InnovationStats(float(s[0] / s[2]), float(np.sqrt(s[1] / s[2])), int(s[2]))


def _count(counts: QCCounts, comm: MPI.Comm) -> QCCounts:
    names = list(QCCounts.__dataclass_fields__)
    v = np.array([getattr(counts, n) for n in names], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, v, op=MPI.SUM)
    return QCCounts(**{n: int(x) for n, x in zip(names, v, strict=True)})


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
        (lon, lat) in degrees of this rank's rows (unused with ``periodic``:
        the row index is the coordinate there).
    observations : ObsBatch
        All observations, or (local filters) at least those within the
        support radius of this rank's rows and those it owns
        (:func:`observation_owners`); ids must be global.
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
        Seconds per phase are added (``obs`` = H, row exchange and QC; the
        filter's phases; ``posterior``).
    """
    t0 = time.perf_counter()
    X = np.asarray(X, dtype=np.float64)
    k, count = X.shape
    op, inside = build_operator(observations, n_rows, grid)
    hx = _observe(X, start, n_rows, op, comm)
    own = observation_owners(op, inside, observations.ids, n_rows, comm.size) == comm.rank
    ok, _ = quality_control(
        observations.values,
        observations.errors,
        hx,
        max_sigma=config.qc.max_sigma,
        inside=inside,
    )
    _, own_counts = quality_control(
        observations.values[own],
        observations.errors[own],
        hx[:, own],
        max_sigma=config.qc.max_sigma,
        inside=inside[own],
    )
    obs = observations.subset(ok)
    hx_ok = hx[:, ok]
    filt = make_filter(config)
    row_coords, obs_coords = localization_coords(config, start, count, row_lonlat, obs)
    if config.localization is None:
        keep = np.ones(len(obs), dtype=bool)
    else:
        geometry = localization_from_config(config.localization).geometry
        keep = observations_near(
            geometry, row_coords, obs_coords, config.localization.support_radius
        )
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
    limit = 1 if (comm.size > 1 or config.localization is not None) else None
    with threadpool_limits(limits=limit, user_api="blas"):
        res = filt.analyse(X, row_coords, space, cycle=cycle, inflation=inflation, timings=timings)
    t1 = time.perf_counter()
    hx_post = _observe(res.ensemble, start, n_rows, op, comm)[:, ok]
    own_ok = own[ok]
    prior = _stats(obs.values, hx_ok, own_ok, comm)
    posterior = _stats(obs.values, hx_post, own_ok, comm)
    if timings is not None:
        timings["posterior"] = timings.get("posterior", 0.0) + time.perf_counter() - t1
    return DistributedAssimilation(
        ensemble=res.ensemble,
        inflation=res.inflation,
        qc=_count(own_counts, comm),
        prior=prior,
        posterior=posterior,
        n_local_obs=int(keep.sum()),
    )
