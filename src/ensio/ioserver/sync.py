"""``mode: sync`` — the baseline: gather every field to model rank 0, write, everyone waits.

This is what a model without an I/O server does today, kept so the benchmark
and the users can measure what the server mode saves. Every ``send`` is a
``Gatherv`` over the model communicator (collective: every rank calls
``send`` for every active field, an empty part included); rank 0 assembles
the global array with the same code as the servers and feeds the same
:class:`~.pipeline.OutputPipeline`, so the files are identical. At each
``update_timestep`` rank 0 writes the periods that ended while the others wait
for its verdict (a broadcast), which also shares a write error with every rank.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ..parallel.abort import abort_job
from ..parallel.agree import root_call
from .client import Client, Transport
from .config import IOServerConfig
from .parts import LocalDomain, place
from .pipeline import Sink, SinkFactory, field_periods
from .protocol import IOServerError
from .report import Report

__all__ = ["SyncLink", "start_sync", "gather_parts", "end_with_abort", "write_gathered_restart"]


@dataclass
class _Root:
    """Rank 0's state: every rank's parts, the sink, its timings."""

    parts: list[Mapping[str, LocalDomain]]
    sink: Sink | None = None
    busy: float = 0.0
    hwm: int = 0
    error: str | None = None


def gather_parts(comm: MPI.Comm, domains: Mapping[str, LocalDomain],
                 root: int | None = 0) -> list[Mapping[str, LocalDomain]] | None:
    """Every rank's declarations, on ``root`` (``None``: on every rank)."""
    if root is None:
        return comm.allgather(dict(domains))
    return comm.gather(dict(domains), root=root)


def write_gathered_restart(comm: MPI.Comm, meta, blocks, root: int = 0) -> tuple[int, int]:
    """Restart ``meta`` without servers: every rank's blocks to ``root``, which writes it.

    Collective over ``comm``. The same :class:`~.restart.RestartAssembler`
    as a server checks and remaps the blocks, so the file is the same; an
    error (named rank and file, nothing written) is raised on every rank.
    Returns ``(bytes, files)`` written (non-zero on ``root`` only).
    """
    from .restart import RestartAssembler

    every = comm.gather((meta, list(blocks)), root=root)
    error, written = None, (0, 0)
    if every is not None:
        asm = RestartAssembler(comm.size)
        try:
            for r, (m, _) in enumerate(every):
                try:
                    asm.begin(m)
                except (ValueError, OSError) as exc:
                    raise ValueError(f"model rank {r}: restart {m.path}: {exc}") from None
            for r, (m, bl) in enumerate(every):
                for name, start, block in bl:
                    if block.size:
                        asm.part(m.rid, name, start, block, r)
                asm.end(m.rid, r)
            written = (asm.bytes_written, len(asm.written))
        except (ValueError, OSError) as exc:
            text = str(exc)
            error = text if text.startswith("model rank") else f"model rank {root} (writer): {text}"
    error = comm.bcast(error, root=root)
    if error is not None:
        raise IOServerError(error)
    return written


def end_with_abort(comm: MPI.Comm, reason: str, sink: Sink | None) -> None:
    """A model rank failed in attached/sync mode: close what this rank writes, end the job."""
    if sink is not None:
        try:
            sink.close()
        except Exception as exc:  # the job ends anyway; say so
            print(f"ensio ioserver: closing files failed: {exc}", file=sys.stderr, flush=True)
    print(f"ensio ioserver: {reason}", file=sys.stderr, flush=True)
    abort_job(comm, 2)


class SyncLink(Transport):
    """The sync-mode transport (see the module docstring)."""

    def __init__(self, cfg: IOServerConfig, comm: MPI.Comm, sink_factory: SinkFactory,
                 history: str, periods: Mapping[str, tuple[int, ...]]) -> None:
        self.cfg = cfg
        self.comm = comm
        self.periods = periods
        self._factory = sink_factory
        self._history = history
        self._root: _Root | None = None
        self._parts: list[Mapping[str, LocalDomain]] = []
        self._t0 = time.perf_counter()
        self.blocked = 0.0
        self.bytes_sent = 0
        self.messages = 0
        self.restarts_written = (0, 0)

    def restart(self, meta, blocks) -> None:
        t = time.perf_counter()
        nbytes, nfiles = write_gathered_restart(self.comm, meta, blocks)
        self.restarts_written = (self.restarts_written[0] + nbytes,
                                 self.restarts_written[1] + nfiles)
        self.blocked += time.perf_counter() - t

    def _root_do(self, fn, *args) -> None:
        """Run a sink call on rank 0, remembering (not raising) its error until the verdict."""
        root = self._root
        if root is None or root.error is not None:
            return
        t = time.perf_counter()
        try:
            fn(*args)
        except Exception as exc:  # shared with every rank at the next verdict
            root.error = f"model rank 0 (writer): {type(exc).__name__}: {exc}"
        root.busy += time.perf_counter() - t

    def _verdict(self) -> None:
        error = self.comm.bcast(None if self._root is None else self._root.error, root=0)
        if error is not None:
            raise IOServerError(error)

    def define(self, domains: Mapping[str, LocalDomain]) -> None:
        from .server import geometry_of

        t = time.perf_counter()
        parts = gather_parts(self.comm, domains, root=0)
        if self.comm.rank == 0:
            self._root = _Root(parts)
            by_domain = {d: [p[d] for p in parts if d in p] for d in self.cfg.domains}

            def build() -> None:
                self._root.sink = self._factory(
                    self.cfg, [f.id for f in self.cfg.enabled_files],
                    geometry_of(self.cfg, by_domain), self.cfg.output_dir, self._history)

            self.cfg.output_dir.mkdir(parents=True, exist_ok=True)
            self._root_do(build)
        self._verdict()
        self.blocked += time.perf_counter() - t

    def send(self, field_id: str, step: int, data: np.ndarray) -> None:
        t = time.perf_counter()
        flat = np.ascontiguousarray(data, dtype=np.float64).reshape(-1)
        self.bytes_sent += flat.nbytes
        self.messages += 1
        root = self._root
        if root is None:
            self.comm.Gatherv([flat, MPI.DOUBLE], None, root=0)
        else:
            grid = self.cfg.grids[self.cfg.fields[field_id].grid]
            d = self.cfg.domains[grid.domain]
            levels = self.cfg.axes[grid.axis].n if grid.axis else 1
            counts = [p[d.id].part.size * levels if d.id in p else 0 for p in root.parts]
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
            buf = np.empty(int(sum(counts)), np.float64)
            self.comm.Gatherv([flat, MPI.DOUBLE], [buf, counts, displs, MPI.DOUBLE], root=0)
            full = np.full(self.cfg.field_shape(field_id), np.nan)
            root.hwm = max(root.hwm, full.nbytes + buf.nbytes)
            for p, c, o in zip(root.parts, counts, displs, strict=True):
                if c:
                    place(full, d, p[d.id].part, buf[o:o + c])
            if root.sink is not None:
                self._root_do(root.sink.push, field_id, step, full)
                root.hwm = max(root.hwm, full.nbytes + buf.nbytes + root.sink.nbytes)
        self.blocked += time.perf_counter() - t

    def step(self, step: int) -> None:
        t = time.perf_counter()
        if self._root is not None and self._root.sink is not None and step > 1:
            self._root_do(self._root.sink.advance, step - 1)
        self._verdict()
        self.blocked += time.perf_counter() - t

    def close(self, last_step: int) -> Report:
        t = time.perf_counter()
        summary = None
        root = self._root
        if root is not None and root.sink is not None:
            if last_step > 0:  # as the servers: advance over the last step, then finish
                self._root_do(root.sink.advance, last_step)
            self._root_do(root.sink.finish, last_step)
            stats: list = []
            self._root_do(lambda: stats.append(root.sink.close()))
            wall = max(time.perf_counter() - self._t0, 1e-12)
            written = stats[0] if stats else None
            summary = (min(root.busy / wall, 1.0), root.hwm,
                       int(getattr(written, "bytes_written", 0)) + self.restarts_written[0],
                       len(getattr(written, "files", ())) + self.restarts_written[1])
            root.sink = None
        self._verdict()
        busy, hwm, nbytes, nfiles = self.comm.bcast(summary, root=0)
        self.blocked += time.perf_counter() - t
        return Report(self.blocked, self.bytes_sent, self.messages, busy, hwm, nbytes, nfiles)

    def abort(self, reason: str) -> None:
        end_with_abort(self.comm, reason, None if self._root is None else self._root.sink)


def start_sync(world: MPI.Comm, cfg: IOServerConfig, history: str,
               sink_factory: SinkFactory, periods=field_periods) -> Client:
    """Every world rank is a model rank; rank 0 of a duplicate communicator writes."""
    comm = world.Dup()
    table = root_call(comm, lambda: periods(cfg, None))
    link = SyncLink(cfg, comm, sink_factory, history, table)
    return Client(cfg, comm, world.rank, link)
