"""Unlink and rename follow a transferred file to the other host (transfer/names.py).

Two hosts are two network namespaces (transfer_hosts.py). The producer on host a
writes a temporary name with a real tool and renames it (``mv``, what cdo/nco and
many models do), or unlinks a file (``rm``); the consumer host b must then serve the
new name and neither the old name nor a deleted file, while readers that opened the
old version keep its bytes. A consumer daemon that is stopped or killed while the
producer unlinks must not hold the producer up, nor serve stale bytes afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import needs
import pytest
from transfer_hosts import NetHost, hosts_config, two_hosts_fixture  # noqa: F401
from transfer_support import CDL, daemon_pid, interposer_cache_fixture  # noqa: F401

pytestmark = needs.tools_mark("ncgen", "nccopy", "mv", "rm")  # netcdf-bin, coreutils

PY = sys.executable
FILES = ["fc/*.nc", "fc/*.nc.tmp"]

#: prints the sha256 of a file's bytes, or the errno name of its open
READ = r"""
import errno, hashlib, sys
try:
    data = open(sys.argv[1], "rb").read()
except OSError as exc:
    print(errno.errorcode[exc.errno])
else:
    print(hashlib.sha256(data).hexdigest())
"""

#: opens a file, reads its first half, waits for a line, then reads the rest
HOLDER = r"""
import hashlib, os, sys
f = open(sys.argv[1], "rb", buffering=0)
size = os.fstat(f.fileno()).st_size
head = f.read(size // 2)
print("opened", flush=True)
sys.stdin.readline()
print(hashlib.sha256(head + f.read()).hexdigest(), flush=True)
"""

#: writes argv[2] bytes derived from the seed argv[3] to argv[1]
WRITE = r"""
import sys
n, seed = int(sys.argv[2]), int(sys.argv[3])
with open(sys.argv[1], "wb") as f:
    f.write(bytes((i * seed + 11) % 256 for i in range(n)))
"""


def _bytes(n: int, seed: int) -> bytes:
    """What WRITE writes, computed here independently of the transfer."""
    return bytes((i * seed + 11) % 256 for i in range(n))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, p.stderr
    return p


def _held(host: NetHost) -> dict[str, object]:
    return {Path(s.path).name: s for s in host.status() or []}


def _read(host: NetHost, config: Path, path: str) -> str:
    return _ok(host.run(config, "post", PY, "-c", READ, path)).stdout.strip()


@pytest.fixture
def work(two_hosts):
    a, _ = two_hosts
    w = a.work
    (w / "sample.cdl").write_text(CDL)
    for d in ("in", "ref", "fc", "out"):
        (w / d).mkdir()
    subprocess.run(["ncgen", "-4", "-o", "in/nc4.nc", "sample.cdl"], cwd=w, check=True)
    subprocess.run(["nccopy", "-k", "classic", "in/nc4.nc", "ref/x.nc"], cwd=w, check=True)
    return w


PLACEMENT = {"1-1": {"a": ["model"], "b": ["post"]},
             "1-N": {"a": ["model", "post"], "b": ["post"]}}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("pattern", ["1-1", "1-N"])
def test_a_temporary_name_renamed_by_mv_is_the_new_name_on_the_other_host(two_hosts, work,
                                                                           pattern, mode):
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", PLACEMENT[pattern], pattern, FILES, mode=mode)
    b.up(config, "post")
    _ok(a.run(config, "model", "nccopy", "-k", "classic", "in/nc4.nc", "fc/x.nc.tmp"))
    assert _held(b)["x.nc.tmp"].state == "complete"
    _ok(a.run(config, "model", "mv", "fc/x.nc.tmp", "fc/x.nc"))
    want = _sha((work / "ref/x.nc").read_bytes())
    assert sorted(_held(b)) == ["x.nc"]
    assert _read(b, config, "fc/x.nc") == want
    assert _read(b, config, "fc/x.nc.tmp") == "ENOENT"
    dumped = _ok(b.run(config, "post", "ncdump", "fc/x.nc")).stdout
    assert dumped == _ok(subprocess.run(["ncdump", "ref/x.nc"], cwd=work, capture_output=True,
                                        text=True)).stdout
    if pattern == "1-N":  # a's own consumers see the same
        assert _read(a, config, "fc/x.nc") == want
        assert _read(a, config, "fc/x.nc.tmp") == "ENOENT"
    assert not list((work / "fc").iterdir())  # never on disk


def test_a_rename_onto_an_existing_name_replaces_it_on_the_other_host(two_hosts, work):
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", PLACEMENT["1-1"], "1-1", FILES)
    b.up(config, "post")
    _ok(a.run(config, "model", PY, "-c", WRITE, "fc/x.nc", "5000", "3"))
    assert _read(b, config, "fc/x.nc") == _sha(_bytes(5000, 3))
    _ok(a.run(config, "model", PY, "-c", WRITE, "fc/x.nc.tmp", "7000", "5"))
    _ok(a.run(config, "model", PY, "-c", "import os; os.rename('fc/x.nc.tmp', 'fc/x.nc')"))
    assert _read(b, config, "fc/x.nc") == _sha(_bytes(7000, 5))
    assert sorted(_held(b)) == ["x.nc"]


def test_a_new_version_replaces_the_copy_and_readers_of_the_old_keep_it(two_hosts, work):
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", PLACEMENT["1-1"], "1-1", FILES)
    b.up(config, "post")
    _ok(a.run(config, "model", PY, "-c", WRITE, "fc/x.nc", "300000", "7"))
    holder = b.start(config, "post", PY, "-c", HOLDER, "fc/x.nc")
    try:
        assert holder.stdout.readline() == "opened\n", holder.stderr.read()
        _ok(a.run(config, "model", PY, "-c", WRITE, "fc/x.nc", "200000", "13"))
        assert _read(b, config, "fc/x.nc") == _sha(_bytes(200000, 13))
        out, err = holder.communicate("go\n", timeout=60)
    finally:
        holder.kill()
    assert holder.returncode == 0, err
    assert out.strip() == _sha(_bytes(300000, 7))


def test_unlink_reaches_the_other_host_and_open_readers_keep_their_bytes(two_hosts, work):
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", PLACEMENT["1-1"], "1-1", FILES)
    b.up(config, "post")
    _ok(a.run(config, "model", PY, "-c", WRITE, "fc/x.nc", "300000", "7"))
    holder = b.start(config, "post", PY, "-c", HOLDER, "fc/x.nc")
    try:
        assert holder.stdout.readline() == "opened\n", holder.stderr.read()
        _ok(a.run(config, "model", "rm", "fc/x.nc"))
        assert _held(b) == {}
        assert _read(b, config, "fc/x.nc") == "ENOENT"
        p = b.run(config, "post", "ncdump", "-h", "fc/x.nc")
        assert p.returncode != 0 and "No such file or directory" in p.stderr
        out, err = holder.communicate("go\n", timeout=60)
    finally:
        holder.kill()
    assert holder.returncode == 0, err
    assert out.strip() == _sha(_bytes(300000, 7))
    assert not (work / "fc/x.nc").exists()


def test_a_rename_out_of_the_connections_writes_the_file_on_the_producer_host(two_hosts,
                                                                             work):
    """The new name matches no connection: the producer host writes it to disk (as
    ``fallback: files`` does), and the other hosts drop their copy of the old name."""
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", PLACEMENT["1-1"], "1-1", FILES)
    b.up(config, "post")
    _ok(a.run(config, "model", "nccopy", "-k", "classic", "in/nc4.nc", "fc/x.nc.tmp"))
    _ok(a.run(config, "model", "mv", "fc/x.nc.tmp", "out/x.nc"))
    assert (work / "out/x.nc").read_bytes() == (work / "ref/x.nc").read_bytes()
    assert _held(a) == {} and _held(b) == {}
    assert _read(b, config, "fc/x.nc.tmp") == "ENOENT"
    assert not list((work / "fc").iterdir())


@pytest.mark.parametrize("fault", ["stopped", "killed"])
def test_a_consumer_daemon_out_of_reach_neither_holds_up_the_unlink_nor_serves_stale(
        two_hosts, work, fault):
    """b's daemon is stopped (SIGSTOP: the unlink's notification is not answered) or
    killed while a's producer unlinks x.nc: ``rm`` returns, and afterwards b serves
    neither x.nc nor, stopped, y.nc (a copy from a host it lost contact with: EIO)."""
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", PLACEMENT["1-1"], "1-1", FILES)
    b.up(config, "post")
    _ok(a.run(config, "model", PY, "-c", WRITE, "fc/x.nc", "4000", "3"))
    _ok(a.run(config, "model", PY, "-c", WRITE, "fc/y.nc", "4000", "5"))
    assert sorted(_held(b)) == ["x.nc", "y.nc"]
    pid = daemon_pid(b.dir)
    os.kill(pid, signal.SIGSTOP if fault == "stopped" else signal.SIGKILL)
    try:
        _ok(a.run(config, "model", "rm", "fc/x.nc"))
    finally:
        if fault == "stopped":
            os.kill(pid, signal.SIGCONT)
    if fault == "stopped":
        assert ("host b did not acknowledge UNLINK path="
                f"{(work / 'fc/x.nc').resolve()}") in a.log()
        assert _read(b, config, "fc/x.nc") == "ENOENT"
        assert _read(b, config, "fc/y.nc") == "EIO"
        assert "lost contact with host a" in b.log()
    else:  # a new daemon on b: it holds nothing; a's next file reaches it again
        assert _read(b, config, "fc/x.nc") == "ENOENT"
        assert _read(b, config, "fc/y.nc") == "ENOENT"
    _ok(a.run(config, "model", PY, "-c", WRITE, "fc/z.nc", "4000", "9"))
    assert _read(b, config, "fc/z.nc") == _sha(_bytes(4000, 9))
    _ok(a.run(config, "model", "rm", "fc/z.nc"))
    assert _read(b, config, "fc/z.nc") == "ENOENT"
    assert not list((work / "fc").iterdir())


def test_status_rows_are_json(two_hosts, work):
    """The held copy on b names its path under the new name in ``ensio transfer status``."""
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", PLACEMENT["1-1"], "1-1", FILES)
    b.up(config, "post")
    _ok(a.run(config, "model", PY, "-c", WRITE, "fc/x.nc.tmp", "1000", "3"))
    _ok(a.run(config, "model", "mv", "fc/x.nc.tmp", "fc/x.nc"))
    rows = [json.loads(x) for x in _ok(b.ensio("transfer", "status", "--json")).stdout
            .splitlines()]
    assert [(Path(r["path"]).name, r["state"], r["size"]) for r in rows] == \
        [("x.nc", "complete", 1000)]


def test_a_producer_daemon_that_stops_takes_its_copies_and_leaves_the_real_file(two_hosts,
                                                                                 work):
    """a's daemon stops normally (``fallback: files`` writes what it holds to disk): b
    drops its copies of a's files and opens then read the real file."""
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", PLACEMENT["1-1"], "1-1", FILES, fallback="files")
    b.up(config, "post")
    _ok(a.run(config, "model", PY, "-c", WRITE, "fc/x.nc", "4000", "3"))
    assert sorted(_held(b)) == ["x.nc"]
    _ok(a.ensio("transfer", "stop"))
    assert (work / "fc/x.nc").read_bytes() == _bytes(4000, 3)
    assert _held(b) == {}
    assert ("host a's daemon stopped: the copies of its files here are dropped (1; new "
            "opens see the real files)") in b.log()
    assert _read(b, config, "fc/x.nc") == _sha(_bytes(4000, 3))


def test_a_copy_pulled_on_demand_follows_the_rename(two_hosts, work):
    """all-to-all with no consumer placed: b pulls x.nc.tmp on its open; a's rename then
    renames b's pulled copy (held under the new name before anyone opens it)."""
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", {"a": ["model"], "b": []}, "all-to-all", FILES)
    b.up(config, "post")
    _ok(a.run(config, "model", "nccopy", "-k", "classic", "in/nc4.nc", "fc/x.nc.tmp"))
    want = _sha((work / "ref/x.nc").read_bytes())
    assert _held(b) == {}
    assert _read(b, config, "fc/x.nc.tmp") == want
    _ok(a.run(config, "model", "mv", "fc/x.nc.tmp", "fc/x.nc"))
    assert sorted(_held(b)) == ["x.nc"]
    assert _read(b, config, "fc/x.nc") == want
    assert _read(b, config, "fc/x.nc.tmp") == "ENOENT"
    _ok(a.run(config, "model", "rm", "fc/x.nc"))
    assert _held(b) == {}
    assert _read(b, config, "fc/x.nc") == "ENOENT"
    assert not list((work / "fc").iterdir())


#: renameat2 through ctypes: RENAME_NOREPLACE (1) onto argv[2]; prints "ok" or the errno name
NOREPLACE = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.renameat2(-100, sys.argv[1].encode(), -100, sys.argv[2].encode(), 1)
print("ok" if rc == 0 else errno.errorcode[ctypes.get_errno()])
"""


def test_rename_noreplace_refuses_a_held_name_and_renames_onto_a_free_one(two_hosts, work):
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", PLACEMENT["1-1"], "1-1", FILES)
    b.up(config, "post")
    _ok(a.run(config, "model", PY, "-c", WRITE, "fc/x.nc.tmp", "1000", "3"))
    _ok(a.run(config, "model", PY, "-c", WRITE, "fc/y.nc", "1000", "5"))
    moved = _ok(a.run(config, "model", PY, "-c", NOREPLACE, "fc/x.nc.tmp", "fc/y.nc")).stdout
    assert moved == "EEXIST\n"
    assert sorted(_held(b)) == ["x.nc.tmp", "y.nc"]
    moved = _ok(a.run(config, "model", PY, "-c", NOREPLACE, "fc/x.nc.tmp", "fc/x.nc")).stdout
    assert moved == "ok\n"
    assert sorted(_held(b)) == ["x.nc", "y.nc"]
    assert _read(b, config, "fc/x.nc") == _sha(_bytes(1000, 3))
    assert _read(b, config, "fc/y.nc") == _sha(_bytes(1000, 5))
