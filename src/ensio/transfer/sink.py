"""Where a file arriving from another host goes: the memory file, at each range's offset.

A consumer host's daemon (:mod:`.network`) receives each ``DATA`` frame's raw bytes
through a :class:`Sink`; after ``SIZE`` it also tells the file's progress map
(:mod:`.progress`) which bytes have arrived, piece by piece, so partial readers
(``serve_partial``) can go on before the whole range is in.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket

from .progress import Progress
from .wire import recv_exact_into

__all__ = ["Sink"]

_CHUNK = 8 << 20      # bytes received per recv_into/pwrite
_PIPE = 1 << 20       # the splice pipe's size (the unprivileged maximum by default)
_LOWAT = 256 << 10    # wake the receiving thread only once this much has arrived


class Sink:
    """Where the raw bytes of ``DATA`` frames go: the memory file, at their offset.

    Through a pipe with ``splice`` (socket → pipe → memfd: one copy, in the kernel),
    or, where the kernel refuses that for this socket, through ``recv_into`` a buffer
    and ``pwrite`` (two copies, the second through Python).

    Inside a ``DATA`` payload the socket's ``SO_RCVLOWAT`` is raised (to 256 KiB, or
    what is left of the payload when less), so the thread is woken once per 256 KiB
    instead of once per segment that arrived: that halved the receiving CPU of an
    8 × 64 MiB stream (loopback and veth, splice into a tmpfs). It is set back to 1
    before the next frame header is read: the kernel wakes a reader only when the
    low-water mark is reached, whatever length the reader asked for, so a small
    frame left alone under a higher mark would never be read.
    """

    def __init__(self, conn: socket.socket, fd: int) -> None:
        self.conn, self.fd = conn, fd
        self.progress: Progress | None = None  # after SIZE: told of each piece written
        self.pipe: tuple[int, int] | None = None
        self.buf = bytearray(0)  # grown to the largest DATA seen, at most _CHUNK
        with contextlib.suppress(OSError, AttributeError):
            self.pipe = os.pipe2(os.O_CLOEXEC)
            with contextlib.suppress(OSError):
                fcntl.fcntl(self.pipe[1], fcntl.F_SETPIPE_SZ, _PIPE)
        self.room = fcntl.fcntl(self.pipe[1], fcntl.F_GETPIPE_SZ) if self.pipe else 0
        self._mark = 1  # the socket's SO_RCVLOWAT

    def _lowat(self, n: int) -> None:
        mark = max(1, min(n, _LOWAT))
        if mark != self._mark:
            with contextlib.suppress(OSError):
                self.conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
                self._mark = mark

    def receive(self, off: int, n: int) -> bool:
        """``n`` raw bytes into the memory file at ``off``; False: the connection closed."""
        try:
            return self._receive(off, n)
        finally:
            self._lowat(1)  # the next frame's header may be short (see the class)

    def _receive(self, off: int, n: int) -> bool:
        while self.pipe is not None and n > 0:
            self._lowat(n)
            r, w = self.pipe
            try:
                k = os.splice(self.conn.fileno(), w, min(n, self.room))
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                self.close()  # refused, the pipe empty: the rest the portable way
                break
            if k == 0:
                return False
            n -= k
            start = off
            while k > 0:
                moved = os.splice(r, self.fd, k, offset_dst=off)
                off += moved
                k -= moved
            if self.progress is not None:
                self.progress.received(start, off)
        return n == 0 or self._copy(off, n)

    def _copy(self, off: int, n: int) -> bool:
        if len(self.buf) < min(_CHUNK, n):
            self.buf = bytearray(min(_CHUNK, n))
        view = memoryview(self.buf)
        while n > 0:
            k = min(n, len(view))
            self._lowat(k)
            if not recv_exact_into(self.conn, view[:k]):
                return False
            done = 0
            while done < k:
                done += os.pwrite(self.fd, view[done:k], off + done)
            if self.progress is not None:
                self.progress.received(off, off + k)
            off += k
            n -= k
        return True

    def close(self) -> None:
        if self.pipe is not None:
            for end in self.pipe:
                os.close(end)
            self.pipe = None
