"""Rows regrouped by location for the analysis, when several variables share a grid.

Why: the readers hand each rank one contiguous block of the state vector,
and the state vector is variable-major. With two variables on two ranks
(the Veros restart: ``core/temp``, ``core/salt``) rank 0 held all of T and
rank 1 all of S, so both ranks computed the same local transform at every
location, once for T and once for S: the second rank made the analysis no
faster (0.28 s on 2 ranks against 0.35 s on 1). A local transform depends
on the location, not on the variable, so the analysis instead gives each
rank the same stretch of every variable (:func:`location_plan`): variable
``v``'s rows ``[a_r, b_r)`` of its block distribution go to rank ``r``. For
variables on one grid that is one set of locations per rank, and each
transform is computed once. Any partition gives the same analysis (the
pipeline's results do not depend on the row distribution), so variables on
different grids are only less well grouped, never wrong.

The exchange is one ``Alltoallv`` each way of the (N_e × rows) matrix
(:func:`move_columns`), a few MB, against the duplicated kernel work.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from ..layout.state import StateLayout
from ..parallel.distribution import block_distribution
from ..parallel.rowsets import RowSets

__all__ = ["location_plan", "move_columns"]

Owner = Callable[[np.ndarray], np.ndarray]


def location_plan(layout: StateLayout, comm: MPI.Comm) -> RowSets | None:
    """Each rank's stretch of every variable (None: one rank or one variable, where the
    block distribution already groups by location)."""
    if comm.size == 1 or len(layout.variables) < 2:
        return None
    starts, lengths, owners = [], [], []
    for v in layout.variables:
        for r in range(comm.size):
            first, count = block_distribution(v.size, comm.size, r)
            if count:
                starts.append(v.offset + first)
                lengths.append(count)
                owners.append(r)
    return RowSets.from_pieces(layout.n_rows, comm.size, comm.rank, np.array(starts),
                               np.array(lengths), np.array(owners))


def _displ(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def move_columns(values: np.ndarray, src_rows: np.ndarray, dst_rows: np.ndarray,
                 src_owner: Owner, dst_owner: Owner, comm: MPI.Comm) -> np.ndarray:
    """Collective: the columns of ``values`` moved from one row ownership to another.

    Parameters
    ----------
    values : ndarray, shape (m, len(src_rows))
        This rank's columns, one per row of ``src_rows`` (increasing), as float64.
    src_rows, dst_rows : ndarray of int
        This rank's rows before and after, each increasing.
    src_owner, dst_owner : callable
        Rank owning each row (any rows) before and after.

    Returns
    -------
    ndarray, shape (m, len(dst_rows))
        The columns of ``dst_rows``, in their order.
    """
    m = values.shape[0]
    dest = np.asarray(dst_owner(src_rows), dtype=np.int64)
    order = np.argsort(dest, kind="stable")  # rows stay increasing within each destination
    send = np.bincount(dest, minlength=comm.size).astype(np.int64) * m
    source = np.asarray(src_owner(dst_rows), dtype=np.int64)
    arrive = np.argsort(source, kind="stable")  # the order the columns arrive in
    recv = np.bincount(source, minlength=comm.size).astype(np.int64) * m
    sendbuf = np.ascontiguousarray(np.asarray(values, dtype=np.float64).T[order])
    recvbuf = np.empty((dst_rows.size, m))
    comm.Alltoallv([sendbuf, send, _displ(send), MPI.DOUBLE],
                   [recvbuf, recv, _displ(recv), MPI.DOUBLE])
    out = np.empty((m, dst_rows.size))
    out[:, arrive] = recvbuf.T
    return out
