"""The per-host staging daemon: ``ensio transfer daemon``.

It listens on ``<socket dir>/daemon.sock`` (a ``SOCK_SEQPACKET`` Unix socket in a
directory of mode 0700 owned by this user, see :mod:`.runtime`), refuses peers of
another uid (``SO_PEERCRED``, logged), and serves each connection in its own
thread: a consumer's open may block until its file is complete, and must not hold
up anyone else. The held files and all decisions are :class:`~.table.Table`'s.

One daemon per directory: the daemon holds an exclusive ``flock`` on
``daemon.lock`` for its lifetime; a second one started by accident exits at once.
It exits on ``STOP`` (``ensio transfer stop``), on SIGTERM/SIGINT, or after
``idle_timeout`` seconds without clients, without held files and without TCP
activity (an experiment registered, a stream received: :mod:`.network`). At exit, complete
files of ``fallback: files`` connections that are not on disk yet and that some declared
consumer has not consumed are written to their real paths; consumed ones are released
(:mod:`.budget`); anything else held is logged as lost.

The daemon keeps up to ``pool_mb`` MiB of pre-faulted memfds ready for producers
(:mod:`.pool`; 0 turns it off): a ``CREATE`` without a descriptor gets one of them,
or a fresh memfd, with its reply. The pool is released at exit.

Log lines (one per event: refusals, producers that died, budgets, timeouts) go to
``<socket dir>/daemon.log``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import signal
import socket
import struct
import threading
import time
from pathlib import Path

from . import view
from .budget import KEEP_DEFAULT, read_keep_lines
from .hugemem import open_memory_source
from .incoming import parse_ranges
from .network import Network
from .persist import persist_loop, wait_persisted
from .pool import MemfdPool
from .protocol import (
    LOCK_NAME,
    LOG_NAME,
    PROTOCOL_VERSION,
    SOCKET_NAME,
    Message,
    encode,
    recv_message,
    send_message,
)
from .table import Peer, Reply, Table

__all__ = ["DEFAULT_POOL_MB", "AlreadyRunning", "Daemon", "serve"]

DEFAULT_POOL_MB = 256.0



class AlreadyRunning(RuntimeError):
    """Another daemon holds the directory's lock."""


class Daemon:
    """A listening staging daemon (``serve_forever`` blocks until it stops)."""

    def __init__(self, socket_dir: str | os.PathLike, idle_timeout: float = 600.0,
                 log: logging.Logger | None = None,
                 pool_mb: float = DEFAULT_POOL_MB, huge_pages: str | None = "off") -> None:
        self.dir = Path(socket_dir)
        self.idle_timeout = idle_timeout
        self.log = log or _file_logger(self.dir / LOG_NAME)
        self._lock_fd = _take_lock(self.dir / LOCK_NAME)
        # huge_pages: "auto" (a private huge-page tmpfs if the machine allows, hugemem.py),
        # "off" (memfds); None: $ENSIO_TRANSFER_HUGE_PAGES, else auto
        self.memory = open_memory_source(self.dir, self.log, huge_pages)
        self.pool = MemfdPool(int(pool_mb * 1024 * 1024), self.log, memory=self.memory)
        self.table = Table(self.log, self.pool)
        self.network = Network(self.table, self.log, on_activity=lambda: self._count(0))
        # producer runs going or finished, per connection, here and on the other hosts
        self.runs = self.network.names.runs
        self.runs.on_change = self._runs_changed
        self._stop = threading.Event()
        self._clients = 0
        self._last_active = time.monotonic()
        self._state = threading.Condition()
        self._ids = iter(range(1, 1 << 62))
        path = self.dir / SOCKET_NAME
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a dead daemon's socket (we hold the lock, so it is dead)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock.bind(os.fspath(path))
        os.chmod(path, 0o600)
        self.sock.listen(128)
        self.socket_path = path

    def serve_forever(self) -> None:
        """Accept clients until stopped; then write out or report what is held."""
        self.log.info("listening on %s (pid %d), memfd pool %d MiB", self.socket_path,
                      os.getpid(), self.pool.limit >> 20)
        persister = threading.Thread(target=persist_loop, args=(self.table,), name="persist",
                                     daemon=True)
        persister.start()
        threading.Thread(target=self.pool.run, name="pool", daemon=True).start()
        acceptor = threading.Thread(target=self._accept_loop, name="accept", daemon=True)
        acceptor.start()
        with self._state:
            while not self._stop.is_set():
                idle = self._clients == 0 and len(self.table) == 0
                left = self._last_active + self.idle_timeout - time.monotonic()
                if idle and left <= 0:
                    self.log.info("idle for %.0f s: stopping", self.idle_timeout)
                    break
                self._state.wait(max(0.05, left) if idle else self.idle_timeout)
        self._stop.set()
        self._shutdown(persister)

    def stop(self) -> None:
        """Ask ``serve_forever`` to return (any thread, signal handlers)."""
        self._stop.set()
        with self._state:
            self._state.notify_all()

    def _shutdown(self, persister: threading.Thread) -> None:
        with contextlib.suppress(OSError):
            self.socket_path.unlink()
        self.sock.close()
        if self.pool.limit:
            self.log.info("memfd pool: %d new files took pre-faulted memory, %d found none "
                          "ready", self.pool.taken, self.pool.missed)
        self.pool.close()
        self.memory.close()
        self.network.close()
        if not wait_persisted(self.table, timeout=120.0):
            self.log.error("write-behind still pending after 120 s at exit")
        self.table.shut()
        self.network.names.close()  # after the spill: other hosts then find the real files
        persister.join(timeout=10.0)
        self.log.info("stopped")
        os.close(self._lock_fd)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # the listening socket was closed: stopping
            uid, pid = _peer_credentials(conn)
            if uid != os.getuid():
                self.log.warning("refused a connection from uid %d (pid %d): not this user",
                                 uid, pid)
                conn.close()
                continue
            threading.Thread(target=self._serve_client, args=(conn, pid), daemon=True,
                             name=f"client-{pid}").start()

    def _serve_client(self, conn: socket.socket, pid: int) -> None:
        """One connection: HELLO, then requests until it closes (a producer's death)."""
        peer = Peer(id=next(self._ids), component="?", pid=pid)
        keeps: dict[str, tuple[str, frozenset[str]]] = {}
        self._count(+1)
        try:
            while True:
                try:
                    msg = recv_message(conn)
                except OSError:
                    msg = None
                if msg is None:
                    break
                if msg.verb == "HELLO":
                    if msg.int("proto", PROTOCOL_VERSION) != PROTOCOL_VERSION:
                        self.log.warning("refused pid %d: protocol %s, not %d", pid,
                                         msg.get("proto"), PROTOCOL_VERSION)
                        self._reply(conn, Reply.err(errno.EPROTO))
                        break
                    peer = Peer(id=peer.id, component=msg.get("component", "?"), pid=pid)
                    keeps = read_keep_lines(msg.get("rules", ""))  # keep lines (budget.py)
                    self._reply(conn, Reply("OK", {"proto": PROTOCOL_VERSION,
                                                   "pid": os.getpid()}))
                    continue
                if msg.verb == "STATUS":
                    self.network.names.drain()  # what opens would see now
                    self._send_status(conn)
                    continue
                reply = self._dispatch(peer, msg, keeps)
                if msg.verb == "RANGES" and msg.get("ack") == "0":
                    continue  # the interposer does not wait for an answer
                self._reply(conn, reply)
                if msg.verb == "STOP":
                    self.log.info("stop requested by %s", peer)
                    self.stop()
        finally:
            conn.close()
            self.table.peer_gone(peer)
            self.network.peer_gone(peer)
            self.runs.peer_gone(peer)
            self._count(-1)

    def _dispatch(self, peer: Peer, msg: Message,
                  keeps: dict[str, tuple[str, frozenset[str]]] | None = None) -> Reply:
        """One request → the table's reply; a descriptor received and not kept is closed.

        ``keeps``: the producer's ``keep`` lines (conn → keep, consumers; :mod:`.budget`).
        """
        self.pool.touch()
        try:
            if msg.verb == "CREATE":  # without a descriptor: the daemon supplies the memory
                reply = self.table.create(
                    peer, msg.get("path"), msg.fd, conn=msg.get("conn"),
                    budget=msg.int("budget", -1), fallback=msg.get("fallback", "files"),
                    persist=msg.get("persist") == "1", mode=int(msg.get("mode", "644"), 8),
                    excl=msg.get("excl") == "1", keep=msg.get("keep") == "1",
                    exist=msg.get("exist") == "1",
                    policy=(keeps or {}).get(msg.get("conn"), KEEP_DEFAULT))
                if reply.verb == "OK":  # the descriptor received is the table's now
                    return self._announce(peer, msg, reply) if msg.get("targets") else reply
            elif msg.verb == "COMPLETE":
                entry_id, final = msg.int("id"), parse_ranges(msg.get("r"))
                reply = self.table.complete(peer, entry_id)
                if reply.verb != "OK" or not self.table.is_current(entry_id):
                    # unlinked or replaced while written: the other hosts drop it too
                    self.network.abort(entry_id)
                elif self.network.finish_later(entry_id, final, peer.pid):
                    reply = Reply("OK", {"pending": 1})  # async: the producer SETTLEs at exit
                elif failed := self.network.finish(entry_id, final):
                    # the producer's close fails: its run must not look fine
                    reply = Reply("ERR", {"errno": errno.EIO, "fatal": 1, "say": failed})
            elif msg.verb == "RANGES":
                self.network.ranges(msg.int("id"), parse_ranges(msg.get("r")))
                reply = Reply("OK")
            elif msg.verb == "NETWORK":
                peers = dict(p.split("=", 1) for p in msg.get("peers").split(",") if "=" in p)
                pull = frozenset(filter(None, msg.get("pull").split(",")))
                reply = self.network.register(msg.get("identity"), msg.get("host"),
                                              msg.get("listen"), msg.get("secret"), peers,
                                              pull)
                if reply.verb == "OK":  # which hosts must end a round (view.Runs.finished)
                    self.runs.place(msg.get("identity"), msg.get("host"),
                                    _producer_hosts(msg.get("identity"), msg.get("producers")))
            elif msg.verb in ("OPEN", "STAT"):
                self.network.names.drain()  # renames/unlinks from other hosts come first
                wait = msg.int("wait_ms", 600_000) / 1000.0 if msg.verb == "OPEN" else None
                reply = self.table.open(peer, msg.get("path"), wait, msg.get("defer") == "1",
                                        partial=msg.get("partial") == "1")
                with view.once_per_wait(self.log):  # a host that is down: said once an open
                    if reply.verb == "ABSENT" and self.network.can_pull(msg.get("conn")):
                        reply = self._pull(peer, msg, wait)
                    if reply.verb == "ABSENT" and wait is not None and msg.get("await") == "1":
                        reply = self._await(peer, msg, wait)  # not produced yet (view.py)
            elif msg.verb == "RUN":
                reply = self.runs.start(peer, _names(msg.get("produces")),
                                        _names(msg.get("consumes")))
            elif msg.verb == "LIST":
                reply = view.listing(self.table, msg.get("dir"))
            elif msg.verb == "CHMOD":
                reply = self.table.chmod(msg.get("path"), int(msg.get("mode"), 8))
            elif msg.verb in ("UNLINK", "RENAME", "DROP"):
                reply = self._name_change(msg, self.runs.produces(peer))
            elif msg.verb == "SETTLE":  # at exit: its async files reached the other hosts?
                failed = self.network.settling.wait_pid(peer.pid)
                reply = Reply("OK") if not failed else Reply(
                    "ERR", {"errno": errno.EIO, "fatal": 1,
                            "say": "; ".join(failed).replace("\n", " ")})
            elif msg.verb == "EXIT":  # exit status 0: what it opened is consumed (budget.py)
                self.table.consumer_exited(peer.pid)
                reply = Reply("OK")
            elif msg.verb == "STOP":
                reply = Reply("OK")
            else:
                reply = Reply.err(errno.ENOSYS)
        except (OSError, ValueError) as exc:
            self.log.error("%s from %s failed: %s", msg.verb, peer, exc)
            reply = Reply.err(getattr(exc, "errno", None) or errno.EIO)
        for fd in (msg.fd, msg.fd2):
            if fd is not None:
                os.close(fd)
        return reply

    def _announce(self, peer: Peer, msg: Message, reply: Reply) -> Reply:
        """A new file for other hosts: open its streams before the producer writes. A host
        that refuses us (a wrong secret) or cannot be reached fails the producer's open
        (``fatal``: one line on its stderr, and its run fails), unless the connection's
        consumers there pull what they miss (``all-to-all``)."""
        entry_id = int(str(reply.fields["id"]))
        try:
            failed = self.network.announce(peer, entry_id, {
                **msg.fields, "component": peer.component, "mode": str(reply.fields["mode"])})
        except OSError:
            if reply.fd is not None:
                os.close(reply.fd)  # the producer's descriptor, never sent
            raise
        if failed is None or self.network.can_pull(msg.get("conn")):
            return reply
        self.network.abort(entry_id)
        self.table.drop(msg.get("path"))
        if reply.fd is not None:
            os.close(reply.fd)
        code, why = failed
        self.log.error("%s: open by %s fails: %s", msg.get("path"), peer, why)
        return Reply("ERR", {"errno": code, "fatal": 1, "say": f"{msg.get('path')}: {why}"})

    def _name_change(self, msg: Message, producer: tuple[str, ...] = ()) -> Reply:
        """Unlink, rename or drop here; then on the hosts holding copies (:mod:`.names`),
        before the producer's call returns. ``producer``: the connections the caller
        produces, whose consumers do not wait for a name it removes
        (:meth:`.view.Runs.removed`)."""
        names = self.network.names
        self.network.settling.wait_paths(*(msg.get(k) for k in ("old", "new", "path")
                                           if msg.get(k)))  # in the producer's order
        if msg.verb == "RENAME":
            old, new = msg.get("old"), msg.get("new")
            export = msg.get("export") == "1"
            reply = self.table.rename(old, new, export, excl=msg.get("excl") == "1")
            if reply.verb != "ERR" and producer:
                self.runs.removed(old, producer)
            if reply.verb != "ERR" and export:  # the file left the transfer layer
                names.unlink(old, producer=producer)
            elif reply.verb != "ERR":
                names.rename(old, new, producer=producer)
            return reply
        path = msg.get("path")
        reply = self.table.unlink(path) if msg.verb == "UNLINK" else self.table.drop(path)
        if msg.verb == "UNLINK" and producer:
            self.runs.removed(path, producer)
        names.unlink(path, producer=producer if msg.verb == "UNLINK" else ())
        return reply

    def _pull(self, peer: Peer, msg: Message, wait: float | None) -> Reply:
        """An absent file of an all-to-all connection: ask the other hosts for it.

        Not on the process's shared connection (``defer``): the interposer asks again on
        a connection of its own, without its lock, and the pull happens then.
        """
        if msg.get("defer") == "1":
            return Reply("BUSY")
        path = msg.get("path")
        if self.network.pull(msg.get("conn"), path, msg.int("wait_ms", 600_000)):
            return self.table.open(peer, path, wait)
        return Reply("ABSENT")

    def _await(self, peer: Peer, msg: Message, wait: float) -> Reply:
        """A consumer's open of a name not produced yet: wait for it (:mod:`.view`).

        On the process's shared connection (``defer``) ``BUSY`` when it would wait: the
        interposer asks again on a connection of its own, and the wait happens then.
        """
        path, conn = msg.get("path"), msg.get("conn")
        exp = self.network.experiments.get(conn.split(":", 1)[0])
        pull = exp is not None and self.network.can_pull(conn)
        if exp is not None:  # producers on other hosts too: ask them first
            if os.path.lexists(path):
                return Reply("ABSENT")
            if msg.get("defer") == "1":
                return Reply("BUSY")  # network I/O: on the interposer's own connection
            holder, silent = self.network.names.hear_from(
                exp.identity, [h for h in exp.peers if h != exp.host], path)
            if holder is not None and not pull:
                self.log.info("%s: complete on host %s, not here: not waited for", path, holder)
                return Reply("ABSENT")
            silent = [h for h in silent if h in self.runs.waiting_on(conn)]
            if silent and not self.runs.finished(conn):
                # info: the usual case of a consumer started first (no daemon there yet)
                self.log.info("%s: producer host%s %s did not answer (its daemon is not up "
                              "yet, or unreachable): not finished, so the consumer waits",
                              path, "s" if len(silent) > 1 else "", ", ".join(silent))

        def poll(left: float) -> None:  # never pushed here: asked for now and then
            self.network.pull(conn, path, int(left * 1000))
        return view.await_reply(self.table, self.log, self.runs, peer, path, conn, wait,
                                lambda left: self.table.open(peer, path, left),
                                defer=msg.get("defer") == "1", poll=poll if pull else None)

    def _runs_changed(self, identities: set[str]) -> None:
        """Our producer runs of these experiments changed: the other hosts hear of it
        (:mod:`.names`), so their consumers wait, or learn that a round ended."""
        for identity in identities:
            exp = self.network.experiments.get(identity)
            if exp is not None:
                self.network.names.tell_runs(identity, [h for h in exp.peers if h != exp.host])

    def _reply(self, conn: socket.socket, reply: Reply) -> None:
        try:
            send_message(conn, encode(reply.verb, **reply.fields), reply.fd, reply.fd2)
        except OSError:
            pass  # the client is gone; its thread ends at the next receive
        finally:
            for fd in (reply.fd, reply.fd2):
                if fd is not None:
                    os.close(fd)

    def _send_status(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            for row in self.table.status():
                send_message(conn, encode("FILE", **row))
            send_message(conn, encode("END"))

    def _count(self, delta: int) -> None:
        with self._state:
            self._clients += delta
            self._last_active = time.monotonic()
            self._state.notify_all()


def _names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def _producer_hosts(identity: str, text: str) -> dict[str, frozenset[str]]:
    """``NETWORK producers=NAME:HOST:HOST,...`` → {``identity:NAME``: hosts}."""
    out = {}
    for item in _names(text):
        name, *hosts = item.split(":")
        out[f"{identity}:{name}"] = frozenset(hosts)
    return out


def _peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """(uid, pid) of the process at the other end (``SO_PEERCRED``)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return uid, pid


def _take_lock(path: Path) -> int:
    """Hold ``daemon.lock`` for the daemon's life; AlreadyRunning if another one has it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(f"a staging daemon already runs in {path.parent}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _file_logger(path: Path) -> logging.Logger:
    log = logging.getLogger(f"ensio.transfer.daemon.{path}")
    if not log.handlers:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s ensio-transfer[%(process)d] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def serve(socket_dir: str | os.PathLike, idle_timeout: float = 600.0,
          pool_mb: float = DEFAULT_POOL_MB) -> None:
    """Run a daemon in the foreground until it stops (SIGTERM/SIGINT stop it cleanly).

    Raises
    ------
    AlreadyRunning
        Another daemon serves ``socket_dir``.
    """
    os.environ.pop("LD_PRELOAD", None)  # the daemon itself is never interposed
    d = Daemon(socket_dir, idle_timeout=idle_timeout, pool_mb=pool_mb, huge_pages=None)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: d.stop())
    d.serve_forever()

