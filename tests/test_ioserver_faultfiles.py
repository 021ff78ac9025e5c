"""Output files of the I/O server writer after a fault (issue 27 item 2).

A child process writes periods through :class:`ensio.ioserver.writer.FileSet`
(a netCDF-4 file, a CDF-5 file and a daily split netCDF-4 file, every period a
separate write call, as a server's graph advances) and is killed at a fault
point drawn uniformly among all the points of an uninterrupted run (counted
first), or meets a full disk (the ENOSPC shim of tests/faultfs.py, a byte
budget drawn at random). Then ``ensio ioserver recover`` publishes what it
left, and every file must be readable by netCDF-C (``ncdump``), CDO and xarray
and hold only complete records: the number the child had published (from its
log of fault points), each record equal to the formula the child wrote, the
time axis the period midpoints, no all-fill record.
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

from ensio.cli.main import main as cli_main
from ensio.ioserver.recovery import recover_dir
from ensio.ioserver.staged import staging_path

SRC = Path(__file__).resolve().parents[1] / "src"
PERIODS = 6  # 12-hourly periods: three days
NAMES = {"n4": "n4.nc", "c5": "c5.nc"}  # the split file: s_2000010{1,2,3}.nc

pytestmark = needs.tools_mark("ncdump", "cdo")

SECTION = {
    "calendar": {"type": "noleap", "start": "2000-01-01 00:00:00", "timestep": "6h"},
    "axes": [{"id": "lev", "n": 3, "values": [1000, 500, 250], "units": "hPa"}],
    "domains": [{"id": "atm", "type": "rectilinear", "ni_glo": 12, "nj_glo": 6}],
    "grids": [{"id": "a2", "domain": "atm"}, {"id": "a3", "domain": "atm", "axis": "lev"}],
    "fields": [{"id": "tas", "grid": "a2", "units": "K", "operation": "average"},
               {"id": "ta", "grid": "a3", "units": "K", "operation": "average"}],
    "files": [
        {"id": "n4", "name": "n4", "output_freq": "12h", "format": "netcdf4", "compression": 2,
         "fields": [{"field_ref": "tas"}, {"field_ref": "ta"}]},
        {"id": "c5", "name": "c5", "output_freq": "12h", "format": "cdf5",
         "fields": [{"field_ref": "tas"}, {"field_ref": "ta"}]},
        {"id": "s", "name": "s_{start}", "output_freq": "12h", "split_freq": "1d",
         "fields": [{"field_ref": "tas"}]},
    ],
}

# The child: writes PERIODS periods, one write call each; a hook logs every fault
# point (flushed before anything else) and SIGKILLs itself at the chosen one.
_CHILD = """
import json, os, signal, sys
from datetime import timedelta
from pathlib import Path
import cftime, numpy as np
from ensio import faults
from ensio.ioserver.configload import ioserver_from_dict
from ensio.ioserver.geometry import regular_geometry
from ensio.ioserver.writer import FileSet
section, out = json.loads(sys.argv[1]), Path(sys.argv[2])
kill_at, log, n_periods = int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
cfg = ioserver_from_dict(section, out)
seen = 0
logf = open(log, "a")
def hook(label):
    global seen
    seen += 1
    logf.write(label + "\\n"); logf.flush()
    if seen == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
faults.set_hook(hook)
class Rec:
    def __init__(self, **kw): self.__dict__.update(kw)
fs = FileSet(cfg, [f.id for f in cfg.files], {"atm": regular_geometry(cfg.domains["atm"])},
             out, "h")
start = cftime.datetime(2000, 1, 1, calendar="noleap")
half = timedelta(hours=12)
def close():
    try:
        fs.close()
    except Exception as exc:  # after a failed write: the run's own error is the one line
        print(f"close: {exc}", file=sys.stderr)
try:
    for k in range(n_periods):
        recs = []
        for f in cfg.files:
            for j, fd in enumerate(f.fields):
                shape = cfg.grid_shape(fd.grid)
                data = 1000.0 * k + 100.0 * j + np.arange(np.prod(shape)).reshape(shape)
                recs.append(Rec(file_id=f.id, field=fd, period=k, t0=start + k * half,
                                t1=start + (k + 1) * half, t_instant=None, data=data))
        fs.write(recs)
except BaseException:
    close()
    raise
fs.close()
"""


def _run_child(out: Path, kill_at: int, log: Path, env: dict | None = None,
               periods: int = PERIODS) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    return subprocess.run([sys.executable, "-c", _CHILD, json.dumps(SECTION), str(out),
                           str(kill_at), str(log), str(periods)],
                          capture_output=True, text=True, timeout=120, env=environ)


def _expected(k: int, j: int, shape: tuple[int, ...]) -> np.ndarray:
    """Record ``k`` of field ``j`` (the child's formula)."""
    return 1000.0 * k + 100.0 * j + np.arange(np.prod(shape)).reshape(shape)


def _published(log: Path) -> dict[str, int]:
    """Records each file had published when the child died (from its fault-point log)."""
    counts: dict[str, int] = {}
    for line in log.read_text().splitlines():
        parts = line.split()
        if parts[0] == "ioserver-published":
            counts[parts[1]] = int(parts[2])
    return counts


def _check_file(path: Path, first: int, n: int, fields: int) -> None:
    """``path`` holds records first..first+n-1: ncdump, cdo and xarray read them."""
    for cmd in (["ncdump", "-h"], ["ncdump", "-v", "time"], ["cdo", "-s", "sinfon"],
                ["cdo", "-s", "info"]):
        run = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, (cmd, path, run.stderr)
    with xr.open_dataset(path, decode_times=False) as ds:
        assert ds.sizes["time"] == n
        mid = 3600.0 * (12.0 * np.arange(first, first + n) + 6.0)  # seconds since the start
        np.testing.assert_array_equal(ds.time.values, mid)
        np.testing.assert_array_equal(ds.time_bnds.values, np.stack([mid - 21600, mid + 21600], 1))
        for j, name in enumerate(("tas", "ta")[:fields]):
            var = ds[name].values
            assert not np.isnan(var).all(axis=tuple(range(1, var.ndim))).any()
            for r in range(n):
                want = _expected(first + r, j, var.shape[1:]).astype(np.float32)
                np.testing.assert_array_equal(var[r], want)


def _check_dir(out: Path, published: dict[str, int], complete: bool = False) -> None:
    """Every file as the log says (``complete``: every period, the run closed)."""
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "leftovers"
    for fid, name in NAMES.items():
        n = PERIODS if complete else published.get(name, 0)
        if n == 0:
            assert not (out / name).exists()
            continue
        _check_file(out / name, 0, n, 2)
        with netCDF4.Dataset(out / name) as ds:
            want = "NETCDF4" if fid == "n4" else "NETCDF3_64BIT_DATA"
            assert ds.data_model == want
    for day in range(PERIODS // 2):
        name = f"s_2000010{day + 1}.nc"
        n = 2 if complete else published.get(name, 0)
        if n == 0:
            assert not (out / name).exists()
        else:
            _check_file(out / name, 2 * day, n, 1)


@pytest.fixture(scope="module")
def points(tmp_path_factory) -> list[str]:
    """The fault points of an uninterrupted run (and its files: complete)."""
    out = tmp_path_factory.mktemp("whole")
    log = out.parent / "whole.log"
    run = _run_child(out, 0, log)
    assert run.returncode == 0, run.stderr
    _check_dir(out, {}, complete=True)
    return log.read_text().splitlines()


def test_an_uninterrupted_run_publishes_every_file_and_counts_its_points(points):
    assert "ioserver-data-written" in points and "ioserver-converted" in points
    assert points.count("ioserver-data-written") == PERIODS


@pytest.mark.parametrize("draw", range(3))
def test_a_writer_killed_at_any_point_leaves_only_complete_records(points, tmp_path, draw):
    rng = np.random.default_rng(seeds.draw_seed(f"kill point {draw}"))
    kill_at = int(rng.integers(1, len(points) + 1))
    out, log = tmp_path / "out", tmp_path / "points.log"
    out.mkdir()
    run = _run_child(out, kill_at, log)
    assert run.returncode == -9, (kill_at, run.stderr)
    published = _published(log)
    # what the kill left is readable as it is: the staging files are CDF-5
    for left in out.glob(".*.ensio-partial.ioserver"):
        run = subprocess.run(["ncdump", "-h", str(left)], capture_output=True, timeout=60)
        assert run.returncode == 0, (left, run.stderr)
    assert cli_main(["ioserver", "recover", str(out)]) == 0
    _check_dir(out, published)


def test_a_kill_between_data_and_publication_rolls_the_period_back(tmp_path):
    out, log = tmp_path / "out", tmp_path / "points.log"
    out.mkdir()
    # the 3rd period's data is written, its numrecs not: 2 periods survive
    run = _run_child(out, 0, log, periods=3)
    assert run.returncode == 0
    labels = log.read_text().splitlines()
    log.unlink()
    for p in out.iterdir():
        p.unlink()
    at = [i for i, x in enumerate(labels) if x == "ioserver-data-written"][2] + 1
    run = _run_child(out, at, log)
    assert run.returncode == -9
    staged = {p.name for p in out.iterdir()}
    assert staging_path(out / "n4.nc").name in staged
    with netCDF4.Dataset(staging_path(out / "n4.nc")) as ds:  # the state as left: 2 records
        assert len(ds.dimensions["time"]) == 2
    done = recover_dir(out, quiet=True)
    assert sorted((p.path.name if p.path else "", p.records) for p in done) == [
        ("", 0), ("c5.nc", 2), ("n4.nc", 2), ("s_20000101.nc", 2)]  # day 2: no record
    _check_dir(out, {"n4.nc": 2, "c5.nc": 2, "s_20000101.nc": 2})


def test_recovery_leaves_a_live_writers_file_alone_and_deletes_empty_ones(tmp_path):
    from ensio.ioserver.staged import lock_staging

    out = tmp_path / "out"
    out.mkdir()
    run = _run_child(out, 0, tmp_path / "log", periods=1)
    assert run.returncode == 0
    # a live writer: a staging file someone holds the lock of
    live = staging_path(out / "live.nc")
    os.link(out / "c5.nc", live)
    fd = os.open(live, os.O_RDWR)
    try:
        assert lock_staging(fd)
        # an empty one (killed before its first record): deleted
        empty = staging_path(out / "empty.nc")
        with netCDF4.Dataset(empty, "w", format="NETCDF3_64BIT_DATA") as ds:
            ds.createDimension("time", None)
            ds.createVariable("time", "f8", ("time",))
        # a header cut short by the kill: deleted
        cut = staging_path(out / "cut.nc")
        cut.write_bytes(b"CDF\x05\x00")
        done = recover_dir(out, quiet=True)
        assert {(p.path, p.records) for p in done} == {(None, 0)}
        assert len(done) == 2 and live.exists() and not empty.exists() and not cut.exists()
    finally:
        os.close(fd)
    assert [p.records for p in recover_dir(out, quiet=True)] == [1]
    assert (out / "live.nc").exists()


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    needs.tool("gcc")
    return faultfs.build_shim(tmp_path_factory.mktemp("shim"))


@pytest.fixture(scope="module")
def disk_total(shim, tmp_path_factory) -> int:
    """Bytes an uninterrupted run writes into its directory (counted by the shim)."""
    out = tmp_path_factory.mktemp("counted")
    report = out.parent / "counted.bytes"
    run = _run_child(out, 0, out.parent / "counted.log",
                     env=faultfs.enospc_env(shim, out, None, report))
    assert run.returncode == 0, run.stderr
    return sum(map(int, report.read_text().split()))


@pytest.mark.parametrize("draw", range(4))
def test_a_full_disk_keeps_complete_records_and_says_so(disk_total, shim, tmp_path, draw):
    out, log = tmp_path / "out", tmp_path / "points.log"
    out.mkdir()
    rng = np.random.default_rng(seeds.draw_seed(f"disk budget {draw}"))
    budget = int(rng.integers(0, disk_total))
    run = _run_child(out, 0, log, env=faultfs.enospc_env(shim, out, budget))
    assert run.returncode != 0, (budget, disk_total, run.stderr)
    last = run.stderr.strip().splitlines()[-1]
    assert "No space left on device" in last and str(out) in last, run.stderr
    assert "close:" not in run.stderr  # the rest was published quietly
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "leftovers"
    for path in out.iterdir():  # complete records only, CDF-5 where netCDF-4 found no space
        with netCDF4.Dataset(path) as ds:
            n = len(ds.dimensions["time"])
        assert n > 0
        first = 2 * (int(path.stem[-1]) - 1) if path.stem.startswith("s_") else 0
        _check_file(path, first, n, 1 if path.stem.startswith("s_") else 2)


def test_a_writer_starting_in_a_directory_publishes_the_leftovers_first(tmp_path, capsys):
    from ensio.ioserver.configload import ioserver_from_dict
    from ensio.ioserver.geometry import regular_geometry
    from ensio.ioserver.writer import FileSet

    out, log = tmp_path / "out", tmp_path / "points.log"
    out.mkdir()
    run = _run_child(out, 0, log, periods=3)
    labels = log.read_text().splitlines()
    log.unlink()
    for p in out.iterdir():
        p.unlink()
    at = labels.index("ioserver-published c5.nc 3")  # the last period written, not closed
    run = _run_child(out, at + 1, log)
    assert run.returncode == -9
    assert not (out / "n4.nc").exists() and not (out / "c5.nc").exists()
    assert staging_path(out / "s_20000101.nc").exists()  # its publication came after
    cfg = ioserver_from_dict(SECTION, out)
    fs = FileSet(cfg, ["c5"], {"atm": regular_geometry(cfg.domains["atm"])}, out, "h")
    fs.close()
    lines = capsys.readouterr().err.splitlines()
    assert f"ensio ioserver recover: {out / 'n4.nc'}: published with 3 complete records " \
           "(netcdf4)" in lines
    # the kill came before day 2's record was published: that file had none
    _check_dir(out, {"n4.nc": 3, "c5.nc": 3, "s_20000101.nc": 2})
