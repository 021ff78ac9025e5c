"""``serve_partial``: a consumer reads the bytes of a file that already arrived from the
other host, and waits in its reads for the rest (issue 12, item 3).

Two hosts (network namespaces, transfer_hosts.py): the producer on ``a``, the consumer
on ``b``. The sending daemon's test hook (``ENSIO_TRANSFER_TEST_HOLD``, see
ensio/transfer/outgoing.py) stops the stream after a given number of bytes until the
test writes ``go`` (or ``break``) into a named pipe: so "the read returned before the
whole file arrived" and "the read waits for the rest" are observed states, not timing.
The file on ``b`` is still ``writing`` while the consumer has read its first bytes; a
consumer blocked in a read waits on the progress map's futex (seen in
``/proc/PID/task/*/syscall``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml
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

from ensio.config.errors import ConfigError
from ensio.transfer.config import transfer_from_dict
from ensio.transfer.progress import COMPLETE, FAILED, STREAMING, Progress, read_progress
from ensio.transfer.run import rules_text

PY = sys.executable
_FUTEX = {"x86_64": "202", "aarch64": "98"}.get(platform.machine())

needs_netcdf = needs.tools_mark("ncdump")  # netcdf-bin


# -- the config key and the rules ----------------------------------------------------------

def _raw(**conn: object) -> dict:
    return {"components": ["model", "post"],
            "connections": [{"name": "restarts", "from": "model", "to": "post",
                             "files": ["/scratch/fc/mem*.nc"], **conn}]}


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
def test_serve_partial_must_be_a_boolean_and_the_error_names_the_key(value):
    with pytest.raises(ConfigError, match=r"^connections\[0\]\.serve_partial: "):
        transfer_from_dict(_raw(serve_partial=value))


def test_serve_partial_is_off_by_default_and_reaches_only_the_consumers_rules():
    assert transfer_from_dict(_raw()).connections[0].serve_partial is False
    assert not any(x.startswith("partial") for x in
                   rules_text(transfer_from_dict(_raw()), "post").splitlines())
    cfg = transfer_from_dict(_raw(serve_partial=True))
    assert rules_text(cfg, "post").splitlines()[-1] == "partial local:restarts"
    assert not any(x.startswith("partial") for x in rules_text(cfg, "model").splitlines())


# -- the progress map ------------------------------------------------------------------------

def _final_prefix(size: int, pending: list[tuple[int, int]], got: set[int]) -> int:
    """Independent: the first byte that was pending and has not been received."""
    missing = {b for off, n in pending for b in range(off, min(off + n, size))} - got
    return min(missing, default=size)


def test_watermark_is_the_first_missing_byte_of_the_ranges_to_come(rng):
    size = 3000
    pending = [(100, 400), (900, 50), (1200, 1800)]
    p = Progress("t", size, pending)
    try:
        reader = p.reader_fd()
        got: set[int] = set()
        assert read_progress(reader) == (STREAMING, 0, size, 100)
        for _ in range(60):
            off = int(rng.integers(0, size))
            end = min(size, off + int(rng.integers(1, 300)))
            p.received(off, end)
            got |= set(range(off, end))
            state, seq, got_size, mark = read_progress(reader)
            assert (state, got_size, seq % 2) == (STREAMING, size, 0)
            assert mark == _final_prefix(size, pending, got)
        p.finish(False)
        state, _, _, mark = read_progress(reader)
        assert state == FAILED and mark == _final_prefix(size, pending, got)
        p.finish(True)  # too late: a failed file stays failed
        assert read_progress(reader)[0] == FAILED
        os.close(reader)
    finally:
        p.close()


def test_a_complete_map_says_every_byte_is_final():
    p = Progress("t", 10, [(0, 10)])
    reader = p.reader_fd()
    p.finish(True)
    p.close()  # the reader's descriptor outlives the daemon's
    assert read_progress(reader)[0::2] == (COMPLETE, 10)
    assert read_progress(reader)[3] == 10
    os.close(reader)


@pytest.mark.parametrize("way", ["splice", "copy"])
def test_the_sink_tells_the_progress_map_what_arrived(way, rng):
    """Bytes received into the memory file move the watermark, and only as far as they go."""
    import socket
    import threading

    from ensio.transfer.sink import Sink

    size = (3 << 20) + 5
    body = rng.bytes(size)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.memfd_create("t", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    p = Progress("t", size, [(0, size)])
    reader = p.reader_fd()
    sink = Sink(b, fd)
    sink.progress = p
    try:
        if way == "copy":
            sink.close()
        sender = threading.Thread(target=a.sendall, args=(body[:size - 5],))
        sender.start()
        assert sink.receive(0, size - 5)
        sender.join()
        assert read_progress(reader)[3] == size - 5  # the last 5 bytes are still to come
        a.sendall(body[size - 5:])
        assert sink.receive(size - 5, 5)
        assert read_progress(reader)[3] == size
        assert os.pread(fd, size, 0) == body
    finally:
        sink.close()
        p.close()
        for x in (a, b):
            x.close()
        os.close(fd)
        os.close(reader)


# -- two hosts ------------------------------------------------------------------------------

SIZE = (4 << 20) + 77
HEAD = (1 << 20) + 12345   # where the sending daemon holds the stream

PRODUCER = REWRITING_PRODUCER
_produced = rewritten


#: opens, reads the first HEAD bytes, then the whole file (read() through Python's io)
CONSUMER = r"""
import hashlib, os, sys
path, head = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
print(size, hashlib.sha256(os.pread(fd, head, 0)).hexdigest(), flush=True)
print("rest", flush=True)
f = os.fdopen(os.dup(fd), "rb")
try:
    data = f.read()
    print("whole", len(data), hashlib.sha256(data).hexdigest(), flush=True)
except OSError as exc:
    again = os.pread(fd, head, 0)
    print("error", exc.errno, hashlib.sha256(again).hexdigest(), flush=True)
"""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_held = held


def _sent(host: NetHost) -> int:
    st = _held(host).get("mem000.nc")
    return st.sent if st is not None else 0


def _setup(two_hosts, tmp: Path, mode: str = "sync", hold: int = HEAD):
    """Config (serve_partial) with model on a, post on b; a's daemon holds after ``hold``."""
    a, b = two_hosts
    (a.work / "fc").mkdir(exist_ok=True)
    fifo = tmp / "release"
    os.mkfifo(fifo)
    config = hosts_config(a.work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-1",
                          ["fc/mem*.nc"], mode=mode, serve_partial=True)
    a.env["ENSIO_TRANSFER_TEST_HOLD"] = f"{hold}:{fifo}"  # a's daemon starts with it
    b.up(config, "post")
    return a, b, config, fifo


_release = release


def _wait_blocked(proc: subprocess.Popen) -> None:
    if _FUTEX is not None:
        wait_for(lambda: in_syscall(proc.pid, _FUTEX), what="the consumer waiting in a read")


#: mode → (the bytes rewritten after the first send: at, n; where the stream is held;
#: the bytes the consumer reads first). Sync sends the whole file after the close: the
#: hold is inside it. Async sent the file while it was written and after the close only
#: the rewritten bytes: the hold is inside those, and the first read ends below the hold.
CASES = {"sync": ((0, 0), HEAD, HEAD),
         "async": ((2 << 20, 512 << 10), 100 << 10, (2 << 20) + (50 << 10))}


@pytest.mark.parametrize("mode", sorted(CASES))
def test_reads_return_before_the_whole_file_arrived_and_wait_for_the_rest(two_hosts, tmp_path,
                                                                          mode):
    (at, n), hold, head = CASES[mode]
    a, b, config, fifo = _setup(two_hosts, tmp_path, mode, hold=hold)
    data = _produced(SIZE, at, n)
    prod = a.start(config, "model", PY, "-c", PRODUCER, "fc/mem000.nc", str(SIZE), str(at),
                   str(n))
    assert prod.stdout.readline() == "written\n", prod.stderr.read()
    if mode == "async":  # the first write has reached b: only the rewrite is left
        wait_for(lambda: _sent(a) >= SIZE, what="the async send of the first write")
    wait_for(lambda: "mem000.nc" in _held(b), what="b holding the file")
    cons = b.start(config, "post", PY, "-c", CONSUMER, "fc/mem000.nc", str(head))
    prod.stdin.write("close\n")
    prod.stdin.flush()
    first = cons.stdout.readline().split()
    assert first == [str(SIZE), _sha(data[:head])], cons.stderr.read()
    # the stream is held: the file on b cannot be complete yet
    assert _held(b)["mem000.nc"].state == "writing"
    assert prod.poll() is None  # its close (sync) or its exit (async) waits for b's copy
    assert cons.stdout.readline() == "rest\n"
    _wait_blocked(cons)
    assert _held(b)["mem000.nc"].waiters == 0  # not in the daemon: in its own read
    _release(fifo, "go")
    out, err = cons.communicate(timeout=60)
    assert out.split() == ["whole", str(SIZE), _sha(data)], err
    assert prod.communicate(timeout=60)[0] == "closed\n"
    assert _held(b)["mem000.nc"].state == "complete"
    assert not list((a.work / "fc").iterdir())


def test_a_stream_broken_mid_file_gives_eio_beyond_the_received_bytes(two_hosts, tmp_path):
    a, b, config, fifo = _setup(two_hosts, tmp_path)
    data = random.Random(12).randbytes(SIZE)
    prod = a.start(config, "model", PY, "-c", PRODUCER, "fc/mem000.nc", str(SIZE), "0", "0")
    assert prod.stdout.readline() == "written\n", prod.stderr.read()
    wait_for(lambda: "mem000.nc" in _held(b), what="b holding the file")
    cons = b.start(config, "post", PY, "-c", CONSUMER, "fc/mem000.nc", str(HEAD))
    prod.stdin.write("close\n")
    prod.stdin.flush()
    assert cons.stdout.readline().split() == [str(SIZE), _sha(data[:HEAD])]
    assert cons.stdout.readline() == "rest\n"
    _wait_blocked(cons)
    _release(fifo, "break")
    out, err = cons.communicate(timeout=60)
    # the rest: EIO, never zeros; the bytes that did arrive still read
    assert out.split() == ["error", "5", _sha(data[:HEAD])], err
    prod.communicate(timeout=60)
    assert _held(b)["mem000.nc"].state == "failed"
    path = (a.work / "fc" / "mem000.nc").resolve()
    log = b.log()
    assert f"{path}: the stream from host a broke off before the file was complete" in log
    assert (f"{path}: partial readers get EIO for the bytes that did not arrive "
            f"(component model@a)") in log


# -- netCDF programs -------------------------------------------------------------------------

#: netCDF4-python writing a file of about 3 MB (HDF5 writes with pwrite; classic with write)
WRITER = r"""
import sys
import netCDF4
import numpy as np
with netCDF4.Dataset(sys.argv[1], "w", format=sys.argv[2]) as ds:
    ds.title = "partial"
    ds.createDimension("t", 4)
    ds.createDimension("x", 100_000)
    v = ds.createVariable("v", "f8", ("t", "x"))
    v.units = "K"
    for i in range(4):
        v[i] = np.arange(100_000) * (i + 1.5)
"""

READER = r"""
import hashlib, json, sys
import netCDF4
path = sys.argv[1]
with netCDF4.Dataset(path) as ds:
    ds.set_auto_mask(False)
    values = {k: hashlib.sha256(v[...].tobytes()).hexdigest() for k, v in ds.variables.items()}
    attrs = {k: str(ds.getncattr(k)) for k in ds.ncattrs()}
with open(path, "rb") as f:
    data = f.read()
print(json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "values": values,
                  "attrs": attrs}))
"""


def _ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, p.stderr
    return p


@needs_netcdf
@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_CLASSIC"])
def test_netcdf_programs_read_a_partial_file_as_the_producer_wrote_it(two_hosts, tmp_path,
                                                                       fmt):
    a, b, config, fifo = _setup(two_hosts, tmp_path, hold=64 << 10)
    work = a.work
    (work / "ref").mkdir()
    _ok(subprocess.run([PY, "-c", WRITER, "ref/mem000.nc", fmt], cwd=work,
                       capture_output=True, text=True))
    ref = work / "ref" / "mem000.nc"
    prod = a.start(config, "model", PY, "-c", WRITER, "fc/mem000.nc", fmt)
    wait_for(lambda: "mem000.nc" in _held(b) and _sent(a) >= 64 << 10,
             what="the first 64 KiB on b")
    readers = [b.start(config, "post", "ncdump", "fc/mem000.nc"),
               b.start(config, "post", PY, "-c", READER, "fc/mem000.nc")]
    for r in readers:
        _wait_blocked(r)
    assert _held(b)["mem000.nc"].state == "writing"
    _release(fifo, "go")
    dumped, err = readers[0].communicate(timeout=60)
    assert readers[0].returncode == 0, err
    plain = _ok(subprocess.run(["ncdump", "ref/mem000.nc"], cwd=work, capture_output=True,
                               text=True)).stdout
    assert dumped == plain
    got, err = readers[1].communicate(timeout=60)
    assert readers[1].returncode == 0, err
    want = _ok(subprocess.run([PY, "-c", READER, str(ref)], capture_output=True,
                              text=True)).stdout
    assert json.loads(got) == json.loads(want)
    assert json.loads(got)["sha256"] == _sha(ref.read_bytes())
    assert prod.wait(timeout=60) == 0
    assert not list((work / "fc").iterdir())


@needs_netcdf
@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_CLASSIC"])
def test_a_header_read_does_not_wait_for_the_data(two_hosts, tmp_path, fmt):
    """The point of serve_partial: ``ncdump -h`` needs the header, not the 3 MB after it."""
    a, b, config, fifo = _setup(two_hosts, tmp_path, hold=64 << 10)
    work = a.work
    (work / "ref").mkdir()
    _ok(subprocess.run([PY, "-c", WRITER, "ref/mem000.nc", fmt], cwd=work,
                       capture_output=True, text=True))
    prod = a.start(config, "model", PY, "-c", WRITER, "fc/mem000.nc", fmt)
    wait_for(lambda: "mem000.nc" in _held(b) and _sent(a) >= 64 << 10,
             what="the first 64 KiB on b")
    header = _ok(b.run(config, "post", "ncdump", "-h", "fc/mem000.nc", timeout=60)).stdout
    assert _held(b)["mem000.nc"].state == "writing"  # still held after 64 KiB
    assert header == _ok(subprocess.run(["ncdump", "-h", "ref/mem000.nc"], cwd=work,
                                        capture_output=True, text=True)).stdout
    _release(fifo, "go")
    assert prod.wait(timeout=60) == 0
    assert _held(b)["mem000.nc"].state == "complete"


def test_without_serve_partial_the_open_waits_for_the_whole_file(two_hosts, tmp_path):
    """The default: the same held stream, and the consumer's open waits in the daemon."""
    a, b = two_hosts
    (a.work / "fc").mkdir()
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    config = hosts_config(a.work / "t.yaml", {"a": ["model"], "b": ["post"]}, "1-1",
                          ["fc/mem*.nc"])
    assert "serve_partial" not in yaml.safe_load(config.read_text())["connections"][0]
    a.env["ENSIO_TRANSFER_TEST_HOLD"] = f"{HEAD}:{fifo}"
    b.up(config, "post")
    data = random.Random(12).randbytes(SIZE)
    prod = a.start(config, "model", PY, "-c", PRODUCER, "fc/mem000.nc", str(SIZE), "0", "0")
    assert prod.stdout.readline() == "written\n", prod.stderr.read()
    wait_for(lambda: "mem000.nc" in _held(b), what="b holding the file")
    cons = b.start(config, "post", PY, "-c", CONSUMER, "fc/mem000.nc", str(HEAD))
    prod.stdin.write("close\n")
    prod.stdin.flush()
    wait_for(lambda: _sent(a) >= HEAD, what="the held stream")
    wait_for(lambda: _held(b)["mem000.nc"].waiters == 1, what="the open waiting in b's daemon")
    _release(fifo, "go")
    out, err = cons.communicate(timeout=60)
    assert out.split() == [str(SIZE), _sha(data[:HEAD]), "rest", "whole", str(SIZE),
                           _sha(data)], err
    assert prod.communicate(timeout=60)[0] == "closed\n"


def _family_in_futex_wait(pid: int) -> bool:
    """``pid`` or one of its children waits in futex."""
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return any(in_syscall(p, _FUTEX) for p in [pid, *kids] if Path(f"/proc/{p}").exists())


#: hands its partial descriptor to another program (cat, as stdin): exec waits for it all
EXEC_CONSUMER = r"""
import hashlib, os, subprocess, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print("opened", flush=True)
out = subprocess.run(["cat"], stdin=fd, stdout=subprocess.PIPE, check=True).stdout
print(len(out), hashlib.sha256(out).hexdigest(), flush=True)
"""


def test_a_program_started_with_a_partial_descriptor_reads_the_whole_file(two_hosts, tmp_path):
    """exec: the new program's reads cannot wait, so the exec waits for the whole file."""
    a, b, config, fifo = _setup(two_hosts, tmp_path)
    data = _produced(SIZE, 0, 0)
    prod = a.start(config, "model", PY, "-c", PRODUCER, "fc/mem000.nc", str(SIZE), "0", "0")
    assert prod.stdout.readline() == "written\n", prod.stderr.read()
    wait_for(lambda: "mem000.nc" in _held(b), what="b holding the file")
    cons = b.start(config, "post", PY, "-c", EXEC_CONSUMER, "fc/mem000.nc")
    prod.stdin.write("close\n")
    prod.stdin.flush()
    assert cons.stdout.readline() == "opened\n", cons.stderr.read()
    if _FUTEX is not None:
        wait_for(lambda: _family_in_futex_wait(cons.pid), what="the exec waiting")
    assert _held(b)["mem000.nc"].state == "writing"
    _release(fifo, "go")
    out, err = cons.communicate(timeout=60)
    assert out.split() == [str(SIZE), _sha(data)], err
    assert prod.communicate(timeout=60)[0] == "closed\n"


def test_a_reader_whose_daemon_dies_gets_eio_not_a_hang(two_hosts, tmp_path):
    import signal

    from transfer_support import daemon_pid, process_gone

    a, b, config, fifo = _setup(two_hosts, tmp_path)
    data = _produced(SIZE, 0, 0)
    prod = a.start(config, "model", PY, "-c", PRODUCER, "fc/mem000.nc", str(SIZE), "0", "0")
    assert prod.stdout.readline() == "written\n", prod.stderr.read()
    wait_for(lambda: "mem000.nc" in _held(b), what="b holding the file")
    cons = b.start(config, "post", PY, "-c", CONSUMER, "fc/mem000.nc", str(HEAD))
    prod.stdin.write("close\n")
    prod.stdin.flush()
    assert cons.stdout.readline().split() == [str(SIZE), _sha(data[:HEAD])]
    assert cons.stdout.readline() == "rest\n"
    _wait_blocked(cons)
    pid = daemon_pid(b.dir)
    os.kill(pid, signal.SIGKILL)  # the daemon that writes the progress map
    wait_for(lambda: process_gone(pid), what="b's daemon's death")
    out, err = cons.communicate(timeout=60)
    assert out.split() == ["error", "5", _sha(data[:HEAD])], err
    assert f"the staging daemon (pid {pid}) died while this file arrived: EIO" in err
    _release(fifo, "break")  # a's stream: b is gone anyway
    prod.communicate(timeout=60)
