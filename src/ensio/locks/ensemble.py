"""The ensemble lock: one writer of a set of member files at a time.

Every run that writes members (``ensio analyse``, ``ensio recover``, ``ensio
bench io``) holds ``<root>/.ensio-lock`` (``root``: the first member's
directory, where the journal lives) for its whole life. The file records who
holds it (host, pid, the pid's start time in clock ticks since boot, the boot
id, the UTC start time and the command), and the holder keeps an exclusive
``flock`` on it.

Taking the lock:

* **free**: the record is written to a unique temporary file, flocked, then
  ``link``-ed to the lock name (atomic: of two racing runs exactly one link
  succeeds);
* **held by a live run** (its flock is held, or the record names a live
  process of this host): :class:`LockError` at once, naming the holder;
* **left by a dead process of this host** (pid gone, pid reused — another
  start time — or another boot): taken over *in place*: the taker holds the
  dead file's flock while it checks the record and rewrites it, so two runs
  racing for a stale lock cannot both win (the loser's flock fails);
* **held by another host**: never broken automatically (its process cannot be
  checked from here); the message says how to remove it;
* **held by another process of the same run** (the record's ``run`` equals the
  taker's, :func:`run_id`): *joined*, not refused. The ranks of one MPI run
  share a directory this way (one node-local directory for all ranks of a
  node, or a local directory that is also the global one, whose lock rank 0
  already holds): the lock is per directory and per run, not per process, so
  a run never reports its own rank as a foreign holder. A joined lock holds
  nothing of its own; the first holder releases it.

A flock needs a file system that supports it (local file systems, tmpfs, NFS
via POSIX locks, Lustre with ``-o flock``); where it is unsupported the record
alone decides, and a race for a *stale* lock is then not excluded.

Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
from pathlib import Path

from .. import faults
from ..errors import EnsioError, file_op
from .filelock import UNSUPPORTED
from .owner import Holder, process_start

__all__ = ["LOCK_NAME", "EnsembleLock", "LockError", "held_by_me", "lock_path", "read_holder"]

LOCK_NAME = ".ensio-lock"
_NO_LINK = {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}


class LockError(EnsioError):
    """The ensemble is locked by another run (or the lock cannot be taken)."""


def lock_path(root: str | Path) -> Path:
    """The lock file of the ensemble whose journal root is ``root``."""
    return Path(os.path.abspath(root)) / LOCK_NAME


def _read_holder(fd: int) -> Holder | None:
    data = os.pread(fd, 1 << 16, 0)
    return Holder.parse(data.decode(errors="replace"))


def read_holder(root: str | Path) -> Holder | None:
    """The record of the lock of ``root``, or None (no lock, or unreadable)."""
    try:
        text = lock_path(root).read_text(errors="replace")
    except OSError:
        return None
    return Holder.parse(text)


def held_by_me(root: str | Path) -> bool:
    """True if this process holds the lock of ``root``."""
    holder = read_holder(root)
    return (holder is not None and holder.pid == os.getpid() and holder.is_local()
            and holder.pid_start == process_start(os.getpid()))


def _try_flock(fd: int) -> bool:
    """An exclusive flock without waiting: False if another holds it; True if unsupported."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno not in UNSUPPORTED:
            raise
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


class EnsembleLock:
    """The exclusive lock of one ensemble directory (one process: rank 0).

    Parameters
    ----------
    root : path-like
        The journal root (:func:`ensio.io.txn.journal.journal_root` of member 1).
    command : str
        What holds the lock, for the message a second run prints.
    run : str
        The taker's run (:func:`.owner.run_id` of its rank 0): a live holder of the
        same run is joined instead of refused. "" (a lone process): never joins.

    Attributes
    ----------
    taken_over : Holder or None
        The dead holder whose stale lock :meth:`acquire` took over.
    joined : Holder or None
        The live holder of the same run whose lock :meth:`acquire` joined.
    """

    def __init__(self, root: str | Path, command: str, *, run: str = "") -> None:
        self.path = lock_path(root)
        self.command = command
        self.run = run
        self.taken_over: Holder | None = None
        self.joined: Holder | None = None
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0 or self.joined is not None

    def acquire(self) -> EnsembleLock:
        """Take the lock now or raise :class:`LockError` naming the holder."""
        if self.held:
            return self
        me = Holder.current(self.command, self.run)
        self._remove_dead_temporaries()
        for _ in range(16):  # each pass ends or the lock changed hands meanwhile
            with file_op("take the lock", self.path):
                if self._create(me) or self._take_over(me):
                    faults.point("lock-taken")
                    return self
        raise LockError(f"cannot take the lock {self.path}: it keeps changing hands")

    def _remove_dead_temporaries(self) -> None:
        """Unpublished records ``.ensio-lock.PID.HEX`` of processes killed while locking."""
        for tmp in self.path.parent.glob(f"{LOCK_NAME}.*.*"):
            pid = tmp.name.split(".")[2]
            if pid.isdigit() and process_start(int(pid)) is None:
                tmp.unlink(missing_ok=True)

    def _create(self, me: Holder) -> bool:
        """Publish a complete, flocked record under the lock name; False if one exists."""
        tmp = self.path.with_name(f"{LOCK_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            _try_flock(fd)
            os.write(fd, me.encode())
            os.fsync(fd)
            try:
                os.link(tmp, self.path)
            except OSError as exc:
                if exc.errno not in _NO_LINK:
                    raise
                os.close(fd)  # no hard links here: create the name itself
                fd = -1
                fd = self._create_in_place(me)
        except FileExistsError:
            if fd >= 0:
                os.close(fd)
            return False
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        finally:
            tmp.unlink(missing_ok=True)
        self._fd = fd
        return True

    def _create_in_place(self, me: Holder) -> int:
        """Without hard links: O_EXCL on the name (a racer may briefly see an empty record)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        _try_flock(fd)
        os.write(fd, me.encode())
        os.fsync(fd)
        return fd

    def _take_over(self, me: Holder) -> bool:
        """Handle an existing lock file: raise if it is live or foreign, take it if stale."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False  # released meanwhile: create it again
        try:
            flocked = _try_flock(fd)
            holder = _read_holder(fd)
            if not flocked and self._ours(holder):
                os.close(fd)
                self.joined = holder
                return True
            if not flocked:
                raise LockError(self._busy(holder))
            if not _same_file(fd, self.path):
                os.close(fd)
                return False  # released (unlinked) while we opened it
            if holder is None:
                raise LockError(f"{self.path}: unreadable lock record; if no ensio run uses "
                                f"these members, remove it (rm {self.path})")
            if not holder.is_local():
                raise LockError(
                    f"{self._busy(holder)}; a lock of another host is never broken "
                    f"automatically: if that run is gone, remove it (rm {self.path})")
            if holder.alive():  # a live holder without flock support
                if self._ours(holder):
                    os.close(fd)
                    self.joined = holder
                    return True
                raise LockError(self._busy(holder))
            os.ftruncate(fd, 0)  # stale: ours now (we hold its flock)
            os.pwrite(fd, me.encode(), 0)
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        self._fd, self.taken_over = fd, holder
        return True

    def _ours(self, holder: Holder | None) -> bool:
        """The holder is a process of this lock's own run."""
        return bool(self.run) and holder is not None and holder.run == self.run

    def _busy(self, holder: Holder | None) -> str:
        who = holder.describe() if holder is not None else "another run (record being written)"
        return f"members locked by {who}: {self.path}"

    def release(self) -> None:
        """Remove the lock file (if it is still ours) and drop the flock. Idempotent.

        A joined lock only forgets it: its first holder releases the file.
        """
        self.joined = None
        if self._fd < 0:
            return
        try:
            if _same_file(self._fd, self.path):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> EnsembleLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
