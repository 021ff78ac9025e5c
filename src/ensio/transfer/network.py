"""The daemon's side of cross-host transfer: experiments, the TCP listener, streams.

``ensio run`` registers its experiment with the local daemon (``NETWORK``): this
host's name, the address to listen on, the secret file and the other hosts'
addresses. The daemon then listens on that address only (one listener per address,
shared by the experiments that name it) and accepts a connection only from a daemon
that proves the experiment's secret (:mod:`.wire`).

Producer host: a file created with ``targets`` gets one :class:`~.outgoing.Stream`
per consumer host (this host excluded: its consumers share the memory); the
producer's close sends what remains and waits until each host has sealed its copy
(sync), or leaves that to the daemon (async, :mod:`.settle`). Connections are kept for
the next file to the same host (:mod:`.kept`).
Consumer host: each incoming stream becomes a held file of the local
:class:`~.table.Table` (:mod:`.incoming`), written by a remote "peer": consumers there
open it exactly as a local file, wait while it streams, and get EIO if the stream
breaks off. Once the producer has closed it (``SIZE``), consumers of ``serve_partial``
connections may open it before it is complete and read what has arrived
(:mod:`.progress`).

Unlink and rename of a file follow it to the hosts that hold a copy, over one control
connection per host (:mod:`.names`); a host accepts copies only while the sender's
control connection is open, and loses them when it ends.

Refusals (a wrong secret, an unknown experiment) and broken streams are logged, one
line each, naming the host and the file.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .errors import TransferError
from .incoming import receive_file
from .kept import KeptConnections, offer
from .names import Names
from .outgoing import Stream
from .secret import read_secret
from .settle import Settling
from .table import Peer, Reply, Table
from .wire import (
    HANDSHAKE_S,
    AuthError,
    client_handshake,
    connect_to,
    listen_on,
    recv_frame,
    send_frame,
    server_handshake,
    tune,
)

__all__ = ["Network"]


_DOWN_S = 30.0        # a host that did not answer is not retried for this long


@dataclass(frozen=True)
class Experiment:
    """One registered experiment (transfer config) on this daemon."""

    identity: str
    host: str
    listen: str
    secret_path: str
    peers: dict[str, str]
    pull: frozenset[str] = frozenset()   # connections (identity:name) pulled on demand


class Network:
    """Registered experiments, listeners, and the streams of this daemon."""

    def __init__(self, table: Table, log: logging.Logger,
                 on_activity: Callable[[], None] = lambda: None) -> None:
        self.table = table
        self.log = log
        self.on_activity = on_activity  # the daemon's idle clock
        self._down: dict[str, float] = {}  # host → until when it is not retried
        self._failures: dict[int, tuple[int, str]] = {}  # entry id → why a stream failed
        self._control_errors: dict[tuple[str, str], tuple[int, str]] = {}  # why no control
        self.lock = threading.Lock()
        self.experiments: dict[str, Experiment] = {}
        self.listeners: dict[str, socket.socket] = {}
        self.streams: dict[int, list[Stream]] = {}       # entry id → its streams
        self._writers: dict[int, int] = {}               # entry id → producer peer id
        self._ids = itertools.count(-1, -1)              # remote peers: negative ids
        self._closed = False
        self.names = Names(table, log, self._control_connect)   # unlink/rename, names.py
        self.kept = KeptConnections()    # stream connections for the next file (kept.py)
        self.settling = Settling()       # async files finishing after the close (settle.py)

    # -- registration ----------------------------------------------------------------------

    def register(self, identity: str, host: str, listen: str, secret: str,
                 peers: dict[str, str], pull: frozenset[str] = frozenset()) -> Reply:
        """``NETWORK``: remember the experiment; listen on ``listen`` if nobody does yet."""
        try:
            read_secret(secret)
        except TransferError as exc:
            self.log.error("experiment %s: %s", identity, exc)
            return Reply("ERR", {"errno": errno.EACCES, "why": str(exc)})
        self.on_activity()
        with self.lock:
            self.experiments[identity] = Experiment(identity, host, listen, secret, peers, pull)
            if listen in self.listeners:
                return Reply("OK")
            try:
                sock = listen_on(listen)
            except OSError as exc:
                why = f"cannot listen on {listen}: {exc.strerror}"
                self.log.error("experiment %s: %s", identity, why)
                return Reply("ERR", {"errno": exc.errno or errno.EADDRNOTAVAIL, "why": why})
            self.listeners[listen] = sock
        self.log.info("host %s: listening on %s (TCP) for experiment %s", host, listen, identity)
        threading.Thread(target=self._accept_loop, args=(sock,), daemon=True,
                         name=f"tcp-{listen}").start()
        return Reply("OK")

    def _secret_of(self, identity: str) -> bytes | None:
        exp = self.experiments.get(identity)
        return None if exp is None else read_secret(exp.secret_path)

    # -- consumer host: incoming streams ------------------------------------------------------

    def _accept_loop(self, lsock: socket.socket) -> None:
        while True:
            try:
                conn, addr = lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._incoming, args=(conn, addr), daemon=True,
                             name=f"in-{addr[0]}").start()

    def _incoming(self, conn: socket.socket, addr: tuple) -> None:
        self.on_activity()
        tune(conn)
        conn.settimeout(HANDSHAKE_S)
        try:
            identity, host = server_handshake(conn, self._secret_of)
        except (AuthError, TransferError, OSError) as exc:
            self.log.warning("refused a TCP connection from %s: %s", addr[0],
                             getattr(exc, "strerror", None) or exc)
            conn.close()
            return
        conn.settimeout(None)
        peer = Peer(id=next(self._ids), component="?", pid=0)
        try:
            first = recv_frame(conn)
            if first is not None and first.verb == "PULL":
                self._serve_pull(conn, first, host)
            elif first is not None and first.verb == "CONTROL":
                self.names.serve(conn, (identity, host))
            elif first is not None and first.verb == "FILE":  # then more on it (kept.py)
                m = first
                while m is not None and m.verb == "FILE" and \
                        self._receive(conn, peer, host, m, (identity, host)):
                    self.table.peer_gone(peer)
                    peer = Peer(id=next(self._ids), component="?", pid=0)
                    m = recv_frame(conn)
        finally:
            conn.close()
            self.table.peer_gone(peer)
            self.on_activity()

    def _receive(self, conn: socket.socket, peer: Peer, host: str, m,
                 origin: tuple[str, str]) -> bool:
        """One file after its ``FILE`` frame ``m`` (:func:`.incoming.receive_file`)."""
        return receive_file(self.table, self.names, self.log, conn, peer, host, m, origin)

    # -- pull on demand (all-to-all, a consumer on a host no file was pushed to) ---------------

    def can_pull(self, conn_key: str) -> bool:
        exp = self.experiments.get(conn_key.split(":", 1)[0])
        return exp is not None and conn_key in exp.pull

    def pull(self, conn_key: str, path: str, wait_ms: int) -> bool:
        """Ask the other hosts for ``path``; True once one has streamed it here."""
        exp = self.experiments.get(conn_key.split(":", 1)[0])
        if exp is None:
            return False
        for host, endpoint in exp.peers.items():
            if host == exp.host or self._down.get(host, 0.0) > time.monotonic():
                continue
            try:
                sock = connect_to(endpoint, patience=0.0)
                client_handshake(sock, read_secret(exp.secret_path), exp.identity, exp.host)
                send_frame(sock, "PULL", path=path, conn=conn_key, wait_ms=wait_ms)
                sock.settimeout(None)
            except (OSError, TransferError) as exc:
                self.log.warning("%s: cannot ask host %s for it: %s", path, host,
                                 getattr(exc, "strerror", None) or exc)
                continue
            peer = Peer(id=next(self._ids), component="?", pid=0)
            try:
                first = recv_frame(sock)
                if first is not None and first.verb == "FILE" and \
                        self._receive(sock, peer, host, first, (exp.identity, host)):
                    self.log.info("%s: pulled from host %s", path, host)
                    return True
            finally:
                sock.close()
                self.table.peer_gone(peer)
        return False

    def _serve_pull(self, conn: socket.socket, m, host: str) -> None:
        """Another host's consumer wants ``path``: stream it if held (once complete)."""
        path = m.get("path")
        asker = Peer(id=next(self._ids), component=f"pull@{host}", pid=0)
        got = self.table.open(asker, path, m.int("wait_ms", 600_000) / 1000.0)
        if got.verb != "OK" or got.fd is None:
            send_frame(conn, got.verb, **got.fields)
            return
        target = (m.get("conn").split(":", 1)[0], host)
        if not self.names.ensure(target):  # it may not keep a copy it cannot be told about
            os.close(got.fd)
            send_frame(conn, "ERR", errno=errno.ENOTCONN)
            return
        self.names.note(path, [target])
        component = self.table.component_of(path)
        send_frame(conn, "FILE", path=path, conn=m.get("conn"), component=component,
                   mode=str(got.fields.get("mode", "0644")))
        reply = recv_frame(conn)
        if reply is None or reply.verb != "OK":
            os.close(got.fd)
            return
        err = Stream(conn, got.fd, host, path, "sync").finish([])
        if err is not None:
            self.log.error("%s: %s", path, err)

    # -- producer host: outgoing streams -------------------------------------------------------

    def announce(self, writer: Peer, entry_id: int, fields: dict[str, str]
                 ) -> tuple[int, str] | None:
        """A file with ``targets`` was created: open a stream to each other host.

        Returns None, or (errno, why) of the first host that refused us or could not be
        reached (the daemon fails the producer's open with it, :mod:`.daemon`).
        """
        identity = fields.get("conn", "").split(":", 1)[0]
        exp = self.experiments.get(identity)
        targets = [t for t in fields.get("targets", "").split(",") if t]
        if exp is None:
            if targets:
                self.log.error("%s: targets %s but experiment %s is not registered here",
                               fields.get("path"), ",".join(targets), identity)
            return None
        streams = []
        failed: tuple[int, str] | None = None
        path = fields.get("path", "?")
        self.settling.wait_paths(path)  # the previous version reached the other hosts first
        for t in targets:
            if t == exp.host:
                continue
            target = (identity, t)
            s = None
            if self.names.ensure(target):
                s = self._open_stream(exp, t, entry_id, fields)
            else:
                self._failures[entry_id] = self._control_errors.get(
                    target, (errno.EHOSTUNREACH, f"host {t} cannot be reached"))
            failed = failed or self._failures.pop(entry_id, None)
            if s is not None:
                streams.append(s)
                self.names.note(path, [target])
            else:  # an older version there must not be served instead of this one
                self.names.unlink(path, only=target)
        with self.lock:
            self.streams[entry_id] = streams
            self._writers[entry_id] = writer.id
        return failed

    def _open_stream(self, exp: Experiment, target: str, entry_id: int,
                     fields: dict[str, str]) -> Stream | None:
        path = fields.get("path", "?")
        endpoint = exp.peers.get(target)
        if endpoint is None:
            self.log.error("%s: host %s is not in the config's hosts", path, target)
            return None
        if self._down.get(target, 0.0) > time.monotonic():
            self.log.error("%s: not streamed to host %s: it did not answer recently", path,
                           target)
            self._failures[entry_id] = (errno.EHOSTUNREACH, f"host {target} ({endpoint}) did "
                                        "not answer recently: the file cannot reach it")
            return None
        fd = self.table.dup_fd(entry_id)
        if fd is None:
            return None
        key = (exp.identity, target)
        sock = None
        try:
            sock = self.kept.offer(key, fields)
            if sock is None:
                sock = connect_to(endpoint)
                client_handshake(sock, read_secret(exp.secret_path), exp.identity, exp.host)
                offer(sock, fields)
        except (OSError, TransferError) as exc:
            self.log.error("%s: cannot stream to host %s (%s): %s", path, target, endpoint,
                           getattr(exc, "strerror", None) or exc)
            refused = isinstance(exc, AuthError)
            self._failures[entry_id] = (
                errno.EACCES if refused else getattr(exc, "errno", None) or errno.EHOSTUNREACH,
                f"host {target} ({endpoint}) " + ("refused this host (wrong secret?): "
                                                  if refused else "cannot be reached: ")
                + str(getattr(exc, "strerror", None) or exc).replace("\n", " "))
            if not isinstance(exc, AuthError):  # unreachable: do not stall every file on it
                self._down[target] = time.monotonic() + _DOWN_S
            os.close(fd)
            if sock is not None:
                sock.close()
            return None
        sock.settimeout(None)
        self._down.pop(target, None)
        return Stream(sock, fd, target, path, fields.get("xmode", "sync"),
                      on_sent=lambda n, after: self.table.add_sent(entry_id, n, after),
                      on_done=lambda done: self.kept.put(key, done))

    def ranges(self, entry_id: int, ranges: list[tuple[int, int]]) -> None:
        """``RANGES`` from the producer (async): queue them on each stream."""
        with self.lock:
            streams = list(self.streams.get(entry_id, ()))
        for s in streams:
            s.add(ranges)

    def finish(self, entry_id: int, final: list[tuple[int, int]]) -> str | None:
        """The producer closed: each host gets the rest and seals its copy (in parallel).
        None, or what failed (one line: the producer's close fails with it)."""
        with self.lock:
            streams = self.streams.pop(entry_id, [])
            self._writers.pop(entry_id, None)
        errors: list[str | None] = [None] * len(streams)

        def run(i: int, s: Stream) -> None:
            errors[i] = s.finish(final)

        # the first host in this thread (the usual single one: no thread hand-off on the
        # producer's close), the others in parallel with it
        threads = [threading.Thread(target=run, args=(i, s))
                   for i, s in enumerate(streams) if i > 0]
        for t in threads:
            t.start()
        if streams:
            run(0, streams[0])
        for t in threads:
            t.join()
        for s, err in zip(streams, errors, strict=True):
            if err is not None:
                self.log.error("%s: %s", s.path, err)
        bad = [f"{s.path}: {err}" for s, err in zip(streams, errors, strict=True) if err]
        return "; ".join(bad).replace("\n", " ") if bad else None

    def finish_later(self, entry_id: int, final: list[tuple[int, int]], pid: int) -> bool:
        """Async: :meth:`finish` in the background (:mod:`.settle`); False (nothing
        started) unless every stream of ``entry_id`` is async."""
        with self.lock:
            streams = self.streams.get(entry_id, [])
            if not streams or any(s.mode != "async" for s in streams):
                return False
            self._writers.pop(entry_id, None)  # complete: its producer's exit must not abort it
        self.settling.start(entry_id, streams[0].path, pid, lambda: self.finish(entry_id, final))
        return True

    def abort(self, entry_id: int) -> None:
        """End the streams of ``entry_id`` unfinished (the other hosts fail their copies)."""
        with self.lock:
            streams = self.streams.pop(entry_id, [])
            self._writers.pop(entry_id, None)
        for s in streams:
            s.abort()

    def peer_gone(self, peer: Peer) -> None:
        """The producer's connection closed: abort the streams of files it still wrote."""
        with self.lock:
            ids = [i for i, w in self._writers.items() if w == peer.id]
            dead = [(i, self.streams.pop(i, [])) for i in ids]
            for i in ids:
                self._writers.pop(i, None)
        for _, streams in dead:
            for s in streams:
                s.abort()

    def close(self) -> None:
        """Stop listening and abort the streams (the daemon says ``BYE`` on the control
        connections later, :meth:`.names.Names.close`, after its held files are on disk).
        Async files already closed get up to a minute to reach the other hosts."""
        if not self.settling.wait_all(60.0):
            self.log.error("async files still on their way to other hosts at exit: their "
                           "copies there fail")
        with self.lock:
            listeners = list(self.listeners.values())
            self.listeners.clear()
            streams = [s for ss in self.streams.values() for s in ss]
            self.streams.clear()
        for sock in listeners:
            with contextlib.suppress(OSError):
                sock.close()
        self.kept.close()
        for s in streams:
            s.abort()


    def _control_connect(self, identity: str, host: str) -> socket.socket:
        """An authenticated connection to ``host``'s daemon (:mod:`.names`); OSError if not."""
        exp = self.experiments.get(identity)
        endpoint = None if exp is None else exp.peers.get(host)
        if exp is None or endpoint is None:
            raise OSError(errno.EHOSTUNREACH, f"host {host} is not in experiment {identity}")
        try:
            sock = connect_to(endpoint, patience=0.0)
        except OSError as exc:
            self._control_errors[(identity, host)] = (
                exc.errno or errno.EHOSTUNREACH,
                f"host {host} ({endpoint}) cannot be reached: {exc.strerror or exc}")
            raise
        try:
            sock.settimeout(HANDSHAKE_S)
            client_handshake(sock, read_secret(exp.secret_path), exp.identity, exp.host)
        except (OSError, TransferError) as exc:
            sock.close()
            if isinstance(exc, AuthError):
                self._control_errors[(identity, host)] = (
                    errno.EACCES, f"host {host} ({endpoint}) refused this host: "
                    f"{exc.strerror or exc} (the same secret file on both hosts?)")
            raise OSError(getattr(exc, "errno", None) or errno.EACCES, str(exc)) from None
        self._control_errors.pop((identity, host), None)
        return sock
