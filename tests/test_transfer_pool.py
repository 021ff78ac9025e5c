"""The staging daemon's pool of pre-faulted memfds (ensio/transfer/pool.py).

What must hold with the pool as without it: the consumer reads exactly the bytes
written, a connection's ``memory_mb`` counts its files as before, a producer that
dies leaves EIO, and the pool's memory goes when the daemon stops. And what the
pool is for: a memfd it hands out already has its pages (``st_blocks``) while its
size is 0, and a completed file holds no more than its own pages.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    Host,
    host_fixture,
    in_process_daemon,
    interposer_cache_fixture,
    wait_for,
    write_config,
)

from ensio.transfer.daemon import Daemon
from ensio.transfer.pool import MemfdPool, trim
from ensio.transfer.protocol import Client, encode

MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL


def allocated(fd: int) -> int:
    """Bytes of memory the file holds (its pages), whatever its size says."""
    return os.fstat(fd).st_blocks * 512


def pool_fds() -> list[int]:
    """This process's descriptors of pool memfds (the daemon runs in the test process)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if "memfd:ensio-pool" in os.readlink(f"/proc/self/fd/{name}"):
                out.append(int(name))
        except OSError:
            pass
    return out


def fill(pool: MemfdPool) -> int:
    """Run the pool's filling to its end in this thread; the steps it took."""
    steps = 0
    while pool.fill_step():
        steps += 1
    return steps


# -- the pool alone -------------------------------------------------------------------


@pytest.fixture
def pool():
    p = MemfdPool(10 * MIB, logging.getLogger("test-pool"))
    yield p
    p.close()


def test_entries_are_sized_after_completed_files_and_stay_within_the_limit(pool):
    assert fill(pool) == 0  # no file completed yet: nothing known, nothing filled
    pool.learn(3_000_000)  # → entries of 4 MiB (rounded up to 2 MiB), two fit in 10 MiB
    fill(pool)
    assert pool.held() == 8 * MIB
    fd = pool.take()
    assert fd is not None
    try:
        assert os.fstat(fd).st_size == 0  # looks empty to the program
        assert allocated(fd) >= 4 * MIB  # but its pages are there
    finally:
        os.close(fd)
    assert pool.held() == 4 * MIB
    fill(pool)
    assert pool.held() == 8 * MIB


def test_the_pool_does_not_fill_while_a_file_is_being_written(pool):
    pool.learn(2 * MIB)
    pool.set_writing(1)
    assert fill(pool) == 0 and pool.held() == 0
    pool.set_writing(0)
    assert fill(pool) > 0 and pool.held() == 10 * MIB


def test_the_pool_waits_for_a_quiet_moment_after_the_daemons_last_request():
    p = MemfdPool(4 * MIB, logging.getLogger("test-pool"), quiet_s=0.3)
    try:
        p.learn(MIB)
        p.touch()  # a program just opened or closed a file: it is busy with it now
        assert fill(p) == 0
        wait_for(p.fill_step, timeout=30, what="the pool filling once quiet")
        fill(p)
        assert p.held() == 4 * MIB
    finally:
        p.close()


def test_an_empty_pool_answers_none_and_close_releases_every_entry(pool):
    assert pool.take() is None and pool.missed == 1
    pool.learn(MIB)
    fill(pool)
    assert len(pool_fds()) == 5
    pool.close()
    assert pool_fds() == [] and pool.held() == 0
    assert pool.take() is None and fill(pool) == 0


def test_trim_after_sealing_frees_the_unused_tail(pool, rng):
    pool.learn(8 * MIB)
    fill(pool)
    fd = pool.take()
    data = rng.bytes(5000)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    trim(fd)
    assert allocated(fd) <= -(-len(data) // PAGE) * PAGE
    assert os.pread(fd, len(data) + 1, 0) == data
    os.close(fd)


# -- in the daemon ----------------------------------------------------------------------


@pytest.fixture
def daemon():
    with in_process_daemon("ensio-p-", pool_mb=16) as dm:
        yield dm


def create(c: Client, path: Path, **kw):
    """CREATE without a descriptor: the daemon supplies the memory."""
    fields = dict(path=str(path), conn="cfg:restarts", budget=-1, fallback="files", persist=0,
                  mode="644", excl=0, keep=0, exist=0)
    fields.update(kw)
    return c.request(encode("CREATE", **fields))


def write_file(dm: Daemon, path: Path, data: bytes, **kw):
    """A whole producer through the daemon's memory; the CREATE reply (its fd closed) and
    the bytes the memfd held when it was handed out."""
    with Client(dm.socket_path, component="model") as c:
        r = create(c, path, **kw)
        if r.verb != "OK":
            return r, 0
        assert r.fd is not None and os.fstat(r.fd).st_size == 0
        had = allocated(r.fd)
        os.write(r.fd, data)
        os.close(r.fd)
        assert c.request(encode("COMPLETE", id=r.get("id"))).verb == "OK"
        return r, had


def read_back(dm: Daemon, path: Path) -> tuple[bytes, int]:
    """What a consumer reads of ``path``, and the bytes of memory the file holds."""
    with Client(dm.socket_path, component="post") as c:
        r = c.request(encode("OPEN", path=str(path), wait_ms=5000))
        assert r.verb == "OK", r
        try:
            return os.pread(r.fd, os.fstat(r.fd).st_size + 1, 0), allocated(r.fd)
        finally:
            os.close(r.fd)


def test_later_files_get_pre_faulted_memory_and_read_back_identical(daemon, tmp_path, rng):
    files = [tmp_path / f"mem{i:03d}.nc" for i in range(1, 4)]
    datas = [rng.bytes(3_000_000 + 1000 * i) for i in range(3)]
    _, had = write_file(daemon, files[0], datas[0])
    assert had == 0  # the first file: nothing was known to fill the pool with
    for path, data in zip(files[1:], datas[1:], strict=True):
        wait_for(lambda: daemon.pool.held() == 16 * MIB, what="the pool filled")
        _, had = write_file(daemon, path, data)
        assert had >= 4 * MIB
    assert daemon.pool.taken == 2
    for path, data in zip(files, datas, strict=True):
        got, holds = read_back(daemon, path)
        assert got == data
        assert holds <= -(-len(data) // PAGE) * PAGE  # the pooled tail was trimmed
    assert not any(p.exists() for p in files)


def test_the_pool_is_not_counted_in_a_connections_budget(daemon, tmp_path, rng):
    """memory_mb counts the connection's files by size, as without a pool: the pool's
    16 MiB (more than the budget) neither refuses the second file nor admits a third."""
    budget = 5_000_000
    sizes = [3_000_000, 3_000_000, 10]
    replies = []
    for i, n in enumerate(sizes):
        if i:
            wait_for(lambda: daemon.pool.held() == 16 * MIB, what="the pool filled")
        r, _ = write_file(daemon, tmp_path / f"m{i}.nc", rng.bytes(n), budget=budget,
                          fallback="error")
        replies.append(r.verb if r.verb == "OK" else r.int("errno"))
    assert replies == ["OK", "OK", errno.ENOSPC]
    assert daemon.pool.held() <= daemon.pool.limit


def test_a_producer_dying_with_pooled_memory_gives_eio(daemon, tmp_path, rng):
    write_file(daemon, tmp_path / "warm.nc", rng.bytes(2 * MIB))
    wait_for(lambda: daemon.pool.held() == 16 * MIB, what="the pool filled")
    path = tmp_path / "mem001.nc"
    with Client(daemon.socket_path, component="model") as c:
        r = create(c, path)
        assert r.verb == "OK" and allocated(r.fd) >= 2 * MIB
        assert not daemon.pool.fill_step()  # room for an entry, but a file is being written
        os.write(r.fd, rng.bytes(MIB))
        os.close(r.fd)
    # the producer's connection closed without COMPLETE: it died
    with Client(daemon.socket_path, component="post") as c:
        got = c.request(encode("OPEN", path=str(path), wait_ms=5000))
    assert (got.verb, got.int("errno")) == ("ERR", errno.EIO)


def test_the_pool_is_released_when_the_daemon_stops(tmp_path, rng):
    d = Path(tempfile.mkdtemp(prefix="ensio-p-", dir="/tmp"))
    os.chmod(d, 0o700)
    try:
        dm = Daemon(d, idle_timeout=3600, pool_mb=16)
        t = threading.Thread(target=dm.serve_forever, daemon=True)
        t.start()
        write_file(dm, tmp_path / "mem001.nc", rng.bytes(4 * MIB))
        wait_for(lambda: dm.pool.held() == 16 * MIB, what="the pool filled")
        assert len(pool_fds()) == 4
        dm.stop()
        t.join(60)
        assert not t.is_alive()
        assert pool_fds() == [] and dm.pool.held() == 0
        assert "memfd pool: 0 new files took pre-faulted memory" in (d / "daemon.log").read_text()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_pool_zero_hands_out_plain_memfds(tmp_path, rng):
    d = Path(tempfile.mkdtemp(prefix="ensio-p-", dir="/tmp"))
    os.chmod(d, 0o700)
    try:
        dm = Daemon(d, idle_timeout=3600, pool_mb=0)
        t = threading.Thread(target=dm.serve_forever, daemon=True)
        t.start()
        datas = [rng.bytes(MIB + i) for i in range(2)]
        for i, data in enumerate(datas):
            _, had = write_file(dm, tmp_path / f"m{i}.nc", data)
            assert had == 0
        assert dm.pool.held() == 0 and dm.pool.taken == 0
        assert [read_back(dm, tmp_path / f"m{i}.nc")[0] for i in range(2)] == datas
        dm.stop()
        t.join(60)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# -- through the interposer, with a real program ------------------------------------------

WRITER = r"""
import os, sys
path, seed, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import random
data = random.Random(seed).randbytes(size)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for off in range(0, size, 1 << 20):
    os.pwrite(fd, data[off:off + (1 << 20)], off)
if len(sys.argv) > 4:  # stop half-way and wait to be killed
    print("written", flush=True)
    sys.stdin.read()
os.close(fd)
"""

READER = r"""
import hashlib, sys
print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())
"""


def _expected(seed: int, size: int) -> str:
    import hashlib
    import random

    return hashlib.sha256(random.Random(seed).randbytes(size)).hexdigest()


def test_unmodified_programs_through_the_pool(host: Host):
    """A program's second file goes into pooled memory; both read back identical; a
    producer killed while writing into pooled memory gives its consumer EIO."""
    (host.work / "fc").mkdir()
    config = write_config(host.work / "t.yaml", ["fc/mem*.nc"])
    size = 3 * MIB + 12345
    for i in (1, 2):
        p = host.run(config, "model", sys.executable, "-c", WRITER, f"fc/mem00{i}.nc", str(i),
                     str(size))
        assert p.returncode == 0, p.stderr
        if i == 1:
            wait_for(lambda: "memfd pool:" in host.log() and "ready" in host.log(),
                     what="the pool filled after the first file")
    for i in (1, 2):
        got = host.run(config, "post", sys.executable, "-c", READER, f"fc/mem00{i}.nc")
        assert got.returncode == 0, got.stderr
        assert got.stdout.strip() == _expected(i, size)
    prod = host.start(config, "model", sys.executable, "-c", WRITER, "fc/mem003.nc", "3",
                      str(size), "hold")
    assert prod.stdout.readline() == "written\n"
    os.kill(prod.pid, signal.SIGKILL)  # ensio run exec'd: this is the producer itself
    prod.wait(60)
    late = host.run(config, "post", sys.executable, "-c", READER, "fc/mem003.nc")
    assert late.returncode != 0 and "[Errno 5] Input/output error" in late.stderr
    assert not (host.work / "fc" / "mem003.nc").exists()
    stop = host.ensio("transfer", "stop")
    assert stop.returncode == 0, stop.stderr
    assert "memfd pool: 2 new files took pre-faulted memory" in host.log()


def test_the_configs_pool_mb_sizes_the_pool_of_the_daemon_ensio_run_starts(host: Host):
    import yaml

    (host.work / "fc").mkdir()
    config = write_config(host.work / "t.yaml", ["fc/mem*.nc"])
    raw = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**raw, "pool_mb": 48}))
    p = host.run(config, "model", sys.executable, "-c", "pass")
    assert p.returncode == 0, p.stderr
    assert "memfd pool 48 MiB" in host.log()
