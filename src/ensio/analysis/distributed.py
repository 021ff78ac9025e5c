"""The analysis on a row-distributed ensemble: the same result for any number of ranks.

Each rank holds its rows of the ensemble matrix (a contiguous block, or any
set of rows: :func:`row_plan`; member-major, ``(k, count)``) and a set of
observations: all of them, or (local filters) only those within the support
radius of its rows plus those it *owns*. What it needs beyond its rows is HX
for its observations, i.e. the state values of the few rows each observation reads (1 for an index
observation, 4 for bilinear). :func:`fetch_rows` gets exactly those values from
their owners with two ``Alltoallv`` (row requests, then values): a copy, so HX
is bit-identical whatever the decomposition, quality control accepts the same
observations on every rank that holds them, global filters compute the same
transform, and local filters the same weights.

Each observation has one **owner** rank (the owner of the state row it reads
with the largest weight; observations outside the state: ``id mod N_mpi``).
Counts and innovation statistics are summed over owned observations only and
all-reduced, so every observation counts once whatever the selection.

The collectives of the pipeline (:func:`~ensio.analysis.pipeline.analyse_rows`)
live here; who owns which row is one plan (:data:`RowPlan`): a contiguous
:class:`~ensio.parallel.distribution.RowDistribution`, or any partition of
the rows into sets (:class:`~ensio.parallel.rowsets.RowSets`, the group
shuffle's tile pieces). :func:`row_plan` returns the plan of a block.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..layout.block import EnsembleBlock
from ..obs import ObsOperator, QCCounts
from ..parallel.distribution import RowDistribution
from ..parallel.rowsets import RowSets
from .localization import Geometry
from .result import InnovationStats
from .tiles import chord_radius, embed

__all__ = [
    "RowPlan",
    "fetch_rows",
    "innovation_stats",
    "observation_owners",
    "observations_near",
    "observe",
    "row_plan",
    "sum_counts",
]

#: Who owns which row: contiguous blocks, or arbitrary sets of rows.
RowPlan = RowDistribution | RowSets


def row_plan(block: EnsembleBlock, comm: MPI.Comm) -> RowPlan:
    """The ownership plan of ``block``'s rows over ``comm``, checked against the block.

    A :class:`~ensio.layout.rowsetblock.RowSetBlock` carries its
    :class:`~ensio.parallel.rowsets.RowSets`; any other block must hold this
    rank's rows of the block distribution.

    Raises
    ------
    ValueError
        The block's rows are not this rank's rows of the plan.
    """
    plan = getattr(block, "plan", None)
    if plan is not None:
        if (plan.size, plan.rank, plan.n_rows) != (comm.size, comm.rank, block.layout.n_rows):
            raise ValueError(
                f"rank {comm.rank}: the block's row sets are for rank {plan.rank} of "
                f"{plan.size} and {plan.n_rows} rows"
            )
        return plan
    dist = RowDistribution.of(block.layout.n_rows, comm)
    if (dist.start, dist.count) != (block.start, block.count):
        raise ValueError(
            f"rank {comm.rank}: block rows [{block.start}, {block.start + block.count}) are not "
            f"its rows [{dist.start}, {dist.stop}) of the block distribution"
        )
    return dist


def _columns(dist: RowPlan, rows: np.ndarray) -> np.ndarray:
    """Columns of this rank's data holding ``rows`` (rows it owns)."""
    if isinstance(dist, RowSets):
        return dist.local(rows)
    return rows - dist.start


def fetch_rows(X: np.ndarray, dist: RowPlan, rows: np.ndarray, comm: MPI.Comm) -> np.ndarray:
    """Collective: the values of arbitrary state rows, from the ranks that own them.

    Parameters
    ----------
    X : ndarray, shape (k, count)
        This rank's rows (``[dist.start, dist.stop)``, or ``dist.rows``).
    dist : RowPlan
        The rows of every rank of ``comm``.
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
        return X[:, _columns(dist, rows)]
    size = comm.size
    owner = dist.owner(rows)
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
    # (requests, k): one block per rank
    reply = np.ascontiguousarray(X[:, _columns(dist, wanted)].T)
    got = np.empty((rows.size, k))
    comm.Alltoallv(
        [reply, recv_counts * k, rdispl * k, MPI.DOUBLE],
        [got, send_counts * k, sdispl * k, MPI.DOUBLE],
    )
    out = np.empty((k, rows.size))
    out[:, order] = got.T
    return out


def observe(X: np.ndarray, dist: RowPlan, op: ObsOperator, comm: MPI.Comm) -> np.ndarray:
    """Collective: HX ``(k, m)`` for this rank's observations (rows through :func:`fetch_rows`)."""
    used = op.weights != 0.0
    need = np.unique(op.rows[used])
    vals = fetch_rows(X, dist, need, comm)
    pos = np.searchsorted(need, op.rows)
    pos[~used] = 0
    V = vals[:, pos] if need.size else np.zeros((X.shape[0], *op.rows.shape))
    V[:, ~used] = 0.0
    return np.einsum("kmp,mp->km", V, op.weights)


def observation_owners(
    op: ObsOperator, inside: np.ndarray, ids: np.ndarray, dist: RowPlan
) -> np.ndarray:
    """Owner rank of each observation (see the module docstring)."""
    main = op.rows[np.arange(len(op)), np.argmax(np.abs(op.weights), axis=1)]
    owner = dist.owner(main)
    return np.where(inside, owner, ids % dist.size)


def observations_near(
    geometry: Geometry, row_coords: np.ndarray, obs_coords: np.ndarray, radius: float
) -> np.ndarray:
    """Mask of observations within ``radius`` of at least one row (k-d tree, chord embedding).

    An observation without a finite location is near no row (quality control
    rejects it as outside; the k-d tree would refuse it).
    """
    if row_coords.shape[0] == 0:
        return np.zeros(obs_coords.shape[0], dtype=bool)
    r = chord_radius(geometry, radius)
    if not np.isfinite(r):
        return np.ones(obs_coords.shape[0], dtype=bool)
    from scipy.spatial import cKDTree  # where the tree is built: slow to import (issue 24)

    tree = cKDTree(embed(geometry, row_coords))
    pts = embed(geometry, obs_coords)
    finite = np.all(np.isfinite(pts), axis=1)
    near = np.zeros(pts.shape[0], dtype=bool)
    dist, _ = tree.query(pts[finite], k=1, distance_upper_bound=r)
    near[finite] = np.isfinite(dist)
    return near


def innovation_stats(
    values: np.ndarray, hx: np.ndarray, own: np.ndarray, comm: MPI.Comm
) -> InnovationStats:
    """Collective: innovation statistics over the observations each rank owns (``own``)."""
    d = values[own] - hx[:, own].mean(axis=0)
    s = np.array([d.sum(), (d**2).sum(), d.size], dtype=float)
    comm.Allreduce(MPI.IN_PLACE, s, op=MPI.SUM)
    return InnovationStats.from_sums(s[0], s[1], s[2])


def sum_counts(counts: QCCounts, comm: MPI.Comm) -> QCCounts:
    """Collective: quality-control counts summed over the ranks."""
    names = list(QCCounts.__dataclass_fields__)
    v = np.array([getattr(counts, n) for n in names], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, v, op=MPI.SUM)
    return QCCounts(**{n: int(x) for n, x in zip(names, v, strict=True)})
