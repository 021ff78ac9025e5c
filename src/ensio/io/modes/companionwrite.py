"""Byte-range write-back of variables with companions (halo copies, level/``also`` increments).

A state variable with companions (:mod:`ensio.layout.companions`) is written
by the I/O task that owns its rows together with the companions of those
rows, in the same file step and the same undo log: the task reads each range
it will write, journals it, puts the analysis into the rows and derives the
companion targets from the rows, then writes the ranges back. The prior of the
rows, which an increment needs, is the bytes just read from the file (the
file still holds exactly the prior the ensemble was read from: the scan
checks its identity before the write), so no copy of the prior ensemble is
kept in memory.

Why not each row's covering range, as plain masked segments do: the target
elements of one task (a halo cell, another level) can lie between the rows of
another task, and two tasks rewriting overlapping ranges concurrently would
lose each other's bytes. So each written variable's elements (rows and
targets) are owned by the task of their source row, and a task's ranges are
the maximal runs of its own elements in element order that contain no other
task's element; elements between them that nobody writes are written back as
read. The ranges of different tasks are then disjoint, whatever the number
of tasks, and the files do not depend on it.

Targets change only where the row's stored value changed, so an analysis that
changes nothing leaves every byte as it was.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import faults
from ...errors import InputError
from ...layout.companions import Companion, write_back
from ...layout.state import StateLayout, VariableLayout
from ...parallel.comms import IOGroups
from ...parallel.distribution import RowDistribution
from ..formats.raw import raw_read, raw_write
from ..formats.store import VarInfo
from ..scan.members import MemberMeta
from ..txn import journal as journal_mod

__all__ = ["CompanionPlan", "check_companion_paths", "companion_plan", "task_row_bounds"]


def task_row_bounds(starts: np.ndarray, first_ranks: Sequence[int],
                    n_rows: int) -> list[tuple[int, int]]:
    """State rows ``[lo, hi)`` of each I/O task, from the ranks' row blocks.

    ``starts``: every rank's first row (:class:`RowDistribution`);
    ``first_ranks``: the first rank of each I/O group, in order.
    """
    los = [int(starts[r]) for r in first_ranks]
    his = [*los[1:], n_rows]
    return list(zip(los, his, strict=True))


def changed_bytes(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Bool per element: the stored bytes differ (NaN == NaN, -0.0 != 0.0)."""
    width = np.dtype(f"u{new.dtype.itemsize}")
    return new.view(width) != old.view(width)


@dataclass(frozen=True, eq=False)
class _Ranges:
    """This task's ranges of one written variable and where each element sits in their buffer."""

    name: str
    lo: np.ndarray  # int64 (c,), first element of each range
    hi: np.ndarray  # int64 (c,), end of each range
    at: np.ndarray  # int64 (c,), start of each range in the joined buffer

    @property
    def length(self) -> int:
        return int((self.hi - self.lo).sum())

    def positions(self, elements: np.ndarray) -> np.ndarray:
        """Index of each element (inside the ranges) in the joined buffer."""
        k = np.searchsorted(self.lo, elements, side="right") - 1
        return self.at[k] + (elements - self.lo[k])


@dataclass(frozen=True, eq=False)
class _Link:
    """One companion restricted to this task: positions in the target's buffer, segment rows."""

    kind: str
    target: str
    pos: np.ndarray
    rows: np.ndarray  # 0-based within the task's segment of the source variable


@dataclass(frozen=True, eq=False)
class _SegmentPlan:
    var: int
    name: str
    rows_pos: np.ndarray  # each segment row's position in its variable's buffer
    ranges: dict[str, _Ranges]  # written variable -> its ranges (the source's first)
    #: the companions restricted to this task: ``target_elements`` are positions in
    #: the target's buffer, ``source_rows`` rows of the task's segment (0-based)
    links: tuple[Companion, ...]


def _runs(mine: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs ``[i, j)`` of True in ``mine``."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mine.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _written(v: VariableLayout, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Elements of each variable written for local rows ``[lo, hi)`` of ``v`` (unsorted)."""
    out: dict[str, list[np.ndarray]] = {v.name: [v.element_indices(lo, hi)]}
    for c in v.companions:
        sel = (c.source_rows >= lo) & (c.source_rows < hi)
        out.setdefault(c.target, []).append(c.target_elements[sel])
    return {name: np.concatenate(parts) for name, parts in out.items()}


class CompanionPlan:
    """This I/O task's ranges and companion links of every variable with companions, built once.

    Parameters
    ----------
    layout : StateLayout
    bounds : list of (int, int)
        Every I/O task's state rows ``[lo, hi)`` (:func:`task_row_bounds`).
    task : int
        This I/O task's index in ``bounds``.
    """

    def __init__(self, layout: StateLayout, bounds: Sequence[tuple[int, int]],
                 task: int) -> None:
        self.segments: dict[int, _SegmentPlan] = {}
        for i, v in enumerate(layout.variables if bounds else ()):
            if v.companions:
                plan = self._plan(i, v, bounds, task)
                if plan is not None:
                    self.segments[i] = plan

    @staticmethod
    def _plan(i: int, v: VariableLayout, bounds: Sequence[tuple[int, int]],
              task: int) -> _SegmentPlan | None:
        per_task = []
        for lo, hi in bounds:
            a, b = max(lo, v.offset) - v.offset, min(hi, v.offset + v.size) - v.offset
            per_task.append((a, b, _written(v, a, b) if a < b else {}))
        a, b, _ = per_task[task]
        if a >= b:
            return None
        names = [v.name, *dict.fromkeys(c.target for c in v.companions if c.target != v.name)]
        ranges = {}
        for name in names:
            elems = [w.get(name, np.empty(0, np.int64)) for _, _, w in per_task]
            owner = np.concatenate([np.full(e.size, t, np.int64) for t, e in enumerate(elems)])
            flat = np.concatenate(elems)
            order = np.argsort(flat, kind="stable")
            flat, owner = flat[order], owner[order]
            if flat.size > 1 and (np.diff(flat) == 0).any():
                raise ValueError(f"variable '{name}': an element is written twice")
            runs = _runs(owner == task)
            lo = np.array([flat[s] for s, _ in runs], dtype=np.int64)
            hi = np.array([flat[e - 1] + 1 for _, e in runs], dtype=np.int64)
            at = np.concatenate([[0], np.cumsum(hi - lo)[:-1]]).astype(np.int64)
            ranges[name] = _Ranges(name, lo, hi, at)
        links = []
        for c in v.companions:
            sel = (c.source_rows >= a) & (c.source_rows < b)
            if sel.any():
                links.append(Companion(c.kind, c.target, ranges[c.target].positions(
                    c.target_elements[sel]), c.source_rows[sel] - a))
        rows_pos = ranges[v.name].positions(v.element_indices(a, b))
        return _SegmentPlan(i, v.name, rows_pos, ranges, tuple(links))

    def write_segment(
        self,
        fd: int,
        path: os.PathLike[str],
        meta: MemberMeta,
        var: int,
        rows: np.ndarray,
        undo: journal_mod.UndoLog | None,
    ) -> tuple[int, float]:
        """Write the rows of variable ``var`` and their companions into one member, in place.

        ``rows``: the task's analysis rows of the variable (physical, NaN:
        keep the prior). Order: read every range, journal it, compute, then
        overwrite. Returns the clips and the seconds spent reading and
        journaling the prior bytes.
        """
        plan = self.segments[var]
        infos = {name: meta.infos[name] for name in plan.ranges}
        t = time.perf_counter()
        bufs = {name: self._read(fd, path, infos[name], r, undo)
                for name, r in plan.ranges.items()}  # fmt: skip
        t_journal = time.perf_counter() - t
        encodings = {name: info.encoding for name, info in infos.items()}
        clips = write_back(bufs, encodings, plan.name, plan.rows_pos, rows, plan.links)
        for name, r in plan.ranges.items():
            for lo, hi, at in zip(r.lo.tolist(), r.hi.tolist(), r.at.tolist(), strict=True):
                faults.point("data-write")
                raw_write(fd, infos[name], lo, bufs[name][at: at + hi - lo], path=path)
        return clips, t_journal

    @staticmethod
    def _read(fd: int, path: os.PathLike[str], info: VarInfo, r: _Ranges,
              undo: journal_mod.UndoLog | None) -> np.ndarray:
        buf = np.empty(r.length, dtype=info.dtype)
        for lo, hi, at in zip(r.lo.tolist(), r.hi.tolist(), r.at.tolist(), strict=True):
            part = raw_read(fd, info, lo, hi, out=buf[at: at + hi - lo], path=path)
            if undo is not None:
                undo.save(path, info.raw_offset + lo * info.dtype.itemsize, part)
        return buf



def companion_plan(layout: StateLayout, rows: RowDistribution, first_ranks: np.ndarray,
                   groups: IOGroups) -> CompanionPlan:
    """This rank's plan (no segment unless it is an I/O task of a layout with companions).

    ``rows``: the ranks' rows; ``first_ranks``: each I/O group's first rank.
    """
    if not groups.is_io or not any(v.companions for v in layout.variables):
        return CompanionPlan(layout, [], -1)
    bounds = task_row_bounds(rows.starts + rows.offset, first_ranks.tolist(), layout.n_rows)
    return CompanionPlan(layout, bounds, groups.group)


def check_companion_paths(paths: Sequence[Path], metas: Sequence[MemberMeta],
                          layout: StateLayout) -> None:
    """Refuse, before anything is written, an ``also`` variable the write cannot reach.

    A byte-range source variable is written with its companions in place,
    so its ``also`` variables need byte ranges too; a library-path source
    takes them along in its rewritten copy, whatever their storage.
    """
    for path, meta in zip(paths, metas, strict=True):
        for v in layout.variables:
            if not meta.raw(v.name):
                continue
            for c in v.companions:
                if c.target != v.name and not meta.raw(c.target):
                    raise InputError(
                        f"{path}: variable '{c.target}' (the also of '{v.name}') is stored "
                        f"chunked or compressed while '{v.name}' is contiguous; store both alike"
                    )
