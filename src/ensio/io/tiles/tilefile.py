"""One tile file's interior: which state rows it holds, and reading/writing them in place.

A tile's interior is a list of runs, one per latitude line and level of each
state variable (:meth:`TileBox.runs <ensio.layout.tiles.TileBox.runs>`):
run k is global rows ``[rows[k], rows[k] + length)`` and tile elements
``[elems[k], elems[k] + length)``. :func:`read_tile` and :func:`write_tile`
move the interior points of any row window of one file, so the ``files``
reader (:class:`~ensio.io.tiles.tiled.TiledEnsemble`, every tile of a row range)
and the group shuffle (:class:`~ensio.io.modes.shuffle.ShuffleEnsembleIO`, a piece
of one tile per rank) share them. Writes are raw byte ranges, the prior bytes
journaled first; halo points are never touched.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...layout.state import StateLayout
from ...layout.tiles import TileGeometry
from ..formats.open import open_member
from ..formats.raw import raw_read, raw_write
from ..formats.store import VarInfo
from ..txn import journal as journal_mod

__all__ = ["TileRuns", "plan_runs", "read_runs_into", "read_tile", "tile_rows", "write_tile"]


@dataclass(frozen=True)
class TileRuns:
    """Where one (tile, variable) interior sits: runs of state rows ⇄ runs of tile elements.

    Only the runs are kept (three ints per latitude line and level; a masked
    variable's line splits into one run per stretch of active points), not
    one index per element: the object is broadcast to every rank.
    """

    rows: np.ndarray  # (n_runs,) first global state row of each run, increasing
    elems: np.ndarray  # (n_runs,) first flat element of each run in the tile's variable
    lengths: np.ndarray  # (n_runs,) elements (= rows) of each run

    def pieces(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The runs clipped to rows ``[lo, hi)``: (element starts, row starts, lengths).

        Three int64 arrays of shape (n_pieces,), one entry per run that
        meets the window (the first and last possibly shortened).
        """
        k0 = int(np.searchsorted(self.rows + self.lengths, lo, side="right"))
        k1 = int(np.searchsorted(self.rows, hi, side="left"))
        if k0 >= k1:
            empty = np.empty(0, np.int64)
            return empty, empty, empty
        rows = self.rows[k0:k1]
        first = np.maximum(rows, lo)
        last = np.minimum(rows + self.lengths[k0:k1], hi)
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
            if v.active is None:
                per_var.append(TileRuns(v.offset + g, t, np.full(g.size, n, np.int64)))
            else:
                per_var.append(_masked_runs(g, t, n, v.active, v.offset))
        plan.append(per_var)
    return plan


def _masked_runs(g: np.ndarray, t: np.ndarray, n: int, active: np.ndarray,
                 offset: int) -> TileRuns:  # fmt: skip
    """The runs ``(g, t, n)`` of a tile's interior cut to a masked variable's active points.

    State row ``offset + i`` is element ``active[i]``; each interior line
    becomes one run per stretch of consecutive active elements (a stretch
    never crosses a line: the next line starts elsewhere in the tile file).
    """
    lo = np.searchsorted(active, g)
    hi = np.searchsorted(active, g + n)
    counts = hi - lo
    line = np.repeat(np.arange(g.size, dtype=np.int64), counts)
    pos = _expand(lo, counts)  # indices into active, line after line
    e = active[pos]
    if e.size == 0:
        empty = np.empty(0, np.int64)
        return TileRuns(empty, empty, empty)
    start = np.ones(e.size, dtype=bool)
    start[1:] = (np.diff(e) != 1) | (np.diff(line) != 0)
    first = np.flatnonzero(start)
    lengths = np.diff(np.append(first, e.size)).astype(np.int64)
    k = line[first]
    return TileRuns(offset + pos[first], t[k] + (e[first] - g[k]), lengths)


def tile_rows(runs: list[TileRuns], lo: int = 0, hi: int | None = None) -> np.ndarray:
    """The global rows of a tile's interior in ``[lo, hi)``, increasing (all variables)."""
    hi = np.iinfo(np.int64).max if hi is None else hi
    parts = [run.window(lo, hi)[1] for run in runs]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _segments(elems: np.ndarray, rows: np.ndarray, lengths: np.ndarray) -> list[tuple[int, int]]:
    """Maximal stretches ``[k, j)`` of pieces with one length and constant strides (file, rows).

    A tile's lat lines of one level are such a stretch: it moves as one
    strided 2-D copy instead of one copy per line.
    """
    out, k, n = [], 0, len(elems)
    while k < n:
        if k + 1 == n or lengths[k + 1] != lengths[k]:
            out.append((k, k + 1))
            k += 1
            continue
        dr, de = rows[k + 1] - rows[k], elems[k + 1] - elems[k]
        ok = (np.diff(rows[k:]) == dr) & (np.diff(elems[k:]) == de)
        ok &= lengths[k + 1 :] == lengths[k]
        j = k + 1 + (len(ok) if ok.all() else int(np.argmin(ok)))
        out.append((k, j))
        k = j
    return out


def read_runs_into(
    fd: int, path: Path, info: VarInfo, pieces: tuple[np.ndarray, np.ndarray, np.ndarray],
    lo: int, out: np.ndarray, scratch: np.ndarray,
) -> tuple[np.ndarray, bool]:  # fmt: skip
    """One tile variable's runs in the window: one ``preadv`` of their element range, decoded
    there (contiguous: fast reductions and byte swap), then one strided copy per stretch of
    lat lines (:func:`_segments`) into ``out``.

    The halo points inside the range are decoded too but never copied (a
    missing value there only makes the return value conservative). Returns
    (a scratch buffer to reuse, whether a value may be non-finite).
    """
    elems, rows, lengths = pieces
    e0, e1 = int(elems[0]), int(elems[-1] + lengths[-1])
    need = (e1 - e0) * 8  # float64 after decoding; the stored items are at most 8 bytes
    if scratch.nbytes < need:
        scratch = np.empty(need, dtype=np.uint8)
    f8 = scratch[:need].view(np.float64)
    size = info.dtype.itemsize
    if size == 8:  # read in place, decode in place
        stored = scratch[:need].view(info.dtype)
        raw_read(fd, info, e0, e1, out=stored, path=path)
        if info.dtype.kind == "f":  # to native float64 where it lies
            if info.dtype != f8.dtype:
                stored.byteswap(inplace=True)
            stored = f8
    else:
        stored = raw_read(fd, info, e0, e1, path=path)
    maybe = info.encoding.decode(stored, f8)
    for k, j in _segments(elems, rows, lengths):
        n, width = j - k, int(lengths[k])
        de = int(elems[k + 1] - elems[k]) if n > 1 else 0
        dr = int(rows[k + 1] - rows[k]) if n > 1 else 0
        src = as_strided(f8[int(elems[k]) - e0 :], (n, width), (de * 8, 8), writeable=False)
        dst = as_strided(out[int(rows[k]) - lo :], (n, width), (dr * 8, 8))
        dst[...] = src
    return scratch, maybe


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
    if raw:
        assert infos is not None
        _read_raw(path, [infos[n] for n in names], wins, values)
        return rows, values
    at = 0
    with open_member(path) as store:  # chunked or compressed variables: the library
        infos = store.variables()
        for name, (elems, _, lengths) in zip(names, wins, strict=True):
            if elems.size == 0:
                continue
            info = infos[name]
            e0, e1 = int(elems[0]), int(elems[-1] + lengths[-1])
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


def _read_raw(
    path: Path, infos: list[VarInfo], wins: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    values: np.ndarray,
) -> None:  # fmt: skip
    """:func:`read_tile`'s byte-range case: each variable's pieces, one after the other."""
    fd = os.open(path, os.O_RDONLY)
    try:
        at, scratch = 0, np.empty(0, dtype=np.uint8)
        for info, (elems, _, lengths) in zip(infos, wins, strict=True):
            if elems.size == 0:
                continue
            packed = np.cumsum(lengths) - lengths  # the pieces' places in ``values``
            n = int(lengths.sum())
            scratch, _ = read_runs_into(fd, path, info, (elems, packed, lengths), 0,
                                        values[at : at + n], scratch)  # fmt: skip
            at += n
    finally:
        os.close(fd)


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
