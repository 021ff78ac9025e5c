"""The consumer host's side of a stream: one file arriving from another host.

Each incoming ``FILE`` becomes a held file of the local :class:`~.table.Table`, written
by a remote "peer" (:mod:`.network` accepts the connection and proves the secret, then
hands each ``FILE`` frame here, one after the other on a kept connection, :mod:`.kept`).
Consumers here open it as any local file, wait while it streams, and get EIO if the
stream breaks off; from ``SIZE`` on, readers of ``serve_partial`` connections may read
what has arrived (:mod:`.progress`).
"""

from __future__ import annotations

import errno
import logging
import os
import socket

from .names import Names, origin_key
from .progress import STREAMING, Progress
from .protocol import Message
from .sink import Sink
from .table import Peer, Table
from .wire import recv_frame, send_frame

__all__ = ["parse_ranges", "receive_file"]


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """``off+len,off+len`` (the interposer's reports) → [(off, len)]."""
    out = []
    for item in filter(None, text.split(",")):
        off, _, n = item.partition("+")
        out.append((int(off), int(n)))
    return out


def receive_file(table: Table, names: Names, log: logging.Logger, conn: socket.socket,
                 peer: Peer, host: str, m: Message, origin: tuple[str, str]) -> bool:
    """One file after its ``FILE`` frame ``m``: ``DATA``…, ``SIZE``, ``DATA``…, ``DONE``
    (see :mod:`.wire`); True if it is held here, complete, at the end.

    Refused (``ERR errno=ENOTCONN``) unless a control connection from ``origin`` is
    open: a copy is served only while its host can tell us of renames (:mod:`.names`).

    From ``SIZE`` on the file has its final size and a progress map
    (:mod:`.progress`): consumers of ``serve_partial`` connections may read the
    bytes already final. The map ends complete or failed whatever happens here.
    """
    path = m.get("path")
    peer = Peer(id=peer.id, component=f"{m.get('component', '?')}@{host}", pid=0)
    wfd, sink, progress, ok = -1, None, None, False
    try:  # the table supplies the memory (pre-faulted from the pool when it can)
        if not names.live(origin):
            log.error("%s: refused from host %s: no control connection from it", path, host)
            send_frame(conn, "ERR", errno=errno.ENOTCONN)
            return False
        reply = table.create(peer, path, None, conn=m.get("conn"), budget=-1,
                             fallback="files", persist=False,
                             mode=int(m.get("mode", "644"), 8), excl=False,
                             keep=False, origin=origin_key(origin))
        if reply.verb != "OK" or reply.fd is None:
            send_frame(conn, reply.verb, **reply.fields)
            return False
        wfd = reply.fd
        send_frame(conn, "OK")
        entry_id = int(str(reply.fields["id"]))
        sink = Sink(conn, wfd)
        while (m := recv_frame(conn)) is not None:
            if m.verb == "DATA":
                if not sink.receive(m.int("off"), m.int("len")):
                    break
            elif m.verb == "SIZE" and progress is None:
                os.ftruncate(wfd, m.int("size"))
                progress = Progress(os.path.basename(path), m.int("size"),
                                    parse_ranges(m.get("r")))
                sink.progress = progress
                table.set_progress(entry_id, progress)
            elif m.verb == "DONE":
                os.ftruncate(wfd, m.int("size"))
                os.close(wfd)
                wfd = -1
                done = table.complete(peer, entry_id)
                ok = done.verb == "OK"
                if progress is not None:
                    progress.finish(ok)
                send_frame(conn, done.verb, **done.fields)
                return ok
            else:
                break
        log.error("%s: the stream from host %s broke off before the file was complete",
                  path, host)
    except OSError as exc:
        log.error("%s: the stream from host %s failed: %s", path, host, exc.strerror or exc)
    finally:
        if wfd >= 0:
            os.close(wfd)
        if sink is not None:
            sink.close()
        if progress is not None:
            _end_progress(table, log, entry_id, progress, ok, path, peer)
    return False


def _end_progress(table: Table, log: logging.Logger, entry_id: int, progress: Progress,
                  ok: bool, path: str, peer: Peer) -> None:
    """The stream is over: partial readers see complete or failed, never a hang."""
    if not ok and progress.state == STREAMING:
        log.error("%s: partial readers get EIO for the bytes that did not arrive "
                  "(component %s)", path, peer.component)
    progress.finish(ok)
    table.set_progress(entry_id, None)
    progress.close()
