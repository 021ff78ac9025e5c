"""Async files finish after the producer's close, and stream connections are kept (issue 28,
item 6: the cross-host stream at the speed of the link).

Two hosts (network namespaces, transfer_hosts.py): the producer on ``a``, the consumer
on ``b``. The sending daemon's test hook (``ENSIO_TRANSFER_TEST_HOLD``, see
ensio/transfer/outgoing.py) stops a stream after a given number of bytes sent after the
close until the test writes ``go`` or ``break`` into a named pipe, so "the close
returned while the other host still waits for bytes" is an observed state. That the
producer then waits at its exit is seen in ``/proc/PID/task/*/syscall``: it sleeps in
``recvmsg``, the interposer's ``SETTLE`` request to its daemon.
"""

from __future__ import annotations

import hashlib
import os
import platform
import random
import subprocess
import sys
import threading
from pathlib import Path

import needs
import pytest
from transfer_hosts import (  # noqa: F401
    REWRITING_PRODUCER,
    NetHost,
    held,
    hosts_config,
    in_syscall,
    release,
    rewritten,
    two_hosts_fixture,
)
from transfer_support import interposer_cache_fixture, wait_for  # noqa: F401

PY = sys.executable
SIZE = (4 << 20) + 77
AT, N = 2 << 20, 512 << 10   # rewritten after the first write was sent: sent after the close
HOLD = 100 << 10             # the stream stops this far into the bytes sent after the close
_RECVMSG = {"x86_64": "47", "aarch64": "212"}.get(platform.machine())

#: writes each named file (seeded random bytes, one seed per file) and closes it
WRITER = r"""
import os, random, sys
for i, path in enumerate(sys.argv[2:]):
    with open(path, "wb") as f:
        f.write(random.Random(i).randbytes(int(sys.argv[1])))
"""

#: prints the sha256 of each named file
READER = r"""
import hashlib, sys
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        print(hashlib.sha256(f.read()).hexdigest())
"""


def _line(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    """The next line of ``proc``'s stdout; fails (instead of hanging) if none comes."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert box, f"no line from the producer in {timeout} s (its close waited?)"
    return box[0]


def _closed_while_held(two_hosts, tmp_path: Path):
    """The producer on a closed its async file; a's daemon holds the stream to b."""
    a, b = two_hosts
    (a.work / "fc").mkdir()
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    config = hosts_config(a.work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-1",
                          ["fc/mem*.nc"], mode="async")
    a.env["ENSIO_TRANSFER_TEST_HOLD"] = f"{HOLD}:{fifo}"  # a's daemon starts with it
    b.up(config, "post")
    prod = a.start(config, "model", PY, "-c", REWRITING_PRODUCER, "fc/mem000.nc", str(SIZE),
                   str(AT), str(N))
    assert prod.stdout.readline() == "written\n", prod.stderr.read()
    wait_for(lambda: getattr(held(a).get("mem000.nc"), "sent", 0) >= SIZE,
             what="the async send of the first write")
    prod.stdin.write("close\n")
    prod.stdin.flush()
    # the close returned although the stream is held: b cannot have the whole file
    assert _line(prod) == "closed\n"
    assert held(b)["mem000.nc"].state == "writing"
    if _RECVMSG is not None:  # and the process waits at its exit, in SETTLE
        wait_for(lambda: in_syscall(prod.pid, _RECVMSG), what="the producer in SETTLE")
    assert prod.poll() is None
    return a, b, config, fifo, prod


@pytest.mark.parametrize("word", ["go", "break"])
def test_an_async_close_returns_first_and_the_exit_waits_for_the_other_host(two_hosts,
                                                                           tmp_path, word):
    """``go``: the exit waits, then succeeds, and b has the file. ``break``: the stream
    fails after the close returned 0, so the run fails, with one line naming file and host."""
    a, b, config, fifo, prod = _closed_while_held(two_hosts, tmp_path)
    release(fifo, word)
    out, err = prod.communicate(timeout=60)
    if word == "go":
        assert prod.returncode == 0, err
        assert held(b)["mem000.nc"].state == "complete"  # before the producer's exit
        got = b.run(config, "post", PY, "-c", READER, "fc/mem000.nc")
        assert got.stdout.split() == [hashlib.sha256(rewritten(SIZE, AT, N)).hexdigest()]
        return
    assert prod.returncode == 1, err
    path = (a.work / "fc" / "mem000.nc").resolve()
    lines = [x for x in err.splitlines() if x.startswith("ensio-transfer")]
    assert len(lines) == 1 and str(path) in lines[0] and "host b" in lines[0], err
    assert held(b)["mem000.nc"].state == "failed"


def test_a_producer_killed_in_its_exit_wait_loses_no_file(two_hosts, tmp_path):
    """Killed while it waits in SETTLE (after its close returned): the file is complete on
    its host, so the stream goes on and b's copy completes, equal to what was written."""
    needs.capability("the recvmsg system call's number (to see the producer in SETTLE)",
                     None if _RECVMSG else f"not known for {platform.machine()}")
    a, b, config, fifo, prod = _closed_while_held(two_hosts, tmp_path)
    prod.kill()  # it sleeps in SETTLE (_closed_while_held waited for that)
    prod.communicate(timeout=60)  # dead: its connections to a's daemon are closed
    release(fifo, "go")
    wait_for(lambda: held(b)["mem000.nc"].state == "complete", what="b's copy complete")
    got = b.run(config, "post", PY, "-c", READER, "fc/mem000.nc")
    assert got.stdout.split() == [hashlib.sha256(rewritten(SIZE, AT, N)).hexdigest()]


def _connections(host: NetHost, peer: NetHost) -> set[str]:
    """Established TCP connections of ``host`` to ``peer``'s daemon port (local ends)."""
    out = subprocess.run(["ip", "netns", "exec", host.ns, "ss", "-Htn", "state", "established",
                          "dst", f"{peer.address}:7790"], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[2] for line in out.splitlines() if line.strip()}


def test_files_to_one_host_go_over_one_kept_connection(two_hosts):
    """Sync: each close returns after its stream gave the connection back, so the next
    file finds it (async files overlap: a second connection may be opened and kept)."""
    a, b = two_hosts
    (a.work / "fc").mkdir()
    config = hosts_config(a.work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-1",
                          ["fc/mem*.nc"])
    b.up(config, "post")
    size = (1 << 20) + 3
    first = a.run(config, "model", PY, "-c", WRITER, str(size), "fc/mem000.nc")
    assert first.returncode == 0, first.stderr
    after_one = _connections(a, b)  # the control connection and the kept stream
    rest = a.run(config, "model", PY, "-c", WRITER, str(size), *(f"fc/mem00{i}.nc"
                                                                  for i in range(1, 4)))
    assert rest.returncode == 0, rest.stderr
    # a new connection for any of the three files would have been kept too
    assert _connections(a, b) == after_one and len(after_one) >= 1
    got = b.run(config, "post", PY, "-c", READER, *(f"fc/mem00{i}.nc" for i in range(4)))
    want = [hashlib.sha256(random.Random(0).randbytes(size)).hexdigest()] + [
        hashlib.sha256(random.Random(i).randbytes(size)).hexdigest() for i in range(3)]
    assert got.stdout.split() == want, got.stderr
