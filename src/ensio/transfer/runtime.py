"""Where the daemon lives, and starting, stopping and asking it.

The socket directory is ``--socket-dir``, else ``$ENSIO_TRANSFER_DIR``, else
``$XDG_RUNTIME_DIR/ensio-transfer``, else ``/tmp/ensio-transfer-<uid>``. It must be
a real directory owned by this user with no access for others (0700): the socket's
permission is the first of the two checks (the daemon's ``SO_PEERCRED`` is the
second).

Starting is race-free: a starter takes ``start.lock`` (``flock``), looks for a
daemon again, and only then starts one, detached (its own session, reparented to
init, so the program ``ensio run`` becomes never has to reap it); the daemon itself
holds ``daemon.lock`` for its life, so even daemons started by hand or by job
scripts never run twice in one directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import TransferError
from .launch import socket_dir_path
from .protocol import LOCK_NAME, LOG_NAME, SOCKET_NAME, Client, DaemonUnavailable, FileStatus

__all__ = ["daemon_status", "ensure_daemon", "prepare_dir", "socket_dir", "stop_daemon"]

_POLL = 0.02  # seconds between looks at a condition we cannot be notified of


def socket_dir(given: str | os.PathLike | None = None) -> Path:
    """The socket directory (not created; the rule is :func:`.launch.socket_dir_path`)."""
    return Path(socket_dir_path(None if given is None else os.fspath(given)))


def prepare_dir(path: str | os.PathLike) -> Path:
    """Create the socket directory (0700) or check that an existing one is safe.

    Raises
    ------
    TransferError
        It is not a directory, belongs to another user, or others may enter it.
    """
    path = Path(path)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise TransferError(f"transfer socket directory {path}: not a directory")
    if st.st_uid != os.getuid():
        raise TransferError(f"transfer socket directory {path}: owned by uid {st.st_uid}, "
                            f"not this user ({os.getuid()})")
    if st.st_mode & 0o077:
        raise TransferError(f"transfer socket directory {path}: mode "
                            f"{stat.S_IMODE(st.st_mode):04o}, must be 0700 (others must not "
                            "reach the socket)")
    return path


def _alive(path: Path) -> bool:
    try:
        with Client(path / SOCKET_NAME, timeout=5.0):
            return True
    except (DaemonUnavailable, OSError):
        return False


@contextlib.contextmanager
def _start_lock(path: Path) -> Iterator[None]:
    fd = os.open(path / "start.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure_daemon(directory: str | os.PathLike | None = None, idle_timeout: float = 600.0,
                  timeout: float = 30.0, pool_mb: float | None = None) -> Path:
    """The socket of a running daemon, started first if there is none.

    ``pool_mb``: the memfd pool of a daemon started here (None: ``$ENSIO_TRANSFER_POOL_MB``,
    else the daemon's default); a daemon already running keeps its own.

    Raises
    ------
    TransferError
        The daemon did not answer within ``timeout`` (its log is named).
    """
    path = prepare_dir(socket_dir(directory))
    if _alive(path):
        return path / SOCKET_NAME
    with _start_lock(path):
        if _alive(path):
            return path / SOCKET_NAME
        pid = _spawn(path, idle_timeout, pool_mb)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _alive(path):
                return path / SOCKET_NAME
            if not _process_exists(pid) and not _lock_held(path):
                break
            time.sleep(_POLL)
    raise TransferError(f"the staging daemon did not start in {path}: see {path / LOG_NAME}")


def _spawn(path: Path, idle_timeout: float, pool_mb: float | None = None) -> int:
    """Start ``ensio transfer daemon`` detached (double fork); its pid."""
    import ensio

    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    src = str(Path(ensio.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "ensio.cli.main", "transfer", "daemon",
            "--socket-dir", str(path), "--idle-timeout", str(idle_timeout)]
    if pool_mb is None and os.environ.get("ENSIO_TRANSFER_POOL_MB"):
        pool_mb = _pool_from_env(os.environ["ENSIO_TRANSFER_POOL_MB"])
    if pool_mb is not None:
        argv += ["--pool-mb", str(pool_mb)]
    log = os.open(path / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the intermediate and daemon processes
        try:
            os.close(r)
            os.setsid()
            grandchild = os.fork()
            if grandchild:
                os.write(w, str(grandchild).encode())
                os._exit(0)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # hold none of the starter's pipes open
            os.execve(sys.executable, argv, env)
        finally:
            os._exit(127)
    os.close(w)
    os.close(log)
    os.waitpid(child, 0)
    with os.fdopen(r, "rb") as f:
        text = f.read().decode() or "0"
    return int(text)


def _pool_from_env(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise TransferError(f"ENSIO_TRANSFER_POOL_MB: expected MiB (0 or more), got {text!r}")
    return value


def _process_exists(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lock_held(path: Path) -> bool:
    """Whether a daemon holds ``daemon.lock`` (a live daemon, perhaps not listening yet)."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def stop_daemon(directory: str | os.PathLike | None = None, timeout: float = 150.0) -> bool:
    """Stop the daemon and wait until it has exited; False if none was running.

    Raises
    ------
    TransferError
        It did not exit within ``timeout``.
    """
    path = socket_dir(directory)
    try:
        with Client(path / SOCKET_NAME, timeout=timeout) as c:
            c.stop()
    except DaemonUnavailable:
        return False
    deadline = time.monotonic() + timeout
    while _lock_held(path):
        if time.monotonic() > deadline:
            raise TransferError(f"the staging daemon in {path} did not exit within {timeout:.0f} s")
        time.sleep(_POLL)
    return True


def daemon_status(directory: str | os.PathLike | None = None) -> list[FileStatus] | None:
    """The files the daemon holds, or None if no daemon runs."""
    path = socket_dir(directory)
    try:
        with Client(path / SOCKET_NAME) as c:
            return c.status()
    except DaemonUnavailable as exc:
        if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.ECONNRESET, errno.EPROTO):
            raise
        return None
