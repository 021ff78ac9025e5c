"""Unmodified programs under ``ensio run``: ncgen, nccopy and cdo produce; ncdump, cdo and a
Python program (netCDF4, h5py) consume.

The reference is always the same command run without transfer: the consumer must read
exactly the bytes that run writes, and the transferred path must never appear on disk
(except with ``persist`` or a fallback, which are tested here too). Faults: a producer
killed before its close, a daemon killed before or during a producer's work.
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
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    CDL,
    Host,
    daemon_pid,
    host_fixture,
    interposer_cache_fixture,
    process_gone,
    wait_for,
    write_config,
)

pytestmark = needs.tools_mark("ncgen", "ncdump", "nccopy", "cdo")  # netcdf-bin, cdo

PY = sys.executable

#: A consumer: the bytes it reads (sha256, size), what netCDF4 and h5py decode, stat/access.
READER = r"""
import hashlib, json, os, sys
import netCDF4
path, hdf5 = sys.argv[1], sys.argv[2] == "1"
with open(path, "rb") as f:
    data = f.read()
out = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
       "stat_size": os.stat(path).st_size, "exists": os.path.exists(path),
       "readable": os.access(path, os.R_OK)}
with netCDF4.Dataset(path) as ds:
    ds.set_auto_mask(False)
    out["netcdf4"] = {k: v[...].tolist() for k, v in ds.variables.items()}
    out["format"] = ds.data_model
if hdf5:
    import h5py
    with h5py.File(path, "r") as f:
        out["h5py"] = {k: f[k][...].tolist() for k in ("temp", "count")}
print(json.dumps(out, sort_keys=True))
"""

#: producer name → (argv with {out}/{cdl}/{classic}/{nc4} placeholders, writes netCDF-4)
PRODUCERS = {
    "ncgen-netcdf4": (["ncgen", "-4", "-o", "{out}", "{cdl}"], True),
    "ncgen-classic": (["ncgen", "-k", "classic", "-o", "{out}", "{cdl}"], False),
    "nccopy-netcdf4": (["nccopy", "-k", "nc4", "{classic}", "{out}"], True),
    "nccopy-classic": (["nccopy", "-k", "classic", "{nc4}", "{out}"], False),
    "cdo-netcdf4": (["cdo", "-s", "--no_history", "-f", "nc4", "copy", "{classic}", "{out}"],
                    True),
    "cdo-classic": (["cdo", "-s", "--no_history", "copy", "{classic}", "{out}"], False),
}


@pytest.fixture
def case(host: Host):
    """Inputs on disk (not transferred), a config for fc/mem*.nc, and a reference directory."""
    w = host.work
    (w / "sample.cdl").write_text(CDL)
    (w / "in").mkdir()
    subprocess.run(["ncgen", "-k", "classic", "-o", "in/classic.nc", "sample.cdl"], cwd=w,
                   check=True)
    subprocess.run(["ncgen", "-4", "-o", "in/nc4.nc", "sample.cdl"], cwd=w, check=True)
    (w / "fc").mkdir()
    (w / "ref").mkdir()
    return host, write_config(w / "t.yaml", ["fc/mem*.nc"])


def _argv(template: list[str], out: str) -> list[str]:
    return [a.format(out=out, cdl="sample.cdl", classic="in/classic.nc", nc4="in/nc4.nc")
            for a in template]


def _reference(host: Host, argv: list[str]) -> Path:
    ref = host.work / "ref" / "mem001.nc"
    subprocess.run(_argv(argv, "ref/mem001.nc"), cwd=host.work, check=True)
    assert ref.exists()
    return ref


def _ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, p.stderr
    return p


@pytest.mark.parametrize("producer", sorted(PRODUCERS))
def test_consumers_read_the_bytes_a_plain_run_writes(case, producer):
    host, config = case
    argv, nc4 = PRODUCERS[producer]
    ref = _reference(host, argv)
    _ok(host.run(config, "model", *_argv(argv, "fc/mem001.nc")))
    target = host.work / "fc" / "mem001.nc"
    assert not target.exists()
    [held] = host.status()
    assert (held.path, held.state, held.component, held.size) == (
        str(target.resolve()), "complete", "model", ref.stat().st_size)

    # ncdump: the same text as on the reference file (same name, so the same header)
    dumped = _ok(host.run(config, "post", "ncdump", "fc/mem001.nc")).stdout
    assert dumped == _ok(subprocess.run(["ncdump", "ref/mem001.nc"], cwd=host.work,
                                        capture_output=True, text=True)).stdout
    # Python: the bytes, and what netCDF4 / h5py decode, equal the reference's
    got = json.loads(_ok(host.run(config, "post", PY, "-c", READER, "fc/mem001.nc",
                                  str(int(nc4)))).stdout)
    want = json.loads(_ok(subprocess.run([PY, "-c", READER, "ref/mem001.nc", str(int(nc4))],
                                         cwd=host.work, capture_output=True, text=True)).stdout)
    assert got == want
    assert got["sha256"] == hashlib.sha256(ref.read_bytes()).hexdigest()
    assert got["exists"] and got["readable"] and got["stat_size"] == ref.stat().st_size
    # cdo as a consumer writing a real file: the same bytes as cdo on the reference
    _ok(host.run(config, "post", "cdo", "-s", "--no_history", "copy", "fc/mem001.nc",
                 "copy_t.nc"))
    _ok(subprocess.run(["cdo", "-s", "--no_history", "copy", "ref/mem001.nc", "copy_r.nc"],
                       cwd=host.work, capture_output=True))
    assert (host.work / "copy_t.nc").read_bytes() == (host.work / "copy_r.nc").read_bytes()
    assert not target.exists() and not list((host.work / "fc").iterdir())


def test_a_transferred_file_can_feed_the_next_producer(case):
    """nccopy (model) reads a file ncgen (model) wrote into memory and writes another."""
    host, config = case
    _ok(host.run(config, "model", "ncgen", "-4", "-o", "fc/mem001.nc", "sample.cdl"))
    _ok(host.run(config, "model", "nccopy", "-k", "classic", "fc/mem001.nc", "fc/mem002.nc"))
    subprocess.run(["nccopy", "-k", "classic", "in/nc4.nc", "ref/mem002.nc"], cwd=host.work,
                   check=True)
    got = json.loads(_ok(host.run(config, "post", PY, "-c", READER, "fc/mem002.nc",
                                  "0")).stdout)
    assert got["sha256"] == hashlib.sha256((host.work / "ref/mem002.nc").read_bytes()).hexdigest()
    assert not list((host.work / "fc").iterdir())


def test_persist_writes_behind_and_rm_removes_it(case):
    host, _ = case
    config = write_config(host.work / "p.yaml", ["fc/mem*.nc"], persist=True)
    ref = _reference(host, PRODUCERS["ncgen-netcdf4"][0])
    _ok(host.run(config, "model", "ncgen", "-4", "-o", "fc/mem001.nc", "sample.cdl"))
    wait_for(lambda: host.status()[0].persist == "done", what="the write-behind")
    target = host.work / "fc" / "mem001.nc"
    assert target.read_bytes() == ref.read_bytes()
    assert not list((host.work / "fc").glob(".*"))  # no temporary left
    dumped = _ok(host.run(config, "post", "ncdump", "-h", "fc/mem001.nc")).stdout
    assert dumped.startswith("netcdf mem001 {")
    _ok(host.run(config, "post", "rm", "fc/mem001.nc"))  # unlink through the interposer
    assert host.status() == [] and not target.exists()


def test_budget_fallback_files_writes_the_real_file(case):
    host, _ = case
    config = write_config(host.work / "b.yaml", ["fc/mem*.nc"], memory_mb=0.001)
    ref = _reference(host, PRODUCERS["ncgen-netcdf4"][0])
    _ok(host.run(config, "model", "ncgen", "-4", "-o", "fc/mem001.nc", "sample.cdl"))
    target = host.work / "fc" / "mem001.nc"
    assert target.read_bytes() == ref.read_bytes() and host.status() == []
    assert f"{target.resolve()}: over the memory budget of connection restarts" in host.log()
    got = json.loads(_ok(host.run(config, "post", PY, "-c", READER, "fc/mem001.nc",
                                  "1")).stdout)
    assert got["sha256"] == hashlib.sha256(ref.read_bytes()).hexdigest()


def test_budget_fallback_error_refuses_the_open(case):
    host, _ = case
    config = write_config(host.work / "e.yaml", ["fc/mem*.nc"], memory_mb=0.001,
                          fallback="error")
    _ok(host.run(config, "model", "ncgen", "-4", "-o", "fc/mem001.nc", "sample.cdl"))
    p = host.run(config, "model", "ncgen", "-4", "-o", "fc/mem002.nc", "sample.cdl")
    assert p.returncode != 0  # netCDF reports HDF5's failed create as "Permission denied"
    p = host.run(config, "model", PY, "-c", "open('fc/mem002.nc', 'wb')")
    assert "[Errno 28] No space left on device" in p.stderr
    log = host.log()
    second = (host.work / "fc" / "mem002.nc").resolve()
    assert f"{second}: connection restarts is at its memory budget: open by model" in log
    assert [s.path for s in host.status()] == [str((host.work / "fc/mem001.nc").resolve())]
    assert not list((host.work / "fc").iterdir())


HALF = r"""
import sys
f = open(sys.argv[1], "wb")
f.write(b"CDF\x01" + bytes(4000))
f.flush()
print("written", flush=True)
sys.stdin.readline()
f.write(bytes(4000))
f.close()
print("closed", flush=True)
"""


def test_a_killed_producer_gives_consumers_an_error_not_a_hang(case):
    host, config = case
    prod = host.start(config, "model", PY, "-c", HALF, "fc/mem001.nc")
    assert prod.stdout.readline() == "written\n"
    cons = host.start(config, "post", "ncdump", "-h", "fc/mem001.nc")
    wait_for(lambda: host.status()[0].waiters == 1, what="ncdump waiting for the file")
    os.kill(prod.pid, signal.SIGKILL)  # ensio run exec'd: this is the producer itself
    prod.wait(60)
    _, err = cons.communicate(timeout=60)
    assert cons.returncode != 0 and "Input/output error" in err
    late = host.run(config, "post", PY, "-c", "open('fc/mem001.nc', 'rb')")
    assert late.returncode != 0 and "[Errno 5] Input/output error" in late.stderr
    path = (host.work / "fc" / "mem001.nc").resolve()
    log = host.log()
    assert f"{path}: the producer model (pid {prod.pid}) died before closing it" in log
    assert f"{path}: open by post (pid {cons.pid}) fails with EIO" in log
    assert not path.exists()


def _kill_daemon(host: Host) -> None:
    pid = daemon_pid(host.dir)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: process_gone(pid), what="the daemon's death")


def _transfer_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ensio-transfer")]


def test_without_a_daemon_a_new_producer_writes_the_real_file(case):
    host, config = case
    ref = _reference(host, PRODUCERS["ncgen-netcdf4"][0])
    script = "echo ready; read go; exec ncgen -4 -o fc/mem001.nc sample.cdl"
    prod = host.start(config, "model", "sh", "-c", script)
    assert prod.stdout.readline() == "ready\n"  # ensio run has started the daemon and exec'd
    _kill_daemon(host)
    _, err = prod.communicate("go\n", timeout=60)
    assert prod.returncode == 0, err
    [line] = _transfer_lines(err)
    assert "staging daemon unreachable" in line and "using real files for new opens" in line
    assert (host.work / "fc" / "mem001.nc").read_bytes() == ref.read_bytes()
    # the next ensio run starts a new daemon over the dead one's socket
    _ok(host.run(config, "model", "ncgen", "-4", "-o", "fc/mem002.nc", "sample.cdl"))
    assert [s.path for s in host.status()] == [str((host.work / "fc/mem002.nc").resolve())]
    assert not (host.work / "fc" / "mem002.nc").exists()


def test_a_daemon_dying_under_a_producer_does_not_lose_its_file(case):
    host, config = case
    prod = host.start(config, "model", PY, "-c", HALF, "fc/mem001.nc")
    assert prod.stdout.readline() == "written\n"
    _kill_daemon(host)
    out, err = prod.communicate("go\n", timeout=60)
    assert prod.returncode == 0 and out == "closed\n", err
    lines = _transfer_lines(err)
    assert len(lines) == 2 and "written to the real file" in lines[1]
    assert (host.work / "fc" / "mem001.nc").read_bytes() == b"CDF\x01" + bytes(8000)
    assert not list((host.work / "fc").glob(".*"))


def test_run_passes_the_exit_status_through(case):
    host, config = case
    assert host.run(config, "model", "sh", "-c", "exit 7").returncode == 7
    p = host.run(config, "model", "no-such-program-ensio")
    assert p.returncode == 127 and "command not found: no-such-program-ensio" in p.stderr


def test_transfer_status_and_stop_commands(case):
    host, config = case
    _ok(host.run(config, "model", "ncgen", "-k", "classic", "-o", "fc/mem001.nc", "sample.cdl"))
    out = _ok(host.ensio("transfer", "status")).stdout.splitlines()
    assert out[0] == f"staging daemon in {host.dir}: 1 file(s)"
    assert out[1].split() == ["path", "bytes", "state", "component", "connection", "persist"]
    size = (host.work / "in" / "classic.nc").stat().st_size  # ncgen writes the same bytes
    assert out[2].split() == [str((host.work / "fc/mem001.nc").resolve()), str(size),
                              "complete", "model", "restarts", "no"]
    stopped = _ok(host.ensio("transfer", "stop")).stdout
    assert stopped == f"stopped the staging daemon in {host.dir}\n"
    p = host.ensio("transfer", "status")
    assert p.returncode == 1 and p.stdout == f"no staging daemon runs in {host.dir}\n"
    # stop wrote the unconsumed file of this fallback: files connection to its real path
    assert (host.work / "fc/mem001.nc").read_bytes() == (host.work / "in/classic.nc").read_bytes()
