"""Sending observations to the ranks that need them: one ``Alltoallv`` of records.

The regional distribution (:mod:`ensio.analysis.regional_obs`) reads each
observation file in slices, one per rank, and routes every observation to the
ranks whose region contains it. A record is every field of
:class:`~ensio.obs.ObsBatch` (location, value, error, ids, operator
information such as index, variable and levels, and any field added later):
floating-point fields travel as one float64 matrix, integer fields as one
int64 matrix, so values arrive bit for bit. The receiver sorts by global id,
which restores the order the replicated path has (files in order, each file
in its own order), so the analysis is the same to the bit.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from mpi4py import MPI

from ..parallel.distribution import block_distribution
from .batch import ObsBatch

__all__ = ["RECORD_FIELDS", "record_bytes", "route", "slice_of"]

#: Fields of :class:`ObsBatch` in record order (every dataclass field, so a new one travels).
RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ObsBatch))


def slice_of(n: int, comm: MPI.Comm) -> tuple[int, int]:
    """This rank's contiguous slice ``[start, stop)`` of ``n`` observations (block rule)."""
    start, count = block_distribution(n, comm.size, comm.rank)
    return start, start + count


def _columns(batch: ObsBatch, names: list[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """The batch as a float64 matrix and an int64 matrix, columns in ``names`` order.

    Floating-point fields widen to float64 (exact); integer and boolean
    fields to int64; datetime/timedelta fields travel as their int64 ticks.
    A field absent here (``None``) travels as NaN / -1, as in ``ObsBatch.concat``.
    """
    m = len(batch)
    fcols = [(n, dt) for n, dt in names if np.dtype(dt).kind == "f"]
    icols = [(n, dt) for n, dt in names if np.dtype(dt).kind != "f"]
    F = np.empty((m, len(fcols)))
    Iv = np.empty((m, len(icols)), dtype=np.int64)
    for j, (n, _) in enumerate(fcols):
        v = getattr(batch, n)
        F[:, j] = np.nan if v is None else v
    for j, (n, _) in enumerate(icols):
        v = getattr(batch, n)
        if v is None:
            Iv[:, j] = -1
        else:
            Iv[:, j] = v.view(np.int64) if v.dtype.kind in "mM" else v
    return F, Iv


def _restore(col: np.ndarray, dtype: str) -> np.ndarray:
    """A received column in its field's dtype (the inverse of :func:`_columns`)."""
    dt = np.dtype(dtype)
    if dt.kind in "mM":
        return np.ascontiguousarray(col).view(dt)
    return col.astype(dt)


def _field_kinds(batch: ObsBatch, comm: MPI.Comm) -> list[tuple[str, str]]:
    """Collective: (name, dtype) of the fields present on any rank, in record order."""
    mine = {n: getattr(batch, n).dtype.str for n in RECORD_FIELDS if getattr(batch, n) is not None}
    kinds: dict[str, str] = {}
    for d in comm.allgather(mine):
        kinds.update(d)
    return [(n, kinds[n]) for n in RECORD_FIELDS if n in kinds]


def record_bytes(batch: ObsBatch) -> int:
    """Bytes of one observation record of ``batch`` (its fields that are not ``None``)."""
    return 8 * sum(1 for n in RECORD_FIELDS if getattr(batch, n) is not None)


def _exchange(buf: np.ndarray, send: np.ndarray, recv: np.ndarray, comm: MPI.Comm) -> np.ndarray:
    """``Alltoallv`` of the rows of ``buf`` (grouped by destination, ``send`` rows each)."""
    width = buf.shape[1]
    out = np.empty((int(recv.sum()), width), dtype=buf.dtype)
    if width == 0:
        return out
    mpi_type = MPI.DOUBLE if buf.dtype == np.float64 else MPI.INT64_T
    sd = np.concatenate([[0], np.cumsum(send)[:-1]]) * width
    rd = np.concatenate([[0], np.cumsum(recv)[:-1]]) * width
    comm.Alltoallv(
        [np.ascontiguousarray(buf), send * width, sd, mpi_type], [out, recv * width, rd, mpi_type]
    )
    return out


def route(batch: ObsBatch, obs: np.ndarray, dest: np.ndarray, comm: MPI.Comm) -> ObsBatch:
    """Collective: send observation ``obs[i]`` of ``batch`` to rank ``dest[i]``; get mine.

    Parameters
    ----------
    batch : ObsBatch
        This rank's observations (e.g. its slice of a file).
    obs, dest : ndarray of int, shape (p,)
        Pairs (position in ``batch``, destination rank); an observation goes
        to as many ranks as it has pairs (repeated pairs are sent once).
    comm : MPI.Comm

    Returns
    -------
    ObsBatch
        Every observation sent to this rank, sorted by global id. Fields
        ``None`` on every rank stay ``None``.
    """
    size = comm.size
    key = np.sort(np.asarray(dest, np.int64) * max(len(batch), 1) + np.asarray(obs, np.int64))
    key = key[np.concatenate([[True], key[1:] != key[:-1]])] if key.size else key  # pairs once
    to, pos = np.divmod(key, max(len(batch), 1))  # sorted by destination, then position
    send = np.bincount(to, minlength=size).astype(np.int64)
    recv = np.empty(size, dtype=np.int64)
    comm.Alltoall(send, recv)
    names = _field_kinds(batch, comm)
    F, Iv = _columns(batch.subset(pos), names)
    F = _exchange(F, send, recv, comm)
    Iv = _exchange(Iv, send, recv, comm)
    got: dict[str, np.ndarray | None] = dict.fromkeys(RECORD_FIELDS)
    fj = ij = 0
    for n, dt in names:
        if np.dtype(dt).kind == "f":
            got[n], fj = _restore(F[:, fj], dt), fj + 1
        else:
            got[n], ij = _restore(Iv[:, ij], dt), ij + 1
    out = ObsBatch(**got)  # type: ignore[arg-type]
    order = np.argsort(out.ids, kind="stable")
    return out.subset(order)
