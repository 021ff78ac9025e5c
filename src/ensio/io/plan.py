"""The per-call plan of the parallel ensemble I/O, and small shared pieces.

Everything a rank needs to move its rows is derived once per read or write
(:func:`make_plan`), collectively and identically on every rank, so that the
pipelines in :mod:`ensio.io.ensemble` only move bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..config.schema import Config
from ..layout.state import Segment, StateLayout
from ..parallel.agree import ErrorNote, note_error, root_call
from ..parallel.comms import IOGroups, io_groups
from ..parallel.distribution import block_distribution
from . import journal
from .members import FileMeta, resolve_io_tasks, root_layout, scan_members

__all__ = ["IOPlan", "Scratch", "Timer", "guard", "make_plan"]


@dataclass(frozen=True)
class IOPlan:
    """Everything a rank needs to run the pipeline, derived once per call."""

    layout: StateLayout
    paths: list[Path]
    metas: list[FileMeta]
    groups: IOGroups
    start: int
    count: int
    group_lo: int
    group_hi: int
    counts: np.ndarray
    displs: np.ndarray
    segments: list[Segment]
    fsync: bool

    @property
    def n_members(self) -> int:
        return len(self.paths)

    @property
    def group_rows(self) -> int:
        """Rows of this rank's I/O group (the I/O task's buffer length)."""
        return self.group_hi - self.group_lo

    @property
    def group_spec(self) -> list:
        """Counts, displacements and type of the group's Scatterv/Gatherv buffer."""
        return [self.counts, self.displs, MPI.DOUBLE]

    def raw(self, m: int, seg: Segment) -> bool:
        return self.metas[m][self.layout.variables[seg.var].name].raw_offset is not None


def make_plan(config: Config, comm: MPI.Comm) -> IOPlan:
    paths = config.member_paths()
    n_io = root_call(comm, lambda: resolve_io_tasks(config, comm.size))
    _recover_stale(paths[0], comm)
    layout = root_layout(config, comm)
    metas = scan_members(paths, layout, comm)
    groups = io_groups(comm, n_io)
    start, count = block_distribution(layout.n_rows, comm.size, comm.rank)
    g0, gn = block_distribution(comm.size, n_io, groups.group)
    bounds = [block_distribution(layout.n_rows, comm.size, r) for r in range(g0, g0 + gn)]
    counts = np.array([c for _, c in bounds], dtype=np.int64)
    displs = np.array([s - bounds[0][0] for s, _ in bounds], dtype=np.int64)
    lo, hi = bounds[0][0], bounds[-1][0] + bounds[-1][1]
    return IOPlan(
        layout,
        paths,
        metas,
        groups,
        start,
        count,
        lo,
        hi,
        counts,
        displs,
        layout.segments(lo, hi),
        config.io.fsync,
    )


def _recover_stale(first_member: Path, comm: MPI.Comm) -> None:
    """Roll back (or finish) an interrupted write before touching the files again."""
    root = journal.journal_root(first_member)
    root_call(comm, lambda: journal.recover(root))


class Timer:
    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t


class Scratch:
    """Reusable on-disk-dtype buffers: a fresh array per segment would cost page faults."""

    def __init__(self) -> None:
        self._bufs: dict[np.dtype, np.ndarray] = {}

    def get(self, dtype: np.dtype, n: int) -> np.ndarray:
        buf = self._bufs.get(dtype)
        if buf is None or buf.size < n:
            buf = self._bufs[dtype] = np.empty(n, dtype=dtype)
        return buf[:n]


def guard(fn: Callable[[], object]) -> ErrorNote:
    """Run ``fn``; return its error as a note to share instead of raising mid-collective."""
    try:
        fn()
    except Exception as exc:
        return note_error(exc)
    return None
