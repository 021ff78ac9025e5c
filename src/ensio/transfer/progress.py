"""The progress map of a file arriving from another host (``serve_partial``).

When the producer on another host closes a file, its daemon first tells this host's
daemon the final size and which ranges are still to come (``SIZE``, :mod:`.wire`).
From then on the consumer's open can return at once: the receiving daemon gives it
the memory file, already at its final size, and a second descriptor, of this map: one
page of shared memory the daemon writes and every partial reader maps read-only
(``csrc/ensio_interpose_partial.c``), so a read that finds its bytes already there
costs a few atomic loads and no request. Layout (native byte order)::

    offset  0  u32  magic 0x45495047 ("EIPG")
            4  u32  state: 0 streaming, 1 complete, 2 failed
            8  u32  seq: even when stable, odd while the daemon updates (a seqlock);
                    also the futex word readers wait on
           12  u32  the daemon's process id (a reader whose daemon died gets EIO)
           16  u64  size: the file's final size
           24  u64  watermark: bytes [0, watermark) are final

The watermark is the start of the first range still to come. Sync sends the whole
file after the close, so it is the received prefix. Async sends only the ranges
written again after the close: bytes outside them were final before the ``SIZE``
frame, but the watermark stops at the first gap still to come, so a read above it
waits even for bytes that happen to be final already (conservative, never wrong).

Writers wake readers with ``FUTEX_WAKE`` (a raw system call through ctypes, x86-64 and
aarch64); elsewhere readers find changes at their next timed wake-up (200 ms).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import platform
import struct
import threading

__all__ = ["COMPLETE", "FAILED", "MAGIC", "STREAMING", "Progress", "read_progress"]

MAGIC = 0x45495047
STREAMING, COMPLETE, FAILED = 0, 1, 2
_PAGE = 4096
_HEAD = struct.Struct("=IIII")   # magic, state, seq, pid
_FUTEX_WAKE = 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_MAX_RANGES = 256   # more ranges to come than this: one range covering them all


def _libc_syscall():
    if _SYS_FUTEX is None:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_syscall = _libc_syscall()


def coarsen(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """At most ``_MAX_RANGES`` ranges covering ``ranges`` (sorted, merged): one cover when
    there are more (readers then wait at its first gap: slower, never wrong)."""
    if len(ranges) <= _MAX_RANGES:
        return ranges
    start = ranges[0][0]
    return [(start, ranges[-1][0] + ranges[-1][1] - start)]


class Progress:
    """The daemon's side of one progress map: the ranges still to come, and the page.

    One thread receives the file (:mod:`.network`) and calls :meth:`received`; any thread
    may call :meth:`finish`. Every update is one seqlock write and one futex wake.
    """

    def __init__(self, name: str, size: int, pending: list[tuple[int, int]]) -> None:
        self.size = size
        self.pending = [[off, min(off + n, size)] for off, n in pending if off < size and n > 0]
        self.state = STREAMING
        self._lock = threading.Lock()
        self.fd = os.memfd_create(f"progress:{name}"[:240], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, _PAGE)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        self.map = mmap.mmap(self.fd, _PAGE)
        self._seq = ctypes.c_uint32.from_buffer(self.map, 8)
        self._state = ctypes.c_uint32.from_buffer(self.map, 4)
        self._mark = ctypes.c_uint64.from_buffer(self.map, 24)
        self._addr = ctypes.addressof(self._seq)
        _HEAD.pack_into(self.map, 0, MAGIC, STREAMING, 0, os.getpid())
        struct.pack_into("=QQ", self.map, 16, size, self.watermark())

    def watermark(self) -> int:
        """Bytes below it are final: the start of the first range still to come."""
        return self.pending[0][0] if self.pending else self.size

    def reader_fd(self) -> int:
        """A new read-only descriptor of the map, for a partial reader (caller closes it)."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    def received(self, off: int, end: int) -> None:
        """Bytes [off, end) are now in the memory file at their final value."""
        with self._lock:
            if self.state != STREAMING:
                return
            before = self.watermark()
            out = []
            for a, b in self.pending:
                if b <= off or a >= end:
                    out.append([a, b])
                    continue
                if a < off:
                    out.append([a, off])
                if b > end:
                    out.append([end, b])
            self.pending = out
            if self.watermark() != before:
                self._publish(STREAMING)

    def finish(self, complete: bool) -> None:
        """The stream ended: every byte is final (``complete``), or the file failed."""
        with self._lock:
            if self.state != STREAMING:
                return
            self.state = COMPLETE if complete else FAILED
            if complete:
                self.pending = []
            self._publish(self.state)

    def _publish(self, state: int) -> None:
        """(lock held) One seqlock write of state and watermark, then wake the readers."""
        seq = self._seq.value
        self._seq.value = seq + 1      # odd: readers retry
        self._mark.value = self.watermark()
        self._state.value = state
        self._seq.value = seq + 2
        if _syscall is not None:  # syscall() is variadic: every argument a full long
            _syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(self._addr),
                     ctypes.c_long(_FUTEX_WAKE), ctypes.c_long(0x7FFFFFFF), ctypes.c_void_p(),
                     ctypes.c_void_p(), ctypes.c_long(0))

    def close(self) -> None:
        """Release the daemon's mapping and descriptor (readers keep theirs)."""
        with self._lock:
            if self.fd < 0:
                return
            del self._seq, self._state, self._mark   # exported buffers: before the unmap
            with contextlib.suppress(BufferError):
                self.map.close()
            os.close(self.fd)
            self.fd = -1


def read_progress(fd: int) -> tuple[int, int, int, int]:
    """(state, seq, size, watermark) of a progress map descriptor (tests, status)."""
    data = os.pread(fd, 32, 0)
    magic, state, seq, _pid = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise ValueError("not an ensio progress map")
    size, mark = struct.unpack_from("=QQ", data, 16)
    return state, seq, size, mark
