"""Blocking locks between processes on a shared file system (the to-do list's).

Three mechanisms, because no single one works everywhere:

``flock``
    :func:`fcntl.flock` on a lock file. Works on local disks, GPFS, Lustre
    mounted with ``-o flock`` and Linux NFS clients (which emulate it with
    POSIX locks since 2.6.12). Refused with ``ENOSYS``/``EOPNOTSUPP``/``ENOLCK``
    on Lustre's default ``noflock`` and on some NFS set-ups without a lock
    manager. Released by the kernel when the holder dies.
``lockf``
    POSIX record locks (:func:`fcntl.lockf`); NFS through NLM/NFSv4 locks.
    They belong to the *process*, not the file descriptor: threads of one
    process never exclude each other and closing any descriptor of the file
    drops the lock, so every lock here is also guarded by an in-process mutex
    and the lock file is opened by nobody else. Released when the holder dies.
``mkdir``
    The last resort that works on any file system with atomic ``rename`` of
    directories (NFS, Lustre, object-store FUSE mounts excepted): the lock is
    a directory ``NAME.d`` holding an ``owner`` file (host, pid, random id,
    time), created as a private directory and renamed into place, so the
    lock directory is never empty and a rename onto it fails while it is held.
    A holder that dies leaves it behind: a lock older than ``stale_after``
    seconds (default 30 s, while holds last milliseconds) is broken by
    renaming it away; the breaker then checks that it removed the owner it
    judged stale and otherwise puts the lock back. Assumes clocks agree to
    well within ``stale_after`` and that no live holder stalls that long; the
    remaining window (two breakers and a third acquirer racing within a few
    microseconds of each other on a lock that is already stale) is documented
    rather than closed.

:func:`detect_lock_kind` tries them in that order on the directory of the
list. The choice is made once, when a list is created, and recorded next to
it, because jobs using *different* mechanisms would not exclude each other.
Lustre mounted with ``-o localflock`` accepts ``flock`` but only within one
node; it cannot be detected, so choose ``lockf`` or ``mkdir`` there.
"""

from __future__ import annotations

import abc
import errno
import fcntl
import json
import os
import secrets
import shutil
import socket
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from .owner import Holder, command_line

__all__ = [
    "LOCK_KINDS",
    "FileLock",
    "LockKind",
    "LockUnsupported",
    "detect_lock_kind",
    "make_lock",
    "owner_record",
]

LockKind = Literal["flock", "lockf", "mkdir"]
LOCK_KINDS: tuple[LockKind, ...] = ("flock", "lockf", "mkdir")

#: errno values meaning "this file system does not do this kind of lock" (both modules).
UNSUPPORTED = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOLCK, errno.ENOSYS, errno.EINVAL}
)

_MUTEXES: dict[str, threading.Lock] = {}
_MUTEXES_GUARD = threading.Lock()


class LockUnsupported(OSError):
    """The file system refuses this kind of lock (see the module docstring)."""


def _mutex(path: Path) -> threading.Lock:
    key = os.path.realpath(path)
    with _MUTEXES_GUARD:
        return _MUTEXES.setdefault(key, threading.Lock())


class FileLock(abc.ABC):
    """An exclusive lock between processes (and threads) on a shared file system."""

    kind: LockKind

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._mutex = _mutex(self.path)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Block until the lock is held by this thread."""
        self._mutex.acquire()
        try:
            self._acquire()
        except BaseException:
            self._mutex.release()
            raise

    def release(self) -> None:
        """Release the lock (also when the file-system part fails)."""
        try:
            self._release()
        finally:
            self._mutex.release()

    @abc.abstractmethod
    def _acquire(self) -> None: ...

    @abc.abstractmethod
    def _release(self) -> None: ...


class _FcntlLock(FileLock):
    """``flock`` or ``lockf`` on ``path`` (created if missing, never replaced)."""

    def __init__(self, path: str | Path, kind: Literal["flock", "lockf"]) -> None:
        super().__init__(path)
        self.kind = kind
        self._fd: int | None = None

    def _call(self, fd: int, op: int) -> None:
        if self.kind == "flock":
            fcntl.flock(fd, op)
        else:
            fcntl.lockf(fd, op)

    def _acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._call(fd, fcntl.LOCK_EX)
        except OSError as exc:
            os.close(fd)
            if exc.errno in UNSUPPORTED:
                raise LockUnsupported(
                    exc.errno,
                    f"{self.kind} locks are not supported on the file system of {self.path} "
                    f"({os.strerror(exc.errno or 0)}); create the list with lock='mkdir'",
                ) from None
            raise
        self._fd = fd

    def _release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            self._call(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


class MkdirLock(FileLock):
    """A lock directory with an owner file and stale-lock recovery (module docstring)."""

    kind: LockKind = "mkdir"

    def __init__(self, path: str | Path, stale_after: float = 30.0) -> None:
        super().__init__(path)
        self.stale_after = float(stale_after)
        self._me: str | None = None

    def _owner_of(self, directory: Path) -> dict | None:
        try:
            return json.loads((directory / "owner").read_text())
        except (OSError, ValueError):
            return None

    def _acquire(self) -> None:
        me = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"
        private = self.path.with_name(f"{self.path.name}.new.{secrets.token_hex(6)}")
        os.mkdir(private)
        delay = 0.0005
        try:
            while True:
                (private / "owner").write_text(owner_record(me))
                try:
                    os.rename(private, self.path)  # fails while the lock is held
                    self._me = me
                    return
                except OSError:
                    # NFS may report an error for a rename that succeeded on a retry.
                    got = self._owner_of(self.path)
                    if got is not None and got.get("owner") == me:
                        self._me = me
                        return
                self._maybe_break()
                time.sleep(delay)
                delay = min(2 * delay, 0.02)
        finally:
            if self._me != me:
                shutil.rmtree(private, ignore_errors=True)

    def _maybe_break(self) -> None:
        seen = self._owner_of(self.path)
        try:
            born = seen["time"] if seen else os.stat(self.path).st_mtime
        except (OSError, KeyError, TypeError):
            return
        if time.time() - float(born) < self.stale_after:
            return
        grave = self.path.with_name(f"{self.path.name}.stale.{secrets.token_hex(6)}")
        try:
            os.rename(self.path, grave)
        except OSError:
            return  # released or broken by someone else meanwhile
        got = self._owner_of(grave)
        if seen is not None and (got is None or got.get("owner") != seen.get("owner")):
            try:  # we removed a fresh lock, not the stale one: give it back
                os.rename(grave, self.path)
                return
            except OSError:
                pass
        shutil.rmtree(grave, ignore_errors=True)

    def _release(self) -> None:
        me, self._me = self._me, None
        got = self._owner_of(self.path)
        if got is None or got.get("owner") != me:
            return  # our lock was broken as stale; never remove someone else's
        grave = self.path.with_name(f"{self.path.name}.free.{secrets.token_hex(6)}")
        try:
            os.rename(self.path, grave)
        except OSError:
            return
        shutil.rmtree(grave, ignore_errors=True)

    def still_held(self) -> bool:
        """Whether the lock directory still names this holder (checked before commits)."""
        got = self._owner_of(self.path)
        return self._me is not None and got is not None and got.get("owner") == self._me


def owner_record(token: str) -> str:
    """The ``owner`` file of a mkdir lock: the one owner record (:class:`.owner.Holder`).

    Plus the holder's unique ``owner`` token (what a release or a breaker
    compares) and ``time`` (seconds since the epoch, what staleness is judged
    by); the keys of the older ``{owner, host, pid, time}`` record are kept,
    so a lock directory left by an older version is still judged and broken.
    """
    record = asdict(Holder.current(command_line()))
    return json.dumps({**record, "owner": token, "time": time.time()})


def make_lock(kind: LockKind, base: str | Path, stale_after: float = 30.0) -> FileLock:
    """The lock of kind ``kind`` for the list at ``base`` (``base.lock`` / ``base.lock.d``)."""
    base = Path(base)
    if kind in ("flock", "lockf"):
        return _FcntlLock(base.with_name(base.name + ".lock"), kind)  # type: ignore[arg-type]
    if kind == "mkdir":
        return MkdirLock(base.with_name(base.name + ".lock.d"), stale_after)
    raise ValueError(f"unknown lock kind {kind!r} (one of {', '.join(LOCK_KINDS)})")


def detect_lock_kind(directory: str | Path) -> LockKind:
    """The first lock kind the file system of ``directory`` accepts (flock → lockf → mkdir)."""
    probe = Path(directory) / f".ensio-lockprobe-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for kind, call in (("flock", fcntl.flock), ("lockf", fcntl.lockf)):
            try:
                call(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in UNSUPPORTED:
                    continue
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    return kind  # type: ignore[return-value]  # held: supported
                raise
            call(fd, fcntl.LOCK_UN)
            return kind  # type: ignore[return-value]
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    return "mkdir"
