"""Bounded memory of direct transfer, and errors that reach the producer (issue 28 items 4, 5).

Protocol-level tests drive the daemon with the Python client (the interposer's packets);
the others run unmodified programs (``cp``, ``cmp``, ``sh``) under ``ensio run``:

* a file is consumed once a process of every declared consumer component opened it and
  exited with status 0; with ``keep: until-consumed`` (the default) its memory is released
  when its budget needs it for a new file (instead of spilling); ``until-unlinked`` keeps it;
* connections without ``memory_mb`` share a default budget of half the machine's memory;
* ``ensio transfer stop`` writes only files some consumer has not consumed;
* a real file shadowed by a transferred one is a warning, once;
* a copy from a lost host stays served when complete; an incomplete one fails, and a real
  file written after the loss wins.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
from transfer_support import (  # noqa: F401
    Host,
    host_fixture,
    in_process_daemon,
    interposer_cache_fixture,
    write_config,
)

from ensio.transfer.budget import default_budget_bytes
from ensio.transfer.daemon import Daemon
from ensio.transfer.entries import Peer
from ensio.transfer.protocol import Client, encode
from ensio.transfer.table import Table

CONN = "cfg:restarts"


@pytest.fixture
def daemon():
    with in_process_daemon("ensio-b-", pool_mb=0) as dm:
        yield dm


@pytest.fixture
def files(tmp_path):
    d = tmp_path / "fc"
    d.mkdir()
    return d


def client(dm: Daemon, component: str, keep: str | None = None, to: str = "post") -> Client:
    """A connection of ``component``; ``keep``: its rules file has that keep line."""
    c = Client(dm.socket_path, component=component)
    if keep is not None:
        rules = dm.dir / f"{component}.rules"
        rules.write_text(f"ensio-transfer-rules 1\ncomponent {component}\n"
                         f"keep {CONN} {keep} {to}\n")
        assert c.request(encode("HELLO", component=component, pid=os.getpid(), proto=1,
                                rules=str(rules))).verb == "OK"
    return c


def produce(c: Client, path: Path, data: bytes, budget: int = -1) -> str:
    fd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    r = c.request(encode("CREATE", path=str(path), conn=CONN, budget=budget, fallback="files",
                         persist=0, mode="644", excl=0, keep=0), fd)
    os.close(fd)
    if r.verb != "OK":
        return r.verb
    assert c.request(encode("COMPLETE", id=r.get("id"))).verb == "OK"
    return "OK"


def read(c: Client, path: Path) -> bytes | str:
    """A consumer's OPEN: the bytes, or the verb / errno name of the answer."""
    r = c.request(encode("OPEN", path=str(path), wait_ms=5000))
    if r.verb == "OK":
        assert r.fd is not None
        try:
            return os.pread(r.fd, 1 << 20, 0)
        finally:
            os.close(r.fd)
    return r.verb if r.verb != "ERR" else errno.errorcode[r.int("errno")]


def logtext(dm: Daemon) -> str:
    return (dm.dir / "daemon.log").read_text()


def held(dm: Daemon) -> dict[str, str]:
    return {Path(s["path"]).name: s["state"] for s in dm.table.status()}


def consumed(dm: Daemon) -> dict[str, str]:
    return {Path(s["path"]).name: s["consumed"] for s in dm.table.status()}


def test_a_consumed_file_is_released_when_its_budget_needs_the_memory(daemon, files, rng):
    data = rng.bytes(5000)
    one, two = files / "mem001.nc", files / "mem002.nc"
    prod = client(daemon, "model", "until-consumed", to="post,arch")
    assert produce(prod, one, data, budget=5000) == "OK"
    post, arch, other = (Client(daemon.socket_path, component=c) for c in
                         ("post", "arch", "other"))
    assert read(other, one) == data  # not a declared consumer: counts for nothing
    assert other.request(encode("EXIT", status=0)).verb == "OK"
    st = arch.request(encode("STAT", path=str(one)))  # a stat is no read
    os.close(st.fd)
    assert read(post, one) == data
    assert post.request(encode("EXIT", status=0)).verb == "OK"
    assert consumed(daemon) == {"mem001.nc": "post"}
    assert produce(prod, two, rng.bytes(5000), budget=5000) == "FALLBACK"  # arch has not
    assert read(arch, one) == data
    assert arch.request(encode("EXIT", status=0)).verb == "OK"
    assert consumed(daemon) == {"mem001.nc": "arch,post"}
    assert produce(prod, two, rng.bytes(5000), budget=5000) == "OK"
    assert held(daemon) == {"mem002.nc": "complete"}
    assert read(post, one) == "ABSENT"  # the real path now (nothing there)
    assert (f"{one}: consumed by arch, post: memory released for {two}"
            in logtext(daemon))
    for c in (prod, post, arch, other):
        c.close()


def test_a_consumer_that_ends_without_exit_0_consumed_nothing(daemon, files, rng):
    data = rng.bytes(3000)
    path = files / "mem001.nc"
    with client(daemon, "model", "until-consumed") as prod:
        assert produce(prod, path, data) == "OK"
    with Client(daemon.socket_path, component="post") as post:  # crashes: no EXIT
        assert read(post, path) == data
    assert consumed(daemon) == {"mem001.nc": ""}
    with Client(daemon.socket_path, component="post") as post:  # its retry
        assert read(post, path) == data
        assert post.request(encode("EXIT", status=0)).verb == "OK"
    assert consumed(daemon) == {"mem001.nc": "post"}


def test_until_unlinked_keeps_a_consumed_file(daemon, files, rng):
    path = files / "mem001.nc"
    prod = client(daemon, "model", "until-unlinked")
    assert produce(prod, path, rng.bytes(1000), budget=1000) == "OK"
    with Client(daemon.socket_path, component="post") as post:
        assert isinstance(read(post, path), bytes)
        assert post.request(encode("EXIT", status=0)).verb == "OK"
    assert produce(prod, files / "mem002.nc", rng.bytes(1000), budget=1000) == "FALLBACK"
    assert held(daemon) == {"mem001.nc": "complete"}
    prod.close()


def test_the_default_budget_is_half_the_machine_memory_and_spills(daemon, files, rng):
    total = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo")
                 if line.startswith("MemTotal:"))
    limits = [total]
    rel = open("/proc/self/cgroup").read().splitlines()[-1].split(":", 2)[2]
    cg = Path("/sys/fs/cgroup", rel.lstrip("/"), "memory.max")
    if cg.exists() and cg.read_text().strip() != "max":
        limits.append(int(cg.read_text()))
    assert default_budget_bytes() == max(64 << 20, min(limits) // 2)
    assert daemon.table.default_budget == default_budget_bytes()
    daemon.table.default_budget = 1500  # two files of 1000 bytes do not fit
    with client(daemon, "model") as prod:
        assert produce(prod, files / "mem001.nc", rng.bytes(1000)) == "OK"
        second = rng.bytes(1000)
        assert produce(prod, files / "mem002.nc", second) == "OK"
    assert held(daemon) == {"mem001.nc": "complete"}
    assert (files / "mem002.nc").read_bytes() == second  # spilled: fallback files
    assert "over the host's default transfer budget: written to the real path" in \
        logtext(daemon)


def test_stop_writes_only_files_a_consumer_has_not_consumed(files, rng):
    d = Path(tempfile.mkdtemp(prefix="ensio-b-", dir="/tmp"))
    os.chmod(d, 0o700)
    dm = Daemon(d, idle_timeout=3600, pool_mb=0)
    t = threading.Thread(target=dm.serve_forever, daemon=True)
    t.start()
    try:
        first, second = rng.bytes(700), rng.bytes(900)
        with client(dm, "model", "until-unlinked") as prod:
            assert produce(prod, files / "mem001.nc", first) == "OK"
            assert produce(prod, files / "mem002.nc", second) == "OK"
        with Client(dm.socket_path, component="post") as post:
            assert read(post, files / "mem001.nc") == first
            assert post.request(encode("EXIT", status=0)).verb == "OK"
        dm.stop()
        t.join(60)
        assert sorted(p.name for p in files.iterdir()) == ["mem002.nc"]
        assert (files / "mem002.nc").read_bytes() == second
        log = (d / "daemon.log").read_text()
        assert f"{files / 'mem001.nc'}: consumed by post: released at daemon exit" in log
    finally:
        dm.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_a_stale_real_file_is_a_warning_once(daemon, files, rng):
    path = files / "mem001.nc"
    path.write_bytes(b"stale")
    with client(daemon, "model", "until-unlinked") as prod:
        for _ in range(3):
            assert produce(prod, path, rng.bytes(50)) == "OK"
        assert produce(prod, files / "mem002.nc", rng.bytes(50)) == "OK"  # nothing on disk
    log = logtext(daemon)
    assert log.count("a real file exists at this transferred path") == 1
    assert f"{path}: a real file exists at this transferred path" in log


def test_a_lost_host_fails_only_its_incomplete_copies(tmp_path, rng):
    import logging

    log = logging.getLogger("test-lost-host")
    table = Table(log, default_budget=1 << 30)
    remote = Peer(id=-1, component="model@a", pid=0)
    reader = Peer(id=5, component="post", pid=os.getpid())
    done, arriving = tmp_path / "done.nc", tmp_path / "arriving.nc"
    data = rng.bytes(4000)
    for path in (done, arriving):
        r = table.create(remote, str(path), None, conn=CONN, budget=-1, fallback="files",
                         persist=False, mode=0o644, excl=False, keep=False, origin="x@a")
        os.write(r.fd, data)
        os.close(r.fd)
        if path == done:
            assert table.complete(remote, int(r.fields["id"])).verb == "OK"
    assert table.lose_origin("x@a", "lost contact with host a") == 1
    got = table.open(reader, str(done), 1.0)
    assert os.pread(got.fd, 8000, 0) == data
    os.close(got.fd)
    assert table.open(reader, str(arriving), 1.0).fields["errno"] == errno.EIO
    time.sleep(0.01)  # the real file's mtime must be later than the loss (clock granularity)
    arriving.write_bytes(b"written later")
    assert table.open(reader, str(arriving), 1.0).verb == "ABSENT"  # the disk's file wins


# -- unmodified programs -------------------------------------------------------------------

@pytest.mark.parametrize("keep", ["until-consumed", "until-unlinked"])
def test_memory_is_released_after_consumption_under_a_2_file_budget(host: Host, rng, keep):
    """cp writes five files of 300 kB one after the other under a budget of two; cmp reads
    each after it is written. Consumed files are released as new ones need the memory, so
    nothing reaches the disk; kept ones fill the budget and the third spills (fallback:
    files)."""
    w = host.work
    (w / "src").mkdir()
    (w / "fc").mkdir()
    for i in range(1, 6):
        (w / "src" / f"{i}").write_bytes(rng.bytes(300_000))
    cfg = write_config(w / "t.yaml", ["fc/mem*.nc"], memory_mb=0.6, keep=keep)
    prod = host.start(cfg, "model", "sh", "-c",
                      'for i in 1 2 3 4 5; do read x; cp src/$i fc/mem$i.nc && echo wrote $i; '
                      "done")
    cons = host.start(cfg, "post", "sh", "-c",
                      'for i in 1 2 3 4 5; do read x; cmp src/$i fc/mem$i.nc && echo same $i; '
                      "done")
    try:
        for i in range(1, 6):
            prod.stdin.write("go\n")
            prod.stdin.flush()
            assert prod.stdout.readline() == f"wrote {i}\n"
            cons.stdin.write("go\n")
            cons.stdin.flush()
            assert cons.stdout.readline() == f"same {i}\n"
        assert prod.wait(60) == 0 and cons.wait(60) == 0
    finally:
        for p in (prod, cons):
            if p.poll() is None:
                p.kill()
                p.wait()
    names = {Path(s.path).name for s in host.status()}
    on_disk = sorted(p.name for p in (w / "fc").iterdir())
    if keep == "until-consumed":  # each new file past the budget releases a consumed one
        assert names == {"mem4.nc", "mem5.nc"} and on_disk == []
        assert host.log().count("consumed by post: memory released for") == 3
    else:
        assert names == {"mem1.nc", "mem2.nc"}
        assert {s.consumed for s in host.status()} == {"post"}  # ensio transfer status
        assert on_disk == ["mem3.nc", "mem4.nc", "mem5.nc"]
        assert "over the memory budget of connection restarts: written to the real path" in \
            host.log()
