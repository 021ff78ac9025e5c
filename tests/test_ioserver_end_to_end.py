"""The I/O server end to end: a Python model under mpiexec, every mode, real tools.

The expected values are computed here from the model's formula on the whole grid
with numpy (independent of the server's graph, accumulators and writer); `cdo
timmean`/`timmax` of the instant file must equal our average/maximum file; every
output passes the IOOS compliance checker (cf:1.8), ncdump, `cdo sinfon` and
xarray; all modes and server counts write the same data.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import yaml

HERE = Path(__file__).parent / "data" / "ioserver_e2e"
sys.path.insert(0, str(HERE))
import fields as F  # noqa: E402

NSTEPS = 16
MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))
ENSIO = str(Path(sys.executable).with_name("ensio"))


def _iodef(tmp: Path, mode: str = "server", servers: int = 1) -> Path:
    raw = yaml.safe_load((HERE / "iodef.yaml").read_text())
    raw["ioserver"].update(mode=mode, servers=servers, output_dir=str(tmp / "out"))
    path = tmp / "iodef.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _run(argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _model(iodef: Path, nprocs: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return _run([MPIEXEC, "-n", str(nprocs), sys.executable, str(HERE / "model.py"),
                 str(iodef), str(NSTEPS), *extra])


@pytest.fixture(scope="module")
def server_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("server1")
    proc = _model(_iodef(tmp), 3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "out"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """nanmean & co. of all-missing points (the land mask) are NaN on purpose."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _read(path: Path, name: str) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        return np.ma.filled(ds[name][...].astype(np.float64), np.nan)


def _masked(a: np.ndarray) -> np.ndarray:
    out = np.array(a, dtype=np.float64)
    out[..., ~F.mask()] = np.nan
    return out


def _series(f, steps) -> np.ndarray:
    return np.stack([_masked(f(s)) for s in steps])


def _close(got: np.ndarray, want: np.ndarray) -> None:
    want32 = want.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(got, want32, rtol=2e-6, atol=0, equal_nan=True)


def test_instant_average_extrema_and_sums_match_numpy(server_run: Path) -> None:
    steps = range(1, NSTEPS + 1)
    tas, ta = _series(F.tas, steps), _series(F.ta, steps)
    _close(_read(server_run / "inst_20010227.nc", "tas"), tas)
    _close(_read(server_run / "inst_20010227.nc", "ta"), ta)
    avg = server_run / "avg.nc"
    with _quiet():
        _close(_read(avg, "tas")[0], np.nanmean(tas, axis=0))
        _close(_read(avg, "tasmax")[0], np.nanmax(tas, axis=0))
        _close(_read(avg, "tasmin")[0], np.nanmin(tas, axis=0))
        _close(_read(avg, "ta")[0], np.nanmean(ta, axis=0))
        _close(_read(avg, "pr_sum")[0], np.nansum(_series(F.pr, steps), axis=0)
               + np.where(F.mask(), 0, np.nan))


def test_chains_expressions_and_spatial_operations_match_numpy(server_run: Path) -> None:
    days = [range(1, 9), range(9, 17)]
    with _quiet():
        daily_mean = [np.nanmean(_series(F.tas, d), axis=0) for d in days]
        daily_max = [np.nanmax(_series(F.tas, d), axis=0) for d in days]
        _close(_read(server_run / "chain.nc", "ave_daily_max")[0], np.mean(daily_max, axis=0))
        _close(_read(server_run / "chain.nc", "min_daily_ave")[0], np.min(daily_mean, axis=0))
        w = area_w = F.area()
        for k, name in enumerate(("daily_20010227-20010228.nc", "daily_20010228-20010301.nc")):
            path = server_run / name
            m = daily_mean[k]
            _close(_read(path, "tas")[0], m)
            warm = [np.where(np.isnan(x), np.nan, np.where(x > 280, x - 273.15, 0.0))
                    for x in _series(F.tas, days[k])]
            _close(_read(path, "warm")[0], np.nanmean(warm, axis=0))
            ok = ~np.isnan(m)
            gm = (w * np.where(ok, m, 0)).sum() / (area_w * ok).sum()
            _close(_read(path, "tas_gm")[0], np.asarray(gm))
            _close(_read(path, "tas_zm")[0], np.nanmean(m, axis=1))
            lon_in = (F.lon() >= 40) & (F.lon() <= 130)
            lat_in = (F.lat() >= -30) & (F.lat() <= 30)
            _close(_read(path, "tas_box")[0], m[np.ix_(lat_in, lon_in)])


@pytest.mark.parametrize("op,name", [("timmean", "tas"), ("timmax", "tasmax")])
def test_cdo_of_the_instant_file_equals_our_time_operation(server_run: Path, tmp_path: Path,
                                                           op: str, name: str) -> None:
    out = tmp_path / f"{op}.nc"
    proc = _run(["cdo", "-s", op, str(server_run / "inst_20010227.nc"), str(out)])
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(_read(out, "tas")[0], _read(server_run / "avg.nc", name)[0],
                               rtol=1e-6, equal_nan=True)


def test_every_file_passes_the_cf_checker_ncdump_cdo_and_xarray(server_run: Path) -> None:
    import xarray as xr
    from compliance_checker.runner import CheckSuite, ComplianceChecker

    CheckSuite.load_all_available_checkers()
    files = sorted(server_run.glob("*.nc"))
    assert len(files) == 5  # inst, avg, chain, two daily files
    for path in files:
        ok, errors = ComplianceChecker.run_checker(str(path), ["cf:1.8"], 0, "normal",
                                                   output_filename=str(path) + ".cf.txt",
                                                   output_format="text")
        assert ok and not errors, (path.name, Path(str(path) + ".cf.txt").read_text()[-3000:])
        assert _run(["ncdump", "-h", str(path)]).returncode == 0
        proc = _run(["cdo", "-s", "sinfon", str(path)])
        assert proc.returncode == 0, (path.name, proc.stderr)
        coder = xr.coders.CFDatetimeCoder(use_cftime=True)
        with xr.open_dataset(path, decode_times=coder) as ds:
            assert "time" in ds.coords


def _data(out: Path) -> dict[str, np.ndarray]:
    res = {}
    for path in sorted(out.glob("*.nc")):
        with netCDF4.Dataset(path) as ds:
            for name, v in ds.variables.items():
                res[f"{path.name}:{name}"] = np.ma.filled(v[...], np.nan)
    return res


@pytest.mark.parametrize("mode,servers,nprocs", [("server", 2, 4), ("attached", 1, 2),
                                                 ("sync", 1, 2)])
def test_every_mode_and_server_count_writes_the_same_data(server_run: Path, tmp_path: Path,
                                                          mode: str, servers: int,
                                                          nprocs: int) -> None:
    proc = _model(_iodef(tmp_path, mode, servers), nprocs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want, got = _data(server_run), _data(tmp_path / "out")
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_mpmd_servers_started_by_ensio_ioserver(server_run: Path, tmp_path: Path) -> None:
    iodef = _iodef(tmp_path)
    proc = _run([MPIEXEC, "-n", "2", sys.executable, str(HERE / "model.py"), str(iodef),
                 str(NSTEPS), ":", "-n", "1", ENSIO, "ioserver", str(iodef)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    want, got = _data(server_run), _data(tmp_path / "out")
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_a_failing_model_rank_ends_the_job_naming_it_and_files_stay_valid(tmp_path: Path):
    proc = _model(_iodef(tmp_path), 3, "1", "10")
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "rank 1" in text and "blew up at step 10" in text, text[-3000:]
    out = tmp_path / "out"
    assert (out / "inst_20010227.nc").exists(), text[-3000:]
    with netCDF4.Dataset(out / "inst_20010227.nc") as ds:
        assert ds.dimensions["time"].size == 9  # steps 1-9 complete; rank 1 never sent 10
        got = np.ma.filled(ds["tas"][:9].astype(np.float64), np.nan)
    _close(got, _series(F.tas, range(1, 10)))
    day1 = out / "daily_20010227-20010228.nc"
    assert _run(["ncdump", "-h", str(day1)]).returncode == 0
    assert _read(day1, "tas").shape[0] == 1  # day 1 = steps 1-8, complete
    assert not (out / "avg.nc").exists() or _read(out / "avg.nc", "tas").shape[0] == 0
    shutil.rmtree(out)
