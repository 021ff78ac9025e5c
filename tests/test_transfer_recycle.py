"""Recycling held files' memory across cycles (issue 28 item 6, ensio/transfer/pool.py).

A complete file that leaves the daemon's table (unlinked, replaced by a new version)
gives its pages to the next new file when no one else has it open, within its budget.
Checked here by what the daemon says and what the kernel shows, never by timing: the
next file's memory arrives already allocated (``st_blocks`` while its size is 0) and
the daemon's log names the file it came from; a reader that still has the old file
open (a descriptor or a mapping) keeps reading its bytes and the memory is not reused;
a budget full of files keeps nothing; sealed memfds are never reused; and whatever is
reused, a consumer reads exactly what the new producer wrote.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import sys
import time
from pathlib import Path

import needs
import pytest
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    Host,
    host_fixture,
    in_process_daemon,
    interposer_cache_fixture,
    write_config,
)

from ensio.transfer.hugemem import thp_available
from ensio.transfer.pool import MemfdPool, exclusive_writable
from ensio.transfer.protocol import Client, encode

MIB = 1 << 20


def allocated(fd: int) -> int:
    """Bytes of memory the file holds (its pages), whatever its size says."""
    return os.fstat(fd).st_blocks * 512


@pytest.fixture
def daemon():
    """An in-process daemon whose files are in the huge-page tmpfs (recyclable)."""
    needs.capability("transparent huge pages for tmpfs", thp_available())
    with in_process_daemon("ensio-r-", pool_mb=16, huge_pages="auto") as dm:
        assert dm.memory.kind == "tmpfs-huge", dm.memory.why
        yield dm


def write_file(dm, path: Path, data: bytes, **kw) -> tuple[str, int]:
    """A producer's whole file through the daemon; the reply verb and the bytes of
    memory its file already held when it was handed out (size 0)."""
    fields = dict(path=str(path), conn="cfg:restarts", budget=-1, fallback="error",
                  persist=0, mode="644", excl=0, keep=0, exist=0)
    fields.update(kw)
    with Client(dm.socket_path, component="model") as c:
        r = c.request(encode("CREATE", **fields))
        if r.verb != "OK":
            return r.verb, 0
        assert os.fstat(r.fd).st_size == 0
        had = allocated(r.fd)
        os.write(r.fd, data)
        os.close(r.fd)
        assert c.request(encode("COMPLETE", id=r.get("id"))).verb == "OK"
        return r.verb, had


def open_held(dm, path: Path) -> int:
    """A consumer's read-only descriptor of ``path``."""
    with Client(dm.socket_path, component="post") as c:
        r = c.request(encode("OPEN", path=str(path), wait_ms=5000))
        assert r.verb == "OK", r
        return r.fd


def read_held(dm, path: Path) -> bytes:
    """A consumer's whole read. Returns once the daemon (in this process) has closed the
    descriptor it sent: it closes it just after the reply, and a test that unlinks the
    file before that would find it open elsewhere, so not recyclable, by scheduling."""
    fd = open_held(dm, path)
    st = os.fstat(fd)
    try:
        return os.pread(fd, st.st_size + 1, 0)
    finally:
        os.close(fd)
        _only_the_table_holds(st.st_dev, st.st_ino)


def _only_the_table_holds(dev: int, ino: int, timeout: float = 30.0) -> None:
    """Until one descriptor of this process refers to the file (the table's own)."""
    deadline = time.monotonic() + timeout
    while True:
        holders = 0
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                st = os.stat(f"/proc/self/fd/{name}")
                holders += (st.st_dev, st.st_ino) == (dev, ino)
        if holders <= 1:
            return
        assert time.monotonic() < deadline, f"{holders} descriptors still hold the file"
        time.sleep(0.001)


def unlink(dm, path: Path) -> None:
    with Client(dm.socket_path, component="post") as c:
        assert c.request(encode("UNLINK", path=str(path))).verb == "OK"


def log_text(dm) -> str:
    return (dm.dir / "daemon.log").read_text()


def test_an_unlinked_files_memory_goes_to_the_next_file(daemon, tmp_path, rng):
    old, new = tmp_path / "mem001.nc", tmp_path / "mem002.nc"
    first, second = rng.bytes(4 * MIB + 777), rng.bytes(4 * MIB - 999)
    write_file(daemon, old, first)
    assert read_held(daemon, old) == first
    unlink(daemon, old)
    assert daemon.pool.recycled == 1
    verb, had = write_file(daemon, new, second)
    assert verb == "OK" and had >= 4 * MIB  # its pages were there before the first write
    assert daemon.pool.reused == 1
    assert f"{new}: written into the recycled memory of {old}" in log_text(daemon)
    assert read_held(daemon, new) == second


def test_a_new_version_is_written_into_the_old_versions_memory(daemon, tmp_path, rng):
    """Cycling: each cycle rewrites the same names; a name's new version takes the memory
    of its old one (no reader has it open any more)."""
    names = [tmp_path / f"mem{i:03d}.nc" for i in (1, 2)]
    for _ in range(2):  # cycles
        datas = [rng.bytes(3 * MIB + i) for i in range(2)]
        for path, data in zip(names, datas, strict=True):
            write_file(daemon, path, data)
        assert [read_held(daemon, p) for p in names] == datas
    assert daemon.pool.recycled == 2 and daemon.pool.reused == 2
    for path in names:
        assert f"{path}: written into the recycled memory of {path}" in log_text(daemon)


@pytest.mark.parametrize("hold", ["descriptor", "mapping"])
def test_a_file_a_reader_still_has_open_is_not_reused(daemon, tmp_path, rng, hold):
    old, new = tmp_path / "mem001.nc", tmp_path / "mem002.nc"
    first = rng.bytes(4 * MIB)
    write_file(daemon, old, first)
    fd = open_held(daemon, old)
    view = None
    if hold == "mapping":
        view = mmap.mmap(fd, len(first), prot=mmap.PROT_READ)
        os.close(fd)
    unlink(daemon, old)
    assert daemon.pool.recycled == 0
    second = rng.bytes(4 * MIB)
    write_file(daemon, new, second)
    assert "recycled memory" not in log_text(daemon)
    if view is not None:
        assert view[:] == first
        view.close()
    else:
        assert os.pread(fd, len(first) + 1, 0) == first
        os.close(fd)
    assert read_held(daemon, new) == second


def test_a_budget_full_of_files_keeps_no_recycled_memory(daemon, tmp_path, rng):
    """Budget 6 MiB, files of 3 MiB (4 MiB recycled, in 2 MiB pages): with two files held
    there is no room for the first one's memory beside the second; with one, there is."""
    kw = dict(budget=6 * MIB, conn="cfg:small")
    a, b, c = (tmp_path / f"m{i}.nc" for i in "abc")
    for path in (a, b):
        assert write_file(daemon, path, rng.bytes(3 * MIB), **kw)[0] == "OK"
    unlink(daemon, a)
    assert daemon.pool.recycled == 0 and daemon.pool.recycled_bytes("cfg:small") == 0
    unlink(daemon, b)
    assert daemon.pool.recycled == 1 and daemon.pool.recycled_bytes("cfg:small") == 4 * MIB
    data = rng.bytes(3 * MIB)
    assert write_file(daemon, c, data, **kw) == ("OK", 4 * MIB)
    assert daemon.pool.recycled_bytes("cfg:small") == 0
    assert read_held(daemon, c) == data


def test_sealed_memfds_are_never_reused(tmp_path, rng):
    with in_process_daemon("ensio-r-", pool_mb=16) as dm:  # huge pages off: memfds
        path = tmp_path / "mem001.nc"
        write_file(dm, path, rng.bytes(2 * MIB))
        unlink(dm, path)
        assert dm.pool.recycled == 0


def test_exclusive_writable_refuses_a_file_open_elsewhere(tmp_path):
    needs.capability("transparent huge pages for tmpfs", thp_available())
    from ensio.transfer.hugemem import open_memory_source

    src = open_memory_source(tmp_path, logging.getLogger("test"), "auto")
    try:
        fd = src.new("x")
        os.write(fd, b"x" * MIB)
        other = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
        assert exclusive_writable(fd) is None  # fd closed; other still open
        alone = os.open(f"/proc/self/fd/{other}", os.O_RDONLY)
        os.close(other)
        rw = exclusive_writable(alone)
        assert rw is not None
        os.close(rw)
    finally:
        src.close()


def test_recycled_memory_is_released_with_the_pool(tmp_path):
    needs.capability("transparent huge pages for tmpfs", thp_available())
    from ensio.transfer.hugemem import open_memory_source

    src = open_memory_source(tmp_path, logging.getLogger("test"), "auto")
    pool = MemfdPool(16 * MIB, logging.getLogger("test-recycle"), memory=src)
    try:
        fd = src.new("x")
        os.write(fd, b"x" * (2 * MIB))
        assert pool.recycle(fd, 2 * MIB, "k", "/x.nc", room=8 * MIB)
        assert pool.held() == 2 * MIB and pool.recycled_bytes("k") == 2 * MIB
        pool.close()
        assert pool.held() == 0 and pool.take_for("k") is None
    finally:
        pool.close()
        src.close()


WRITER = r"""
import os, sys, random
for name in sys.argv[2:]:
    data = random.Random(name + sys.argv[1]).randbytes(3 << 20)
    with open(name, "wb") as f:
        f.write(data)
"""

READER = r"""
import hashlib, os, sys
for name in sys.argv[1:]:
    print(hashlib.sha256(open(name, "rb").read()).hexdigest())
    os.unlink(name)
"""


def test_unmodified_programs_cycle_through_recycled_memory(host: Host):
    """Two cycles of a Python model writing two files and a post-processor reading and
    deleting them: the second cycle's files are written into the first cycle's memory."""
    import hashlib
    import random

    needs.capability("transparent huge pages for tmpfs", thp_available())
    (host.work / "fc").mkdir()
    config = write_config(host.work / "t.yaml", ["fc/mem*.nc"])
    names = ["fc/mem001.nc", "fc/mem002.nc"]
    for cycle in ("1", "2"):
        p = host.run(config, "model", sys.executable, "-c", WRITER, cycle, *names)
        assert p.returncode == 0, p.stderr
        got = host.run(config, "post", sys.executable, "-c", READER, *names)
        assert got.returncode == 0, got.stderr
        want = [hashlib.sha256(random.Random(n + cycle).randbytes(3 << 20)).hexdigest()
                for n in names]
        assert got.stdout.split() == want
    log = host.log()
    assert "a private tmpfs with transparent huge pages" in log
    assert log.count("written into the recycled memory of") == 2, log
    assert host.ensio("transfer", "stop").returncode == 0
    assert "memory: 4 files left their memory for new ones, 2 new files were written into it" \
        in host.log()
    assert not any((host.work / n).exists() for n in names)
