"""Files shared among the servers: each server writes its rows of one CDF-5 file.

The model of ``tests/data/ioserver_e2e`` (unequal row blocks, a land mask, a
missing sample) runs under mpiexec with S = 2 and 3 servers; its two CDF-5
files are ``shared: auto`` with a tiny ``shared_min_mb``, so every server
writes its rows (one of them split per day: the collective create/close of
each split file). The data must equal, bit for bit, the same files written by
one server (``servers: 1``: auto means not shared) and by sync mode, and the
instant file must equal the model's formula evaluated here with numpy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import yaml

from ensio.config.errors import ConfigError
from ensio.ioserver.configload import ioserver_from_dict
from ensio.ioserver.start import build_plan

HERE = Path(__file__).parent / "data" / "ioserver_e2e"
sys.path.insert(0, str(HERE))
import fields as F  # noqa: E402

NSTEPS = 16
MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))
SHARED = ("inst_20010227.nc", "inst_20010228.nc", "avg.nc")


def _raw(**top) -> dict:
    raw = yaml.safe_load((HERE / "iodef.yaml").read_text())["ioserver"]
    raw["shared_min_mb"] = 0.001  # ~1 kB: both CDF-5 files qualify with several servers
    raw["files"] = [
        {"id": "inst", "name": "inst_{start:%Y%m%d}", "output_freq": "1ts",
         "split_freq": "1d", "format": "cdf5",
         "fields": [{"field_ref": "tas", "operation": "instant"},
                    {"field_ref": "ta", "operation": "instant", "precision": 8},
                    {"field_ref": "tas", "name": "warm", "operation": "instant",
                     "expr": "tas > 280 ? tas - 273.15 : 0", "units": "degC",
                     "standard_name": None, "long_name": "warm excess"}]},
        {"id": "avg", "name": "avg", "output_freq": "1d", "format": "cdf5",
         "fields": [{"field_ref": "tas"}, {"field_ref": "tas_max", "name": "tasmax"},
                    {"field_ref": "ta"}, {"field_ref": "pr", "name": "pr_sum"},
                    {"field_ref": "tas", "name": "tas_last", "operation": "instant"}]},
        {"id": "gm", "name": "gm", "output_freq": "1d", "format": "cdf5",  # not shareable
         "fields": [{"field_ref": "tas", "name": "tas_gm", "mean": "global"}]},
    ]
    raw.update(top)
    return raw


def _iodef(tmp: Path, **top) -> Path:
    path = tmp / "iodef.yaml"
    path.write_text(yaml.safe_dump({"ioserver": _raw(output_dir=str(tmp / "out"), **top)}))
    return path


def _run(argv: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _model(tmp: Path, nprocs: int, **top) -> Path:
    proc = _run([MPIEXEC, "-n", str(nprocs), sys.executable, str(HERE / "model.py"),
                 str(_iodef(tmp, **top)), str(NSTEPS)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "out"


def _content(out: Path) -> dict[str, np.ndarray | dict]:
    """Every variable's raw values and attributes, and every file's dimensions."""
    res: dict[str, np.ndarray | dict] = {}
    for path in sorted(out.glob("*.nc")):
        with netCDF4.Dataset(path) as ds:
            ds.set_auto_mask(False)
            res[f"{path.name}:dims"] = {k: len(d) for k, d in ds.dimensions.items()}
            res[f"{path.name}:format"] = {"format": ds.data_model}
            for name, v in ds.variables.items():
                res[f"{path.name}:{name}"] = v[...]
                res[f"{path.name}:{name}:attrs"] = {
                    k: np.asarray(v.getncattr(k)).tolist() for k in v.ncattrs()}
    return res


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The reference: one server writes every file (``auto`` is then not shared)."""
    return _content(_model(tmp_path_factory.mktemp("one"), 3, servers=1))


@pytest.fixture(scope="module", params=[2, 3])
def shared_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = request.param
    return _model(tmp_path_factory.mktemp(f"s{s}"), 2 + s, servers=s)


def test_plan_puts_shared_files_on_every_server_and_fields_to_all() -> None:
    cfg = ioserver_from_dict(_raw())
    one, three = build_plan(cfg, (0,)), build_plan(cfg, (2, 3, 4))
    assert one.shared == ()
    assert three.shared == ("inst", "avg")
    assert [f for s in (2, 3, 4) for f in three.files[s] if f == "gm"] == ["gm"]
    for s in (2, 3, 4):
        assert {"inst", "avg"} <= set(three.files[s])
    for fid in ("tas", "ta", "pr"):
        assert three.table.fields[fid].servers == (2, 3, 4)
    big = ioserver_from_dict(_raw(shared_min_mb=1.0))  # records of a few kB: not shared
    assert build_plan(big, (2, 3, 4)).shared == ()


def test_shared_files_equal_the_single_server_files_bit_for_bit(shared_run: Path,
                                                                single: dict) -> None:
    got = _content(shared_run)
    assert got.keys() == single.keys()
    for k, want in single.items():
        if isinstance(want, dict):
            assert got[k] == want, k
        else:
            assert got[k].dtype == want.dtype, k
            np.testing.assert_array_equal(got[k], want, err_msg=k)


def test_shared_instant_file_holds_the_model_formula(shared_run: Path) -> None:
    for day, name in enumerate(SHARED[:2]):
        steps = range(8 * day + 1, 8 * day + 9)
        with netCDF4.Dataset(shared_run / name) as ds:
            tas = np.ma.filled(ds["tas"][...].astype(np.float64), np.nan)
            ta = np.ma.filled(ds["ta"][...], np.nan)
            assert ds["ta"].dtype == np.float64
        want = np.stack([np.where(F.mask(), F.tas(s), np.nan) for s in steps])
        np.testing.assert_array_equal(tas, want.astype(np.float32).astype(np.float64))
        want3 = np.stack([np.where(F.mask(), F.ta(s), np.nan) for s in steps])
        np.testing.assert_array_equal(ta, want3)


def test_shared_files_pass_ncdump_cdo_and_the_cf_checker(shared_run: Path) -> None:
    from compliance_checker.runner import CheckSuite, ComplianceChecker

    CheckSuite.load_all_available_checkers()
    for name in SHARED:
        path = shared_run / name
        report = Path(str(path) + ".cf.txt")
        ok, errors = ComplianceChecker.run_checker(str(path), ["cf:1.8"], 0, "normal",
                                                   output_filename=str(report),
                                                   output_format="text")
        assert ok and not errors, (name, report.read_text()[-3000:])
        assert _run(["ncdump", str(path)]).returncode == 0
        proc = _run(["cdo", "-s", "sinfon", str(path)])
        assert proc.returncode == 0, (name, proc.stderr)


def test_mpmd_servers_write_the_same_shared_files(tmp_path: Path, single: dict) -> None:
    iodef = _iodef(tmp_path)  # servers: 1 in the file; the MPMD job has two
    proc = _run([MPIEXEC, "-n", "2", sys.executable, str(HERE / "model.py"), str(iodef),
                 str(NSTEPS), ":", "-n", "2", str(Path(sys.executable).with_name("ensio")),
                 "ioserver", str(iodef)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = _content(tmp_path / "out")
    for k, want in single.items():
        if not isinstance(want, dict):
            np.testing.assert_array_equal(got[k], want, err_msg=k)


def test_sync_mode_writes_the_same_data(tmp_path: Path, single: dict) -> None:
    got = _content(_model(tmp_path, 2, mode="sync"))
    for k, want in single.items():
        if not isinstance(want, dict):
            np.testing.assert_array_equal(got[k], want, err_msg=k)


@pytest.mark.parametrize("change,key", [
    ({"mean": "global"}, "ioserver.files.avg.fields.tas.mean"),
    ({"extract": {"lon": [0, 90], "lat": [-30, 30]}}, "ioserver.files.avg.fields.tas.extract"),
    ({"operation": "once"}, "ioserver.files.avg.fields.tas.operation"),
])
def test_shared_true_with_a_global_array_operation_is_a_config_error(change: dict,
                                                                      key: str) -> None:
    raw = _raw()
    raw["files"][1]["shared"] = True
    raw["files"][1]["fields"][0].update(change)
    with pytest.raises(ConfigError) as err:
        ioserver_from_dict(raw)
    msg = str(err.value)
    assert msg.startswith(key + ":") and "shared: false" in msg and "\n" not in msg


def test_shared_true_needs_cdf5_and_auto_skips_what_cannot_be_shared() -> None:
    raw = _raw()
    raw["files"][1].update(shared=True, format="netcdf4")
    with pytest.raises(ConfigError, match=r"^ioserver\.files\.avg\.format: .*cdf5"):
        ioserver_from_dict(raw)
    raw = _raw()
    raw["files"][1]["shared"] = "sometimes"
    with pytest.raises(ConfigError, match=r"ioserver\.files\.avg\.shared"):
        ioserver_from_dict(raw)
    raw = _raw()
    raw["files"][1]["shared"] = False
    assert build_plan(ioserver_from_dict(raw), (2, 3)).shared == ("inst",)


def test_a_failing_model_rank_leaves_shared_files_with_complete_records(tmp_path: Path):
    proc = _run([MPIEXEC, "-n", "4", sys.executable, str(HERE / "model.py"),
                 str(_iodef(tmp_path, servers=2)), str(NSTEPS), "1", "10"])
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "rank 1" in text and "blew up at step 10" in text, text[-3000:]
    out = tmp_path / "out"
    sizes = {}
    for name, first in (("inst_20010227.nc", 1), ("inst_20010228.nc", 9)):
        if not (out / name).exists():
            continue
        assert _run(["ncdump", "-h", str(out / name)]).returncode == 0
        with netCDF4.Dataset(out / name) as ds:
            n = sizes[name] = ds.dimensions["time"].size
            tas = np.ma.filled(ds["tas"][...].astype(np.float64), np.nan)
        want = [np.where(F.mask(), F.tas(s), np.nan) for s in range(first, first + n)]
        if n:
            np.testing.assert_array_equal(tas, np.stack(want).astype(np.float32))
            assert _run(["cdo", "-s", "sinfon", str(out / name)]).returncode == 0
    # Only records every server finished, nothing past the failure. (How many
    # depends on what the servers handled before the ABORT, and mpiexec may kill
    # them as soon as the failed rank exits: no lower bound can be promised.)
    assert sizes.get("inst_20010227.nc", 0) <= 8, sizes
    assert sizes.get("inst_20010228.nc", 0) <= 2, sizes
