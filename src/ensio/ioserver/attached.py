"""``mode: attached`` — no server ranks: the model ranks post-process and write.

Each model rank runs the post-processing graph on its own part (the graph's
``points`` are the local part shapes: time operations and expressions are
point-wise, so a part's result is the global result restricted to it). The
records the graph emits are the same, in the same order, on every rank; each
is gathered (``Gatherv`` over the model communicator) to the rank that owns
its file (files round-robin over the model ranks), which applies the spatial
operations on the global array and writes through the same
:class:`~.writer.FileSet` as a server. Collective: every rank calls ``send``
for every active field, an empty part included.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from mpi4py import MPI

from ..parallel.agree import all_call
from .client import Client, Transport
from .config import IOServerConfig
from .parts import LocalDomain, local_shape, place
from .pipeline import SinkFactory, field_periods, with_missing
from .protocol import IOServerError
from .report import Report
from .sync import end_with_abort, gather_parts, write_gathered_restart

__all__ = ["AttachedLink", "start_attached", "file_owners"]


def file_owners(cfg: IOServerConfig, size: int) -> dict[str, int]:
    """Enabled file id -> model rank that writes it (round-robin in config order)."""
    return {f.id: i % size for i, f in enumerate(cfg.enabled_files)}


class AttachedLink(Transport):
    """The attached-mode transport (see the module docstring)."""

    def __init__(self, cfg: IOServerConfig, comm: MPI.Comm, history: str,
                 periods: Mapping[str, tuple[int, ...]]) -> None:
        self.cfg = cfg
        self.comm = comm
        self.periods = periods
        self._history = history
        self._owners = file_owners(cfg, comm.size)
        self._parts: list[Mapping[str, LocalDomain]] = []
        self._graph: Any = None
        self._files: Any = None
        self._t0 = time.perf_counter()
        self.blocked = 0.0
        self.busy = 0.0
        self.hwm = 0
        self.bytes_sent = 0
        self.messages = 0
        self.restarts_written = (0, 0)

    def restart(self, meta, blocks) -> None:
        """Gathered to model rank 0, which writes it (as in sync mode)."""
        t = time.perf_counter()
        nbytes, nfiles = write_gathered_restart(self.comm, meta, blocks)
        self.restarts_written = (self.restarts_written[0] + nbytes,
                                 self.restarts_written[1] + nfiles)
        self.blocked += time.perf_counter() - t

    def define(self, domains: Mapping[str, LocalDomain]) -> None:
        from .graph import Graph
        from .server import geometry_of
        from .writer import FileSet

        t = time.perf_counter()
        self._parts = gather_parts(self.comm, domains, root=None)
        mine = self._parts[self.comm.rank]
        points = {}
        for gid, g in self.cfg.grids.items():
            ld = mine.get(g.domain)
            levels = self.cfg.axes[g.axis].n if g.axis else None
            points[gid] = local_shape(self.cfg.domains[g.domain],
                                      None if ld is None else ld.part, levels)
        own = [f for f, r in self._owners.items() if r == self.comm.rank]

        def build() -> None:
            self._graph = Graph(self.cfg, points=points)
            if own:
                by_domain = {d: [p[d] for p in self._parts if d in p] for d in self.cfg.domains}
                self.cfg.output_dir.mkdir(parents=True, exist_ok=True)
                self._files = FileSet(self.cfg, own, geometry_of(self.cfg, by_domain),
                                      self.cfg.output_dir, self._history)

        all_call(self.comm, build)
        self.blocked += time.perf_counter() - t

    def send(self, field_id: str, step: int, data: np.ndarray) -> None:
        if not self._graph.needs(field_id, step):
            return
        t = time.perf_counter()
        fd = self.cfg.fields[field_id]
        ld = self._parts[self.comm.rank].get(self.cfg.grids[fd.grid].domain)
        mask = None if ld is None else ld.mask
        self._graph.push(field_id, step, with_missing(data, mask, fd.missing_value))
        self.hwm = max(self.hwm, self._graph.nbytes)
        self.busy += time.perf_counter() - t

    def _write(self, records: Sequence[Any]) -> None:
        """Gather each record to its file's owner; the owner writes them."""
        mine = []
        for rec in records:
            owner = self._owners[rec.file_id]
            flat = np.ascontiguousarray(rec.data, dtype=np.float64).reshape(-1)
            self.bytes_sent += flat.nbytes
            self.messages += 1
            if self.comm.rank != owner:
                self.comm.Gatherv([flat, MPI.DOUBLE], None, root=owner)
                continue
            d = self.cfg.domains[self.cfg.grids[rec.field.in_grid].domain]
            counts = [int(np.prod(rec.data.shape[:-len(d.shape)], dtype=int))
                      * p[d.id].part.size if d.id in p else 0 for p in self._parts]
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
            buf = np.empty(int(sum(counts)), np.float64)
            self.comm.Gatherv([flat, MPI.DOUBLE], [buf, counts, displs, MPI.DOUBLE], root=owner)
            full = np.full((*rec.data.shape[:-len(d.shape)], *d.shape), np.nan)
            self.hwm = max(self.hwm, full.nbytes + buf.nbytes)
            for p, c, o in zip(self._parts, counts, displs, strict=True):
                if c:
                    place(full, d, p[d.id].part, buf[o:o + c])
            mine.append(replace(rec, data=full))
        if mine:
            self._files.write(mine)

    def _records(self, fn, step: int) -> None:
        t = time.perf_counter()
        note = None
        try:
            records = fn(step)
        except Exception as exc:  # agreed below: the gathers must not start on some ranks only
            note, records = f"model rank {self.comm.rank}: {type(exc).__name__}: {exc}", []
        notes = [n for n in self.comm.allgather(note) if n is not None]
        if notes:
            raise IOServerError(notes[0])
        self._write(records)
        self.busy += time.perf_counter() - t

    def step(self, step: int) -> None:
        t = time.perf_counter()
        if step > 1:
            self._records(self._graph.advance, step - 1)
        self.blocked += time.perf_counter() - t

    def close(self, last_step: int) -> Report:
        t = time.perf_counter()
        if last_step > 0:  # as the servers: advance over the last step, then finish
            self._records(self._graph.advance, last_step)
        self._records(self._graph.finish, last_step)
        stats = self._files.close() if self._files is not None else None
        self._files = None
        wall = max(time.perf_counter() - self._t0, 1e-12)
        mine = (self.busy / wall, self.hwm,
                int(getattr(stats, "bytes_written", 0)) + self.restarts_written[0],
                len(getattr(stats, "files", ())) + self.restarts_written[1])
        every = self.comm.allgather(mine)
        self.blocked += time.perf_counter() - t
        return Report(self.blocked, self.bytes_sent, self.messages,
                      min(max(e[0] for e in every), 1.0), max(e[1] for e in every),
                      sum(e[2] for e in every), sum(e[3] for e in every))

    def abort(self, reason: str) -> None:
        end_with_abort(self.comm, reason, self._files)


def start_attached(world: MPI.Comm, cfg: IOServerConfig, history: str,
                   sink_factory: SinkFactory | None = None, periods=field_periods) -> Client:
    """Every world rank is a model rank and a writer (``sink_factory`` is not used:
    the graph runs on the parts, the writer on the owners)."""
    comm = world.Dup()
    return Client(cfg, comm, world.rank, AttachedLink(cfg, comm, history,
                                                      all_call(comm, lambda: periods(cfg, None))))
