"""Stream connections kept open for the next file to the same host.

Why: every file sent to another host used to open its own TCP connection, prove the
secret (two round trips) and start a thread on the other side, all inside the
producer's ``open``. Across two network namespaces that was 3-8 ms per file, and
the link stood idle meanwhile: the previous file's stream had ended at its close,
the next one could not start before its open returned. A connection whose file was
sealed on the other host (``DONE`` answered ``OK``) is therefore kept, already
authenticated, and the next ``FILE`` to that host and experiment goes over it.

A kept connection is taken only if nothing arrived on it meanwhile (the other
daemon closed it, or sent something it should not have) and it was kept less than
``_IDLE_S``. The other daemon may still have died silently: the caller waits for its
answer to ``FILE`` at most ``CONNECT_S`` and then opens a new connection
(:mod:`.network`). A connection that carried a failed or aborted file is never kept.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time

from .wire import CONNECT_S, recv_frame, send_frame

__all__ = ["KeptConnections", "offer"]

_KEEP = 4        # kept connections per (experiment, host) at most
_IDLE_S = 60.0   # a connection kept longer is closed instead of reused


class _Gone(OSError):
    """The other daemon closed the connection, or did not answer in time."""


def offer(sock: socket.socket, fields: dict[str, str]) -> None:
    """``FILE`` (of the announced ``fields``) and its answer.

    Raises
    ------
    OSError
        The other daemon refused the file (:class:`_Gone`: it did not answer at all).
    """
    try:
        send_frame(sock, "FILE", path=fields.get("path", "?"), conn=fields.get("conn", ""),
                   component=fields.get("component", "?"), mode=fields.get("mode", "644"))
        reply = recv_frame(sock)
    except OSError as exc:
        raise _Gone(exc.errno or errno.EIO, f"connection lost: {exc.strerror or exc}") from None
    if reply is None:
        raise _Gone(errno.EIO, "refused the file (closed)")
    if reply.verb != "OK":
        raise OSError(errno.EIO, f"refused the file ({reply.verb})")


def _unused(sock: socket.socket) -> bool:
    """True if nothing (no byte, no end) arrived on ``sock`` since it was kept."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False  # the other side closed it, or a byte nobody asked for


class KeptConnections:
    """Authenticated connections to other hosts' daemons, keyed (experiment, host)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str], list[tuple[float, socket.socket]]] = {}
        self._closed = False

    def put(self, key: tuple[str, str], sock: socket.socket) -> None:
        """Keep ``sock`` (its file done) for the next file to ``key``, or close it."""
        with self._lock:
            kept = self._kept.setdefault(key, [])
            if not self._closed and len(kept) < _KEEP:
                kept.append((time.monotonic(), sock))
                return
        sock.close()

    def take(self, key: tuple[str, str]) -> socket.socket | None:
        """The most recently kept usable connection to ``key`` (others found dead or
        too old are closed), or None."""
        stale = []
        try:
            with self._lock:
                kept = self._kept.get(key, [])
                while kept:
                    since, sock = kept.pop()
                    if time.monotonic() - since < _IDLE_S and _unused(sock):
                        return sock
                    stale.append(sock)
            return None
        finally:
            for sock in stale:
                sock.close()

    def offer(self, key: tuple[str, str], fields: dict[str, str]) -> socket.socket | None:
        """A kept connection to ``key`` that accepted the file, or None.

        A kept connection that closed, or does not answer within ``CONNECT_S`` (its
        host may have vanished), is dropped for the next one or a new connection.
        Raises OSError when the other daemon answered and refused the file.
        """
        while (sock := self.take(key)) is not None:
            sock.settimeout(CONNECT_S)
            try:
                offer(sock, fields)
                return sock
            except _Gone:
                sock.close()
            except OSError:
                sock.close()
                raise
        return None

    def close(self) -> None:
        """Close every kept connection and keep no more (daemon exit)."""
        with self._lock:
            self._closed = True
            socks = [s for kept in self._kept.values() for _, s in kept]
            self._kept.clear()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
