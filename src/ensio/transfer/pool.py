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

Recycling (issue 28 item 6): a complete file that leaves the table (unlinked, replaced by a
new version, released as consumed) gives its pages to the next producer instead of to the
kernel, when nothing else has it open (:func:`exclusive_writable`: a write lease is
granted only then) and it takes no seals (the huge-page tmpfs of :mod:`.hugemem`; a
sealed memfd can never be written again). It is truncated and its pages allocated again
at once (:meth:`MemfdPool.recycle`): the kernel hands back the blocks just freed, which
the machine has backed. That is what matters on a virtual machine that reports free
memory to its host (virtio-balloon free page reporting): a page freed for a few seconds
is taken back, and writing into it later costs a host fault per page (measured: 64 MiB
into fresh memory 7 ms of CPU right after a free, 120-130 ms some seconds later;
recycled: 7-14 ms); the background fill below allocates from free memory, which such a
host may have taken back already (``fallocate`` does not touch the pages, and the pages
of an empty file cannot be touched), so recycled memory is what avoids those faults. The
pages cannot be kept across the truncate instead: a file must look empty to its next
producer, and shmem frees every page past the size. Recycled memory counts against the
budget its file counted against (it is kept only while the budget's files and the
recycled memory fit in it), is taken before pre-faulted entries (the newest first, same
budget first), and is released with the pool (idle, daemon exit) and when the host's
available memory drops below a tenth;
``limit`` 0 (``pool_mb: 0``) turns recycling off with the pool.

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
import fcntl
import logging
import os
import signal
import threading
import time

from .hugemem import MemorySource

__all__ = ["MemfdPool", "exclusive_writable", "fallocate_keep_size", "supply_memfd", "trim"]

FALLOC_FL_KEEP_SIZE = 0x01
_ROUND = 2 << 20
_HISTORY = 4
_MIN_AVAILABLE_FRACTION = 0.10
_STEP = 4 << 20  # filled between looks at whether a producer started writing
_RECYCLE_MIN = 1 << 20  # smaller files are not worth a descriptor
_RECYCLE_MAX = 256      # recycled entries at most (each is a descriptor of the daemon)

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


def supply_memfd(pool: MemfdPool | None, path: str, key: str = "") -> tuple[int, str | None]:
    """The memory of a new file of budget ``key`` and where it came from: recycled from
    a file that left the table (that file's path), pre-faulted by ``pool`` (""), else
    fresh (None), named after ``path``, from the pool's :class:`~.hugemem.MemorySource`
    (a huge-page tmpfs file, which cannot be sealed, or a memfd, sealing allowed). The
    caller owns it."""
    got = pool.take_for(key) if pool is not None else None
    if got is not None:
        return got
    if pool is not None:
        return pool.memory.new(path), None
    return os.memfd_create(os.path.basename(path) or "ensio",
                           os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING), None


def exclusive_writable(fd: int) -> int | None:
    """A read-write descriptor of ``fd``'s file if no one else has the file open, else
    None; ``fd`` is closed either way (its file is leaving the table).

    No one else: a write lease (``F_SETLEASE``) is granted only when the caller's is the
    only open file description of the file (a reader's descriptor, a mapping, a
    descriptor in flight in a socket all count). It is released at once: once the file
    has left the table no one can get a new descriptor of it. A break in between (an
    open through ``/proc/PID/fd``) would signal the daemon; ``F_SETSIG`` makes that
    ``SIGURG``, ignored by default, instead of ``SIGIO``, which would end it. A file
    with a write seal (a memfd once complete) is never writable again: None.
    """
    try:
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & ~fcntl.F_SEAL_SEAL:
            return None
        rw = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        fcntl.fcntl(rw, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(rw, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        fcntl.fcntl(rw, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError:  # EAGAIN: open elsewhere (EINVAL, EACCES: no leases here)
        os.close(rw)
        return None
    return rw


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
        # recycled memory, oldest first: (fd, bytes, budget key, the file it held)
        self._recycled: collections.deque[tuple[int, int, str, str]] = collections.deque()
        self._sizes: collections.deque[int] = collections.deque(maxlen=_HISTORY)
        self._last_take = time.monotonic()
        self._closed = False
        self._partial: tuple[int, int, int] | None = None  # being filled: fd, done, size
        self._writing = 0  # files being written now (the table says)
        self._in_step = False  # the filling thread works on the partial entry unlocked
        self.taken = 0      # memfds handed out (status, tests)
        self.missed = 0     # takes that found the pool empty
        self.recycled = 0   # files whose memory was kept for the next ones
        self.reused = 0     # new files that took recycled memory

    # -- what the daemon asks --------------------------------------------------------

    def take(self) -> int | None:
        """A pre-faulted memfd (the caller owns it), or None if none is ready."""
        got = self.take_for("")
        return None if got is None else got[0]

    def take_for(self, key: str) -> tuple[int, str] | None:
        """Memory for a new file of budget ``key`` (the caller owns it) and where it came
        from: recycled memory first, the newest of ``key`` else the newest of any budget
        (the path of the file that held it), then a pre-faulted entry (""); None if the
        pool has neither."""
        with self._cond:
            self._last_take = time.monotonic()
            if self._recycled:
                mine = [i for i, r in enumerate(self._recycled) if r[2] == key]
                i = mine[-1] if mine else len(self._recycled) - 1
                fd, _, _, source = self._recycled[i]
                del self._recycled[i]
                self.reused += 1
                return fd, source
            if not self._ready:
                self.missed += 1 if self.limit else 0
                self._cond.notify_all()
                return None
            fd, _ = self._ready.popleft()
            self.taken += 1
            self._cond.notify_all()  # room for another entry
            return fd, ""

    def recycle(self, fd: int, size: int, key: str, source: str, room: int) -> bool:
        """Keep the memory of a file that left the table for the next new file (the pool
        owns ``fd`` from now on, a read-write descriptor no one else has, see
        :func:`exclusive_writable`): truncated, and ``size`` bytes (rounded up to 2 MiB)
        allocated again at once, so the kernel hands back the blocks just freed. Not if
        that would take budget ``key``'s recycled memory past ``room`` bytes, the file is
        small, the pool is closed or the host short of memory: False (``fd`` closed)."""
        want = -(-size // _ROUND) * _ROUND
        with self._cond:
            ok = (not self._closed and self.limit > 0 and size >= _RECYCLE_MIN
                  and self._recycled_bytes(key) + want <= room and _available_ok(want))
        try:
            if ok:
                os.ftruncate(fd, 0)
                fallocate_keep_size(fd, want)
        except OSError:
            ok = False
        with self._cond:
            if not ok or self._closed:
                os.close(fd)
                return False
            self._recycled.append((fd, want, key, source))
            self.recycled += 1
            while len(self._recycled) > _RECYCLE_MAX:
                os.close(self._recycled.popleft()[0])
            return True

    def recycled_bytes(self, key: str) -> int:
        """Bytes of recycled memory kept for budget ``key``."""
        with self._cond:
            return self._recycled_bytes(key)

    def _recycled_bytes(self, key: str) -> int:
        return sum(n for _, n, k, _ in self._recycled if k == key)

    def trim_recycled(self, key: str, room: int) -> None:
        """Release budget ``key``'s recycled memory, oldest first, down to ``room`` bytes
        (its files grew without taking it: the budget bounds both together)."""
        with self._cond:
            while self._recycled_bytes(key) > max(0, room):
                i = next(i for i, r in enumerate(self._recycled) if r[2] == key)
                os.close(self._recycled[i][0])
                del self._recycled[i]

    def learn(self, size: int) -> None:
        """A file of ``size`` bytes was completed: the next entries are sized after it."""
        if self.limit <= 0 or size <= 0:
            return
        with self._cond:
            self._sizes.append(size)
            self._cond.notify_all()

    def held(self) -> int:
        """Bytes pre-faulted in the pool now (entries ready, the one being filled, and
        recycled memory)."""
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
            if self._ready or self._partial or self._recycled:
                self.log.info("memfd pool: idle for %.0f s, %d bytes released", idle,
                              self._held())
                self._release()
            return False
        while self._recycled and not _available_ok(0):  # the host needs it back
            os.close(self._recycled.popleft()[0])
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
        return (sum(n for _, n in self._ready) + (self._partial[1] if self._partial else 0)
                + sum(r[1] for r in self._recycled))

    def _drop_partial(self) -> None:
        if self._partial is not None:
            os.close(self._partial[0])
            self._partial = None

    def _release(self) -> None:
        while self._ready:
            os.close(self._ready.popleft()[0])
        while self._recycled:
            os.close(self._recycled.popleft()[0])
        self._drop_partial()

    def close(self) -> None:
        """Release every entry and stop ``run`` (daemon exit; ``run`` releases an entry it
        is filling right now when its step returns)."""
        with self._cond:
            if self.recycled and not self._closed:
                self.log.info("memory: %d files left their memory for new ones, %d new files "
                              "were written into it", self.recycled, self.reused)
            self._closed = True
            while self._ready:
                os.close(self._ready.popleft()[0])
            while self._recycled:
                os.close(self._recycled.popleft()[0])
            if not self._in_step:
                self._drop_partial()
            self._cond.notify_all()
