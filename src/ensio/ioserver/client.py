"""The model side: :class:`Client` (one API for the three modes) and the server-mode link.

A model rank declares its part of each domain, closes the definition, then
per step calls ``update_timestep`` and ``send``. The client checks every call
locally (field id, shape, dtype, call order) so a mistake is reported on the
rank that made it, naming field and rank. What happens to the data depends on
the mode, behind the :class:`Transport` interface: :class:`ServerLink` (this
module) copies it into a bounded buffer of outstanding ``Isend``\\ s to the
server ranks; :mod:`.attached` and :mod:`.sync` post-process on the model ranks.
"""

from __future__ import annotations

import abc
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from ..parallel.abort import abort_job
from .config import IOServerConfig
from .parts import LocalDomain, domain_message, local_shape, make_local_domain
from .protocol import (
    DRAIN_SECONDS,
    HEADER_BYTES,
    TAG_ERROR,
    TAG_MSG,
    TAG_REPORT,
    FieldTable,
    Header,
    IOServerError,
    Kind,
    encode,
    restart_part,
)
from .report import Report, with_server_text

__all__ = ["Client", "Transport", "ServerLink", "recv_text"]


class Transport(abc.ABC):
    """Where a client's validated calls go (server link, attached or sync pipeline)."""

    #: field id -> step periods at which some file needs it (``()`` = never).
    periods: Mapping[str, tuple[int, ...]]

    @abc.abstractmethod
    def define(self, domains: Mapping[str, LocalDomain]) -> None:
        """The rank's declared domains (collective over the model ranks)."""

    @abc.abstractmethod
    def step(self, step: int) -> None:
        """The rank starts ``step``: everything of the steps before it was sent."""

    @abc.abstractmethod
    def send(self, field_id: str, step: int, data: np.ndarray) -> None:
        """A checked local part (float32/float64, the part's shape) of an active field."""

    @abc.abstractmethod
    def close(self, last_step: int) -> Report:
        """Last call: flush, wait for the files, the report."""

    @abc.abstractmethod
    def abort(self, reason: str) -> None:
        """The model failed: tell whoever writes files, without waiting for them."""

    def restart(self, meta: Any, blocks: Sequence[tuple[str, tuple[int, ...], np.ndarray]]
                ) -> None:
        """This rank's blocks of restart ``meta`` (a :class:`~.restart.RestartMeta`)."""
        raise IOServerError(f"{type(self).__name__} cannot write restarts")


def server_lost(server: int, rank: int, first: bool, seconds: float, what: str) -> NoReturn:
    """A server did not answer for ``seconds``: one line, and the job ends (as the C client).

    Every waiting model rank gets here; the first model rank speaks at once, the
    others give it a grace period (they may have noticed first), then speak
    themselves: one line in the normal case, never a hang.
    """
    if not first:
        time.sleep(min(seconds, 10.0))
    print(f"ensio ioclient: error: model rank {rank}: ioserver rank {server} did not answer "
          f"for {seconds:g} s ({what}; stopped or hung? the limit is ioserver.timeout_s)",
          file=sys.stderr, flush=True)
    abort_job(MPI.COMM_WORLD, 2)


def recv_text(comm: MPI.Comm, source: int, tag: int,
              deadline: tuple[float, int, bool, str] | None = None) -> tuple[str, int]:
    """Receive one ``MPI_CHAR`` text message; (text, its source).

    ``deadline`` = (seconds, this world rank, is the first model rank, what is
    awaited): a server silent that long ends the job (:func:`server_lost`).
    """
    status = MPI.Status()
    if deadline is None:
        comm.Probe(source=source, tag=tag, status=status)
    else:
        start = time.monotonic()
        while not comm.Iprobe(source=source, tag=tag, status=status):
            if time.monotonic() - start > deadline[0]:
                server_lost(source, deadline[1], deadline[2], deadline[0], deadline[3])
            time.sleep(1e-4)
    buf = bytearray(status.Get_count(MPI.CHAR))
    comm.Recv([buf, MPI.CHAR], source=status.Get_source(), tag=tag)
    return buf.decode(errors="replace"), status.Get_source()


class ServerLink(Transport):
    """Server mode: messages to the server ranks through a bounded buffer.

    ``send`` copies the part into one message (header + payload) and posts an
    ``Isend`` to each server the field table lists. Completed sends are
    reclaimed with ``Testsome``; only when the outstanding bytes would exceed
    ``buffer_bytes`` does the rank block (``Waitany``), and that time is the
    ``blocked_seconds`` of the report. A message larger than the whole buffer
    is sent once the buffer is empty.
    """

    def __init__(self, iocomm: MPI.Comm, table: FieldTable, servers: tuple[int, ...],
                 buffer_bytes: int, rank: int) -> None:
        self.iocomm = iocomm
        self.table = table
        self.servers = servers
        self.periods = {f: (e.periods if e.servers else ()) for f, e in table.fields.items()}
        self._limit = buffer_bytes
        self._rank = rank
        self._reqs: list[MPI.Request] = []
        self._owner: list[int] = []
        self._dest: list[int] = []  # server of each request (named when it stays silent)
        self._first = rank == min(set(range(iocomm.size)) - set(servers))
        self._held: dict[int, list[int]] = {}  # message id -> [open requests, bytes]
        self._next = 0
        self._bytes = 0
        self.blocked = 0.0
        self.bytes_sent = 0
        self.messages = 0

    # -- buffer
    def _drop(self, done: list[int]) -> None:
        for i in sorted(done, reverse=True):
            owner = self._owner.pop(i)
            self._reqs.pop(i)
            self._dest.pop(i)
            held = self._held[owner]
            held[0] -= 1
            if held[0] == 0:
                self._bytes -= held[1]
                del self._held[owner]

    def _reclaim(self, block: bool) -> None:
        if not self._reqs:
            return
        if block:
            t = time.perf_counter()
            idx, done = MPI.Request.Testany(self._reqs)
            while not done:
                if time.perf_counter() - t > self.table.timeout_s:
                    server_lost(self._dest[0], self._rank, self._first, self.table.timeout_s,
                                "a send stays pending")
                time.sleep(1e-4)
                idx, done = MPI.Request.Testany(self._reqs)
            self.blocked += time.perf_counter() - t
            self._drop([idx])
        done = MPI.Request.Testsome(self._reqs) if self._reqs else None
        if done:
            self._drop(list(done))

    def _post(self, msg: np.ndarray, dests: tuple[int, ...]) -> None:
        self.check_errors()
        self._reclaim(block=False)
        while self._reqs and self._bytes + msg.nbytes > self._limit:
            self._reclaim(block=True)
            self.check_errors()
        ident = self._next
        self._next += 1
        self._held[ident] = [len(dests), msg.nbytes]
        self._bytes += msg.nbytes
        close = int(msg[:HEADER_BYTES].view(np.int64)[1]) == Kind.CLOSE
        for d in dests:  # CLOSE synchronously: its completion proves that server took it
            send = self.iocomm.Issend if close else self.iocomm.Isend
            self._reqs.append(send([msg, MPI.BYTE], dest=d, tag=TAG_MSG))
            self._owner.append(ident)
            self._dest.append(d)
        self.bytes_sent += msg.nbytes * len(dests)
        self.messages += len(dests)

    def check_errors(self) -> None:
        """Raise a server's verdict (tag 7704) if one arrived."""
        if self.iocomm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_ERROR):
            text, src = recv_text(self.iocomm, MPI.ANY_SOURCE, TAG_ERROR)
            raise IOServerError(f"{text} (from server rank {src})")

    # -- transport
    def define(self, domains: Mapping[str, LocalDomain]) -> None:
        for did, ld in domains.items():
            a, payload = domain_message(ld)
            self._post(encode(Header(Kind.DOMAIN, a=a, name=did), payload), self.servers)
        self._post(encode(Header(Kind.DEFINED, a=(len(domains),))), self.servers)

    def step(self, step: int) -> None:
        self._post(encode(Header(Kind.STEP, step=step)), self.servers)

    def send(self, field_id: str, step: int, data: np.ndarray) -> None:
        dests = self.table.fields[field_id].servers
        self._post(encode(Header(Kind.FIELD, step=step, name=field_id), data), dests)

    def restart(self, meta: Any, blocks: Sequence[tuple[str, tuple[int, ...], np.ndarray]]
                ) -> None:
        """BEGIN, the non-empty PARTs, END to ``servers[rid % S]`` through the buffer."""
        owner = (self.servers[meta.rid % len(self.servers)],)
        self._post(encode(Header(Kind.RESTART_BEGIN, a=(meta.rid,)),
                          json.dumps(meta.to_json())), owner)
        sent = 0
        for name, start, block in blocks:
            if block.size:
                self._post(restart_part(meta.rid, name, start, block), owner)
                sent += 1
        self._post(encode(Header(Kind.RESTART_END, a=(meta.rid, sent))), owner)

    def close(self, last_step: int) -> Report:
        t, before = time.perf_counter(), self.blocked
        n = len(self.servers)  # the counters include the CLOSE messages (as the C client's)
        a = (int(self.blocked * 1e9), self.bytes_sent + n * HEADER_BYTES, self.messages + n)
        self._post(encode(Header(Kind.CLOSE, step=last_step, a=a)), self.servers)
        while self._reqs:
            self._reclaim(block=True)
            self.check_errors()
        self.blocked = before + time.perf_counter() - t  # the whole flush, counted once
        status = MPI.Status()
        while True:  # the report, unless a server's verdict comes first
            # twice the limit: the servers may wait that long for a silent model rank
            recv_wait = time.monotonic()
            while not self.iocomm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
                if time.monotonic() - recv_wait > 2 * self.table.timeout_s:
                    server_lost(self.servers[0], self._rank, self._first,
                                2 * self.table.timeout_s, "no report after this rank closed")
                time.sleep(1e-4)
            if status.Get_tag() == TAG_ERROR:
                self.check_errors()
            elif status.Get_tag() == TAG_REPORT:
                text, _ = recv_text(self.iocomm, status.Get_source(), TAG_REPORT)
                break
            else:  # nothing else is sent to a client; drop it rather than spin
                recv_text(self.iocomm, status.Get_source(), status.Get_tag())
        self.iocomm.Free()  # nothing is pending on it any more (the C client does the same)
        own = Report(blocked_seconds=self.blocked, bytes_sent=self.bytes_sent,
                     messages=self.messages)
        return with_server_text(own, text)

    def abort(self, reason: str) -> None:
        """Send ABORT, then wait for the servers' verdict (they drain and close files).

        Returning at once would let this process exit non-zero, and ``mpiexec``
        then kills the servers before they have written the complete steps. The
        sends still in the buffer keep progressing meanwhile (the servers drain
        them). Bounded: the servers end the job within ``DRAIN_SECONDS``.
        """
        msg = encode(Header(Kind.ABORT), reason.encode()[:4096])
        reqs = [self.iocomm.Isend([msg, MPI.BYTE], dest=d, tag=TAG_MSG) for d in self.servers]
        deadline = time.monotonic() + DRAIN_SECONDS + 30.0
        while time.monotonic() < deadline:
            MPI.Request.Testall(reqs + self._reqs)
            if self.iocomm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_ERROR):
                recv_text(self.iocomm, MPI.ANY_SOURCE, TAG_ERROR)
                return
            time.sleep(0.001)  # a failed run waiting for the servers' verdict


class Client:
    """A model rank's handle on the I/O server (any mode); see :func:`ensio.ioserver.start`.

    Attributes
    ----------
    comm : MPI.Comm
        The model ranks' communicator (the world without the server ranks):
        use it, not the world, for the model's own communication.
    rank : int
        This rank's world rank (named in every error).
    """

    def __init__(self, cfg: IOServerConfig, comm: MPI.Comm, rank: int,
                 transport: Transport) -> None:
        self.cfg = cfg
        self.comm = comm
        self.rank = rank
        self.transport = transport
        self._domains: dict[str, LocalDomain] = {}
        self._defined = False
        self._closed = False
        self._step = 0
        self._restarts = 0

    def _error(self, text: str) -> IOServerError:
        return IOServerError(f"model rank {self.rank}: {text}")

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise self._error(f"{call}() after close()")

    def set_domain(self, domain_id: str, *, ibegin: int, ni: int, jbegin: int = 0,
                   nj: int = 1, lon: Any = None, lat: Any = None, lon_bounds: Any = None,
                   lat_bounds: Any = None, mask: Any = None, area: Any = None) -> None:
        """Declare this rank's part ``[jbegin:jbegin+nj, ibegin:ibegin+ni]`` of a domain.

        ``mask`` (True = valid) marks points that are missing in every field on
        the domain; ``area`` (m^2) weights the global and zonal means. A rank
        that declares nothing for a domain has an empty part of it.
        """
        self._check_open("set_domain")
        if self._defined:
            raise self._error(f"set_domain({domain_id!r}) after close_definition()")
        d = self.cfg.domains.get(domain_id)
        if d is None:
            raise self._error(f"unknown domain {domain_id!r} (known: {sorted(self.cfg.domains)})")
        try:
            self._domains[domain_id] = make_local_domain(
                d, ibegin, ni, jbegin, nj, lon=lon, lat=lat, lon_bounds=lon_bounds,
                lat_bounds=lat_bounds, mask=mask, area=area)
        except ValueError as exc:
            raise self._error(str(exc)) from None

    def close_definition(self) -> None:
        """End of the declarations (collective over ``comm``)."""
        if self._defined:
            raise self._error("close_definition() called twice")
        self._defined = True
        self.transport.define(self._domains)

    def update_timestep(self, step: int) -> None:
        """Start ``step`` (1, 2, ...): everything of the earlier steps has been sent."""
        self._check_open("update_timestep")
        if not self._defined:
            raise self._error("update_timestep() before close_definition()")
        if step <= self._step:
            raise self._error(f"update_timestep({step}) after step {self._step}: steps increase")
        self._step = step
        self.transport.step(step)

    def is_active(self, field_id: str, step: int | None = None) -> bool:
        """Whether some file needs ``field_id`` at ``step`` (default: the current step)."""
        periods = self.transport.periods.get(field_id)
        if periods is None:
            self._check_source(field_id)
            return False
        s = self._step if step is None else step
        if s < 1:
            raise self._error(f"is_active({field_id!r}) needs a step >= 1 "
                              "(call update_timestep first, or pass step)")
        return any(s % p == 0 for p in periods)

    def _check_source(self, field_id: str) -> None:
        fd = self.cfg.fields.get(field_id)
        if fd is None:
            known = ", ".join(self.cfg.sources)
            raise self._error(f"unknown field {field_id!r} (sources: {known})")
        if not fd.is_source:
            raise self._error(f"field {field_id!r} is computed on the servers "
                              "(it has expr or field_ref): the model cannot send it")

    def expected_shape(self, field_id: str) -> tuple[int, ...]:
        """Shape of this rank's part of a source field."""
        grid = self.cfg.grids[self.cfg.fields[field_id].grid]
        d = self.cfg.domains[grid.domain]
        ld = self._domains.get(grid.domain)
        levels = self.cfg.axes[grid.axis].n if grid.axis else None
        return local_shape(d, None if ld is None else ld.part, levels)

    def send(self, field_id: str, data: Any) -> None:
        """Send this rank's part of ``field_id`` for the current step (copied at once).

        A send at a step no file needs is skipped (see :meth:`is_active`).
        """
        self._check_open("send")
        self._check_source(field_id)
        if self._step == 0:
            raise self._error(f"send({field_id!r}) before the first update_timestep()")
        arr = np.asarray(data)
        if arr.dtype.kind != "f" or arr.dtype.itemsize not in (4, 8):
            raise self._error(f"field {field_id!r} has dtype {arr.dtype}, "
                              "expected float32 or float64")
        shape = self.expected_shape(field_id)
        if arr.shape != shape and not (arr.ndim == 1 and arr.size == int(np.prod(shape))):
            raise self._error(f"field {field_id!r} has shape {arr.shape}, expected {shape} "
                              "(this rank's part)")
        if self.is_active(field_id):
            self.transport.send(field_id, self._step, arr.reshape(shape))

    def write_restart(self, path: str | Path,
                      variables: Mapping[str, tuple[Sequence[int], Any]],
                      template: str | Path, *, rid: int | None = None) -> None:
        """Hand this rank's blocks of a restart file to the writers and go on (seed 003).

        Collective over the model ranks: every rank calls it for each restart,
        in the same order, with the same ``path``, ``template`` and variable
        names (a rank without a part of a variable passes an empty block).
        ``variables`` maps a variable of ``template`` to ``(start, block)``:
        the block's global start index per dimension and its values, in any
        decomposition (the writer remaps). The file is a copy of ``template`` with the variables
        replaced, renamed into place when whole. Server mode: the blocks are
        copied into the bounded send buffer (like :meth:`send`), the server
        ``servers[rid % S]`` writes; attached/sync: model rank 0 writes now.
        ``rid`` numbers the restarts of the run (default: 0, 1, 2, ... per call).
        """
        from .restart import RestartMeta

        self._check_open("write_restart")
        rid = self._restarts if rid is None else int(rid)
        self._restarts = max(self._restarts, rid + 1)
        blocks = []
        for name, (start, data) in variables.items():
            arr = np.asarray(data)
            start = tuple(int(s) for s in start)
            if arr.dtype.kind not in "fiub":
                raise self._error(f"restart {path}: {name!r} has dtype {arr.dtype}")
            if len(start) != arr.ndim:
                raise self._error(f"restart {path}: {name!r} start {start} has "
                                  f"{len(start)} indices for a {arr.ndim}-d block")
            blocks.append((name, start, arr))
        meta = RestartMeta(rid, str(Path(path).absolute()), str(Path(template).absolute()),
                           tuple(sorted(variables)))
        self.transport.restart(meta, blocks)

    def read_restart(self, path: str | Path,
                     variables: Mapping[str, tuple[Sequence[int], Sequence[int]]]
                     ) -> dict[str, np.ndarray]:
        """This rank's blocks of a restart file, in any decomposition (any mode).

        ``variables`` maps a variable to ``(start, shape)``: the box of the
        global array this rank needs; returns ``{variable: block}`` with the
        values as stored (bitwise what :meth:`write_restart` wrote, whatever
        decomposition wrote it). Each rank reads its boxes directly (not
        collective). A restart written in this run is on disk once
        :meth:`close` returned (server mode) or at once (attached, sync).
        """
        from .restart import RestartError, read_restart_blocks

        self._check_open("read_restart")
        try:
            return read_restart_blocks(path, variables)
        except RestartError as exc:
            raise self._error(str(exc)) from None

    def close(self) -> Report:
        """Flush, wait until the files are closed (collective), return the :class:`Report`."""
        if self._closed:
            raise self._error("close() called twice")
        if not self._defined:
            self.close_definition()
        self._closed = True
        return self.transport.close(self._step)

    def abort(self, reason: str) -> None:
        """Tell the writers this rank failed; they close the files and end the job."""
        if not self._closed:
            self._closed = True
            self.transport.abort(f"model rank {self.rank} failed: {reason}")

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self.abort(f"{exc_type.__name__}: {exc}".splitlines()[0])
