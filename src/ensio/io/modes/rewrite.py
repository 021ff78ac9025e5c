"""Library-path writes: chunked/compressed state variables, one writer per file.

The netCDF library cannot be driven by several writers of one file, and a
compressed chunk whose size changes is moved by HDF5 (chunk index and
superblock change), so a byte-range undo log cannot cover it. After every raw
in-place write is done, each such variable is gathered whole to one owner rank
per file, which writes a copy of the file through the library and renames it
into place; the journal keeps the original inode as a whole-file backup. Files
that are a run's private staged copies (analysis copies, renamed only by the
run's commit) are written directly, without that second copy. The owners take
the files in rounds, one per rank, so the ranks rewrite at the same time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
from mpi4py import MPI

from ...config.schema import IOSection
from ...layout.state import StateLayout, VariableLayout
from ...parallel.agree import ErrorNote, guard
from ...parallel.distribution import RowDistribution
from ...stopwatch import Stopwatch
from ..scan.members import MemberScan
from ..txn import journal
from ..txn.librarycopy import rewrite_copy

__all__ = ["LibraryWriter", "variable_counts", "write_library"]


class LibraryWriter(Protocol):
    """What :func:`write_library` needs of the files mode's ensemble-I/O object.

    A protocol, not the class, so this module does not import files.py
    (which calls it): the two would otherwise form an import circle.
    """

    comm: MPI.Comm
    rows: RowDistribution
    layout: StateLayout
    paths: list[Path]
    io: IOSection
    scan: MemberScan
    private: bool


def variable_counts(rows: RowDistribution, offset: int, size: int) -> np.ndarray:
    """Rows of each rank inside the state rows ``[offset, offset + size)``, shape (size,).

    The counts of a ``Gatherv`` of one variable; its displacements are their
    running sum, because the ranks' blocks are contiguous and in order.
    """
    lo = np.maximum(rows.starts + rows.offset, offset)
    hi = np.minimum(rows.starts + rows.offset + rows.counts, offset + size)
    return np.maximum(hi - lo, 0)


def write_library(
    ens: LibraryWriter,
    data: np.ndarray,
    keep: np.ndarray,
    undo: journal.UndoLog | None,
    sw: Stopwatch,
    clips: np.ndarray,
) -> ErrorNote:
    """Library-path variables: gather each whole to one owner per file, rewrite a copy, rename.

    (Into a run's private staged copies, ``ens.private``, the owner writes directly:
    :func:`ensio.io.txn.librarycopy.rewrite_elements`.)

    Collective over ``ens.comm``; every rank walks the same (member, variable)
    list, derived from metadata all ranks share, so the gathers match. Gathers
    are timed as ``"comm"``, the rewrite as ``"write"``. Rows to ``keep``
    (inactive, shape (count,)) travel as NaN and keep their prior values;
    the owner adds its clips (per layout variable) to ``clips``.
    """
    comm, rows, layout = ens.comm, ens.rows, ens.layout
    comm.Barrier()  # raw in-place writes are finished before files are copied
    note: ErrorNote = None
    files = [(m, [v for v in layout.variables if not meta.raw(v.name)])
             for m, meta in enumerate(ens.scan.metas)]
    files = [(m, lib) for m, lib in files if lib]
    # In rounds of comm.size files, rank i owning the i-th: all of a round's gathers first,
    # then every owner rewrites its file while the others rewrite theirs. Gathering and
    # rewriting file by file would serialise the ranks (the next file's gather waits for
    # the owner still rewriting the last one); a round holds one file per rank.
    for r in range(0, len(files), comm.size):
        mine_to_write: tuple[int, dict[str, np.ndarray]] | None = None
        for owner, (m, lib) in enumerate(files[r : r + comm.size]):
            gathered = _gather_file(comm, rows, data, keep, m, lib, owner, sw)
            if gathered is not None:
                mine_to_write = (m, gathered)
        if mine_to_write is not None and note is None:
            m, gathered = mine_to_write
            with sw("write"):
                meta = ens.scan.metas[m]
                encodings = {name: meta.infos[name].encoding for name in gathered}
                note = guard(
                    lambda m=m, g=gathered, e=encodings, meta=meta: _count(
                        clips, layout, rewrite_copy(ens.paths[m], layout, g, undo, ens.io.fsync,
                                                    e, known=meta.infos, backend=meta.store,
                                                    private=ens.private)
                    )
                )
    return note


def _gather_file(comm: MPI.Comm, rows: RowDistribution, data: np.ndarray, keep: np.ndarray,
                 m: int, lib: list[VariableLayout], owner: int,
                 sw: Stopwatch) -> dict[str, np.ndarray] | None:
    """Collective: member ``m``'s library-path variables whole on ``owner`` (None elsewhere)."""
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
    return gathered if comm.rank == owner else None


def _count(clips: np.ndarray, layout: StateLayout, found: dict[str, int]) -> None:
    for i, v in enumerate(layout.variables):
        clips[i] += found.get(v.name, 0)
