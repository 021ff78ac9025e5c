"""What a consumer's file-system view needs from the daemon: names not there yet, listings.

Two answers of the daemon for the interposer's directory and wait calls
(``csrc/ensio_interpose_dirs.c``, ``csrc/ensio_interpose_consume.c``):

* :func:`await_name`: a consumer opens a name its connection says will be produced
  (``OPEN … await=1``, sent only for a connection the process consumes and does not
  produce) that is neither held nor on disk. Workflow jobs are often started before
  their producer, so the open waits for the producer's ``CREATE`` (or for a real file
  at the path: fallback, a producer without the interposer) up to the connection's
  ``consumer_timeout_s``, then fails with ``ETIMEDOUT`` and one log line naming the
  file and the connection. The wait is logged when it begins: that line is what a
  workflow (and the tests) see of a consumer that started first. No wait once the
  connection's producer has finished (:class:`Runs`): the name will not come.
* :func:`listing`: the held names of one directory (``LIST dir=``), so ``readdir``,
  ``glob`` and ``ls`` list transferred files beside the real ones. Failed files are
  left out: their open fails with EIO and no tool should pick them up by a wildcard.
  The names go back in a sealed memfd (one per line): a directory may hold more names
  than one packet carries.

Both read the table under its lock (:class:`~.table.Table`'s ``cond``, notified by
every ``CREATE``) and change nothing in it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time

from .entries import Peer, Reply
from .table import Table

__all__ = ["REAL_FILE_POLL_S", "Runs", "await_name", "await_reply", "listing"]

#: How often a waiting open looks for a real file at the path (a fallback or
#: uninterposed producer writes it without telling the daemon); a ``CREATE`` wakes it
#: at once.
REAL_FILE_POLL_S = 0.25


class Runs:
    """Which connections have a producer run going, and which have finished one.

    A run is one program under the interposer, from its start (each exec) to its exit:
    it says ``RUN`` with the connections it produces and consumes, and the end of that
    connection is the end of the run. The first process ``ensio run`` starts is a run
    for the whole of it (a shell running several programs covers the gaps between
    them); its children are live runs too, but their end ends no round. A
    connection's producer is *finished* when no producer run of it is live and one
    ended after the last consumer run of it ended:
    the consumers of that round are reading what it left, so a name it did not produce
    will not come (ENOENT at once).
    A consumer started before its producer (no producer run since the consumers' last
    one), or while a producer runs, waits. The test is made when a wait would begin: a
    producer run ending while consumers wait does not end their wait (a job may run
    several producer programs one after the other); the timeout does.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = 0
        self._live: dict[str, int] = {}
        self._producer_end: dict[str, int] = {}
        self._consumer_end: dict[str, int] = {}
        #: peer id → (pid, component, produces, consumes, a child of a live run)
        self._by_peer: dict[int, tuple[int, str, tuple[str, ...], tuple[str, ...], bool]] = {}

    def start(self, peer: Peer, produces: list[str], consumes: list[str]) -> Reply:
        parent = _parent_pid(peer.pid)
        with self._lock:
            if peer.id in self._by_peer:
                return Reply("OK")
            child = any(pid == parent and comp == peer.component
                        for pid, comp, *_ in self._by_peer.values())
            self._by_peer[peer.id] = (peer.pid, peer.component, tuple(produces),
                                      tuple(consumes), child)
            for conn in produces:
                self._live[conn] = self._live.get(conn, 0) + 1
        return Reply("OK")

    def peer_gone(self, peer: Peer) -> None:
        """A run ended. Only a run's first program (not a child of a live run of the same
        component: ``sh -c 'cat a; cat b'``) ends a round of its connections."""
        with self._lock:
            run = self._by_peer.pop(peer.id, None)
            if run is None:
                return
            _pid, _comp, produces, consumes, child = run
            self._seq += 1
            for conn in produces:
                self._live[conn] -= 1
                if not child:
                    self._producer_end[conn] = self._seq
            for conn in consumes if not child else ():
                self._consumer_end[conn] = self._seq

    def finished(self, conn: str) -> bool:
        """No producer run of ``conn`` is live and one ended after its consumers' last."""
        with self._lock:
            return (self._live.get(conn, 0) == 0
                    and self._producer_end.get(conn, 0) > self._consumer_end.get(conn, 0))


def await_name(table: Table, log: logging.Logger, peer: Peer, path: str, conn: str,
               wait_s: float) -> bool:
    """Wait until ``path`` is held or exists on disk; False after ``wait_s`` (logged).

    The caller then opens it as usual (a held file still being written is waited for
    within what is left of the same timeout by the table's own open).
    """
    deadline = time.monotonic() + wait_s
    with table.cond:
        if path in table.entries or os.path.lexists(path):
            return True
        log.info("%s: consumer %s waits for it to be produced (connection %s, up to %.0f s)",
                 path, peer, _conn_name(conn), wait_s)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                log.error("%s: open by %s timed out (ETIMEDOUT) after %.0f s: never produced "
                          "(connection %s)", path, peer, wait_s, _conn_name(conn))
                return False
            table.cond.wait(min(left, REAL_FILE_POLL_S))
            if path in table.entries or os.path.lexists(path):
                log.info("%s: produced, consumer %s stops waiting", path, peer)
                return True


def await_reply(table: Table, log: logging.Logger, runs: Runs, peer: Peer, path: str,
                conn: str, wait_s: float, open_again, defer: bool = False) -> Reply:
    """An ``OPEN … await=1`` that found nothing: wait, then ``open_again(left_s)``.

    ``ABSENT`` when a real file is there or appears (the interposer opens it) or the
    connection's producer finished without it (:class:`Runs`), ``ERR ETIMEDOUT`` when
    nothing came. ``defer``: ``BUSY`` instead of waiting (on the process's shared
    connection: the interposer waits on one of its own).
    """
    if runs.finished(conn) or os.path.lexists(path):
        return Reply("ABSENT")
    if defer:
        return Reply("BUSY")
    start = time.monotonic()
    if not await_name(table, log, peer, path, conn, wait_s):
        return Reply.err(errno.ETIMEDOUT)
    return open_again(max(0.0, wait_s - (time.monotonic() - start)))


def listing(table: Table, directory: str) -> Reply:
    """``OK n=`` with a sealed memfd of the held names in ``directory``, one a line."""
    prefix = directory.rstrip("/") + "/"
    with table.cond:
        names = sorted(p[len(prefix):] for p, e in table.entries.items()
                       if p.startswith(prefix) and "/" not in p[len(prefix):]
                       and e.state != "failed")
    fd = os.memfd_create("ensio-list", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        data = "".join(f"{n}\n" for n in names).encode("utf-8", "surrogateescape")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return Reply("OK", {"n": len(names), "bytes": len(data)}, fd)


def _parent_pid(pid: int) -> int:
    """The parent of ``pid`` (0 if it is gone): ``/proc/<pid>/stat``'s fourth field."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _conn_name(conn: str) -> str:
    """``identity:name`` → ``name`` (what the user wrote in the config)."""
    return conn.rsplit(":", 1)[-1] if conn else "?"
