"""Library-path writes: chunked/compressed state variables, one writer per file.

The netCDF library cannot be driven by several writers of one file, and a
compressed chunk whose size changes is moved by HDF5 (chunk index and
superblock change), so a byte-range undo log cannot cover it. After every raw
in-place write is done, each such variable is gathered whole to one owner rank
per file, which writes a copy of the file through the library and renames it
into place; the journal keeps the original inode as a whole-file backup.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from ..durable import replacing
from ..layout.encoding import Encoding
from ..layout.state import StateLayout
from ..parallel.agree import ErrorNote
from ..parallel.distribution import RowDistribution
from ..stopwatch import Stopwatch
from . import journal
from .open import open_member
from .pipeline import guard
from .store import MemberStore

if TYPE_CHECKING:  # files.py imports this module
    from .files import FileEnsembleIO

__all__ = ["rewrite_copy", "rewrite_elements", "variable_counts", "write_library"]


def variable_counts(rows: RowDistribution, offset: int, size: int) -> np.ndarray:
    """Rows of each rank inside the state rows ``[offset, offset + size)``, shape (size,).

    The counts of a ``Gatherv`` of one variable; its displacements are their
    running sum, because the ranks' blocks are contiguous and in order.
    """
    lo = np.maximum(rows.starts + rows.offset, offset)
    hi = np.minimum(rows.starts + rows.offset + rows.counts, offset + size)
    return np.maximum(hi - lo, 0)


def write_library(
    ens: FileEnsembleIO,
    data: np.ndarray,
    keep: np.ndarray,
    undo: journal.UndoLog | None,
    sw: Stopwatch,
    clips: np.ndarray,
) -> ErrorNote:
    """Library-path variables: gather each whole to one owner per file, rewrite a copy, rename.

    Collective over ``ens.comm``; every rank walks the same (member, variable)
    list, derived from metadata all ranks share, so the gathers match. Gathers
    are timed as ``"comm"``, the rewrite as ``"write"``. Rows to ``keep``
    (inactive, shape (count,)) travel as NaN and keep their prior values;
    the owner adds its clips (per layout variable) to ``clips``.
    """
    comm, rows, layout = ens.comm, ens.rows, ens.layout
    comm.Barrier()  # raw in-place writes are finished before files are copied
    note: ErrorNote = None
    for m, meta in enumerate(ens.scan.metas):
        lib = [v for v in layout.variables if not meta.raw(v.name)]
        if not lib:
            continue
        owner = m % comm.size
        gathered: dict[str, np.ndarray] = {}
        for v in lib:
            counts = variable_counts(rows, v.offset, v.size)
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            a, b = max(rows.start, v.offset), min(rows.stop, v.offset + v.size)
            mine = data[m, a - rows.start : b - rows.start] if b > a else data[m, :0]
            flags = keep[a - rows.start : b - rows.start] if b > a else keep[:0]
            if flags.any():
                mine = np.where(flags, np.nan, mine)
            full = np.empty(v.size) if comm.rank == owner else None
            with sw("comm"):
                comm.Gatherv(
                    np.ascontiguousarray(mine),
                    [full, counts, displs, MPI.DOUBLE] if full is not None else None,
                    root=owner,
                )
            if full is not None:
                gathered[v.name] = full
        if comm.rank == owner and note is None:
            with sw("write"):
                infos = ens.scan.metas[m].infos
                encodings = {name: infos[name].encoding for name in gathered}
                note = guard(
                    lambda m=m, g=gathered, e=encodings: _count(
                        clips, layout, rewrite_copy(ens.paths[m], layout, g, undo, ens.io.fsync, e)
                    )
                )
    return note


def _count(clips: np.ndarray, layout: StateLayout, found: dict[str, int]) -> None:
    for i, v in enumerate(layout.variables):
        clips[i] += found.get(v.name, 0)


def rewrite_copy(
    path: Path,
    layout: StateLayout,
    values: dict[str, np.ndarray],
    undo: journal.UndoLog | None,
    fsync: bool,
    encodings: Mapping[str, Encoding] | None = None,
) -> dict[str, int]:
    """Write library-path variables into a copy of ``path`` and rename it into place.

    ``values`` are physical (NaN: keep the prior value) state rows of the
    layout's variables (:func:`rewrite_elements` with their active elements).
    """
    return rewrite_elements(
        path, {name: (layout.variable(name).active, full) for name, full in values.items()},
        undo, fsync, encodings,
    )  # fmt: skip


def rewrite_elements(
    path: Path,
    values: Mapping[str, tuple[np.ndarray | None, np.ndarray]],
    undo: journal.UndoLog | None,
    fsync: bool,
    encodings: Mapping[str, Encoding] | None = None,
) -> dict[str, int]:
    """Variables' elements ``values[name] = (elements, physical values)`` via a copy of ``path``.

    ``elements``: flat indices into the variable (None: all of it). Values
    are physical (NaN: keep the prior value), packed with the file's
    ``encodings`` (default: its own). Returns the clips per variable. The
    copy replaces the file itself: a symlinked member stays a link to the
    rewritten file, and the copy keeps the file's permission bits and owner
    (:func:`ensio.durable.replacing`). The journal backs up that same file.
    """
    path = Path(os.path.realpath(path))
    if undo is not None:
        undo.save_file(path)
    clips: dict[str, int] = {}
    with replacing(path, fsync=fsync, label="library") as tmp:
        shutil.copyfile(path, tmp)
        with open_member(tmp, writable=True) as store:
            infos = store.variables()
            for name, (elements, full) in values.items():
                enc = (encodings or {}).get(name) or infos[name].encoding
                clips[name] = _store_elements(store, name, infos[name].size, elements, full, enc)
    return clips


def _store_elements(
    store: MemberStore, name: str, size: int, elements: np.ndarray | None, full: np.ndarray,
    enc: Encoding,
) -> int:  # fmt: skip
    """``full`` into ``elements`` (None: all ``size``) of the variable, packed; the clips.

    Elements not listed (masked points, a tile's halo), NaN values (inactive
    rows) and unchanged packed values keep their stored values.
    """
    cur = store.read_elements(name, 0, size)
    prior = cur if elements is None else cur[elements]
    new = np.empty_like(prior)
    clips = enc.encode(full, new)
    enc.keep_prior(prior, full, new)
    if elements is None:
        cur = new
    else:
        cur[elements] = new
    store.write_elements(name, 0, cur)
    return clips
