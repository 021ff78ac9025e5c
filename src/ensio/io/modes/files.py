"""``io.mode: files``: N_e member files ⇄ the row-distributed ensemble matrix.

The algorithm (DESIGN.md, "Parallel ensemble read"): the N_mpi ranks form N_io
contiguous groups; the first rank of each group is its I/O task and owns the
group's contiguous row range. For member m = 1..N_e an I/O task reads *its*
byte ranges of the state variables of file m (independent ``pread``s, no
coordination with other readers) and scatters them to its group, while a
worker thread already reads file m+1 (:func:`~ensio.io.modes.pipeline.run_pipeline`).
Writing is the mirror: gather, then the worker journals the prior bytes and
``pwrite``s the analysis in place while the next gather runs.

Variables without a raw byte range (chunked, compressed, record) are read
through the netCDF library by each I/O task; on write they are gathered whole
to one owner rank per file, which rewrites a copy of the file and renames it
into place (:mod:`ensio.io.modes.rewrite`; one writer per file, atomic, journaled as
a whole-file backup).

Everything that does not change between calls (the I/O groups, the row
distribution, the layout, the validated member metadata) is built once by
:class:`FileEnsembleIO` and reused by every :meth:`~FileEnsembleIO.read` and
:meth:`~FileEnsembleIO.write` of the object's life.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
from mpi4py import MPI

from ... import faults
from ...config.schema import Config, EnsembleSection, IOSection
from ...errors import InputError
from ...layout.block import EnsembleBlock, all_finite
from ...layout.state import StateLayout
from ...parallel.agree import ErrorNote, guard, rebuild, root_call
from ...parallel.comms import io_groups
from ...parallel.distribution import RowDistribution
from ...progress import Advance, no_progress
from ...stopwatch import Stopwatch
from ..formats.open import open_member
from ..formats.raw import raw_read, raw_write
from ..scan.members import MemberMeta, MemberScan, resolve_io_tasks, root_layout
from ..txn import journal as journal_mod
from ..txn.commit import journaled_write
from .base import EnsembleIO
from .companionwrite import check_companion_paths, companion_plan
from .pipeline import Scratch, run_pipeline
from .rewrite import write_library
from .stats import IOStats
from .tiledio import TiledEnsembleIO

__all__ = ["FileEnsembleIO"]

_NATIVE_F8 = np.dtype(np.float64)
_SWAPPED_F8 = _NATIVE_F8.newbyteorder("S")
#: :func:`~ensio.io.txn.journal.recover` states after which member files may have changed.
_RESTORED = ("rolled_back", "committed")


class FileEnsembleIO(EnsembleIO):
    """Collective: the parallel ensemble I/O of one set of member files, built once.

    Parameters
    ----------
    paths : sequence of Path
        The N_e member files, in matrix order (``config.member_paths()``).
    layout : StateLayout or EnsembleSection
        The layout, or the ``ensemble`` section to build it from member 1
        (on rank 0, shared).
    io : IOSection
        ``tasks`` (N_io), ``journal``, ``fsync``.
    comm : MPI.Comm
        The filter communicator (``MPI.COMM_SELF`` for a serial run). Not
        freed; the object frees only the communicators it splits.
    private : bool
        The files are a run's staged copies that no one reads before the run's
        commit renames them (analysis copies, ``io.in_place: false``): library-path
        variables are written straight into them, not into a second copy renamed
        over them (:func:`ensio.io.txn.librarycopy.rewrite_elements`).
    copies_of : sequence of MemberMeta, optional
        The files are byte copies, just made, of scanned files with this metadata:
        not opened again to be checked (:class:`~ensio.io.scan.members.MemberScan`).

    Attributes
    ----------
    layout : StateLayout
    groups : IOGroups
        The I/O groups (:func:`ensio.parallel.comms.io_groups`).
    rows : RowDistribution
        This rank's rows of the matrix (over ``comm``).
    group_rows : RowDistribution
        The rows of this rank's I/O group (a span of ``rows``): the I/O
        task's buffer and its scatter counts and displacements.
    scan : MemberScan
        The validated member metadata (``scan.metas``), refreshed by one
        ``stat`` per file before each call.
    stats : IOStats or None
        What the last :meth:`read` or :meth:`write` measured.

    Raises
    ------
    InputError, ConfigError
        On every rank: a bad member file, N_io > N_mpi.
    """

    mode: ClassVar[str] = "files"

    def __init__(
        self,
        paths: Sequence[Path],
        layout: StateLayout | EnsembleSection,
        io: IOSection,
        comm: MPI.Comm,
        *,
        private: bool = False,
        copies_of: Sequence[MemberMeta] | None = None,
    ) -> None:
        self.paths = list(paths)
        self.io = io
        self.comm = comm
        self.private = private
        self.n_io = root_call(comm, lambda: resolve_io_tasks(io, len(self.paths), comm.size))
        self._recover()
        if not isinstance(layout, StateLayout):
            layout = root_layout(layout, self.paths[0], comm)
        self.layout = layout
        self.scan = MemberScan(self.paths, layout, comm, copies_of)
        self.groups = io_groups(comm, self.n_io)
        self.rows = RowDistribution.of(layout.n_rows, comm)
        tasks = RowDistribution(comm.size, self.n_io, self.groups.group)
        self.group_rows = self.rows.span(tasks.start, tasks.stop)
        lo = self.group_rows.offset
        self.segments = layout.segments(lo, lo + self.group_rows.n_rows)
        self._companions = companion_plan(layout, self.rows, tasks.starts, self.groups)
        self.stats: IOStats | None = None
        self._clips = np.zeros(len(layout.variables), dtype=np.int64)  # of the current write
        self._fresh = True  # the scan is current: the first call need not stat again
        self._maybe_nonfinite = True  # of the current read (see read)
        self._closed = False

    # ----------------------------------------------------------------- life cycle

    @classmethod
    def open_run(cls, config: Config, comm: MPI.Comm, root: Path) -> EnsembleIO:
        """Collective: the member files of ``config``; tiled ones (``{tile}``) as tiles."""
        if config.ensemble.tiled:
            return TiledEnsembleIO.open_run(config, comm, root)
        return cls(config.member_paths(), config.ensemble, config.io, comm)

    def close(self) -> None:
        """Free the I/O group communicators (collective; idempotent)."""
        if not self._closed:
            self._closed = True
            self.groups.free()

    @property
    def n_members(self) -> int:
        return len(self.paths)

    def checked_metas(self) -> list[MemberMeta]:
        """Collective: the member files' metadata, current (one ``stat`` per file; a file
        that changed since it was checked is checked again)."""
        self._prepare()
        return list(self.scan.metas)

    @property
    def state_bytes(self) -> int:
        """On-disk bytes of the state variables, all members together."""
        return sum(v.size * v.dtype.itemsize for v in self.layout.variables) * self.n_members

    def _recover(self) -> None:
        """Roll back (or finish) an interrupted write before touching the files again."""
        root = self._journal_root()
        root_call(self.comm, lambda: journal_mod.recover(root))

    def _prepare(self) -> None:
        if self._closed:
            raise ValueError("ensemble I/O object used after close()")
        if not self._fresh:
            # recovery on rank 0 and the members' check share one collective
            root = self._journal_root()
            self.scan.refresh(before=lambda: journal_mod.recover(root).state in _RESTORED)
        self._fresh = False

    def _finish(self, note: ErrorNote, counts: np.ndarray, stats: IOStats
                ) -> tuple[dict[str, int], IOStats]:
        """Collective: agree on errors, sum per-variable ``counts``, take the slowest seconds.

        One ``allgather`` instead of three collectives: on a loaded machine each
        synchronisation of the ranks costs about a scheduler time slice, which
        for small members is more than the data movement.
        """
        names = [f.name for f in dataclasses.fields(stats) if f.name.endswith("_seconds")]
        seconds = [getattr(stats, n) for n in names]
        parts = self.comm.allgather((note, np.asarray(counts, dtype=np.int64), seconds))
        agreed = next((n for n, _, _ in parts if n is not None), None)
        if agreed is not None:
            raise rebuild(agreed)
        total = np.sum([c for _, c, _ in parts], axis=0, dtype=np.int64)
        slowest = np.max([s for _, _, s in parts], axis=0)
        by_name = {v.name: int(n) for v, n in zip(self.layout.variables, total, strict=True)}
        return by_name, dataclasses.replace(stats, **dict(zip(names, slowest.tolist(),
                                                               strict=True)))

    def _scatter_spec(self) -> list:
        """Counts, displacements and type of the group's Scatterv/Gatherv buffer."""
        return [self.group_rows.counts, self.group_rows.starts, MPI.DOUBLE]

    # ----------------------------------------------------------------------- read

    def read(
        self,
        out: EnsembleBlock | None = None,
        *,
        overlap: bool = True,
        progress: Advance = no_progress,
    ) -> EnsembleBlock:
        """Collective: read all members into the row-distributed ensemble matrix.

        Parameters
        ----------
        out : EnsembleBlock, optional
            A block of the same shape to read into (its array is reused). A
            cycling filter reuses its matrix: first-touch page faults of a fresh
            multi-GB array cost about as much as the copy from the page cache.
        overlap : bool
            Read file m+1 while file m is scattered (default). ``False`` reads
            and scatters in turn; it exists to measure what the overlap gains.
        progress : callable, optional
            Called once per member this rank has read (a progress bar's advance).

        Returns
        -------
        EnsembleBlock
            This rank's rows, ``data`` of shape (N_e, count).
        """
        t_start = time.perf_counter()
        self._prepare()
        shape = (self.n_members, self.rows.count)
        if out is not None and out.data.shape == shape and out.data.flags.c_contiguous:
            data = out.data
        else:
            data = np.empty(shape, dtype=np.float64)
        sw = Stopwatch()
        gcomm = self.groups.group_comm
        note: ErrorNote = None
        self._maybe_nonfinite = False  # set by _read_member
        if not self.groups.is_io:
            for m in range(self.n_members):
                with sw("comm"):
                    gcomm.Scatterv(None, data[m], root=0)
        elif gcomm.size == 1:
            scratch = Scratch()
            for m in range(self.n_members):
                with sw("read"):
                    note = note or guard(lambda m=m: self._read_member(m, data[m], scratch))
                progress()
        else:
            scratch, spec = Scratch(), self._scatter_spec()

            def read_one(m: int, buf: np.ndarray) -> None:
                self._read_member(m, buf, scratch)
                progress()

            note = run_pipeline(
                "read", self.n_members, self.group_rows.n_rows, read_one,
                lambda m, buf: gcomm.Scatterv([buf, *spec], data[m], root=0),
                sw, depth=2 if overlap else 0,
            )  # fmt: skip
        block = EnsembleBlock(self.layout, self.rows.start, self.rows.count, data)
        if self.groups.is_io and gcomm.size == 1 and not self._maybe_nonfinite:
            # this rank decoded all its rows itself and found every value finite:
            # no row is inactive, and a scan of the whole block would cost as
            # much as reading it from the page cache
            block.inactive = np.zeros(self.rows.count, dtype=bool)
        else:
            block.inactive = block.inactive_rows()
        mine = IOStats.from_stopwatch(sw, time.perf_counter() - t_start, self.state_bytes)
        # error agreement, inactive counts and seconds in one collective
        inactive, stats = self._finish(note, block.count_by_variable(block.inactive), mine)
        self.stats = dataclasses.replace(stats, inactive=inactive)
        return block

    def _read_member(self, m: int, out: np.ndarray, scratch: Scratch) -> None:
        """Read this I/O task's rows of member ``m`` into ``out`` (float64, group rows).

        Native float64 segments are read straight into ``out`` (one copy, kernel to
        matrix); other dtypes go through a reused scratch buffer and one cast.
        Values are physical (scale_factor/add_offset applied), missing ones NaN
        (:class:`~ensio.layout.encoding.Encoding` of the member's variable).
        """
        path, meta, lo = self.paths[m], self.scan.metas[m], self.group_rows.offset
        fd = os.open(path, os.O_RDONLY)
        store = None
        try:
            for seg in self.segments:
                name = self.layout.variables[seg.var].name
                info = meta.infos[name]
                dst = out[seg.row_lo - lo : seg.row_hi - lo]
                if meta.raw(name):
                    if seg.select is None and info.dtype == _NATIVE_F8:
                        raw_read(fd, info, seg.elem_lo, seg.elem_hi, out=dst, path=path)
                        self._maybe_nonfinite |= info.encoding.decode(dst, dst)
                        continue
                    if seg.select is None and info.dtype == _SWAPPED_F8:
                        # classic files are big-endian: one swapping copy (SIMD, faster
                        # than swapping in place), then the missing-value scan on
                        # native values (on swapped ones it is several times slower)
                        buf = scratch.get(info.dtype, seg.n_elems)
                        np.copyto(dst, raw_read(fd, info, seg.elem_lo, seg.elem_hi, out=buf,
                                                path=path))
                        self._maybe_nonfinite |= info.encoding.decode(dst, dst)
                        continue
                    buf = scratch.get(info.dtype, seg.n_elems)
                    arr = raw_read(fd, info, seg.elem_lo, seg.elem_hi, out=buf, path=path)
                else:
                    store = store or open_member(path, known=meta.infos, backend=meta.store)
                    arr = store.read_elements(name, seg.elem_lo, seg.elem_hi)
                src = arr if seg.select is None else arr[seg.select]
                self._maybe_nonfinite |= info.encoding.decode(src, dst)
        finally:
            os.close(fd)
            if store is not None:
                store.close()

    # ---------------------------------------------------------------------- write

    def write(
        self,
        block: EnsembleBlock,
        *,
        overlap: bool = True,
        journal: bool | None = None,
        progress: Advance = no_progress,
    ) -> IOStats:
        """Collective: write the analysis rows back into the member files, in place.

        Only the bytes of the state variables change, and of those not the
        ones of inactive rows (:meth:`EnsembleBlock.inactive_rows
        <ensio.layout.block.EnsembleBlock.inactive_rows>`: every member keeps
        its bytes there) nor of packed values the analysis left unchanged.
        Values are packed per member (:meth:`~ensio.layout.encoding.Encoding.encode`);
        the clips are counted in ``stats.clipped``. With ``io.journal`` the
        prior bytes are journaled first, so a crash at any instant is undone by
        :func:`ensio.io.txn.journal.recover` (run automatically by the next read or
        write, or by ``ensio recover``). If any rank fails, every file is rolled
        back before the error is raised.

        Parameters
        ----------
        block : EnsembleBlock
            This rank's rows (``rows.start``, ``rows.count``), all members.
        overlap : bool
            ``False`` gathers and writes in turn (to measure the overlap).
        journal : bool, optional
            Override ``io.journal`` for this call (to measure its cost).
        progress : callable, optional
            Called once per member this rank has written (a progress bar's advance).

        Returns
        -------
        IOStats
            Also kept as :attr:`stats`.
        """
        t_start = time.perf_counter()
        self._prepare()
        if block.data.shape != (self.n_members, self.rows.count) or block.start != self.rows.start:
            raise ValueError(
                f"ensemble block rows [{block.start}, {block.start + block.count}) × "
                f"{block.data.shape[0]} members do not match this rank's "
                f"[{self.rows.start}, {self.rows.stop}) × {self.n_members}"
            )
        self._check_writable()
        data = np.ascontiguousarray(block.data, dtype=np.float64)
        keep = block.inactive_rows()
        library = any(not meta.raw(v.name) for meta in self.scan.metas
                      for v in self.layout.variables)  # the same on every rank
        journaled = self.io.journal if journal is None else journal
        sw = Stopwatch()
        self._clips = np.zeros(len(self.layout.variables), dtype=np.int64)

        def write(undo: journal_mod.UndoLog | None) -> ErrorNote:
            note = self._write_rows(data, keep, undo, sw, 2 if overlap else 0, progress)
            if not library:  # nothing to gather: also spares write_library's barrier
                return note
            return note or write_library(self, data, keep, undo, sw, self._clips)

        journaled_write(self.comm, self._journal_root(), journaled, self.io.fsync, write)
        self.scan.written()
        mine = IOStats.from_stopwatch(sw, time.perf_counter() - t_start, self.state_bytes)
        clipped, stats = self._finish(None, self._clips, mine)
        self.stats = dataclasses.replace(stats, clipped=clipped)
        return self.stats

    def _journal_root(self) -> Path:
        return journal_mod.journal_root(self.paths[0])

    def _check_writable(self) -> None:
        """A library-path variable in a format without library writes: refuse before writing.

        The metadata is the same on every rank, so every rank raises alike.
        """
        check_companion_paths(self.paths, self.scan.metas, self.layout)
        for path, meta in zip(self.paths, self.scan.metas, strict=True):
            if meta.library_writes:
                continue
            for name in meta.infos:
                if not meta.raw(name):
                    raise InputError(
                        f"{path}: variable '{name}' has no raw byte range and its format "
                        "cannot write through a library"
                    )

    def _write_rows(
        self,
        data: np.ndarray,
        keep: np.ndarray,
        undo: journal_mod.UndoLog | None,
        sw: Stopwatch,
        depth: int,
        progress: Advance = no_progress,
    ) -> ErrorNote:
        """Gather each member's rows to the I/O tasks and write their byte ranges in place.

        Rows to ``keep`` travel as NaN: the I/O task puts the prior bytes back
        wherever a value is not finite, so no flags need to travel.
        """
        gcomm = self.groups.group_comm
        marked = keep.any()

        def outgoing(m: int) -> np.ndarray:
            return np.where(keep, np.nan, data[m]) if marked else data[m]

        if not self.groups.is_io:
            for m in range(self.n_members):
                with sw("comm"):
                    gcomm.Gatherv(outgoing(m), None, root=0)
            return None
        scratch = (Scratch(), Scratch())

        def store(m: int, rows: np.ndarray) -> None:
            sw.add("journal", self._write_member(m, rows, undo, scratch))
            progress()

        if gcomm.size == 1:
            note: ErrorNote = None
            for m in range(self.n_members):
                with sw("write"):
                    note = note or guard(lambda m=m: store(m, outgoing(m)))
            return note
        spec = self._scatter_spec()
        return run_pipeline(
            "write", self.n_members, self.group_rows.n_rows, store,
            lambda m, buf: gcomm.Gatherv(outgoing(m), [buf, *spec], root=0),
            sw, depth=depth,
        )  # fmt: skip

    def _write_member(
        self,
        m: int,
        src: np.ndarray,
        undo: journal_mod.UndoLog | None,
        scratch: tuple[Scratch, Scratch],
    ) -> float:
        """Write this I/O task's byte-range rows of member ``m`` in place; returns journal seconds.

        Order per segment: read the prior bytes, append them to the undo journal,
        then overwrite. The prior bytes are also read, and put back, where a
        value is not finite (an inactive row) or, in a packed variable, where
        the analysis left the physical value unchanged. A masked segment is a
        read-modify-write of its covering range, which no other task touches.
        """
        path, meta, lo = self.paths[m], self.scan.metas[m], self.group_rows.offset
        t_journal = 0.0
        fd = os.open(path, os.O_RDWR)
        try:
            for seg in self.segments:
                name = self.layout.variables[seg.var].name
                if not meta.raw(name):
                    continue
                info = meta.infos[name]
                rows = src[seg.row_lo - lo : seg.row_hi - lo]
                if seg.var in self._companions.segments:  # rows with their companions
                    clips, t = self._companions.write_segment(fd, path, meta, seg.var, rows, undo)
                    self._clips[seg.var] += clips
                    t_journal += t
                    continue
                merge = info.encoding.packed or not all_finite(rows)
                prior = None
                if undo is not None or seg.select is not None or merge:
                    t = time.perf_counter()
                    buf = scratch[0].get(info.dtype, seg.n_elems)
                    prior = raw_read(fd, info, seg.elem_lo, seg.elem_hi, out=buf, path=path)
                    if undo is not None:
                        undo.save(path, info.raw_offset + seg.elem_lo * info.dtype.itemsize, prior)
                    t_journal += time.perf_counter() - t
                if seg.select is None and info.dtype == _NATIVE_F8 and not merge:
                    new = rows
                else:
                    new = scratch[1].get(info.dtype, seg.n_rows)
                    self._clips[seg.var] += info.encoding.encode(rows, new)
                    if merge:
                        old = prior if seg.select is None else prior[seg.select]
                        info.encoding.keep_prior(old, rows, new)
                    if seg.select is not None:
                        prior[seg.select] = new
                        new = prior
                faults.point("data-write")
                raw_write(fd, info, seg.elem_lo, new, path=path)
            if self.io.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return t_journal

