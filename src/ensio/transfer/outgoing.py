"""One file streamed from the producer host's daemon to one consumer host's daemon.

A :class:`Stream` is opened when the producer creates the file (so consumers on the
other host find it there and wait for it), and ends with ``DONE`` after the
producer's close. Bytes move with ``sendfile`` from the producer's memory file to the
socket: no copy through Python.

Sync mode sends the whole file after the close. Async mode sends the ranges the
interposer reports while the producer still runs (a background thread per stream),
so after the close only what was written again since (dirty) and what was not yet
reported remains. ``sent`` counts every byte sent, ``after_close`` those sent after
the producer's close (what the producer's consumers wait for).

Ranges a report names are sent after the report arrived, and every write is
reported after it happened: so every byte's last write is sent at least once after
it, and the consumer host's copy ends equal to the producer's. For the same reason,
at the close every byte outside the ranges still to send is final on the consumer
host already: the ``SIZE`` frame names those ranges (:mod:`.progress`).

Test hook (never set outside tests): ``ENSIO_TRANSFER_TEST_HOLD=BYTES:FIFO`` in the
sending daemon's environment stops each stream after ``BYTES`` bytes sent after the
close, until a line is read from the named pipe ``FIFO``: ``go`` sends the rest, any
other line breaks the stream off (as a vanished host would). Tests use it to observe
a consumer reading a file that has only partly arrived, without sleeps.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable

from .progress import coarsen
from .wire import recv_frame, send_frame

__all__ = ["Stream", "merge"]

_ZEROS = bytes(1 << 16)


def _test_hold() -> tuple[int, str] | None:
    """``ENSIO_TRANSFER_TEST_HOLD`` (see the module docstring), None when unset."""
    text = os.environ.get("ENSIO_TRANSFER_TEST_HOLD", "")
    count, sep, fifo = text.partition(":")
    return (int(count), fifo) if sep and count.isdigit() else None


def merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping (offset, length) ranges covering the same bytes."""
    out: list[list[int]] = []
    for off, n in sorted(r for r in ranges if r[1] > 0):
        if out and off <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], off + n - out[-1][0])
        else:
            out.append([off, n])
    return [(a, b) for a, b in out]


class Stream:
    """An authenticated connection carrying one file (see :mod:`.wire`)."""

    def __init__(self, sock: socket.socket, fd: int, host: str, path: str, mode: str,
                 on_sent: Callable[[int, int], None] = lambda sent, after: None,
                 on_done: Callable[[socket.socket], None] | None = None) -> None:
        self.sock = sock
        self.on_sent = on_sent  # (bytes, of which after the close): the daemon's statistics
        self.on_done = on_done  # takes the connection once the file is sealed (kept.py)
        self.fd = fd            # our own descriptor of the producer's memory
        self.host = host
        self.path = path
        self.mode = mode
        self.sent = 0
        self.after_close = 0
        self.error: str | None = None
        self._lock = threading.Lock()   # one sender on the socket at a time
        self._cond = threading.Condition()
        self._pending: list[tuple[int, int]] = []
        self._stop = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._hold = _test_hold()
        if mode == "async":
            self._thread = threading.Thread(target=self._background, daemon=True,
                                            name=f"send-{host}")
            self._thread.start()

    # -- async: ranges while the producer runs --------------------------------------------

    def add(self, ranges: list[tuple[int, int]]) -> None:
        """Ranges written since the last report: the background thread sends them."""
        with self._cond:
            self._pending = merge(self._pending + ranges)
            self._cond.notify_all()

    def _background(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                todo, self._pending = self._pending, []
            for off, n in todo:
                if not self._send_range(off, n):
                    return

    # -- both modes -----------------------------------------------------------------------

    def _send_range(self, off: int, n: int) -> bool:
        """``DATA`` of [off, off+n) clipped to the file's size; False after an error."""
        hold = self._hold
        if hold is not None and self._closing and self.after_close < hold[0] < \
                self.after_close + n:
            cut = hold[0] - self.after_close  # the test hook: stop exactly there
            if not self._send_range(off, cut):
                return False
            return self._held() and self._send_range(off + cut, n - cut)
        with self._lock:
            if self.error is not None:
                return False
            size = os.fstat(self.fd).st_size
            n = max(0, min(n, size - off))
            if n == 0:
                return True
            try:
                send_frame(self.sock, "DATA", off=off, len=n)
                done = 0
                while done < n:
                    k = os.sendfile(self.sock.fileno(), self.fd, off + done, n - done)
                    if k == 0:  # the file shrank meanwhile: the size at DONE settles it
                        while done < n:
                            done += self.sock.send(_ZEROS[:min(len(_ZEROS), n - done)])
                        break
                    done += k
            except OSError as exc:
                self.error = f"lost the connection to host {self.host}: {exc.strerror or exc}"
                return False
            after = n if self._closing else 0
            self.sent += n
            self.after_close += after
        self.on_sent(n, after)
        return True

    def _held(self) -> bool:
        """The test hook: wait for a line on the pipe; False (stream broken) unless ``go``."""
        assert self._hold is not None
        fifo, self._hold = self._hold[1], None
        with open(fifo, encoding="utf-8") as f:
            word = f.readline().strip()
        if word == "go":
            return True
        self.error = f"test hook: stream to host {self.host} broken off"
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        return False

    def finish(self, final: list[tuple[int, int]]) -> str | None:
        """The producer closed the file: send what remains, then ``DONE``; None or the error.

        Sync: the whole file. Async: the ranges not sent yet and ``final`` (the ranges
        the interposer reported with its close).
        """
        with self._cond:
            self._closing = True
            self._stop = True
            todo = merge(self._pending + final)
            self._pending = []
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        size = os.fstat(self.fd).st_size  # sealed: final
        if self.mode != "async":
            todo = [(0, size)]
        todo = coarsen(merge([(off, min(n, size - off)) for off, n in todo if off < size]))
        try:
            send_frame(self.sock, "SIZE", size=size,
                       r=",".join(f"{off}+{n}" for off, n in todo))
        except OSError as exc:
            self.error = f"lost the connection to host {self.host}: {exc.strerror or exc}"
        for off, n in todo if self.error is None else []:
            if not self._send_range(off, n):
                break
        if self.error is None:
            try:
                send_frame(self.sock, "DONE", size=os.fstat(self.fd).st_size)
                reply = recv_frame(self.sock)
                if reply is None or reply.verb != "OK":
                    self.error = (f"host {self.host} did not accept the file "
                                  f"({reply.verb if reply else 'connection closed'})")
            except OSError as exc:
                self.error = f"lost the connection to host {self.host}: {exc.strerror or exc}"
        keep = self.error is None and self.on_done is not None
        self.close(keep_socket=keep)
        if keep:
            assert self.on_done is not None
            self.on_done(self.sock)
        return self.error

    def abort(self) -> None:
        """The producer died: close the connection, so the other host fails the file."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=70)
        self.close()

    def close(self, keep_socket: bool = False) -> None:
        with self._lock:
            if not keep_socket:
                with contextlib.suppress(OSError):
                    self.sock.close()
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
