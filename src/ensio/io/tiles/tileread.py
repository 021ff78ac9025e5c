"""Reading one member's rows from its P tiles straight into the ensemble matrix.

Why a separate path from :func:`~ensio.io.tiles.tilefile.read_tile`: a tile's
interior rows in a row window are one run per latitude line, separated in the
file by the halo and in the matrix by the other tiles' runs. Reading them
through the netCDF library opened every tile on every read (4 ms per
netCDF-4 tile), and even a raw range read then cost a copy into a temporary,
an index array and a scattered assignment per tile.

Here every variable that is one plain byte range (``VarInfo.raw_offset``)
is read with one ``pread`` per tile of the element range its runs span into
a small scratch buffer (a tile's share: it stays in cache), decoded there
contiguously (byte swap, packing, missing → NaN) and copied into the
matrix with one strided copy per level (:func:`~ensio.io.tiles.tilefile.read_runs_into`).
The alternative, ``os.preadv`` of each run straight into its rows of the
matrix (halo bytes into a scratch buffer) and one decode per variable
afterwards, is kept behind :data:`STRIDED` = False: measured, it is no
faster (it moves the same bytes and needs two buffers per latitude line)
and it applies only to 8-byte floats. Variables without a byte range
(chunked or compressed netCDF-4) go through
:func:`~ensio.io.tiles.tilefile.read_tile` and the netCDF library. Values are
identical either way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...layout.encoding import Encoding
from ...layout.state import StateLayout
from ..formats.store import VarInfo
from .tilefile import TileRuns, read_runs_into, read_tile

__all__ = ["direct", "read_member_rows"]

#: Read each tile variable's element range in one piece, then decode it into the
#: matrix with one strided copy per level (else: preadv into the rows directly).
STRIDED = True

#: At most this many buffers per ``preadv`` (Linux IOV_MAX).
_IOV_MAX = 1024


def direct(info: VarInfo) -> bool:
    """Whether a variable is read straight into the float64 matrix (same item size)."""
    return info.raw_offset is not None and info.dtype.kind == "f" and info.dtype.itemsize == 8


def _preadv_all(fd: int, bufs: list[memoryview], offset: int, path: Path, info: VarInfo) -> None:
    """Fill every buffer of ``bufs`` from consecutive file bytes at ``offset``.

    Batches of :data:`_IOV_MAX` buffers; a short read (signal, end of file)
    resumes after the bytes it got; 0 bytes means the file is truncated.
    """
    i, skip = 0, 0  # first buffer not yet full, bytes of it already read
    while i < len(bufs):
        batch = [bufs[i][skip:], *bufs[i + 1 : i + _IOV_MAX]]
        want = sum(len(b) for b in batch)
        got = os.preadv(fd, batch, offset)
        if got == 0 and want > 0:
            raise InputError(
                f"{path}: truncated file (variable {info.name!r} needs bytes beyond "
                f"offset {offset}, where the file ends)"
            )
        offset += got
        got += skip
        while i < len(bufs) and got >= len(bufs[i]):
            got -= len(bufs[i])
            i += 1
        skip = got


def _read_runs(
    fd: int, path: Path, info: VarInfo, pieces: tuple[np.ndarray, np.ndarray, np.ndarray],
    lo: int, dest: memoryview, scratch: memoryview,
) -> None:  # fmt: skip
    """One tile variable's runs in the window, raw bytes into ``dest`` (rows from ``lo``)."""
    elems, rows, lengths = pieces
    size = info.dtype.itemsize
    ends = elems + lengths
    gaps = (elems[1:] - ends[:-1]).tolist()
    bufs: list[memoryview] = []
    for k, (r, n) in enumerate(zip((rows - lo).tolist(), lengths.tolist(), strict=True)):
        if k:
            g = gaps[k - 1] * size
            while g > 0:  # halo bytes between two runs: read past them
                step = min(g, len(scratch))
                bufs.append(scratch[:step])
                g -= step
        bufs.append(dest[r * size : (r + n) * size])
    if int(ends[-1]) > info.size:
        raise ValueError(f"elements up to {int(ends[-1])} outside variable {info.name!r}")
    assert info.raw_offset is not None
    _preadv_all(fd, bufs, info.raw_offset + int(elems[0]) * size, path, info)


def _same(encodings: Sequence[Encoding]) -> bool:
    """All equal (``repr``: a NaN fill value equals itself)."""
    return len({repr(e) for e in encodings}) == 1


def read_member_rows(
    paths: Sequence[Path], infos: Sequence[Mapping[str, VarInfo]], runs: Sequence[list[TileRuns]],
    layout: StateLayout, lo: int, out: np.ndarray,
) -> bool:  # fmt: skip
    """Rows ``[lo, lo + out.size)`` of one member from its tiles into ``out`` (float64, 1-D).

    ``paths[t]``, ``infos[t]`` (its state variables), ``runs[t]`` (its
    interior, per variable) describe tile t. Physical values, missing NaN.
    Returns True unless every value is known to be finite (the caller may
    then skip the scan for inactive rows, as ``files`` mode does).
    """
    hi = lo + out.size
    names = [v.name for v in layout.variables]
    dest = memoryview(out.view(np.uint8))
    scratch = memoryview(np.empty(1 << 16, dtype=np.uint8))
    raw_by_var: list[list[tuple[Encoding, tuple[np.ndarray, np.ndarray, np.ndarray]]]] = [
        [] for _ in names
    ]
    maybe_nan = False
    block = np.empty(0, dtype=np.uint8)
    for path, tile_infos, tile_runs in zip(paths, infos, runs, strict=True):
        wins = [run.pieces(lo, hi) for run in tile_runs]
        use = [j for j, (e, _, _) in enumerate(wins) if e.size]
        if STRIDED:
            fast = [j for j in use if tile_infos[names[j]].raw_offset is not None]
        else:
            fast = [j for j in use if direct(tile_infos[names[j]])]
        slow = [names[j] for j in use if j not in fast]
        if fast:
            fd = os.open(path, os.O_RDONLY)
            try:
                for j in fast:
                    info = tile_infos[names[j]]
                    if STRIDED:
                        block, maybe = read_runs_into(fd, path, info, wins[j], lo, out, block)
                        maybe_nan |= maybe
                        continue
                    _read_runs(fd, path, info, wins[j], lo, dest, scratch)
                    raw_by_var[j].append((info, wins[j]))  # type: ignore[arg-type]
            finally:
                os.close(fd)
        if slow:  # the library or a raw range, one variable at a time
            pick = [names.index(n) for n in slow]
            rows, values = read_tile(path, slow, [tile_runs[j] for j in pick], lo, hi,
                                     infos=tile_infos if _all_raw(tile_infos, slow) else None)
            out[rows - lo] = values
            maybe_nan = True
    for v, parts in zip(layout.variables, raw_by_var, strict=True):
        if parts:
            maybe_nan |= _decode(v.offset, v.offset + v.size, lo, out, parts)
    return maybe_nan


def _all_raw(infos: Mapping[str, VarInfo], names: list[str]) -> bool:
    return all(infos[n].raw_offset is not None for n in names)


def _decode(v0: int, v1: int, lo: int, out: np.ndarray, parts: list) -> bool:
    """Decode in place what was read raw of one variable: once if every tile did, same encoding."""
    infos = [info for info, _ in parts]
    a, b = max(v0, lo) - lo, min(v1, lo + out.size) - lo
    covered = sum(int(n.sum()) for _, (_, _, n) in parts) == b - a
    if covered and _same([i.encoding for i in infos]) and len({i.dtype for i in infos}) == 1:
        seg = out[a:b]
        return infos[0].encoding.decode(_as_stored(seg, infos[0]), seg)
    maybe = False
    for info, (_, rows, lengths) in parts:
        for r, n in zip((rows - lo).tolist(), lengths.tolist(), strict=True):
            seg = out[r : r + n]
            maybe |= info.encoding.decode(_as_stored(seg, info), seg)
    return maybe


def _as_stored(seg: np.ndarray, info: VarInfo) -> np.ndarray:
    """The raw bytes in ``seg`` as stored (``seg`` itself if native float64: decoded in place)."""
    return seg if info.dtype == seg.dtype else seg.view(info.dtype)
