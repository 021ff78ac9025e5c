"""How a server rank's run ends, in agreement with the other servers.

:func:`serve` runs one :class:`~.server.ServerCore` to its end. Ending is a job of
its own because it is collective over the servers (``srvcomm``) while the core
only ever talks to the clients: on a failure anywhere (a bad message, a client's
ABORT, an error in the pipeline), every server closes its files (valid, with
every complete record) and tells the others, the client at fault and the failed
clients get a tag-7704 error, the lowest failed server prints
``ensio ioserver: <reason>`` and the job ends with ``MPI_Abort`` — never a hang.
On a normal end the first server gathers the summaries and sends the combined
report to every client.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from ..parallel.abort import abort_job
from .config import IOServerConfig
from .mismatch import unsent_warning
from .pipeline import SinkFactory
from .protocol import TAG_ERROR, TAG_MSG, TAG_REPORT, Header, Kind, encode
from .report import combine_servers, server_text
from .server import ServerAbort, ServerCore

__all__ = ["serve"]


def _stop_for(core: ServerCore, servers: Sequence[int], reason: str) -> list[MPI.Request]:
    """A failure here: tell the other servers (they may be in their loop), close the files."""
    iocomm = core.iocomm
    msg = encode(Header(Kind.ABORT), reason.encode()[:4096])
    reqs = [iocomm.Isend([msg, MPI.BYTE], dest=r, tag=TAG_MSG)
            for r in servers if r != iocomm.rank]
    try:
        core.close_files()
    except Exception as exc:  # the job ends anyway; say so
        print(f"ensio ioserver: closing files failed: {exc}", file=sys.stderr, flush=True)
    return reqs + core.error_sends


def _first_failed(srvcomm: MPI.Comm, failed: bool) -> int | None:
    """Collective over the servers, once each at its end: the lowest failed server rank.

    A server that ended normally waits for the others (they end too: every
    client sent CLOSE to every server, or a failing server sent ABORT); one
    that failed waits at most a minute, then ends the job anyway.
    """
    mine = np.array([srvcomm.rank if failed else srvcomm.size], dtype=np.intc)
    lowest = np.empty(1, dtype=np.intc)
    req = srvcomm.Iallreduce([mine, MPI.INT], [lowest, MPI.INT], op=MPI.MIN)
    if failed:
        _wait_all([req], 60.0)
        if not MPI.Request.Testall([req]):
            return srvcomm.rank  # someone is stuck: speak for the job
    else:
        req.Wait()
    return None if int(lowest[0]) == srvcomm.size else int(lowest[0])


def _wait_all(reqs: list[MPI.Request], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while reqs and not MPI.Request.Testall(reqs) and time.monotonic() < deadline:
        time.sleep(0.001)


def serve(cfg: IOServerConfig, iocomm: MPI.Comm, srvcomm: MPI.Comm, servers: Sequence[int],
          clients: Sequence[int], files: Sequence[str], fields: set[str],
          sink_factory: SinkFactory, out_dir: Path, history: str, *,
          periods: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """Run one server rank to the end; the combined report (first server) or ``{}``.

    On any failure, on any server, the job ends here: every server closes its
    files, the lowest failed one prints ``ensio ioserver: <reason>`` and all
    call ``MPI_Abort`` (exit status 2). After a normal end the first server warns,
    one line each, about source fields the model never sent (naming the outputs
    that are therefore all fill).
    """
    core = ServerCore(cfg, iocomm, clients, files, fields, sink_factory, out_dir, history,
                      periods=periods)
    reason = None
    try:
        summary = core.run()
    except ServerAbort as exc:
        reason = str(exc)
    except Exception as exc:  # a bug or an I/O error in the pipeline: same clean ending
        reason = f"server rank {iocomm.rank} failed: {type(exc).__name__}: {exc}"
    if reason is not None and core.restarts.incomplete and "incomplete" not in reason:
        reason += f" (restarts not written: {', '.join(core.restarts.incomplete)})"
    pending = _stop_for(core, servers, reason) if reason is not None else []
    if reason is not None:  # the files are closed: release the failed ranks (Client.abort)
        verdict = bytearray(f"files closed; the run ends: {reason}".encode())
        pending += [iocomm.Isend([verdict, MPI.CHAR], dest=c, tag=TAG_ERROR)
                    for c in sorted(core.aborted)]
    first = _first_failed(srvcomm, reason is not None)
    if first is not None:
        if first == srvcomm.rank:
            print(f"ensio ioserver: {reason}", file=sys.stderr, flush=True)
        _wait_all([srvcomm.Ibarrier()], 10.0)  # the line is out before anyone aborts
        _wait_all(pending, 2.0)
        abort_job(iocomm, 2)
    summaries = srvcomm.gather(summary, root=0)
    unsent = srvcomm.gather(core.unsent(), root=0)
    if srvcomm.rank != 0:
        return {}
    for fid in sorted(set().union(*unsent)):
        print(unsent_warning(cfg, fid), file=sys.stderr, flush=True)
    combined = combine_servers(summaries)
    text = bytearray(server_text(combined).encode())
    reqs = [iocomm.Isend([text, MPI.CHAR], dest=c, tag=TAG_REPORT) for c in clients]
    MPI.Request.Waitall(reqs)
    return combined
