"""Shared pieces of the transfer tests: a private daemon directory, ``ensio run``, waiting.

Test modules import the fixtures ``host_fixture`` and ``interposer_cache_fixture``
(registered as ``host`` and ``interposer_cache``). Every test gets its own socket
directory under /tmp (a Unix socket path must stay under 108 bytes, which pytest's
tmp_path may exceed) and its own daemon, stopped (or killed) at teardown. The interposer
is built once per session into a private cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import needs
import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

CDL = """netcdf sample {
dimensions:
  time = UNLIMITED ; lat = 3 ; lon = 4 ;
variables:
  double time(time) ; time:units = "hours since 2000-01-01" ;
  float lat(lat) ; lat:units = "degrees_north" ;
  float lon(lon) ; lon:units = "degrees_east" ;
  float temp(time, lat, lon) ; temp:units = "K" ;
  int count(lat) ;
  :title = "transfer test" ;
data:
  time = 0, 6 ;
  lat = -30, 0, 30 ;
  lon = 0, 90, 180, 270 ;
  temp = 280.5, 281, 282, 283, 284, 285, 286, 287, 288, 289, 290, 291.25,
         270, 271, 272, 273, 274, 275, 276, 277, 278, 279, 280, 281 ;
  count = 1, 2, 3 ;
}
"""


def wait_for(cond: Callable[[], object], timeout: float = 30.0, what: str = "condition"):
    """Poll ``cond`` until it returns something true; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def daemon_pid(sock_dir: Path) -> int:
    """The pid the running daemon wrote into its lock file."""
    return int((sock_dir / "daemon.lock").read_text().split()[0])


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie of ours still answers kill(0): look at its state
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    return False


@pytest.fixture(scope="session", name="interposer_cache")
def interposer_cache_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private XDG cache with the interposer built once (needs a C compiler)."""
    cc = os.environ.get("CC", "cc")
    needs.capability("a C compiler to build the transfer interposer",
                     None if shutil.which(cc) or shutil.which("gcc") else f"no {cc} nor gcc")
    cache = tmp_path_factory.mktemp("xdg-cache")
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONPATH=str(SRC))
    subprocess.run([sys.executable, "-m", "ensio.cli.main", "transfer", "build"], env=env,
                   check=True, capture_output=True)
    return cache


class Host:
    """One test's daemon directory and the environment of its ``ensio`` commands."""

    def __init__(self, sock_dir: Path, cache: Path, work: Path) -> None:
        self.dir = sock_dir
        self.work = work
        self.env = dict(os.environ, PYTHONPATH=str(SRC), ENSIO_TRANSFER_DIR=str(sock_dir),
                        XDG_CACHE_HOME=str(cache))
        self.env.pop("LD_PRELOAD", None)

    def ensio(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ensio.cli.main", *args], env=self.env,
                              cwd=self.work, capture_output=True, text=kw.pop("text", True),
                              timeout=kw.pop("timeout", 120), **kw)

    def run(self, config: Path, component: str, *cmd: str, **kw) -> subprocess.CompletedProcess:
        """``ensio run --transfer config --component component -- cmd``, finished."""
        return self.ensio("run", "--transfer", str(config), "--component", component, "--",
                          *cmd, **kw)

    def start(self, config: Path, component: str, *cmd: str, **kw) -> subprocess.Popen:
        """The same, started (stdin/stdout/stderr pipes)."""
        return subprocess.Popen(
            [sys.executable, "-m", "ensio.cli.main", "run", "--transfer", str(config),
             "--component", component, "--", *cmd], env=self.env, cwd=self.work,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            **kw)

    def status(self):
        from ensio.transfer.runtime import daemon_status

        return daemon_status(self.dir)

    def log(self) -> str:
        path = self.dir / "daemon.log"
        return path.read_text() if path.exists() else ""


@pytest.fixture(name="host")
def host_fixture(interposer_cache: Path, tmp_path: Path) -> Iterator[Host]:
    """A fresh daemon directory; whatever daemon runs there is stopped at the end."""
    sock_dir = Path(tempfile.mkdtemp(prefix="ensio-t-", dir="/tmp"))
    work = tmp_path / "work"
    work.mkdir()
    h = Host(sock_dir, interposer_cache, work)
    yield h
    teardown_daemon(sock_dir)


def lock_held(sock_dir: Path) -> bool:
    """Whether a live daemon holds ``daemon.lock`` in ``sock_dir``."""
    try:
        fd = os.open(sock_dir / "daemon.lock", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def teardown_daemon(sock_dir: Path) -> None:
    """Stop the daemon of ``sock_dir`` (kill it if it will not stop), remove the directory.

    Why errors surface: a daemon that does not stop on request is a bug these tests
    are here to find, so an error of ``stop_daemon`` fails the test (after the
    cleanup), and so does a daemon still holding its lock afterwards (it is killed).
    Only the lock tells a live daemon: its pid stays in the file after it exits.
    """
    from ensio.transfer.runtime import stop_daemon

    try:
        stop_daemon(sock_dir, timeout=30)
    finally:
        held = lock_held(sock_dir)
        if held:
            with contextlib.suppress(ProcessLookupError):  # it may just have exited
                os.kill(daemon_pid(sock_dir), signal.SIGKILL)
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert not held, f"a daemon still held {sock_dir / 'daemon.lock'} after stop_daemon (killed)"


def write_config(path: Path, files: list[str], **conn: object) -> Path:
    """A two-component config (model → post) with one connection ``restarts``."""
    import yaml

    connection = {"name": "restarts", "from": "model", "to": "post", "files": files}
    connection.update(conn)
    path.write_text(yaml.safe_dump({"components": ["model", "post"],
                                    "connections": [connection]}))
    return path


@contextlib.contextmanager
def in_process_daemon(prefix: str, **options: object) -> Iterator[object]:
    """A staging daemon serving on a thread of this process, in a fresh 0700 directory
    under /tmp (socket paths must stay short); stopped and removed afterwards."""
    import threading

    from ensio.transfer.daemon import Daemon

    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(d, 0o700)
    dm = Daemon(d, idle_timeout=3600, **options)
    t = threading.Thread(target=dm.serve_forever, daemon=True)
    t.start()
    try:
        yield dm
    finally:
        dm.stop()
        t.join(60)
        shutil.rmtree(d, ignore_errors=True)
