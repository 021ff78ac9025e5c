"""The server core: receive parts, assemble global fields, drive the output pipeline.

One loop per server rank: ``MPI_Probe(ANY_SOURCE, 7701)`` on the I/O
communicator, decode the header, act. DOMAIN parts become one global
geometry per domain once every client sent DEFINED; FIELD parts are placed
into a global array per (field, step), pushed to the pipeline when every
model rank with a non-empty part sent its own; STEP messages move each
client's step, and ``advance(min over clients of (step - 1))`` lets the graph
write the periods that ended. MPI keeps the messages of one source in order,
so a client's STEP s+1 proves all its parts of step s arrived.

Back-pressure: the global arrays of incomplete (field, step) pairs are the
server's memory. Beyond ``server_buffer_mb`` the server receives only from
the ranks the oldest incomplete pair waits for (and small control messages
from anyone, so an ABORT is never missed); the other clients' bounded
buffers fill and they stall, instead of the server growing without bound.

Failures (a bad message, a client's ABORT, a rank that will never send): the
client at fault gets a tag-7704 error and the core raises :class:`ServerAbort`;
how the servers then end the job together is :mod:`.serverend`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mpi4py import MPI

from .config import IOServerConfig
from .geometry import DomainGeometry
from .mismatch import extent_mismatch, never_sent
from .parts import LocalDomain, assemble_geometry, domain_from_message, place
from .pipeline import Sink, SinkFactory, domain_geometry
from .protocol import (
    DRAIN_SECONDS,
    HEADER_BYTES,
    TAG_ERROR,
    TAG_MSG,
    Header,
    IOServerError,
    Kind,
    ProtocolError,
    decode,
    split_restart_part,
)
from .restart import RestartAssembler, RestartError, RestartMeta

__all__ = ["ServerCore", "ServerAbort"]

#: Messages up to this size are received even under back-pressure (control, ABORT).
SMALL_MESSAGE = HEADER_BYTES + 4096


class ServerAbort(Exception):
    """The run must end: ``reason`` is printed, files are closed, the job aborts."""


@dataclass
class _Pending:
    """A (field, step) being assembled: the global array and who sent a part."""

    data: np.ndarray
    got: set[int] = field(default_factory=set)


class ServerCore:
    """The state of one server rank (see the module docstring).

    Parameters
    ----------
    cfg : IOServerConfig
    iocomm : MPI.Comm
        Duplicate of the world: ranks are world ranks.
    clients : sequence of int
        World ranks of the model processes.
    files : sequence of str
        Ids of the files this server writes.
    fields : collection of str
        Source fields the field table sends to this server.
    sink_factory : SinkFactory
        Builds the output pipeline once the geometry is known.
    out_dir : Path
    history : str
    periods : mapping, optional
        Per source field, the step periods the field table gives it: a field due
        by the last step that never came is warned about (:meth:`unsent`).
    """

    def __init__(self, cfg: IOServerConfig, iocomm: MPI.Comm, clients: Sequence[int],
                 files: Sequence[str], fields: set[str] | frozenset[str],
                 sink_factory: SinkFactory, out_dir: Path, history: str, *,
                 periods: Mapping[str, Sequence[int]] | None = None) -> None:
        self.cfg = cfg
        self.iocomm = iocomm
        self.clients = tuple(clients)
        self.files = tuple(files)
        self.fields = frozenset(fields)
        self.periods = dict(periods or {})
        self.seen: set[str] = set()  # source fields some model rank sent
        self.last_step = 0
        self.sink_factory = sink_factory
        self.out_dir = out_dir
        self.history = history
        self.sink: Sink | None = None
        self.limit = int(cfg.server_buffer_mb * 2**20)
        self.domains: dict[int, dict[str, LocalDomain]] = {c: {} for c in self.clients}
        self.defined: set[int] = set()
        self.steps: dict[int, int] = {c: 0 for c in self.clients}
        self.closed: dict[int, int] = {}
        self.pending: dict[tuple[str, int], _Pending] = {}
        self.done: set[tuple[str, int]] = set()  # pushed, step not advanced over yet
        self.held = 0
        self.hwm = 0
        self.advanced = 0
        self.busy = 0.0
        self.stash: dict[int, np.ndarray] = {}
        self.error_sends: list[MPI.Request] = []  # tag-7704 sends, awaited before MPI_Abort
        self.failures: list[str] = []  # model ranks that sent ABORT, in order
        self.aborted: set[int] = set()
        self.drain_end: float | None = None
        self.restarts = RestartAssembler(len(self.clients))  # client ids: world ranks
        self.heard = {c: time.monotonic() for c in self.clients}  # last message of each

    # ------------------------------------------------------------------ receive loop
    def run(self) -> dict[str, float]:
        """Serve until every client closed; this server's summary (report keys)."""
        t0 = time.perf_counter()
        while len(self.closed) < len(self.clients):
            if self.failures and (self._drained() or not self._message_before(self.drain_end)):
                raise ServerAbort(self.failures[0])
            src, msg, t = self._next_message()
            self._handle(src, msg)
            poll = getattr(self.sink, "poll", None)  # shared files: announce records
            if poll is not None:
                poll()
            self.busy += time.perf_counter() - t
        if self.failures:
            raise ServerAbort(self.failures[0])
        if self.restarts.incomplete:
            raise ServerAbort(f"every model rank closed, restarts incomplete: "
                              f"{', '.join(self.restarts.incomplete)}")
        t = time.perf_counter()
        last = self.last_step = max(self.closed.values(), default=0)
        self._advance_to(last)
        sink = self._sink()
        sink.finish(last)
        stats = sink.close()
        self.sink = None
        self.busy += time.perf_counter() - t
        wall = max(time.perf_counter() - t0, 1e-12)
        return {
            "server_busy_fraction": min(self.busy / wall, 1.0),
            "server_memory_hwm_bytes": float(self.hwm),
            "bytes_written": float(stats.bytes_written + self.restarts.bytes_written),
            "files_written": float(len(stats.files) + len(self.restarts.written)),
        }

    def _recv(self, status: MPI.Status) -> tuple[int, np.ndarray, float]:
        t = time.perf_counter()
        msg = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        src = status.Get_source()
        self.iocomm.Recv([msg, MPI.BYTE], source=src, tag=TAG_MSG)
        self.heard[src] = time.monotonic()
        return src, msg, t

    def _next_message(self) -> tuple[int, np.ndarray, float]:
        """The next message to handle: (source, bytes, time it was taken).

        Under the budget: a held-back message first, else any source. Over
        it: only what the oldest incomplete (field, step) waits for, plus
        small messages of other ranks that do not start a new (field, step)
        — those are held back (one per rank, and nothing more is taken from
        that rank, so its order is kept) until the budget allows them.
        """
        status = MPI.Status()
        waiting = self._waiting_for() if self.held > self.limit else None
        if not waiting:
            if self.stash:
                src = min(self.stash)
                return src, self.stash.pop(src), time.perf_counter()
            self._probe_any(status)
            return self._recv(status)
        for r in waiting:
            if r in self.stash:
                return r, self.stash.pop(r), time.perf_counter()
        silent_since = time.monotonic()
        while True:  # poll: the awaited ranks, else small messages from the others
            if self.closed and time.monotonic() - silent_since > self.cfg.timeout_s:
                raise ServerAbort(self._silence())
            for r in waiting:
                if self.iocomm.Iprobe(source=r, tag=TAG_MSG, status=status):
                    return self._recv(status)
            for r in range(self.iocomm.size):
                if r in waiting or r in self.stash or not self.iocomm.Iprobe(
                        source=r, tag=TAG_MSG, status=status):
                    continue
                if status.Get_count(MPI.BYTE) <= SMALL_MESSAGE:
                    src, msg, t = self._recv(status)
                    if not self._starts_entry(src, msg):
                        return src, msg, t
                    self.stash[src] = msg
                    silent_since = time.monotonic()
            time.sleep(1e-4)  # stalled on purpose (back-pressure); yield the core

    def _probe_any(self, status: MPI.Status) -> None:
        """``Probe(ANY_SOURCE)`` that gives up after ``timeout_s`` without any message
        once some model rank has closed.

        A model rank that closed waits for the report, which waits for every
        other rank; one silent that long while another already ended is
        stopped, hung or dead (under a launcher that lets the others run): the
        run ends naming it, instead of waiting forever. Before any rank closed,
        silence is allowed (a long initialisation or model step). Polling also
        leaves the core to the model while idle.
        """
        if self.iocomm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_MSG, status=status):
            return
        start = time.monotonic()
        while not self.iocomm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_MSG, status=status):
            if self.closed and time.monotonic() - start > self.cfg.timeout_s:
                raise ServerAbort(self._silence())
            time.sleep(1e-4)

    def _silence(self) -> str:
        """Who the server gave up on: the open model rank heard from longest ago."""
        open_ranks = [c for c in self.clients if c not in self.closed]
        rank = min(open_ranks, key=lambda c: (self.heard[c], c))
        return (f"model rank {rank} sent nothing for {time.monotonic() - self.heard[rank]:.0f} s "
                f"(stopped, hung or dead? {len(open_ranks)} model ranks still open; the limit "
                f"is ioserver.timeout_s = {self.cfg.timeout_s:g} s without any message)")

    def _starts_entry(self, src: int, msg: np.ndarray) -> bool:
        """Whether a message is a FIELD part of a (field, step) not held yet."""
        try:
            header, _ = decode(msg)
        except ProtocolError:
            return False  # reported when handled
        return (src in self.domains and header.kind == Kind.FIELD
                and (header.name, header.step) not in self.pending)

    def _waiting_for(self) -> list[int]:
        """The ranks the oldest incomplete (field, step) still needs."""
        if len(self.defined) < len(self.clients):
            return sorted(set(self.clients) - self.defined)
        if not self.pending:
            return []
        (fid, step) = min(self.pending, key=lambda k: k[1])
        missing = sorted(self._needed(fid) - self.pending[(fid, step)].got)
        gone = [r for r in missing if r in self.closed or self.steps[r] > step]
        if gone:  # it will never come: waiting for it would hang the run
            raise ServerAbort(f"field {fid!r} step {step}: model ranks {gone} went on to a "
                              "later step without sending their part")
        return missing

    # ------------------------------------------------------------------ messages
    def _handle(self, src: int, msg: np.ndarray) -> None:
        if src not in self.domains:  # another server: it is ending the run
            try:
                reason = bytes(decode(msg)[1]).decode(errors="replace")
            except ProtocolError:
                reason = f"server rank {src} sent a bad message"
            raise ServerAbort(reason)
        try:
            header, payload = decode(msg)
        except ProtocolError as exc:
            self._fail(src, f"model rank {src}: {exc}")
        if src in self.closed:
            self._fail(src, f"model rank {src}: {header.kind.name} message after CLOSE")
        handler = {Kind.DOMAIN: self._on_domain, Kind.DEFINED: self._on_defined,
                   Kind.FIELD: self._on_field, Kind.STEP: self._on_step,
                   Kind.CLOSE: self._on_close, Kind.ABORT: self._on_abort,
                   Kind.RESTART_BEGIN: self._on_restart, Kind.RESTART_PART: self._on_restart,
                   Kind.RESTART_END: self._on_restart}[header.kind]
        handler(src, header, payload)

    def _on_restart(self, src: int, header: Header, payload: np.ndarray) -> None:
        """A restart message: to the assembler (it writes the file when every rank ended)."""
        try:
            if header.kind == Kind.RESTART_BEGIN:
                meta = RestartMeta.from_json(json.loads(bytes(payload)))
                try:
                    self.restarts.begin(meta)
                except (RestartError, OSError) as exc:
                    raise RestartError(f"model rank {src}: restart {meta.path}: {exc}") from None
            elif header.kind == Kind.RESTART_PART:
                start, block = split_restart_part(header, payload)
                self.restarts.part(header.a[0], header.name, start, block, src)
            else:
                self.restarts.end(header.a[0], src)
            self.hwm = max(self.hwm, self.held + self.restarts.nbytes
                           + (self.sink.nbytes if self.sink is not None else 0))
        except (RestartError, ProtocolError, ValueError, KeyError, OSError) as exc:
            text = str(exc)
            if not text.startswith("model rank"):
                text = f"model rank {src}: restart: {type(exc).__name__}: {text}"
            self._fail(src, text)

    def _on_abort(self, src: int, header: Header, payload: np.ndarray) -> None:
        """A model rank failed: keep serving the others until the steps before its
        current one are complete (or nothing arrives for ``DRAIN_SECONDS``), so the
        files end with every complete step; then the run ends with its reason."""
        text = bytes(payload).decode(errors="replace").strip()
        self.failures.append(text if text.startswith("model rank") else
                             f"model rank {src} failed: {text}")
        self.aborted.add(src)
        self.closed[src] = self.steps[src] - 1  # its step stays: caps every advance
        if self.drain_end is None:
            self.drain_end = time.monotonic() + DRAIN_SECONDS

    def _drained(self) -> bool:
        """Every step before the first failed rank's current step has fully arrived."""
        if any(r not in self.defined for r in self.aborted):
            return True  # failed during the definitions: no file can be written
        if self.sink is None:
            return False  # another rank's DEFINED is still on its way
        first = min(self.steps[r] for r in self.aborted)
        return all(c in self.closed or self.steps[c] >= first for c in self.clients)

    def _message_before(self, deadline: float | None) -> bool:
        """Poll for a message until ``deadline``; False when none came (a hung model)."""
        while not self.iocomm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_MSG):
            if self.stash:
                return True
            if deadline is None or time.monotonic() > deadline:
                return False
            time.sleep(1e-3)  # a failed run, bounded by the deadline: no busy spin
        return True

    def _on_domain(self, src: int, header: Header, payload: np.ndarray) -> None:
        d = self.cfg.domains.get(header.name)
        if d is None:
            self._fail(src, f"model rank {src}: unknown domain {header.name!r}")
        if src in self.defined or d.id in self.domains[src]:
            self._fail(src, f"model rank {src}: domain {header.name!r} declared twice or "
                            "after DEFINED")
        try:
            self.domains[src][d.id] = domain_from_message(d, header.a, payload)
        except ValueError as exc:
            self._fail(src, f"model rank {src}: {exc}")

    def _on_defined(self, src: int, header: Header, payload: np.ndarray) -> None:
        if header.a[0] != len(self.domains[src]):
            self._fail(src, f"model rank {src}: DEFINED says {header.a[0]} domains, "
                            f"{len(self.domains[src])} arrived")
        self.defined.add(src)
        if len(self.defined) == len(self.clients):
            self.sink = self.sink_factory(self.cfg, self.files, self.geometry(),
                                          self.out_dir, self.history)
            for key in sorted(self.pending, key=lambda k: k[1]):
                self._maybe_complete(key)

    def _on_field(self, src: int, header: Header, payload: np.ndarray) -> None:
        fid, step = header.name, header.step
        fd = self.cfg.fields.get(fid)
        if fd is None or not fd.is_source:
            what = "unknown field" if fd is None else "field computed on the servers (not a source)"
            self._fail(src, f"model rank {src}: {what} {fid!r} (step {step})")
        if fid not in self.fields:
            self._fail(src, f"model rank {src}: field {fid!r} is not sent to server rank "
                            f"{self.iocomm.rank} (no file of it needs the field)")
        if src not in self.defined:
            self._fail(src, f"model rank {src}: field {fid!r} before its DEFINED message")
        grid = self.cfg.grids[fd.grid]
        ld = self.domains[src].get(grid.domain)
        levels = self.cfg.axes[grid.axis].n if grid.axis else 1
        expect = (ld.part.size if ld is not None else 0) * levels
        if header.count != expect:
            self._fail(src, f"model rank {src}: field {fid!r} step {step}: part of "
                            f"{header.count} values, expected {expect} (its part of domain "
                            f"{grid.domain!r} x {levels} levels)")
        if step != self.steps[src]:
            self._fail(src, f"model rank {src}: field {fid!r} for step {step} during its "
                            f"step {self.steps[src]}")
        key = (fid, step)
        if key in self.done:
            self._fail(src, f"model rank {src}: field {fid!r} sent twice at step {step}")
        self.seen.add(fid)
        entry = self.pending.get(key)
        if entry is None:
            entry = _Pending(np.full(self.cfg.field_shape(fid), np.nan))
            self.pending[key] = entry
            self.held += entry.data.nbytes
            self.hwm = max(self.hwm, self.held)
        if src in entry.got:
            self._fail(src, f"model rank {src}: field {fid!r} sent twice at step {step}")
        entry.got.add(src)
        if expect:
            place(entry.data, self.cfg.domains[grid.domain], ld.part, payload)
        self._maybe_complete(key)

    def _on_step(self, src: int, header: Header, payload: np.ndarray) -> None:
        if header.step <= self.steps[src]:
            self._fail(src, f"model rank {src}: step {header.step} after step {self.steps[src]}")
        self.steps[src] = header.step
        self._advance_to(min(self.steps.values()) - 1)

    def _on_close(self, src: int, header: Header, payload: np.ndarray) -> None:
        self.closed[src] = header.step
        self.steps[src] = header.step + 1  # everything of its last step arrived
        self._advance_to(min(self.steps.values()) - 1)

    # ------------------------------------------------------------------ assembly
    def _needed(self, fid: str) -> set[int]:
        domain = self.cfg.grids[self.cfg.fields[fid].grid].domain
        return {c for c in self.clients
                if (ld := self.domains[c].get(domain)) is not None and ld.part.size > 0}

    def _maybe_complete(self, key: tuple[str, int]) -> None:
        if self.sink is None:
            return
        entry = self.pending[key]
        if self._needed(key[0]) <= entry.got:
            del self.pending[key]
            self.done.add(key)
            self.held -= entry.data.nbytes
            self.sink.push(key[0], key[1], entry.data)
            self.hwm = max(self.hwm, self.held + self.sink.nbytes)

    def _advance_to(self, step: int) -> None:
        if step <= self.advanced or self.sink is None:
            return
        late = sorted(k for k in self.pending if k[1] <= step)
        if late:
            fid, s = late[0]
            missing = sorted(self._needed(fid) - self.pending[late[0]].got)
            raise ServerAbort(f"field {fid!r} step {s}: model ranks {missing} went on to a "
                              "later step without sending their part")
        self.sink.advance(step)
        self.advanced = step
        self.done = {k for k in self.done if k[1] > step}

    def _sink(self) -> Sink:
        if self.sink is None:
            raise ServerAbort("every client closed before all of them sent DEFINED")
        return self.sink

    def geometry(self) -> dict[str, DomainGeometry]:
        """Global geometry of every domain the clients declared or this server's files use."""
        used = {self.cfg.grids[fd.grid].domain for f in self.cfg.files if f.id in self.files
                for fd in f.fields}
        out: dict[str, DomainGeometry] = {}
        for did, d in self.cfg.domains.items():
            parts = [self.domains[c][did] for c in self.clients if did in self.domains[c]]
            if not parts and did not in used:
                continue
            wrong = extent_mismatch(d, [p.part for p in parts])
            if wrong is not None:
                raise ServerAbort(wrong)
            try:
                out[did] = domain_geometry(self.cfg, did, assemble_geometry(d, parts))
            except ValueError as exc:
                if did in used:
                    raise ServerAbort(str(exc)) from None
        return out

    # ------------------------------------------------------------------ failures
    def _fail(self, client: int, reason: str) -> None:
        """Send ``reason`` to the client at fault (tag 7704), then end the run."""
        text = bytearray(reason.encode())
        self.error_sends.append(self.iocomm.Isend([text, MPI.CHAR], dest=client, tag=TAG_ERROR))
        raise ServerAbort(reason)

    def unsent(self) -> list[str]:
        """Source fields due by the last step (run ended normally) that never came."""
        return never_sent(self.fields, self.seen, self.periods, self.last_step)

    def close_files(self) -> None:
        """Abort path: close the pipeline's files (every complete record is in them)."""
        sink, self.sink = self.sink, None
        if sink is not None:  # shared files are abandoned, not closed collectively
            getattr(sink, "abort", sink.close)()


def geometry_of(cfg: IOServerConfig, parts: Mapping[str, Sequence[LocalDomain]]
                ) -> dict[str, DomainGeometry]:
    """Global geometry per domain from every rank's declarations (attached/sync modes)."""
    out = {}
    for did, d in cfg.domains.items():
        wrong = extent_mismatch(d, [p.part for p in parts.get(did, ())])
        if wrong is not None:
            raise IOServerError(wrong)
        try:
            out[did] = domain_geometry(cfg, did, assemble_geometry(d, parts.get(did, ())))
        except ValueError:
            continue  # a domain no rank declared and no lon/lat: the writer reports it if used
    return out
