"""Parallel ensemble file I/O: N_e member files ⇄ the row-distributed ensemble matrix.

The algorithm (DESIGN.md, "Parallel ensemble read"): the N_mpi ranks form N_io
contiguous groups; the first rank of each group is its I/O task and owns the
group's contiguous row range. For member m = 1..N_e an I/O task reads *its*
byte ranges of the state variables of file m (independent ``pread``s, no
coordination with other readers) and scatters them to its group, while a
reader thread already reads file m+1 into the second buffer (double
buffering). Writing is the mirror: gather, then a writer thread journals the
prior bytes and ``pwrite``s the analysis in place while the next gather runs.

Why a thread and not non-blocking collectives: MPICH (as shipped in the mpich
wheel) progresses a non-blocking scatter only inside MPI calls, so a rank busy
in ``pread`` stalls its own scatter. ``os.preadv``, numpy casts and mpi4py's
blocking calls all release the GIL, so a reader thread gives real overlap.

Variables that are chunked or compressed (no raw byte range) are read through
the netCDF library by each I/O task; on write they are gathered whole to one
owner rank per file, which rewrites a copy of the file and renames it into
place (one writer per file, atomic, journaled as a whole-file backup).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .. import faults
from ..config.schema import Config
from ..layout.block import EnsembleBlock
from ..parallel.agree import ErrorNote, agree, raise_if_any, rebuild, root_call
from . import journal
from .members import remember_written
from .open import open_member
from .plan import IOPlan, Scratch, Timer, guard, make_plan
from .raw import raw_read, raw_write
from .rewrite import write_library

__all__ = ["EnsembleBlock", "IOStats", "read_ensemble", "write_ensemble"]


@dataclass
class IOStats:
    """Where the time of one read or write went.

    Seconds are the maximum over ranks (the critical path); ``state_bytes`` is
    the on-disk size of the state variables moved, all members together.
    """

    total_seconds: float = 0.0
    read_seconds: float = 0.0
    write_seconds: float = 0.0
    comm_seconds: float = 0.0
    wait_seconds: float = 0.0
    journal_seconds: float = 0.0
    state_bytes: int = 0

    def reduce(self, comm: MPI.Comm) -> IOStats:
        vals = np.array(
            [
                self.total_seconds,
                self.read_seconds,
                self.write_seconds,
                self.comm_seconds,
                self.wait_seconds,
                self.journal_seconds,
            ]
        )
        out = np.empty_like(vals)
        comm.Allreduce(vals, out, op=MPI.MAX)
        return IOStats(*out.tolist(), state_bytes=self.state_bytes)


# --------------------------------------------------------------------------- read


_NATIVE_F8 = np.dtype(np.float64)


def _read_member(plan: IOPlan, m: int, out: np.ndarray, scratch: Scratch) -> None:
    """Read this I/O task's rows of member ``m`` into ``out`` (float64, group rows).

    Native float64 segments are read straight into ``out`` (one copy, kernel to
    matrix); other dtypes go through a reused scratch buffer and one cast.
    """
    path = plan.paths[m]
    fd = os.open(path, os.O_RDONLY)
    store = None
    try:
        for seg in plan.segments:
            name = plan.layout.variables[seg.var].name
            info = plan.metas[m][name]
            dst = out[seg.row_lo - plan.group_lo : seg.row_hi - plan.group_lo]
            if info.raw_offset is not None:
                if seg.select is None and info.dtype == _NATIVE_F8:
                    raw_read(fd, info, seg.elem_lo, seg.elem_hi, out=dst, path=path)
                    continue
                buf = scratch.get(info.dtype, seg.n_elems)
                arr = raw_read(fd, info, seg.elem_lo, seg.elem_hi, out=buf, path=path)
            else:
                store = store or open_member(path)
                arr = store.read_elements(name, seg.elem_lo, seg.elem_hi)
            dst[...] = arr if seg.select is None else arr[seg.select]
    finally:
        os.close(fd)
        if store is not None:
            store.close()


def read_ensemble(
    config: Config, comm: MPI.Comm, *, out: EnsembleBlock | None = None, overlap: bool = True
) -> EnsembleBlock:
    """Collective: read all members into the row-distributed ensemble matrix.

    Parameters
    ----------
    config : Config
    comm : MPI.Comm
        The filter communicator (``MPI.COMM_SELF`` for a serial run).
    out : EnsembleBlock, optional
        A block of the same shape to read into (its array is reused). A
        cycling filter reuses its matrix: first-touch page faults of a fresh
        multi-GB array cost about as much as the copy from the page cache.
    overlap : bool
        Read file m+1 while file m is scattered (default). ``False`` reads and
        scatters in turn; it exists to measure what the overlap gains.

    Returns
    -------
    EnsembleBlock
        This rank's rows, ``data`` of shape (N_e, count).
    """
    t_start = time.perf_counter()
    plan = make_plan(config, comm)
    shape = (plan.n_members, plan.count)
    if out is not None and out.data.shape == shape and out.data.flags.c_contiguous:
        data = out.data
    else:
        data = np.empty(shape, dtype=np.float64)
    t_read, t_comm, t_wait = Timer(), Timer(), Timer()
    note: ErrorNote = None
    gcomm = plan.groups.group_comm
    try:
        if not plan.groups.is_io:
            for m in range(plan.n_members):
                with t_comm():
                    gcomm.Scatterv(None, data[m], root=0)
        elif gcomm.size == 1:
            scratch = Scratch()
            for m in range(plan.n_members):
                with t_read():
                    note = note or guard(lambda m=m: _read_member(plan, m, data[m], scratch))
        else:
            note = _read_pipelined(plan, data, t_read, t_comm, t_wait, depth=2 if overlap else 0)
    finally:
        plan.groups.free()
    raise_if_any(comm, note)
    stats = IOStats(
        total_seconds=time.perf_counter() - t_start,
        read_seconds=t_read.seconds,
        comm_seconds=t_comm.seconds,
        wait_seconds=t_wait.seconds,
        state_bytes=_state_bytes(plan),
    ).reduce(comm)
    return EnsembleBlock(plan.layout, plan.start, plan.count, data, stats)


def _read_pipelined(
    plan: IOPlan,
    data: np.ndarray,
    t_read: Timer,
    t_comm: Timer,
    t_wait: Timer,
    depth: int = 2,
) -> ErrorNote:
    """I/O task of a group > 1: reader thread fills buffers, main thread scatters.

    ``depth = 0`` is the unoverlapped reference: read, then scatter, in turn.
    """
    n, spec = plan.group_rows, plan.group_spec
    gcomm = plan.groups.group_comm
    if depth == 0:
        buf, scratch, note = np.empty(n), Scratch(), None
        for m in range(plan.n_members):
            with t_read():
                note = note or guard(lambda m=m: _read_member(plan, m, buf, scratch))
            with t_comm():
                gcomm.Scatterv([buf, *spec], data[m], root=0)
        return note
    free: queue.Queue[np.ndarray] = queue.Queue()
    for _ in range(depth):
        free.put(np.empty(n, dtype=np.float64))
    filled: queue.Queue[tuple[np.ndarray, ErrorNote]] = queue.Queue()
    stop = threading.Event()

    def reader() -> None:
        scratch = Scratch()
        for m in range(plan.n_members):
            buf = free.get()
            err: ErrorNote = None
            if not stop.is_set():
                with t_read():
                    err = guard(lambda m=m, buf=buf: _read_member(plan, m, buf, scratch))
            if err is not None:
                buf[...] = 0.0
                stop.set()
            filled.put((buf, err))

    th = threading.Thread(target=reader, name="ensio-reader", daemon=True)
    th.start()
    note: ErrorNote = None
    for m in range(plan.n_members):
        with t_wait():
            buf, err = filled.get()
        note = note or err
        with t_comm():
            gcomm.Scatterv([buf, *spec], data[m], root=0)
        free.put(buf)
    th.join()
    return note


# -------------------------------------------------------------------------- write


def _write_member(
    plan: IOPlan,
    m: int,
    src: np.ndarray,
    undo: journal.UndoLog | None,
    scratch: tuple[Scratch, Scratch],
) -> float:
    """Write this I/O task's raw-path rows of member ``m`` in place; returns journal seconds.

    Order per segment: read the prior bytes, append them to the undo journal,
    then overwrite. A masked segment is a read-modify-write of its covering
    range, which no other task touches.
    """
    path = plan.paths[m]
    t_journal = 0.0
    fd = os.open(path, os.O_RDWR)
    try:
        for seg in plan.segments:
            if not plan.raw(m, seg):
                continue
            info = plan.metas[m][plan.layout.variables[seg.var].name]
            rows = src[seg.row_lo - plan.group_lo : seg.row_hi - plan.group_lo]
            prior = None
            if undo is not None or seg.select is not None:
                t = time.perf_counter()
                buf = scratch[0].get(info.dtype, seg.n_elems)
                prior = raw_read(fd, info, seg.elem_lo, seg.elem_hi, out=buf, path=path)
                if undo is not None:
                    undo.save(path, info.raw_offset + seg.elem_lo * info.dtype.itemsize, prior)
                t_journal += time.perf_counter() - t
            if seg.select is not None:
                new = prior
                new[seg.select] = rows
            elif info.dtype == _NATIVE_F8:
                new = rows
            else:
                new = scratch[1].get(info.dtype, seg.n_elems)
                new[...] = rows
            faults.point("data-write")
            raw_write(fd, info, seg.elem_lo, new, path=path)
        if plan.fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return t_journal


def write_ensemble(
    config: Config, comm: MPI.Comm, block: EnsembleBlock, *, overlap: bool = True
) -> IOStats:
    """Collective: write the analysis rows back into the member files, in place.

    Only the bytes of the state variables change. With ``io.journal`` the
    prior bytes are journaled first, so a crash at any instant is undone by
    :func:`ensio.io.journal.recover` (run automatically by the next read or
    write, or by ``ensio recover``). If any rank fails, every file is rolled
    back before the error is raised. ``overlap=False`` gathers and writes in
    turn (to measure the overlap).
    """
    t_start = time.perf_counter()
    plan = make_plan(config, comm)
    if block.data.shape != (plan.n_members, plan.count) or block.start != plan.start:
        plan.groups.free()
        raise ValueError(
            f"ensemble block rows [{block.start}, {block.start + block.count}) × "
            f"{block.data.shape[0]} members do not match this rank's "
            f"[{plan.start}, {plan.start + plan.count}) × {plan.n_members}"
        )
    data = np.ascontiguousarray(block.data, dtype=np.float64)
    root = journal.journal_root(plan.paths[0])
    fsync = config.io.fsync
    undo = journal.UndoLog.create(root, comm.rank, fsync=fsync) if config.io.journal else None
    t_write, t_comm, t_wait, t_journal = Timer(), Timer(), Timer(), Timer()
    note: ErrorNote = None
    gcomm = plan.groups.group_comm
    try:
        if not plan.groups.is_io:
            for m in range(plan.n_members):
                with t_comm():
                    gcomm.Gatherv(data[m], None, root=0)
        elif gcomm.size == 1:
            scratch = (Scratch(), Scratch())
            for m in range(plan.n_members):
                with t_write():
                    note = note or guard(
                        lambda m=m: _add(t_journal, _write_member(plan, m, data[m], undo, scratch))
                    )
        else:
            note = _write_pipelined(
                plan, data, undo, t_write, t_comm, t_wait, t_journal, depth=2 if overlap else 0
            )
        note = note or write_library(plan, data, comm, undo, fsync, t_write, t_comm)
    finally:
        plan.groups.free()
        if undo is not None:
            undo.close()
    note = agree(comm, note)
    if note is not None:
        if config.io.journal:
            root_call(comm, lambda: journal.abort(root, fsync=fsync))
        raise rebuild(note)
    comm.Barrier()  # every rank's bytes are written before the journal is committed
    if config.io.journal:
        root_call(comm, lambda: journal.commit(root, fsync=fsync))
    remember_written(plan.paths, plan.metas, comm)
    return IOStats(
        total_seconds=time.perf_counter() - t_start,
        write_seconds=t_write.seconds - t_journal.seconds,
        comm_seconds=t_comm.seconds,
        wait_seconds=t_wait.seconds,
        journal_seconds=t_journal.seconds,
        state_bytes=_state_bytes(plan),
    ).reduce(comm)


def _write_pipelined(
    plan: IOPlan,
    data: np.ndarray,
    undo: journal.UndoLog | None,
    t_write: Timer,
    t_comm: Timer,
    t_wait: Timer,
    t_journal: Timer,
    depth: int = 2,
) -> ErrorNote:
    """I/O task of a group > 1: main thread gathers, writer thread writes.

    ``depth = 0`` is the unoverlapped reference: gather, then write, in turn.
    """
    n, spec = plan.group_rows, plan.group_spec
    gcomm = plan.groups.group_comm
    if depth == 0:
        buf, scratch, note = np.empty(n), (Scratch(), Scratch()), None
        for m in range(plan.n_members):
            with t_comm():
                gcomm.Gatherv(data[m], [buf, *spec], root=0)
            with t_write():
                note = note or guard(
                    lambda m=m: _add(t_journal, _write_member(plan, m, buf, undo, scratch))
                )
        return note
    free: queue.Queue[np.ndarray] = queue.Queue()
    for _ in range(depth):
        free.put(np.empty(n, dtype=np.float64))
    filled: queue.Queue[tuple[int, np.ndarray] | None] = queue.Queue()
    errors: list[ErrorNote] = []

    def writer() -> None:
        scratch = (Scratch(), Scratch())
        while (item := filled.get()) is not None:
            m, buf = item
            if not errors:
                with t_write():
                    err = guard(
                        lambda m=m, buf=buf: _add(
                            t_journal, _write_member(plan, m, buf, undo, scratch)
                        )
                    )
                if err is not None:
                    errors.append(err)
            free.put(buf)

    th = threading.Thread(target=writer, name="ensio-writer", daemon=True)
    th.start()
    for m in range(plan.n_members):
        with t_wait():
            buf = free.get()
        with t_comm():
            gcomm.Gatherv(data[m], [buf, *spec], root=0)
        filled.put((m, buf))
    filled.put(None)
    th.join()
    return errors[0] if errors else None


def _state_bytes(plan: IOPlan) -> int:
    return sum(v.size * v.dtype.itemsize for v in plan.layout.variables) * plan.n_members


def _add(timer: Timer, seconds: float) -> None:
    timer.seconds += seconds
