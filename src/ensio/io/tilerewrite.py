"""Tiles whose state variables are chunked or compressed: rewritten whole through the library.

Models that write their restarts through XIOS or with netCDF-4 compression
give tiles whose variables have no raw byte range. Such a tile cannot be
patched in place by several ranks: the library allows one writer per file,
and a compressed chunk whose size changes moves (HDF5 rewrites its index).
So, as for single-file members (:mod:`ensio.io.rewrite`), each such tile
gets one owner rank: every rank sends it the interior points of its rows,
and the owner writes the whole tile into a copy through the library and
renames it into place, the journal keeping the original inode as a
whole-file backup. A tile is either written this way (all its state
variables) or as raw byte ranges, never both, so its undo records are one
kind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..durable import replacing
from ..parallel.agree import ErrorNote
from . import journal as journal_mod
from .open import open_member
from .pipeline import guard
from .store import VarInfo
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
        merged = [
            (np.concatenate([g[j][0] for g in gathered]),
             np.concatenate([g[j][1] for g in gathered]))
            for j in range(len(names))
        ]  # fmt: skip
        found = [0]

        def rewrite(path: Path = paths[m][t], merged: list = merged, found: list = found) -> None:
            found[0] = rewrite_tile(path, names, merged, undo, fsync)

        note = guard(rewrite)
        clips += found[0]
    return note, clips


def rewrite_tile(
    path: Path, names: Sequence[str], values: Sequence[tuple[np.ndarray, np.ndarray]],
    undo: journal_mod.UndoLog | None, fsync: bool,
) -> int:  # fmt: skip
    """Tile elements ``values[j] = (elems, physical values)`` of ``names[j]``, via a copy."""
    path = Path(os.path.realpath(path))
    if undo is not None:
        undo.save_file(path)
    clips = 0
    with replacing(path, fsync=fsync, label="library") as tmp:
        shutil.copyfile(path, tmp)
        with open_member(tmp, writable=True) as store:
            infos = store.variables()
            for name, (elems, vals) in zip(names, values, strict=True):
                if elems.size == 0:
                    continue
                info = infos[name]
                cur = np.asarray(store.read_elements(name, 0, info.size)).ravel().copy()
                prior = cur[elems]
                new = np.empty_like(prior)
                clips += info.encoding.encode(np.ascontiguousarray(vals, np.float64), new)
                info.encoding.keep_prior(prior, vals, new)
                cur[elems] = new
                store.write_elements(name, 0, cur)
    return clips
