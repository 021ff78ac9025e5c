"""The staging daemon, driven through its protocol by the Python client (no interposer).

The client speaks exactly the packets of the C interposer (ensio/transfer/protocol.py),
so these tests pin the daemon's side: sealing, per-consumer descriptors, sync waiting,
producers that die, budgets, persist, names, and the daemon's own life.
"""

from __future__ import annotations

import errno
import fcntl
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import needs
import pytest
from transfer_support import (
    SRC,
    daemon_pid,
    in_process_daemon,
    process_gone,
    teardown_daemon,
    wait_for,
)

from ensio.transfer.daemon import Daemon, serve
from ensio.transfer.protocol import Client, DaemonUnavailable, encode
from ensio.transfer.runtime import daemon_status, ensure_daemon, stop_daemon


@pytest.fixture
def daemon():
    with in_process_daemon("ensio-d-") as dm:
        yield dm


@pytest.fixture
def files(tmp_path):
    """A directory for the transferred names (which must never appear on disk)."""
    d = tmp_path / "fc"
    d.mkdir()
    return d


def memfd(data: bytes = b"") -> int:
    fd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    return fd


def create(c: Client, path, fd: int, **kw):
    fields = dict(path=str(path), conn="cfg:restarts", budget=-1, fallback="files", persist=0,
                  mode="644", excl=0, keep=0, exist=0)
    fields.update(kw)
    return c.request(encode("CREATE", **fields), fd)


def produce(dm: Daemon, path, data: bytes, **kw) -> int:
    """A whole producer: create, write, complete; the entry id."""
    with Client(dm.socket_path, component="model") as c:
        fd = memfd(data)
        r = create(c, path, fd, **kw)
        os.close(fd)
        assert r.verb == "OK", r
        assert c.request(encode("COMPLETE", id=r.get("id"))).verb == "OK"
        return r.int("id")


def read_all(fd: int) -> bytes:
    return os.pread(fd, os.fstat(fd).st_size + 1, 0)


def test_consumers_get_their_own_read_only_descriptor_of_sealed_memory(daemon, files, rng):
    data = rng.bytes(200_000)
    path = files / "mem001.nc"
    with Client(daemon.socket_path, component="model") as prod:
        fd = memfd(data[:1000])
        r = create(prod, path, fd)
        assert r.verb == "OK"
        os.write(fd, data[1000:])
        assert prod.request(encode("COMPLETE", id=r.get("id"))).verb == "OK"
        with pytest.raises(PermissionError):
            os.write(fd, b"changed")  # sealed: the producer's own descriptor is refused too
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 10)
        os.close(fd)
    with Client(daemon.socket_path, component="post") as cons:
        a = cons.request(encode("OPEN", path=str(path), wait_ms=1000))
        b = cons.request(encode("OPEN", path=str(path), wait_ms=1000))
        assert a.verb == b.verb == "OK" and a.get("mode") == "0644"
        assert os.read(a.fd, 10) == data[:10]
        assert os.read(b.fd, 10) == data[:10]  # its own offset
        assert read_all(a.fd) == data
        assert fcntl.fcntl(a.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        with pytest.raises(OSError) as info:
            os.write(a.fd, b"x")
        assert info.value.errno == errno.EBADF
        os.close(a.fd)
        os.close(b.fd)
    assert not path.exists()
    [st] = daemon_status(daemon.dir)
    assert (st.path, st.size, st.state, st.component, st.connection) == (
        str(path), len(data), "complete", "model", "restarts")


def test_a_consumer_waits_for_the_whole_file(daemon, files, rng):
    data = rng.bytes(50_000)
    path = files / "mem002.nc"
    got = {}
    with Client(daemon.socket_path, component="model") as prod:
        fd = memfd(data[:7])
        r = create(prod, path, fd)

        def consumer():
            with Client(daemon.socket_path, component="post") as cons:
                reply = cons.request(encode("OPEN", path=str(path), wait_ms=60_000))
                got["verb"], got["data"] = reply.verb, read_all(reply.fd)
                os.close(reply.fd)

        t = threading.Thread(target=consumer)
        t.start()
        wait_for(lambda: daemon_status(daemon.dir)[0].waiters == 1, what="a waiting consumer")
        st = prod.request(encode("STAT", path=str(path)))  # STAT never waits
        assert st.verb == "OK" and os.fstat(st.fd).st_size == 7
        os.close(st.fd)
        os.write(fd, data[7:])
        assert prod.request(encode("COMPLETE", id=r.get("id"))).verb == "OK"
        os.close(fd)
        t.join(60)
    assert got == {"verb": "OK", "data": data}


def test_a_producer_that_dies_gives_eio_not_a_hang(daemon, files):
    path = files / "mem003.nc"
    prod = Client(daemon.socket_path, component="model")
    fd = memfd(b"CDF\x01 half a file")
    assert create(prod, path, fd).verb == "OK"
    os.close(fd)
    replies = []

    def consumer():
        with Client(daemon.socket_path, component="post") as cons:
            replies.append(cons.request(encode("OPEN", path=str(path), wait_ms=60_000)))

    t = threading.Thread(target=consumer)
    t.start()
    wait_for(lambda: daemon_status(daemon.dir)[0].waiters == 1, what="a waiting consumer")
    prod.close()  # the producer's process is gone
    t.join(60)
    assert replies[0].verb == "ERR" and replies[0].int("errno") == errno.EIO
    with Client(daemon.socket_path, component="post") as cons:
        late = cons.request(encode("OPEN", path=str(path), wait_ms=1000))
        assert late.verb == "ERR" and late.int("errno") == errno.EIO
    [st] = daemon_status(daemon.dir)
    assert st.state == "failed" and st.size == 0  # its memory is released
    log = (daemon.dir / "daemon.log").read_text()
    assert f"{path}: the producer model (pid {os.getpid()}) died before closing it" in log
    assert f"{path}: open by post (pid {os.getpid()}) fails with EIO" in log
    assert "component model" in log
    assert not path.exists()


def test_consumer_timeout_is_an_error_with_a_log_line(daemon, files):
    path = files / "mem004.nc"
    with Client(daemon.socket_path, component="model") as prod:
        fd = memfd(b"x")
        assert create(prod, path, fd).verb == "OK"
        with Client(daemon.socket_path, component="post") as cons:
            r = cons.request(encode("OPEN", path=str(path), wait_ms=50))
        assert r.verb == "ERR" and r.int("errno") == errno.ETIMEDOUT
        os.close(fd)
    assert f"{path}: open by post" in (daemon.dir / "daemon.log").read_text()


def test_absent_files_are_real_files(daemon, files):
    with Client(daemon.socket_path, component="post") as c:
        for verb in ("OPEN", "STAT", "UNLINK"):
            assert c.request(encode(verb, path=str(files / "none.nc"), wait_ms=10)).verb == "ABSENT"
        fd = memfd(b"")
        r = create(c, files / "none.nc", fd, exist=1)
        os.close(fd)
        assert r.verb == "ERR" and r.int("errno") == errno.ENOENT


def test_budget_fallback_files_spills_to_the_real_path(daemon, files, rng):
    first, second = rng.bytes(3000), rng.bytes(3000)
    budget = 4000
    produce(daemon, files / "a.nc", first, budget=budget)
    assert not (files / "a.nc").exists()
    produce(daemon, files / "b.nc", second, budget=budget)  # 6000 > 4000: b goes to disk
    assert (files / "b.nc").read_bytes() == second
    assert [s.path for s in daemon_status(daemon.dir)] == [str(files / "a.nc")]
    with Client(daemon.socket_path, component="model") as c:  # at the budget: new files fall back
        fd = memfd()
        assert create(c, files / "d.nc", fd, budget=3000).verb == "FALLBACK"
        os.close(fd)
    log = (daemon.dir / "daemon.log").read_text()
    assert f"{files / 'b.nc'}: over the memory budget of connection restarts: written" in log
    assert f"{files / 'd.nc'}: connection restarts is at its memory budget: model" in log


def test_budget_fallback_error_fails_with_enospc(daemon, files, rng):
    with Client(daemon.socket_path, component="model") as c:
        fd = memfd(rng.bytes(5000))
        r = create(c, files / "big.nc", fd, budget=4000, fallback="error")
        os.close(fd)
        # a file that grows past the budget is kept (nothing lost), the next open fails
        assert c.request(encode("COMPLETE", id=r.get("id"))).verb == "OK"
        fd = memfd()
        r = create(c, files / "next.nc", fd, budget=4000, fallback="error")
        os.close(fd)
        assert r.verb == "ERR" and r.int("errno") == errno.ENOSPC
        assert c.request(encode("UNLINK", path=str(files / "big.nc"))).verb == "OK"
        produce(daemon, files / "next.nc", b"fits now", budget=4000, fallback="error")
    assert not (files / "big.nc").exists() and not (files / "next.nc").exists()
    assert [s.path for s in daemon_status(daemon.dir)] == [str(files / "next.nc")]
    log = (daemon.dir / "daemon.log").read_text()
    assert f"{files / 'big.nc'}: written by model (pid {os.getpid()}), takes connection " in log
    assert f"{files / 'next.nc'}: connection restarts is at its memory budget: open by model" in log


def test_persist_writes_behind_and_unlink_removes_both(daemon, files, rng):
    data = rng.bytes(10_000)
    path = files / "restart.nc"
    produce(daemon, path, data, persist=1, mode="640")
    wait_for(lambda: daemon_status(daemon.dir)[0].persist == "done", what="write-behind")
    assert path.read_bytes() == data and (path.stat().st_mode & 0o777) == 0o640
    assert not list(files.glob(".*ensio-tmp*"))
    with Client(daemon.socket_path, component="post") as c:
        r = c.request(encode("UNLINK", path=str(path)))
        assert r.verb == "OK" and r.int("ondisk") == 1
    assert daemon_status(daemon.dir) == []


@pytest.mark.parametrize("export", [0, 1], ids=["held-name", "out-of-the-connections"])
def test_rename_of_a_persisted_file_moves_its_real_file(daemon, files, rng, export):
    """A persisted file renamed (to a held name, or out of the connections) leaves no real
    file under its old name: the write-behind copy moves with it, as a rename on disk."""
    data = rng.bytes(5000)
    old, new = files / "mem001.nc.tmp", files / ("mem001.nc" if not export else "out.dat")
    produce(daemon, old, data, persist=1)
    wait_for(lambda: daemon_status(daemon.dir)[0].persist == "done", what="write-behind")
    assert old.read_bytes() == data
    with Client(daemon.socket_path, component="model") as c:
        assert c.request(encode("RENAME", old=str(old), new=str(new),
                                export=export)).verb == "OK"
    assert not old.exists()
    assert new.read_bytes() == data


def test_rename_moves_exports_and_drops(daemon, files):
    produce(daemon, files / "tmp.nc", b"version 1")
    produce(daemon, files / "other.nc", b"other")
    with Client(daemon.socket_path, component="model") as c:
        assert c.request(encode("RENAME", old=str(files / "tmp.nc"), new=str(files / "a.nc"),
                                export=0)).verb == "OK"
        out = files / "exported.nc"
        assert c.request(encode("RENAME", old=str(files / "other.nc"), new=str(out),
                                export=1)).verb == "OK"
        assert out.read_bytes() == b"other"
        assert c.request(encode("DROP", path=str(files / "a.nc"))).verb == "OK"
    assert daemon_status(daemon.dir) == []
    assert not (files / "a.nc").exists() and not (files / "tmp.nc").exists()


def test_a_new_version_never_changes_what_a_reader_has(daemon, files):
    path = files / "mem005.nc"
    produce(daemon, path, b"old content")
    with Client(daemon.socket_path, component="post") as cons:
        old = cons.request(encode("OPEN", path=str(path), wait_ms=1000))
        produce(daemon, path, b"new, longer content", excl=0)
        new = cons.request(encode("OPEN", path=str(path), wait_ms=1000))
        assert read_all(old.fd) == b"old content" and read_all(new.fd) == b"new, longer content"
        os.close(old.fd)
        os.close(new.fd)
    # keep=1 (an open for writing without O_TRUNC) starts from the held content
    with Client(daemon.socket_path, component="model") as c:
        fd = memfd()
        r = create(c, path, fd, keep=1, exist=1)
        assert read_all(fd) == b"new, longer content"
        os.pwrite(fd, b"NEW", 0)
        assert c.request(encode("COMPLETE", id=r.get("id"))).verb == "OK"
        os.close(fd)
        ex = memfd()
        r = create(c, path, ex, excl=1)
        os.close(ex)
        assert r.verb == "ERR" and r.int("errno") == errno.EEXIST
        got = c.request(encode("OPEN", path=str(path), wait_ms=1000))
        assert read_all(got.fd) == b"NEW, longer content"
        os.close(got.fd)


# ---- the daemon's life (separate processes) ---------------------------------------------


@pytest.fixture
def sock_dir():
    """A daemon directory; its daemon is stopped at teardown, an error fails the test."""
    d = Path(tempfile.mkdtemp(prefix="ensio-s-", dir="/tmp"))
    yield d
    teardown_daemon(d)


def _start(d: str, q) -> None:
    sys.path.insert(0, str(SRC))
    ensure_daemon(d)
    with Client(Path(d) / "daemon.sock") as c:
        q.put(c.daemon_pid)


def test_two_starters_at_once_end_with_one_daemon(sock_dir):
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_start, args=(str(sock_dir), q)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    pids = {q.get(timeout=10) for _ in procs}
    assert pids == {daemon_pid(sock_dir)}
    running = subprocess.run(["pgrep", "-f", f"transfer daemon --socket-dir {sock_dir}"],
                             capture_output=True, text=True).stdout.split()
    assert running == [str(daemon_pid(sock_dir))]


def test_stop_writes_out_fallback_files_and_reports_the_rest(sock_dir, files):
    ensure_daemon(sock_dir)
    sock = sock_dir / "daemon.sock"
    pid = daemon_pid(sock_dir)

    class Handle:
        socket_path = sock

    produce(Handle, files / "kept.nc", b"kept bytes")
    produce(Handle, files / "lost.nc", b"lost bytes", fallback="error")
    assert stop_daemon(sock_dir) is True
    wait_for(lambda: process_gone(pid), what="the daemon's exit")
    assert (files / "kept.nc").read_bytes() == b"kept bytes"
    assert not (files / "lost.nc").exists()
    log = (sock_dir / "daemon.log").read_text()
    assert f"{files / 'lost.nc'}: lost at daemon exit (state complete, component model)" in log
    assert stop_daemon(sock_dir) is False
    assert daemon_status(sock_dir) is None


def test_idle_daemon_exits(sock_dir):
    env = dict(os.environ, PYTHONPATH=str(SRC))
    os.chmod(sock_dir, 0o700)
    p = subprocess.run([sys.executable, "-m", "ensio.cli.main", "transfer", "daemon",
                        "--socket-dir", str(sock_dir), "--idle-timeout", "0.2"],
                       env=env, timeout=60, capture_output=True, text=True)
    assert p.returncode == 0
    assert "idle for 0 s: stopping" in (sock_dir / "daemon.log").read_text()
    assert not (sock_dir / "daemon.sock").exists()


NOBODY = 65534


def _serve_as_nobody(d: str) -> None:
    """A forked child: drop to uid/gid 65534, then serve ``d`` like ``ensio transfer daemon``.

    Forked, not exec'd: uid 65534 may not be allowed to read the interpreter or the
    source tree (an interpreter under /root, mode 700), and the modules are loaded.
    """
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    serve(d)


@needs.mark(needs.root, "run a daemon as another user")
def test_a_peer_of_another_user_is_refused(sock_dir):
    os.chown(sock_dir, NOBODY, NOBODY)
    os.chmod(sock_dir, 0o700)
    daemon = multiprocessing.get_context("fork").Process(target=_serve_as_nobody,
                                                         args=(str(sock_dir),))
    daemon.start()
    try:
        wait_for(lambda: (sock_dir / "daemon.sock").exists() or not daemon.is_alive(),
                 what="the daemon's socket")
        assert daemon.is_alive(), f"the daemon of uid {NOBODY} exited: {daemon.exitcode}"
        assert os.stat(sock_dir / "daemon.sock").st_uid == NOBODY
        with pytest.raises(DaemonUnavailable):
            Client(sock_dir / "daemon.sock", timeout=30)  # root reaches the socket, and is refused
        wait_for(lambda: "refused a connection from uid 0" in (sock_dir / "daemon.log").read_text(),
                 what="the refusal in the log")
    finally:
        daemon.terminate()
        daemon.join(60)
    assert daemon.exitcode == 0  # SIGTERM stops it cleanly
