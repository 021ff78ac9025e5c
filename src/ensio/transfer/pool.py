"""A pool of pre-faulted memfds: producers write into pages that already exist.

Writing a file into fresh memfd pages costs the kernel a page allocation per 4 KiB
page inside every ``write`` (shmem has no large folios while transparent huge pages
for shmem are off, the default), which made a producer's writes into memory slower
than writes into the page cache. ``fallocate(FALLOC_FL_KEEP_SIZE)`` allocates the
pages of a memfd ahead, without zeroing them and without changing its size: the
file still looks empty (``st_size`` 0), and a later ``write`` is a plain copy into
resident pages (about twice as fast on the benchmark machine). The staging daemon
keeps a few such memfds ready (:class:`MemfdPool`), filled by a background thread
while the programs compute, and hands one to each producer's ``CREATE``. When the
file is complete the daemon seals it and trims the pages past its end
(:func:`trim`), so a file holds exactly its own pages.

Size of an entry: the largest of the last few completed files (rounded up to
2 MiB): members of an ensemble write files of one size. Before the first file
completes nothing is known and nothing is filled. An entry larger than its file
costs nothing for long (the tail is trimmed at completion); a smaller one still
pre-faults the file's first part.

Memory: at most ``limit`` bytes sit in the pool (``ensio transfer daemon
--pool-mb``); they belong to no connection's ``memory_mb`` until a producer takes
them, and a taken memfd counts by its file size as before. The pool does not fill
while the host's available memory would drop below a tenth of its total; it is
released after ``idle_s`` seconds without a take, and when the daemon stops.

When: only while no file is being written on this host (the table says,
:meth:`MemfdPool.set_writing`), once the daemon has had no request for ``quiet_s``
(1 s: the programs that just wrote or opened files are still busy with them), and at
the lowest CPU priority: the pool is filled in the gaps between output bursts, from
idle time. Filling beside a producer's writes slowed them down more than the pool
saved them (the kernel's page allocator and the memory bandwidth are shared); right
after them it would compete with the consumers reading the new files.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import threading
import time

from .hugemem import MemorySource

__all__ = ["MemfdPool", "fallocate_keep_size", "supply_memfd", "trim"]

FALLOC_FL_KEEP_SIZE = 0x01
_ROUND = 2 << 20
_HISTORY = 4
_MIN_AVAILABLE_FRACTION = 0.10
_STEP = 4 << 20  # filled between looks at whether a producer started writing

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_libc.fallocate.restype = ctypes.c_int


def fallocate_keep_size(fd: int, length: int, offset: int = 0) -> None:
    """Allocate the pages of ``length`` bytes of ``fd`` at ``offset`` without changing its size.

    Raises
    ------
    OSError
        The file system refuses (ENOSPC, EOPNOTSUPP).
    """
    if _libc.fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def trim(fd: int) -> None:
    """Free the pages of ``fd`` past its end (a pooled memfd's unused tail).

    ``ftruncate`` to the current size drops every page beyond it; the seals allow
    it (the size does not change), so the caller trims after sealing, when no one
    can write past the end any more.
    """
    os.ftruncate(fd, os.fstat(fd).st_size)


def supply_memfd(pool: MemfdPool | None, path: str) -> tuple[int, bool]:
    """The memory of a new file: one pre-faulted from ``pool`` (True), else a fresh one
    named after ``path`` (False), from the pool's :class:`~.hugemem.MemorySource` (a
    huge-page tmpfs file, which cannot be sealed, or a memfd, sealing allowed). The
    caller owns it."""
    fd = pool.take() if pool is not None else None
    if fd is not None:
        return fd, True
    if pool is not None:
        return pool.memory.new(path), False
    return os.memfd_create(os.path.basename(path) or "ensio",
                           os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING), False


def _lowest_priority() -> None:
    """Run the calling thread only on otherwise idle CPU time (``SCHED_IDLE``), else at
    nice 19; either is allowed unprivileged. A failure leaves it as it was."""
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, 19)


def _available_ok(extra: int) -> bool:
    """Whether ``extra`` more bytes leave a tenth of the host's memory available."""
    total = avail = None
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
            elif line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    if total is None or avail is None:
        return False
    return avail - extra >= _MIN_AVAILABLE_FRACTION * total


class MemfdPool:
    """Pre-faulted memfds (pages allocated, size 0) for the next producers.

    ``take`` never waits: an empty pool answers None and the caller makes a plain
    memfd. ``run`` (a thread of the daemon) fills it; ``close`` releases everything.
    """

    def __init__(self, limit: int, log: logging.Logger, idle_s: float = 300.0,
                 quiet_s: float = 1.0, memory: MemorySource | None = None) -> None:
        self.limit = max(0, int(limit))
        self.memory = memory if memory is not None else MemorySource()  # where files come from
        self.idle_s = idle_s
        self.quiet_s = quiet_s
        self._last_request = -quiet_s  # the daemon's last request (monotonic seconds)
        self.log = log
        self._cond = threading.Condition()
        self._ready: collections.deque[tuple[int, int]] = collections.deque()  # (fd, bytes)
        self._sizes: collections.deque[int] = collections.deque(maxlen=_HISTORY)
        self._last_take = time.monotonic()
        self._closed = False
        self._partial: tuple[int, int, int] | None = None  # being filled: fd, done, size
        self._writing = 0  # files being written now (the table says)
        self._in_step = False  # the filling thread works on the partial entry unlocked
        self.taken = 0      # memfds handed out (status, tests)
        self.missed = 0     # takes that found the pool empty

    # -- what the daemon asks --------------------------------------------------------

    def take(self) -> int | None:
        """A pre-faulted memfd (the caller owns it), or None if none is ready."""
        with self._cond:
            self._last_take = time.monotonic()
            if not self._ready:
                self.missed += 1 if self.limit else 0
                self._cond.notify_all()
                return None
            fd, _ = self._ready.popleft()
            self.taken += 1
            self._cond.notify_all()  # room for another entry
            return fd

    def learn(self, size: int) -> None:
        """A file of ``size`` bytes was completed: the next entries are sized after it."""
        if self.limit <= 0 or size <= 0:
            return
        with self._cond:
            self._sizes.append(size)
            self._cond.notify_all()

    def held(self) -> int:
        """Bytes pre-faulted in the pool now (entries ready, and the one being filled)."""
        with self._cond:
            return self._held()

    def entry_size(self) -> int:
        """The size of the next entry (0: nothing known yet, or the pool is off)."""
        with self._cond:
            return self._entry_size()

    def _entry_size(self) -> int:
        if not self._sizes or self.limit <= 0:
            return 0
        want = -(-max(self._sizes) // _ROUND) * _ROUND
        return min(want, self.limit)

    # -- the filling thread ------------------------------------------------------------

    def touch(self) -> None:
        """The daemon served a request: programs are opening, writing or closing files
        now, and the pool waits until ``quiet_s`` passed without one."""
        self._last_request = time.monotonic()  # one float store: no lock needed

    def set_writing(self, n: int) -> None:
        """``n`` files are being written now. The pool fills only while none is: a fill
        running beside a producer's writes slowed them down more than it saved (the
        kernel's page allocation and memory bandwidth are shared), so it uses the gaps
        between output bursts."""
        with self._cond:
            self._writing = n
            if n == 0:
                self._cond.notify_all()

    def run(self) -> None:
        """Fill the pool until ``close`` (the daemon's filling thread): at the lowest CPU
        priority (``SCHED_IDLE``), so the pool uses idle time, never a program's."""
        _lowest_priority()
        while True:
            with self._cond:
                while not self._closed and not self._work():
                    self._cond.wait(self._wait_s())
                if self._closed:
                    return
            if not self.fill_step():
                with self._cond:  # refused by the kernel: try again much later
                    self._cond.wait(60.0)

    def fill_step(self) -> bool:
        """Pre-fault the next :data:`_STEP` bytes of the entry being filled, if there is
        work now (no file being written, room under the limit, memory available); never
        waits. False: nothing was done."""
        with self._cond:
            if self._closed or not self._work():
                return False
            fd, done, size = self._partial
            self._in_step = True  # close() leaves the partial entry to us meanwhile
        try:
            fallocate_keep_size(fd, min(_STEP, size - done), offset=done)
            failed = None
        except OSError as exc:
            failed = exc
        with self._cond:
            self._in_step = False
            if failed is not None or self._closed:
                if failed is not None:
                    self.log.warning("memfd pool: cannot pre-fault %d bytes (%s): not filled",
                                     size, failed.strerror)
                self._drop_partial()
                return False
            done = min(size, done + _STEP)
            self._partial = None if done == size else (fd, done, size)
            if done == size:
                self._ready.append((fd, size))
                if self._held() + size > self.limit:
                    self.log.info("memfd pool: %d entries of %d MiB ready", len(self._ready),
                                  size >> 20)
                self._cond.notify_all()
            return True

    def _work(self) -> bool:
        """(lock held) Whether there is something to fill now; ``self._partial`` is then
        the entry to go on with (a new one is made here). Releases an idle pool."""
        now = time.monotonic()
        idle = now - self._last_take
        if idle >= self.idle_s:
            if self._ready or self._partial:
                self.log.info("memfd pool: idle for %.0f s, %d bytes released", idle,
                              self._held())
                self._release()
            return False
        if self._writing or self._in_step or now - self._last_request < self.quiet_s:
            return False
        if self._partial is not None:
            return True
        size = self._entry_size()
        if not size or self._held() + size > self.limit or not _available_ok(size):
            return False
        fd = self.memory.new("ensio-pool")
        self._partial = (fd, 0, size)
        return True

    def _wait_s(self) -> float | None:
        """(lock held) How long the filling thread sleeps when there is no work: until the
        pool turns idle (it is released then), or until woken (a take, a learn, the last
        writer done, close); a pool short of memory looks again every 5 s."""
        now = time.monotonic()
        idle = now - self._last_take
        if idle >= self.idle_s:
            return None
        quiet = self._last_request + self.quiet_s - now
        if quiet > 0:
            return quiet + 0.01
        return max(0.5, min(5.0, self.idle_s - idle))

    def _held(self) -> int:
        return sum(n for _, n in self._ready) + (self._partial[1] if self._partial else 0)

    def _drop_partial(self) -> None:
        if self._partial is not None:
            os.close(self._partial[0])
            self._partial = None

    def _release(self) -> None:
        while self._ready:
            os.close(self._ready.popleft()[0])
        self._drop_partial()

    def close(self) -> None:
        """Release every entry and stop ``run`` (daemon exit; ``run`` releases an entry it
        is filling right now when its step returns)."""
        with self._cond:
            self._closed = True
            while self._ready:
                os.close(self._ready.popleft()[0])
            if not self._in_step:
                self._drop_partial()
            self._cond.notify_all()
