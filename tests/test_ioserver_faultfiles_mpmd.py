"""Output files after a process of an MPMD job dies or the disk fills (issue 27 item 2).

The real layout: the Fortran model tests/data/ioclient/faultfiles_model.f90 (2 ranks,
built once per module against ``ensio ioclient build``) and ``ensio ioserver`` ranks,
server first or last on the mpiexec line. Faults:

- the server SIGKILLed at a fault point drawn uniformly among the points of an
  uninterrupted run (``ENSIO_FAULT_COUNT`` counts them, ``ENSIO_FAULT_KILL_AT``
  kills there: the kill lands where the test says, and the labels up to it say how
  many records each file had published);
- a model rank SIGKILLing itself after a given step;
- a full disk under the server (the ENOSPC shim of tests/faultfs.py, byte budget
  drawn below what the run writes);
- one of two servers writing a shared CDF-5 file killed at a drawn point.

Every rank must exit non-zero (no rank left running after mpiexec returns; the
subprocess timeout is only a safety net), and after ``ensio ioserver recover``
every file must be readable by ncdump, CDO and xarray with only complete records:
each equal to the model's formula, the time axis the periods' midpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import faultfs
import needs
import netCDF4
import numpy as np
import pytest
import seeds
import xarray as xr
import yaml
from test_ioserver_faults import _assert_job_ended

from ensio.cli.main import main as cli_main
from ensio.ioserver.build import build_client

DATA = Path(__file__).parent / "data" / "ioclient"
BIN = Path(sys.executable).parent
SAFETY = 120  # seconds: a job still running then has hung (the test fails)
NI, NJ, NSTEPS = 8, 6, 12

pytestmark = [needs.tools_mark("gfortran", "ncdump", "cdo"),
              needs.mark(needs.venv_tool, "mpicc")]

#: file name -> (steps per record, operation); the split files: 4 records each
FILES = {"inst.nc": (1, "instant"), "mean2.nc": (2, "average")}
SPLITS = [f"sp_2001010{1 if h < 24 else 2}{h % 24:02d}.nc" for h in (0, 4, 8)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Fortran model, compiled against a freshly built client library."""
    tmp = tmp_path_factory.mktemp("faultfiles")
    r = build_client(tmp / "prefix")
    exe = tmp / "faultfiles_model"
    subprocess.run([str(r.fc), "-Wall", str(DATA / "faultfiles_model.f90"), "-o", str(exe),
                    *r.fortran_flags.split()], check=True, timeout=120, cwd=tmp)
    return exe


def _config(tmp: Path, servers: int = 1, shared: bool = False) -> Path:
    files = [{"id": "inst", "name": "inst", "output_freq": "1ts", "format": "netcdf4",
              "fields": [{"field_ref": "tas", "operation": "instant"}]},
             {"id": "mean2", "name": "mean2", "output_freq": "2ts", "format": "cdf5",
              "fields": [{"field_ref": "tas", "operation": "average"}]},
             {"id": "sp", "name": "sp_{start:%Y%m%d%H}", "output_freq": "1ts",
              "split_freq": "4h", "fields": [{"field_ref": "tas", "operation": "instant"}]}]
    if shared:
        files = [{"id": "sh", "name": "shared", "output_freq": "1ts", "format": "cdf5",
                  "shared": "true", "fields": [{"field_ref": "tas", "operation": "instant"}]}]
    raw = {"ioserver": {
        "mode": "server", "servers": servers, "output_dir": str(tmp / "out"),
        "calendar": {"type": "noleap", "start": "2001-01-01 00:00:00", "timestep": "1h"},
        "domains": [{"id": "atm", "type": "rectilinear", "ni_glo": NI, "nj_glo": NJ}],
        "grids": [{"id": "g", "domain": "atm"}],
        "fields": [{"id": "tas", "grid": "g", "units": "K"}],
        "files": files,
    }}
    path = tmp / "iodef.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _command(model: Path, config: Path, server_first: bool, args: tuple[str, ...] = (),
             servers: int = 1) -> list[str]:
    models = ["-n", "2", str(model), str(NSTEPS), *args]
    server = ["-n", str(servers), str(BIN / "ensio"), "ioserver", str(config)]
    return [str(BIN / "mpiexec"), *(server + [":"] + models if server_first
                                    else models + [":"] + server)]


def _run(cmd: list[str], tmp: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SAFETY,
                          env={**os.environ, **env}, stdin=subprocess.DEVNULL)
    _assert_job_ended(tmp)
    return proc


def _expected(first_step: int, steps: int, operation: str) -> np.ndarray:
    """The record made of model steps first_step .. first_step + steps - 1 (1-based)."""
    j, i = np.meshgrid(np.arange(1, NJ + 1), np.arange(1, NI + 1), indexing="ij")
    s = np.arange(first_step, first_step + steps, dtype=float)
    if operation == "instant":
        s = s[-1:]
    return (s.mean() * 1000.0 + j * 10.0 + i).astype(np.float32)


def _check_file(path: Path, first_step: int, n: int, steps: int, operation: str) -> None:
    """``path`` holds exactly ``n`` complete records from model step ``first_step``."""
    for cmd in (["ncdump", "-h"], ["ncdump", "-v", "time"], ["cdo", "-s", "sinfon"],
                ["cdo", "-s", "info"]):
        run = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, (cmd, path, run.stderr)
    with xr.open_dataset(path, decode_times=False) as ds:
        assert ds.sizes["time"] == n, path
        t0 = 3600.0 * (first_step - 1 + steps * np.arange(n))
        np.testing.assert_array_equal(ds.time.values, t0 + 1800.0 * steps)
        for r in range(n):
            want = _expected(first_step + r * steps, steps, operation)
            np.testing.assert_array_equal(ds.tas.values[r], want, err_msg=f"{path} {r}")


def _published(labels: list[str]) -> dict[str, int]:
    """Records each file had published by the last of ``labels``."""
    counts: dict[str, int] = {}
    for label in labels:
        parts = label.split()
        if parts[0] == "ioserver-published":
            counts[parts[1]] = int(parts[2])
    return counts


def _check_out(out: Path, counts: dict[str, int]) -> None:
    """Every file with the records ``counts`` gives (absent: none), nothing else."""
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "leftovers"
    expected = set()
    for name, (steps, op) in FILES.items():
        if counts.get(name, 0):
            expected.add(name)
            _check_file(out / name, 1, counts[name], steps, op)
    for k, name in enumerate(SPLITS):
        if counts.get(name, 0):
            expected.add(name)
            _check_file(out / name, 1 + 4 * k, counts[name], 1, "instant")
    assert {p.name for p in out.iterdir()} == expected


@pytest.fixture(scope="module")
def counted(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An uninterrupted run: its fault points (server rank) and bytes written."""
    tmp = tmp_path_factory.mktemp("counted")
    shim = faultfs.build_shim(tmp)
    log, report = tmp / "points.jsonl", tmp / "bytes"
    env = {"ENSIO_FAULT_COUNT": str(log), "ENSIO_FAULT_RANK": "2",
           **faultfs.enospc_env(shim, tmp / "out", None, report)}
    proc = _run(_command(model, _config(tmp), False), tmp, env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (line,) = log.read_text().splitlines()
    labels = json.loads(line)["labels"]
    full = {n: NSTEPS // s for n, (s, _) in FILES.items()} | {n: 4 for n in SPLITS}
    _check_out(tmp / "out", full)
    assert _published(labels) == full
    return {"labels": labels, "bytes": sum(map(int, report.read_text().split())), "shim": shim}


@pytest.mark.parametrize("server_first", [False, True])
def test_a_server_killed_at_a_drawn_point_leaves_only_complete_records(
        model: Path, counted: dict, tmp_path: Path, server_first: bool) -> None:
    labels = counted["labels"]
    rng = np.random.default_rng(seeds.draw_seed("server kill point"))
    k = int(rng.integers(1, len(labels) + 1))
    rank = 0 if server_first else 2
    env = {"ENSIO_FAULT_KILL_AT": str(k), "ENSIO_FAULT_RANK": str(rank)}
    proc = _run(_command(model, _config(tmp_path), server_first), tmp_path, env)
    assert proc.returncode != 0, (k, labels[k - 1], proc.stdout + proc.stderr)
    assert "DONE" not in proc.stdout
    out = tmp_path / "out"
    for left in out.glob(".*.ensio-partial.ioserver"):  # readable as left: CDF-5
        run = subprocess.run(["ncdump", "-h", str(left)], capture_output=True, timeout=60)
        assert run.returncode == 0, (left, run.stderr)
    assert cli_main(["ioserver", "recover", str(out)]) == 0
    _check_out(out, _published(labels[:k]))


def test_a_model_rank_killed_mid_run_leaves_only_complete_records(
        model: Path, tmp_path: Path) -> None:
    kill_step = 7  # once the server is writing (the staging file of inst.nc exists)
    staging = tmp_path / "out" / ".inst.nc.ensio-partial.ioserver"
    proc = _run(_command(model, _config(tmp_path), False, (str(kill_step), str(staging))),
                tmp_path, {})
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "DONE" not in proc.stdout
    out = tmp_path / "out"
    assert cli_main(["ioserver", "recover", str(out)]) == 0
    counts = {}
    for p in out.iterdir():  # whatever the server had completed: a prefix of the run
        with netCDF4.Dataset(p) as ds:
            counts[p.name] = len(ds.dimensions["time"])
    assert counts.get("inst.nc", 0) <= kill_step and counts.get("mean2.nc", 0) <= kill_step // 2
    _check_out(out, counts)


@pytest.mark.parametrize("draw", range(2))
def test_a_full_disk_under_the_server_is_one_line_and_files_stay_complete(
        model: Path, counted: dict, tmp_path: Path, draw: int) -> None:
    rng = np.random.default_rng(seeds.draw_seed(f"server disk budget {draw}"))
    budget = int(rng.integers(0, counted["bytes"]))
    out = tmp_path / "out"
    out.mkdir()
    env = faultfs.enospc_env(counted["shim"], out, budget)
    proc = _run(_command(model, _config(tmp_path), draw % 2 == 0), tmp_path, env)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, (budget, text[-3000:])
    hits = [line for line in text.splitlines() if "No space left on device" in line]
    assert len(hits) == 1 and str(out) in hits[0], (budget, text[-3000:])
    counts = {}
    for p in out.iterdir():  # published by the server on its way out: complete records
        if not p.name.startswith("."):
            with netCDF4.Dataset(p) as ds:
                counts[p.name] = len(ds.dimensions["time"])
    _check_out(out, counts)


@pytest.mark.parametrize("victim", [0, 1])
def test_a_shared_file_keeps_its_announced_records_when_a_server_dies(
        model: Path, tmp_path: Path, victim: int) -> None:
    config = _config(tmp_path, servers=2, shared=True)
    count = tmp_path / "points.jsonl"
    rank = 2 + victim  # servers last: world ranks 2 and 3
    proc = _run(_command(model, config, False, servers=2), tmp_path,
                {"ENSIO_FAULT_COUNT": str(count), "ENSIO_FAULT_RANK": str(rank)})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    labels = json.loads(count.read_text().splitlines()[0])["labels"]
    _check_file(tmp_path / "out" / "shared.nc", 1, NSTEPS, 1, "instant")
    rng = np.random.default_rng(seeds.draw_seed(f"shared kill point {victim}"))
    k = int(rng.integers(1, len(labels) + 1))
    (tmp_path / "out" / "shared.nc").unlink()
    proc = _run(_command(model, config, False, servers=2), tmp_path,
                {"ENSIO_FAULT_KILL_AT": str(k), "ENSIO_FAULT_RANK": str(rank)})
    assert proc.returncode != 0, (k, proc.stdout + proc.stderr)
    out = tmp_path / "out" / "shared.nc"
    if out.exists():  # created by server 0 before the kill: the announced records only
        with netCDF4.Dataset(out) as ds:
            n = len(ds.dimensions["time"])
        done = [int(x.split()[2]) for x in labels[:k] if x.startswith("ioserver-shared-done")]
        assert n <= max(done, default=0)
        if n:
            _check_file(out, 1, n, 1, "instant")
        else:
            run = subprocess.run(["ncdump", "-h", str(out)], capture_output=True, timeout=60)
            assert run.returncode == 0, run.stderr


def test_a_full_disk_under_two_servers_of_a_shared_file_is_one_line(
        model: Path, counted: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    config = _config(tmp_path, servers=2, shared=True)
    report = tmp_path / "bytes"
    env = faultfs.enospc_env(counted["shim"], out, None, report)
    proc = _run(_command(model, config, False, servers=2), tmp_path, env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    total = sum(map(int, report.read_text().split()))
    (out / "shared.nc").unlink()
    rng = np.random.default_rng(seeds.draw_seed("shared disk budget"))
    budget = int(rng.integers(0, total))
    env = faultfs.enospc_env(counted["shim"], out, budget)
    proc = _run(_command(model, config, True, servers=2), tmp_path, env)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, (budget, text[-3000:])
    hits = [line for line in text.splitlines() if "No space left on device" in line]
    assert len(hits) == 1 and str(out / "shared.nc") in hits[0], (budget, text[-3000:])
    if (out / "shared.nc").exists():
        with netCDF4.Dataset(out / "shared.nc") as ds:
            n = len(ds.dimensions["time"])
        if n:
            _check_file(out / "shared.nc", 1, n, 1, "instant")
