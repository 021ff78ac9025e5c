"""Library-path writes: chunked/compressed state variables, one writer per file.

The netCDF library cannot be driven by several writers of one file, and a
compressed chunk whose size changes is moved by HDF5 (chunk index and
superblock change), so a byte-range undo log cannot cover it. After every raw
in-place write is done, each such variable is gathered whole to one owner rank
per file, which writes a copy of the file through the library and renames it
into place; the journal keeps the original inode as a whole-file backup.
"""

from __future__ import annotations

import shutil

import numpy as np
from mpi4py import MPI

from ..durable import replacing
from ..parallel.agree import ErrorNote
from ..parallel.distribution import block_distribution
from . import journal
from .open import open_member
from .plan import IOPlan, Timer, guard

__all__ = ["write_library"]


def write_library(
    plan: IOPlan,
    data: np.ndarray,
    comm: MPI.Comm,
    undo: journal.UndoLog | None,
    fsync: bool,
    t_write: Timer,
    t_comm: Timer,
) -> ErrorNote:
    """Library-path variables: gather each whole to one owner per file, rewrite a copy, rename.

    Collective over ``comm``; every rank walks the same (member, variable)
    list, derived from metadata all ranks share, so the gathers match.
    """
    comm.Barrier()  # raw in-place writes are finished before files are copied
    layout = plan.layout
    bounds = [block_distribution(layout.n_rows, comm.size, r) for r in range(comm.size)]
    note: ErrorNote = None
    for m in range(plan.n_members):
        lib = [v for v in layout.variables if plan.metas[m][v.name].raw_offset is None]
        if not lib:
            continue
        owner = m % comm.size
        gathered: dict[str, np.ndarray] = {}
        for v in lib:
            counts = np.array(
                [max(0, min(s + c, v.offset + v.size) - max(s, v.offset)) for s, c in bounds]
            )
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            a = max(plan.start, v.offset)
            b = min(plan.start + plan.count, v.offset + v.size)
            mine = data[m, a - plan.start : b - plan.start] if b > a else data[m, :0]
            full = np.empty(v.size) if comm.rank == owner else None
            with t_comm():
                comm.Gatherv(
                    np.ascontiguousarray(mine),
                    [full, counts, displs, MPI.DOUBLE] if full is not None else None,
                    root=owner,
                )
            if full is not None:
                gathered[v.name] = full
        if comm.rank == owner and note is None:
            with t_write():
                note = guard(lambda m=m, g=gathered: _rewrite_copy(plan, m, g, undo, fsync))
    return note


def _rewrite_copy(
    plan: IOPlan, m: int, values: dict[str, np.ndarray], undo: journal.UndoLog | None, fsync: bool
) -> None:
    """Write library-path variables into a copy of member ``m`` and rename it into place."""
    path = plan.paths[m]
    if undo is not None:
        undo.save_file(path)
    with replacing(path, fsync=fsync, label="library") as tmp:
        shutil.copyfile(path, tmp)
        with open_member(tmp, writable=True) as store:
            for name, full in values.items():
                v = plan.layout.variable(name)
                if v.active is None:
                    store.write_elements(name, 0, full)
                else:
                    cur = store.read_elements(name, 0, v.n_elements)
                    cur[v.active] = full
                    store.write_elements(name, 0, cur)
