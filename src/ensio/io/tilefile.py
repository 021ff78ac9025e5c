"""One tile file's interior: which state rows it holds, and reading/writing them in place.

A tile's interior is a list of runs, one per latitude line and level of each
state variable (:meth:`TileBox.runs <ensio.layout.tiles.TileBox.runs>`):
run k is global rows ``[rows[k], rows[k] + length)`` and tile elements
``[elems[k], elems[k] + length)``. :func:`read_tile` and :func:`write_tile`
move the interior points of any row window of one file, so the ``files``
reader (:class:`~ensio.io.tiled.TiledEnsemble`, every tile of a row range)
and the group shuffle (:class:`~ensio.io.shuffle.ShuffleEnsembleIO`, a piece
of one tile per rank) share them. Writes are raw byte ranges, the prior bytes
journaled first; halo points are never touched.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..layout.state import StateLayout
from ..layout.tiles import TileGeometry
from . import journal as journal_mod
from .open import open_member
from .raw import raw_read, raw_write
from .store import VarInfo

__all__ = ["TileRuns", "plan_runs", "read_tile", "tile_rows", "write_tile"]


@dataclass(frozen=True)
class TileRuns:
    """Where one (tile, variable) interior sits: runs of state rows ⇄ runs of tile elements.

    Only the run starts are kept (two ints per latitude line and level), not
    one index per element: the object is broadcast to every rank.
    """

    rows: np.ndarray  # (n_runs,) first global state row of each run, increasing
    elems: np.ndarray  # (n_runs,) first flat element of each run in the tile's variable
    length: int  # elements per run

    def pieces(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The runs clipped to rows ``[lo, hi)``: (element starts, row starts, lengths).

        Three int64 arrays of shape (n_pieces,), one entry per run that
        meets the window (the first and last possibly shortened).
        """
        k0 = int(np.searchsorted(self.rows + self.length, lo, side="right"))
        k1 = int(np.searchsorted(self.rows, hi, side="left"))
        if k0 >= k1:
            empty = np.empty(0, np.int64)
            return empty, empty, empty
        rows = self.rows[k0:k1]
        first = np.maximum(rows, lo)
        last = np.minimum(rows + self.length, hi)
        return self.elems[k0:k1] + (first - rows), first, last - first

    def window(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(tile elements, state rows) of the interior points in rows ``[lo, hi)``, in order.

        Both int64 of shape (n,); both increasing (the runs follow each other
        in the tile file and in the state alike).
        """
        e, r, n = self.pieces(lo, hi)
        return _expand(e, n), _expand(r, n)


def _expand(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + n)`` over the pieces, in two passes."""
    total = int(lengths.sum())
    offsets = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) + np.repeat(starts - offsets, lengths)


def plan_runs(geometry: TileGeometry, layout: StateLayout) -> list[list[TileRuns]]:
    """Per tile, per state variable: the interior's runs (global rows ⇄ tile elements)."""
    plan = []
    for box in geometry.boxes:
        per_var = []
        for v in layout.variables:
            g, t, n = box.runs(v.shape, geometry.grid)
            per_var.append(TileRuns(v.offset + g, t, n))
        plan.append(per_var)
    return plan


def tile_rows(runs: list[TileRuns], lo: int = 0, hi: int | None = None) -> np.ndarray:
    """The global rows of a tile's interior in ``[lo, hi)``, increasing (all variables)."""
    hi = np.iinfo(np.int64).max if hi is None else hi
    parts = [run.window(lo, hi)[1] for run in runs]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def read_tile(
    path: Path, names: list[str], runs: list[TileRuns], lo: int, hi: int,
    infos: Mapping[str, VarInfo] | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(rows, values) of one tile file's interior points in rows ``[lo, hi)``.

    Rows increasing (variables follow each other in the state); values
    physical float64, missing ones NaN; only the element range of each
    variable that holds those rows is read, and the file is not opened when
    the tile has none. With ``infos`` (the file's variables, known from an
    earlier metadata pass) contiguous variables are read as raw byte ranges
    without opening the file through the netCDF library.
    """
    wins = [run.pieces(lo, hi) for run in runs]
    rows = np.concatenate([_expand(r, n) for _, r, n in wins]) if wins \
        else np.empty(0, np.int64)
    values = np.empty(rows.size, dtype=np.float64)
    if rows.size == 0:
        return rows, values
    raw = infos is not None and all(infos[n].raw_offset is not None for n in names)
    at = 0
    with contextlib.ExitStack() as stack:
        if raw:
            fd = os.open(path, os.O_RDONLY)
            stack.callback(os.close, fd)
        else:
            store = stack.enter_context(open_member(path))
            infos = store.variables()
        assert infos is not None
        for name, (elems, _, lengths) in zip(names, wins, strict=True):
            if elems.size == 0:
                continue
            info = infos[name]
            e0, e1 = int(elems[0]), int(elems[-1] + lengths[-1])
            if raw:
                part = raw_read(fd, info, e0, e1, path=path)
            else:
                part = np.asarray(store.read_elements(name, e0, e1)).ravel()
            n = int(lengths.sum())
            if n == e1 - e0:  # no halo between the runs: one contiguous range
                picked = np.ascontiguousarray(part)
            else:
                picked = np.empty(n, dtype=part.dtype)
                k = 0
                for e, m in zip((elems - e0).tolist(), lengths.tolist(), strict=True):
                    picked[k : k + m] = part[e : e + m]
                    k += m
            info.encoding.decode(picked, values[at : at + n])
            at += n
    return rows, values


def write_tile(
    path: Path,
    names: list[str],
    runs: list[TileRuns],
    window: tuple[int, int],
    value_of: Callable[[np.ndarray], np.ndarray],
    undo: journal_mod.UndoLog | None,
    fsync: bool,
    infos: Mapping[str, VarInfo] | None = None,
) -> int:
    """Write one tile file's interior points in rows ``window = (lo, hi)``, in place.

    ``value_of(rows)`` gives the analysis of those rows (non-finite: keep the
    prior bytes); the prior bytes are saved to ``undo`` first. ``infos``:
    the file's variables when already known. Returns the number of values
    clipped by packing.
    """
    lo, hi = window
    wins = [run.window(lo, hi) for run in runs]
    if all(e.size == 0 for e, _ in wins):
        return 0
    if infos is None:
        with open_member(path) as store:
            infos = dict(store.variables())
    clips = 0
    fd = os.open(path, os.O_RDWR)
    try:
        for name, (elems, rows) in zip(names, wins, strict=True):
            clips += _write_window(fd, path, infos[name], elems, value_of(rows), undo)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return clips


def _write_window(
    fd: int,
    path: Path,
    info: VarInfo,
    elems: np.ndarray,
    values: np.ndarray,
    undo: journal_mod.UndoLog | None,
) -> int:
    """Encode ``values`` and pwrite them at tile elements ``elems`` (increasing).

    When the elements fill at least half of their range (the halo is thin),
    the range is written in one piece, the points between the runs (halo)
    with the prior bytes just read: one pwrite and one undo record instead of
    one per latitude line, and the bytes of the halo do not change. Ranks
    with disjoint row windows have disjoint element ranges, so this is safe
    for concurrent writers of one tile. Sparse windows are written run by run.
    """
    if elems.size == 0:
        return 0
    e0, e1 = int(elems[0]), int(elems[-1]) + 1
    prior = raw_read(fd, info, e0, e1, path=path)
    values = np.ascontiguousarray(values, dtype=np.float64)
    new = np.empty(elems.size, dtype=info.dtype)
    clips = info.encoding.encode(values, new)
    dense = elems.size == e1 - e0  # no halo inside the range: elems is e0 .. e1 - 1
    if info.encoding.packed or not np.isfinite(values).all():
        info.encoding.keep_prior(prior if dense else prior[elems - e0], values, new)
    size = info.dtype.itemsize
    if 2 * elems.size >= e1 - e0:
        if dense:
            whole = new
        else:
            whole = prior.copy()
            whole[elems - e0] = new
        if undo is not None:
            undo.save(path, int(info.raw_offset) + e0 * size, prior)  # type: ignore[arg-type]
        raw_write(fd, info, e0, whole, path=path)
        return clips
    # pieces: maximal stretches of consecutive elements (one run, or part of one)
    cuts = np.flatnonzero(np.diff(elems) != 1) + 1
    for p, q in zip([0, *cuts], [*cuts, elems.size], strict=True):
        start = int(elems[p])
        if undo is not None:
            old = np.ascontiguousarray(prior[start - e0 : start - e0 + q - p])
            undo.save(path, int(info.raw_offset) + start * size, old)  # type: ignore[arg-type]
        raw_write(fd, info, start, new[p:q], path=path)
    return clips
