"""An XIOS model relinked against ensio: module xios + iodef.xml, run MPMD.

tests/data/xios_model/model_xios.f90 is written the way XIOS's test clients are
(xios_initialize, context, xios_define_calendar, domain attributes with a halo,
close_context_definition, update_calendar/send_field, finalize) and uses only the
xios module. It runs as ``mpiexec -n 2 model_xios : -n 1 ensio ioserver iodef.xml``.
The same model through the native module (model_native.f90) and a YAML written
by hand (iodef_native.yaml) must write the same files (values, time axis, bounds,
coordinates); the values must equal the model's formula evaluated here with numpy
(an instant file, daily mean/max/sum, an expression, a mean of daily maxima); the
halo the model sends (-999) must not reach any file; a disabled file and a
disabled entry are not written; and every file is clean for compliance-checker
cf:1.8.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
import yaml

from ensio.ioserver.build import build_client, xios_flags
from ensio.ioserver.iodefattrs import supported

DATA = Path(__file__).parent / "data" / "xios_model"
BIN = Path(sys.executable).parent
NI, NJ, NK, NSTEPS, DT = 24, 12, 3, 16, 10800.0

pytestmark = [needs.tools_mark("gfortran"), needs.mark(needs.venv_tool, "mpicc")]


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """The client and module xios in a prefix; both models compiled against it."""
    tmp = tmp_path_factory.mktemp("xios")
    r = build_client(tmp / "prefix")
    assert (tmp / "prefix" / "include" / "xios.mod").is_file()
    exes = {}
    for name in ("model_xios", "model_native"):
        exes[name] = tmp / name
        subprocess.run([str(r.fc), "-Wall", str(DATA / f"{name}.f90"), "-o", str(exes[name]),
                        *xios_flags(r).split()], check=True, timeout=300, cwd=tmp)
    return exes


def _mpmd(exe: Path, config: Path, ok: bool = True,
          **env: str) -> subprocess.CompletedProcess[str]:
    """2 model ranks and 1 server in one MPMD job, in the config's directory."""
    cmd = [str(BIN / "mpiexec"), "-n", "2", str(exe), ":", "-n", "1",
           str(BIN / "ensio"), "ioserver", config.name]
    # the timeout only turns a hang into a failure; it is not how the job ends
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          cwd=config.parent, stdin=subprocess.DEVNULL,
                          env={**os.environ, **env})
    if ok:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def xml_out(programs, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("xml_run")
    shutil.copy(DATA / "iodef.xml", run / "iodef.xml")
    _mpmd(programs["model_xios"], run / "iodef.xml")
    return run


@pytest.fixture(scope="module")
def native_out(programs, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("native_run")
    raw = yaml.safe_load((DATA / "iodef_native.yaml").read_text())
    if supported("file", "time_naming"):  # what the XML reader sets (XIOS's names)
        for f in raw["ioserver"]["files"]:
            f["time_naming"] = "xios"
    (run / "iodef.yaml").write_text(yaml.safe_dump(raw))
    _mpmd(programs["model_native"], run / "iodef.yaml")
    return run / "out"


def _nc(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("*.nc"))


def _vars(path: Path) -> dict[str, tuple[np.ndarray, dict]]:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        return {n: (v[...].copy(), {a: v.getncattr(a) for a in v.ncattrs()})
                for n, v in ds.variables.items()}


def _time(path: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """The record coordinate (named after the unlimited dimension), its bounds, units."""
    with netCDF4.Dataset(path) as ds:
        dim = next(d for d in ds.dimensions.values() if d.isunlimited()).name
        t = ds.variables[dim]
        return t[:].data, ds.variables[t.bounds][:].data, t.units


def test_the_files_are_the_native_models(xml_out, native_out):
    assert _nc(xml_out) == _nc(native_out) == [
        "chain.nc", "daily.nc", "inst_20010227-20010228.nc", "inst_20010228-20010301.nc"]
    for name in _nc(xml_out):
        a, b = _vars(xml_out / name), _vars(native_out / name)
        assert sorted(a) == sorted(b), name
        for v in a:
            assert a[v][0].dtype == b[v][0].dtype, (name, v)
            np.testing.assert_array_equal(a[v][0], b[v][0], err_msg=f"{name}:{v}")
            assert a[v][1] == b[v][1], (name, v)
        with netCDF4.Dataset(xml_out / name) as x, netCDF4.Dataset(native_out / name) as n:
            ga = {k: x.getncattr(k) for k in x.ncattrs() if k != "history"}
            gb = {k: n.getncattr(k) for k in n.ncattrs() if k != "history"}
            assert ga == gb, name


def _formula(step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tas, pr (nj, ni) and ta (nk, nj, ni) of model_xios.f90 at a step."""
    lon = np.radians(7.5 + 15.0 * np.arange(NI))[None, :]
    lat = np.radians(-82.5 + 15.0 * np.arange(NJ))[:, None]
    w = 2 * np.pi * step / 8
    tas = 260 + 30 * np.cos(lat) + 5 * np.sin(lon + w)
    pr = 1e-5 * (2 + np.sin(lat) * np.cos(w)) * np.ones_like(tas)
    ta = tas[None] - 6.5 * np.arange(1, NK + 1)[:, None, None]
    return tas, pr, ta


def test_values_time_axis_and_bounds_follow_the_formula(xml_out):
    steps = {s: _formula(s) for s in range(1, NSTEPS + 1)}
    days = [range(1, 9), range(9, 17)]
    d = _vars(xml_out / "daily.nc")
    tas_day = [np.mean([steps[s][0] for s in r], axis=0) for r in days]
    max_day = [np.max([steps[s][0] for s in r], axis=0) for r in days]
    np.testing.assert_allclose(d["tas"][0], tas_day, rtol=1e-13)
    np.testing.assert_allclose(d["tas_max"][0], max_day, rtol=1e-13)
    np.testing.assert_allclose(d["pr"][0], [np.sum([steps[s][1] for s in r], axis=0)
                                            for r in days], rtol=1e-12)
    warm = [np.mean([np.where(steps[s][0] > 280, steps[s][0] - 273.15, 0) for s in r], axis=0)
            for r in days]
    np.testing.assert_allclose(d["warm"][0], warm, rtol=1e-12, atol=1e-12)
    assert "tas_off" not in d and d["tas"][0].dtype == np.float64
    t, tb, units = _time(xml_out / "daily.nc")
    assert units == "seconds since 2001-02-27 00:00:00"
    np.testing.assert_array_equal(t, [43200.0, 129600.0])
    np.testing.assert_array_equal(tb, [[0.0, 86400.0], [86400.0, 172800.0]])
    np.testing.assert_array_equal(d["lon"][0], 7.5 + 15.0 * np.arange(NI))
    np.testing.assert_array_equal(d["lat_bnds"][0][:, 1] - d["lat_bnds"][0][:, 0], 15.0)
    c = _vars(xml_out / "chain.nc")
    # an entry with no field_ref inherits nothing: XIOS's default prec, 4
    assert c["ave_daily_max"][0].dtype == np.float32
    np.testing.assert_allclose(c["ave_daily_max"][0][0], np.mean(max_day, axis=0), rtol=1e-6)
    inst = [_vars(xml_out / n) for n in ("inst_20010227-20010228.nc",
                                         "inst_20010228-20010301.nc")]
    tas_inst = np.concatenate([v["tas"][0] for v in inst])
    ta_inst = np.concatenate([v["ta"][0] for v in inst])
    np.testing.assert_allclose(tas_inst, [steps[s][0] for s in range(1, NSTEPS + 1)],
                               rtol=1e-13)
    assert ta_inst.dtype == np.float32  # prec="4" on the file's entry
    np.testing.assert_allclose(ta_inst, [steps[s][2] for s in range(1, NSTEPS + 1)], rtol=1e-6)
    assert np.all(tas_inst > 200) and np.all(ta_inst > 200)  # no halo value (-999)


def test_disabled_file_is_not_written_and_cf_checker_is_clean(xml_out):
    from compliance_checker.runner import CheckSuite, ComplianceChecker

    assert not (xml_out / "unused.nc").exists()
    CheckSuite.load_all_available_checkers()
    for path in sorted(xml_out.glob("*.nc")):
        report = Path(str(path) + ".cf.txt")
        ok, errors = ComplianceChecker.run_checker(str(path), ["cf:1.8"], 0, "normal",
                                                   output_filename=str(report),
                                                   output_format="text")
        assert ok and not errors, (path.name, report.read_text()[-3000:])


def test_an_attribute_change_at_run_time_stops_the_job_with_one_line(programs, tmp_path):
    shutil.copy(DATA / "iodef.xml", tmp_path / "iodef.xml")
    proc = _mpmd(programs["model_xios"], tmp_path / "iodef.xml", ok=False,
                 XIOS_TEST_SET_FIELD_ATTR="1")
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.startswith("xios (ensio): ")]
    assert lines, proc.stderr[-3000:]
    assert all(x == lines[0] for x in lines)
    assert lines[0].startswith("xios (ensio): xios_set_field_attr(tas): ")
    assert "iodef.xml" in lines[0]
