"""Tiles whose state variables are chunked or compressed: rewritten whole through the library.

Models that write their restarts through XIOS or with netCDF-4 compression
give tiles whose variables have no raw byte range. Such a tile cannot be
patched in place by several ranks: the library allows one writer per file,
and a compressed chunk whose size changes moves (HDF5 rewrites its index).
So, as for single-file members (:mod:`ensio.io.modes.rewrite`), each such tile
gets one owner rank: every rank sends it the interior points of its rows,
and the owner writes the whole tile into a copy through the library and
renames it into place, the journal keeping the original inode as a
whole-file backup. A tile is either written this way (all its state
variables) or as raw byte ranges, never both, so its undo records are one
kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ...parallel.agree import ErrorNote, guard
from ..formats.store import VarInfo
from ..txn import journal as journal_mod
from ..txn.librarycopy import rewrite_elements
from .tilefile import TileRuns

__all__ = ["library_tiles", "rewrite_tile", "write_library_tiles"]


def library_tiles(
    infos: Sequence[Sequence[Mapping[str, VarInfo]]], names: Sequence[str]
) -> list[tuple[int, int]]:
    """(member, tile) of every tile with a state variable that has no raw byte range."""
    return [(m, t) for m, tiles in enumerate(infos) for t, tile in enumerate(tiles)
            if any(tile[n].raw_offset is None for n in names)]  # fmt: skip


def write_library_tiles(
    comm: MPI.Comm,
    paths: Sequence[Sequence[Path]],
    names: Sequence[str],
    runs: Sequence[Sequence[TileRuns]],
    tiles: Sequence[tuple[int, int]],
    data: np.ndarray,
    lo: int,
    undo: journal_mod.UndoLog | None,
    fsync: bool,
) -> tuple[ErrorNote, int]:
    """Collective: rows ``[lo, lo + data.shape[1])`` of ``tiles``, each rewritten by its owner.

    Tile k of ``tiles`` belongs to rank ``k mod size``. ``data`` (N_e, n):
    this rank's rows, physical; NaN keeps the stored value. Every rank takes
    part in every gather whatever failed before, and returns the first error
    it met (shared by the caller's agreement) and the values clipped by
    packing in the tiles it owns.
    """
    hi = lo + data.shape[1]
    note: ErrorNote = None
    clips = 0
    for k, (m, t) in enumerate(tiles):
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        for run in runs[t]:
            elems, rows = run.window(lo, hi)
            parts.append((elems, data[m, rows - lo]))
        owner = k % comm.size
        gathered = comm.gather(parts, root=owner)
        if comm.rank != owner or note is not None:
            continue
        assert gathered is not None
        found = [0]

        def rewrite(path: Path = paths[m][t], parts: list = gathered, found: list = found) -> None:
            found[0] = rewrite_tile(path, names, parts, undo, fsync)

        note = guard(rewrite)
        clips += found[0]
    return note, clips


def rewrite_tile(
    path: Path, names: Sequence[str], parts: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]],
    undo: journal_mod.UndoLog | None, fsync: bool,
) -> int:  # fmt: skip
    """Tile elements of ``names`` from the ranks' ``parts``, via a copy; the values clipped.

    ``parts[r][j] = (elems, physical values)``: rank r's interior points of
    variable ``names[j]`` (a ``gather`` of each writer's part, in rank order,
    so the elements stay increasing). Written by
    :func:`ensio.io.txn.librarycopy.rewrite_elements`, the single-file members' path.
    """
    merged = {name: (np.concatenate([p[j][0] for p in parts]),
                     np.concatenate([p[j][1] for p in parts]))
              for j, name in enumerate(names)}  # fmt: skip
    return sum(rewrite_elements(path, merged, undo, fsync).values())
