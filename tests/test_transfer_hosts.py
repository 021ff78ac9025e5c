"""Transfer across two hosts (network namespaces, see transfer_hosts.py): every pattern.

Unmodified producers (ncgen, nccopy) on one host, unmodified consumers (ncdump, a
netCDF4 Python program) on the other: the bytes read equal, byte for byte, the file a
run without transfer writes, and the transferred paths never appear on disk. The
pattern decides which host's daemon receives which file; a host that should not get
a file does not hold it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import needs
import pytest
from transfer_hosts import NetHost, hosts_config, two_hosts_fixture  # noqa: F401
from transfer_support import CDL, interposer_cache_fixture  # noqa: F401

pytestmark = needs.tools_mark("ncgen", "ncdump", "nccopy")  # netcdf-bin

PY = sys.executable

READER = r"""
import hashlib, json, sys
import netCDF4
path = sys.argv[1]
with open(path, "rb") as f:
    data = f.read()
with netCDF4.Dataset(path) as ds:
    ds.set_auto_mask(False)
    values = {k: v[...].tolist() for k, v in ds.variables.items()}
print(json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "netcdf4": values}))
"""

#: netCDF4-python writing 3.2 MB in four steps, each flushed (HDF5 writes with pwrite)
WRITER = r"""
import sys
import netCDF4
import numpy as np
with netCDF4.Dataset(sys.argv[1], "w") as ds:
    ds.createDimension("t", None)
    ds.createDimension("x", 100_000)
    v = ds.createVariable("v", "f8", ("t", "x"))
    for i in range(4):
        v[i] = np.arange(100_000) * (i + 1.5)
        ds.sync()
"""

#: file name → the producing command (a plain run of it writes the reference)
PRODUCERS = {
    "mem000.nc": ["ncgen", "-4", "-o", "{out}", "sample.cdl"],
    "mem001.nc": ["nccopy", "-k", "classic", "in/nc4.nc", "{out}"],
    "mem002.nc": [PY, "-c", WRITER, "{out}"],
}

#: pattern → (host → components there, [(host, rank, file)] produced, host → files it holds)
CASES = {
    # producer process i → consumer process i's host: post 0 is on b, post 1 on a
    "1-1": ({"b": ["post"], "a": ["model", "post"]},
            [("a", 0, "mem000.nc"), ("a", 1, "mem001.nc")],
            {"b": ["mem000.nc"], "a": ["mem000.nc", "mem001.nc"]}),
    # every file to every consumer host
    "1-N": ({"a": ["model", "post"], "b": ["post"]},
            [("a", 0, "mem000.nc"), ("a", 1, "mem001.nc")],
            {"b": ["mem000.nc", "mem001.nc"], "a": ["mem000.nc", "mem001.nc"]}),
    # all files to one host: producers on a and b, the consumer on b
    "N-1": ({"a": ["model"], "b": ["model", "post"]},
            [("a", 0, "mem000.nc"), ("b", 1, "mem001.nc")],
            {"b": ["mem000.nc", "mem001.nc"], "a": ["mem000.nc"]}),
    # producers and consumers on both: each consumer host receives every file
    "all-to-all": ({"a": ["model", "post"], "b": ["model", "post"]},
                   [("a", 0, "mem000.nc"), ("b", 1, "mem001.nc")],
                   {"a": ["mem000.nc", "mem001.nc"], "b": ["mem000.nc", "mem001.nc"]}),
}


def _ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, p.stderr
    return p


@pytest.fixture
def work(two_hosts):
    """Inputs and the reference files (plain runs, no transfer) in the shared directory."""
    a, _ = two_hosts
    w = a.work
    (w / "sample.cdl").write_text(CDL)
    (w / "in").mkdir()
    (w / "ref").mkdir()
    (w / "fc").mkdir()
    subprocess.run(["ncgen", "-4", "-o", "in/nc4.nc", "sample.cdl"], cwd=w, check=True)
    for name, argv in PRODUCERS.items():
        subprocess.run([x.format(out=f"ref/{name}") for x in argv], cwd=w, check=True)
    return w


def _held(host: NetHost) -> dict[str, object]:
    return {Path(s.path).name: s for s in host.status() or []}


@pytest.mark.parametrize("pattern", sorted(CASES))
def test_every_pattern_crosses_the_hosts(two_hosts, work, pattern):
    hosts = dict(zip("ab", two_hosts, strict=True))
    placement, produced, expected = CASES[pattern]
    config = hosts_config(work / "t.yaml", placement, pattern, ["fc/mem*.nc"])
    for h in hosts.values():  # each host's daemon listens before any producer starts
        h.up(config, "post" if "post" in placement[h.name] else "model")
    for host, rank, name in produced:
        argv = [x.format(out=f"fc/{name}") for x in PRODUCERS[name]]
        _ok(hosts[host].run(config, "model", *argv, rank=rank))
    for host, names in expected.items():
        held = _held(hosts[host])
        assert sorted(held) == names, (host, held)
        assert all(s.state == "complete" for s in held.values())
        if "post" not in placement[host]:
            continue
        for name in names:
            ref = work / "ref" / name
            got = json.loads(_ok(hosts[host].run(config, "post", PY, "-c", READER,
                                                 f"fc/{name}")).stdout)
            want = json.loads(_ok(subprocess.run([PY, "-c", READER, str(ref)],
                                                 capture_output=True, text=True)).stdout)
            assert got["sha256"] == hashlib.sha256(ref.read_bytes()).hexdigest()
            assert got == want
            dumped = _ok(hosts[host].run(config, "post", "ncdump", f"fc/{name}")).stdout
            plain = _ok(subprocess.run(["ncdump", f"ref/{name}"], cwd=work,
                                       capture_output=True, text=True)).stdout
            assert dumped == plain
    assert not list((work / "fc").iterdir())  # never on disk, on either host


# -- async ---------------------------------------------------------------------------------

#: A producer that writes 1 MiB, waits, rewrites `dirty` bytes at `at`, and closes.
REWRITER = r"""
import sys
path, size, at, dirty = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = bytearray((i * 7 + 3) % 251 for i in range(size))
f = open(path, "wb", buffering=0)
f.write(data)
print("written", flush=True)
sys.stdin.readline()
f.seek(at)
f.write(bytes(255 - b for b in data[at:at + dirty]))
f.close()
print("closed", flush=True)
"""


def _rewritten(size: int, at: int, dirty: int) -> bytes:
    data = bytearray((i * 7 + 3) % 251 for i in range(size))
    data[at:at + dirty] = bytes(255 - b for b in data[at:at + dirty])
    return bytes(data)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_async_sends_while_the_producer_runs_and_only_dirty_bytes_after_close(two_hosts, work,
                                                                               mode):
    """The seed's measure in bytes: what is sent after the producer's close. Sync: the
    whole file; async: only the bytes written again after the first send (dirty)."""
    from transfer_support import wait_for

    a, b = two_hosts
    config = hosts_config(work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-1",
                          ["fc/mem*.nc"], mode=mode)
    b.up(config, "post")
    size, at, dirty = 1 << 20, 123_457, 4099
    prod = a.start(config, "model", PY, "-c", REWRITER, "fc/mem000.nc", str(size), str(at),
                   str(dirty))
    assert prod.stdout.readline() == "written\n", prod.stderr.read()
    if mode == "async":  # the whole first write reaches b while the producer still runs
        wait_for(lambda: _held(a)["mem000.nc"].sent == size, what="the async send of 1 MiB")
    else:
        assert _held(a)["mem000.nc"].sent == 0
    assert _held(b)["mem000.nc"].state == "writing"
    out, err = prod.communicate("go\n", timeout=60)
    assert prod.returncode == 0 and out == "closed\n", err
    st = _held(a)["mem000.nc"]
    want = (dirty, size + dirty) if mode == "async" else (size, size)
    assert (st.after_close, st.sent) == want
    [row] = [json.loads(x) for x in _ok(a.ensio("transfer", "status", "--json")).stdout
             .splitlines()]
    assert (row["after_close"], row["sent"], row["size"]) == (*want, size)
    got = b.run(config, "post", PY, "-c",
                "import sys; sys.stdout.buffer.write(open('fc/mem000.nc','rb').read())",
                text=False)
    assert got.returncode == 0, got.stderr
    assert got.stdout == _rewritten(size, at, dirty)
    assert not list((work / "fc").iterdir())


def test_async_programs_give_the_consumer_host_the_plain_bytes(two_hosts, work):
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-N",
                          ["fc/mem*.nc"], mode="async")
    b.up(config, "post")
    for name, argv in PRODUCERS.items():
        _ok(a.run(config, "model", *[x.format(out=f"fc/{name}") for x in argv]))
        got = json.loads(_ok(b.run(config, "post", PY, "-c", READER, f"fc/{name}")).stdout)
        assert got["sha256"] == hashlib.sha256((work / "ref" / name).read_bytes()).hexdigest()
        st = _held(a)[name]
        if st.size < 1 << 20:  # reported with the close; never-written holes are not sent
            assert 0 < st.after_close == st.sent <= st.size
        else:  # reported while written (how much is sent before the close is timing)
            assert 0 < st.after_close <= st.sent
    assert not list((work / "fc").iterdir())


#: one pwrite of random bytes (seeded) at an offset, so longer than the interposer's
#: slices that it is made in several, reported one by one; closes on a line from stdin
SLICED = r"""
import os, random, sys
path, seed, size, at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
assert os.pwrite(fd, random.Random(seed).randbytes(size), at) == size
print("written", flush=True)
sys.stdin.readline()
os.close(fd)
print("closed", flush=True)
"""


def test_async_sends_a_long_write_while_the_producer_runs(two_hosts, work):
    """A write longer than the interposer's slices (4 MiB) reaches the other host whole
    before the close (every slice reported), at its offset; nothing is left for after."""
    import random

    from seeds import draw_seed
    from transfer_support import wait_for

    a, b = two_hosts
    config = hosts_config(work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-1",
                          ["fc/mem*.nc"], mode="async")
    b.up(config, "post")
    seed, size, at = draw_seed("sliced write"), (9 << 20) + 3, 5
    prod = a.start(config, "model", PY, "-c", SLICED, "fc/mem000.nc", str(seed), str(size),
                   str(at))
    assert prod.stdout.readline() == "written\n", prod.stderr.read()
    wait_for(lambda: _held(a)["mem000.nc"].sent == size, what="the async send of the write")
    out, err = prod.communicate("go\n", timeout=60)
    assert prod.returncode == 0 and out == "closed\n", err
    st = _held(a)["mem000.nc"]
    assert (st.after_close, st.sent) == (0, size)
    got = b.run(config, "post", PY, "-c",
                "import sys; sys.stdout.buffer.write(open('fc/mem000.nc','rb').read())",
                text=False)
    assert got.returncode == 0, got.stderr
    assert got.stdout == bytes(at) + random.Random(seed).randbytes(size)
    assert not list((work / "fc").iterdir())


# -- the secret and faults ---------------------------------------------------------------

#: A peer on host a that guesses: its HMAC proof is made with another secret.
ROGUE = r"""
import socket, sys
from ensio.transfer.secret import proof
from ensio.transfer.wire import WIRE_VERSION, recv_frame, send_frame
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
nc = "1" * 32
send_frame(sock, "HELLO", proto=WIRE_VERSION, identity=sys.argv[3], host="a", nonce=nc)
ch = recv_frame(sock)
send_frame(sock, "AUTH", mac=proof(b"not-the-secret", "client", ch.get("nonce"), nc,
                                    sys.argv[3], "a"))
answer = recv_frame(sock)
print("refused" if answer is None else "accepted: " + answer.verb)
"""


def test_a_wrong_secret_is_refused_and_logged(two_hosts, work):
    from ensio.transfer.config import load_transfer_config

    a, b = two_hosts
    config = hosts_config(work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-1",
                          ["fc/mem*.nc"])
    b.up(config, "post")
    secret = work / "t.yaml.secret"
    assert secret.stat().st_mode & 0o777 == 0o600  # created by ensio run
    identity = load_transfer_config(config).identity
    p = subprocess.run(
        ["ip", "netns", "exec", a.ns, PY, "-c", ROGUE, b.address, "7790", identity],
        env=a.env, capture_output=True, text=True, timeout=60)
    assert p.stdout == "refused\n", p.stderr
    assert (f"refused a TCP connection from {a.address}: host a: wrong secret for "
            f"experiment {identity}") in b.log()
    assert secret.read_text().strip() not in b.log()


def test_a_secret_others_may_read_is_refused(two_hosts, work):
    a, _ = two_hosts
    config = hosts_config(work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-1",
                          ["fc/mem*.nc"])
    secret = work / "t.yaml.secret"
    secret.write_text("0123456789abcdef0123456789abcdef\n")
    secret.chmod(0o640)
    p = a.run(config, "model", "true")
    assert p.returncode == 2
    assert p.stderr.strip() == (f"ensio: error: transfer secret {secret}: mode 0640, must be "
                                "0600 (group and others must not read it)")


HALF = r"""
import sys
f = open(sys.argv[1], "wb", buffering=0)
f.write(b"CDF\x01" + bytes(4 << 20))
print("written", flush=True)
sys.stdin.readline()
f.close()
"""


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_killed_producer_on_the_other_host_gives_eio(two_hosts, work, mode):
    from transfer_support import wait_for

    a, b = two_hosts
    config = hosts_config(work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-1",
                          ["fc/mem*.nc"], mode=mode)
    b.up(config, "post")
    prod = a.start(config, "model", PY, "-c", HALF, "fc/mem000.nc")
    assert prod.stdout.readline() == "written\n", prod.stderr.read()
    cons = b.start(config, "post", "ncdump", "-h", "fc/mem000.nc")
    wait_for(lambda: _held(b)["mem000.nc"].waiters == 1, what="ncdump waiting on b")
    prod.kill()  # ensio run exec'd: this is the producer itself
    prod.communicate(timeout=60)
    _, err = cons.communicate(timeout=60)
    assert cons.returncode != 0 and "Input/output error" in err
    path = (work / "fc" / "mem000.nc").resolve()
    assert f"{path}: the producer model (pid {prod.pid}) died before closing it" in a.log()
    assert f"{path}: the stream from host a broke off before the file was complete" in b.log()
    assert _held(b)["mem000.nc"].state == "failed" and not path.exists()


def test_a_host_not_in_hosts_is_one_line(two_hosts, work):
    a, _ = two_hosts
    config = hosts_config(work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-1",
                          ["fc/mem*.nc"])
    p = a.ensio("run", "--transfer", str(config), "--component", "model", "--", "true",
                env={"ENSIO_TRANSFER_HOST": "c"})
    assert p.returncode == 2
    assert p.stderr.strip() == (f"ensio: error: {config.resolve()}: this host 'c' is not in "
                                "hosts (a, b): set ENSIO_TRANSFER_HOST")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_killed_tcp_peer_gives_consumers_eio_not_a_hang(two_hosts, work, mode):
    import os
    import signal

    from transfer_support import daemon_pid, process_gone, wait_for

    a, b = two_hosts
    config = hosts_config(work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-1",
                          ["fc/mem*.nc"], mode=mode)
    b.up(config, "post")
    prod = a.start(config, "model", PY, "-c", HALF, "fc/mem000.nc")
    assert prod.stdout.readline() == "written\n", prod.stderr.read()
    cons = b.start(config, "post", PY, "-c", "open('fc/mem000.nc', 'rb').read()")
    wait_for(lambda: _held(b)["mem000.nc"].waiters == 1, what="the consumer waiting on b")
    pid = daemon_pid(a.dir)
    os.kill(pid, signal.SIGKILL)  # the TCP peer of b's daemon dies mid-stream
    wait_for(lambda: process_gone(pid), what="a's daemon's death")
    _, err = cons.communicate(timeout=60)
    assert cons.returncode != 0 and "[Errno 5] Input/output error" in err
    prod.kill()
    prod.communicate(timeout=60)
    assert _held(b)["mem000.nc"].state == "failed"
    path = (work / "fc" / "mem000.nc").resolve()
    log = b.log()
    assert f"{path}: the stream from host a broke off before the file was complete" in log
    assert f"{path}: open by post (pid " in log
    assert not path.exists()


def test_all_to_all_pulls_on_demand_to_a_host_no_file_was_pushed_to(two_hosts, work):
    """post is placed on no host, so nothing is pushed; its open on b pulls from a."""
    a, b = two_hosts
    config = hosts_config(work / "t.yaml", {"a": ["model"], "b": []}, "all-to-all",
                          ["fc/mem*.nc"])
    b.up(config, "post")
    _ok(a.run(config, "model", "ncgen", "-4", "-o", "fc/mem000.nc", "sample.cdl"))
    assert _held(b) == {}
    # a file no host holds after the producer's round: ENOENT at once, not a wait (a
    # consumer run after the ones that read this round's files would be taken for the
    # next round's, started before its producer: it waits, as on one host)
    p = b.run(config, "post", PY, "-c", "open('fc/mem009.nc', 'rb')")
    assert p.returncode != 0 and "No such file or directory" in p.stderr
    dumped = _ok(b.run(config, "post", "ncdump", "fc/mem000.nc")).stdout
    assert dumped == _ok(subprocess.run(["ncdump", "ref/mem000.nc"], cwd=work,
                                        capture_output=True, text=True)).stdout
    assert _held(b)["mem000.nc"].state == "complete"
    got = json.loads(_ok(b.run(config, "post", PY, "-c", READER, "fc/mem000.nc")).stdout)
    assert got["sha256"] == hashlib.sha256((work / "ref/mem000.nc").read_bytes()).hexdigest()
    assert f"{(work / 'fc/mem000.nc').resolve()}: pulled from host a" in b.log()
    assert not list((work / "fc").iterdir())
