"""The observation-space diagnostics file of every analysis (issue 26 item 3).

Expected numbers never come from ensio: the prior and the analysis members are
read back with the plain netCDF4 library (tests/cases.py), H is the dense
operator tests/cases.py builds from scratch, and O−B, O−A, the spreads, the
QC flags and the per-type statistics are computed here with numpy.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
import xarray as xr
from cases import (
    SYNTHETIC,
    SYNTHETIC_FAST,
    EnsembleCase,
    VarCase,
    make_obs_case,
    reference_matrix,
    row_lonlat,
    sha256,
    write_observations,
)
from mpi4py import MPI
from seeds import draw_seed

from ensio import faults
from ensio.config import config_from_dict
from ensio.config.errors import ConfigError
from ensio.errors import FileOpError
from ensio.obs import QC_FLAGS
from ensio.offline import run_analysis

VARS = [VarCase("state", ("lat", "lon")), VarCase("t", ("lev", "lat", "lon"))]
MAX_SIGMA = 4.0
CYCLE = 3
ENSIO = [sys.executable, "-m", "ensio"]


def _case(root: Path, members: int = 6):
    """Members, observations in three files (index, bilinear, one outside the grid), the
    dense H of the first two, the prior read back; one observation a gross error."""
    seed = draw_seed("test_obsdiag")
    case = EnsembleCase(members=members, nlat=7, nlon=11, nlev=3, variables=VARS,
                        seed=seed % 2**32)  # fmt: skip
    paths = case.write(root)
    X = reference_matrix(paths, VARS)
    coords = row_lonlat(paths[0], VARS)
    with netCDF4.Dataset(paths[0]) as ds:
        lon = np.asarray(ds["lon"][:], dtype=float)
        lat = np.asarray(ds["lat"][:], dtype=float)
    obs = make_obs_case(X, coords, lon, lat, np.random.default_rng(seed + 1))
    hx = X @ obs.H.T
    sd = np.sqrt(obs.error**2 + hx.var(axis=0, ddof=1))
    obs.value[5] = hx[:, 5].mean() + 50 * sd[5]  # far beyond MAX_SIGMA: gross
    files = obs.write(root)
    files.append(write_observations(root / "obs_c.nc", np.array([30.0]), np.array([85.0]),
                                    np.array([1.0]), np.array([1.0])))  # fmt: skip
    raw = case.config(root)
    raw["observations"] = [{"file": p.name} for p in files]
    raw["analysis"] = {
        "filter": "letkf", "seed": 5, "inflation": {"forget": 0.9},
        "localization": {"taper": "gaspari-cohn", "radius_km": 5000.0},
        "qc": {"max_sigma": MAX_SIGMA},
    }  # fmt: skip
    return paths, X, obs, raw


def _expected_flags(obs, hx: np.ndarray) -> np.ndarray:
    """QC from its definition: gross where |d| > max_sigma·sqrt(σ_o² + var_b); outside last."""
    d = np.abs(obs.value - hx.mean(axis=0))
    gross = ~(d <= MAX_SIGMA * np.sqrt(obs.error**2 + hx.var(axis=0, ddof=1)))
    flags = np.where(gross, QC_FLAGS.index("gross"), 0)
    return np.append(flags, QC_FLAGS.index("outside")).astype(np.int8)


def _close(got, want, what: str) -> None:
    got, want = np.asarray(got, float), np.asarray(want, float)
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11, err_msg=what)


def test_diag_file_equals_numpy_from_prior_and_posterior_members(tmp_path):
    paths, X, obs, raw = _case(tmp_path)
    raw["output"] = {"diagnostics": "out/diag_{cycle:02d}.nc"}
    report = run_analysis(config_from_dict(raw, base_dir=tmp_path), MPI.COMM_SELF, cycle=CYCLE)
    path = tmp_path / "out" / f"diag_{CYCLE:02d}.nc"
    assert report.diagnostics == path and path.exists()
    Xa = reference_matrix(paths, VARS)
    assert np.max(np.abs(Xa - X)) > 1e-3  # the analysis changed the members
    hb, ha = X @ obs.H.T, Xa @ obs.H.T  # (k, m) prior and analysis in observation space
    flags = _expected_flags(obs, hb)
    assert np.sum(flags == QC_FLAGS.index("gross")) >= 1
    n = obs.value.size
    with xr.open_dataset(path) as ds:
        assert ds.attrs["Conventions"] == "CF-1.8" and ds.attrs["featureType"] == "point"
        assert int(ds.attrs["cycle"]) == CYCLE and int(ds.attrs["ensemble_size"]) == X.shape[0]
        assert ds.sizes["obs"] == n + 1
        np.testing.assert_array_equal(ds["obs_id"].values, np.arange(n + 1))
        np.testing.assert_array_equal(ds["qc"].values, flags)
        assert ds["qc"].attrs["flag_meanings"].split() == list(QC_FLAGS)
        assert ds["lon"].attrs["units"] == "degrees_east"
        _close(ds["value"].values[:n], obs.value, "value")
        _close(ds["error"].values[:n], obs.error, "error")
        _close(ds["lon"].values[:n], obs.lon, "lon")
        _close(ds["lat"].values[:n], obs.lat, "lat")
        _close(ds["omb"].values[:n], obs.value - hb.mean(axis=0), "omb")
        _close(ds["oma"].values[:n], obs.value - ha.mean(axis=0), "oma")
        _close(ds["spread_b"].values[:n], hb.std(axis=0, ddof=1), "spread_b")
        _close(ds["spread_a"].values[:n], ha.std(axis=0, ddof=1), "spread_a")
        for name in ("omb", "oma", "spread_b", "spread_a"):  # outside: H never applied
            assert np.isnan(ds[name].values[n]), name
        # observed variable: an index reaching t's rows observes t, bilinear ones 'state'
        n_state = 7 * 11
        kind = np.where(obs.index >= n_state, 1, 0)
        np.testing.assert_array_equal(ds["obs_type"].values[:n], kind)
        assert ds["obs_type"].attrs["flag_meanings"].split() == ["state", "t"]
        assert ds.attrs["observation_files"].split() == ["obs_a.nc", "obs_b.nc", "obs_c.nc"]
        obs_file = ds["obs_file"].values
        types = [str(t) for t in ds["type_name"].values]
        rows = {t: {v: ds[v].values[i] for v in ("n_obs", "n_used", "omb_mean", "omb_rms",
                                                 "oma_mean", "oma_rms", "spread_b_rms",
                                                 "spread_a_rms", "error_rms", "consistency")}
                for i, t in enumerate(types)}  # fmt: skip
    assert types == ["state", "t", "file obs_a.nc", "file obs_b.nc", "file obs_c.nc", "all"]
    in_a = np.arange(n) < obs.n_a
    np.testing.assert_array_equal(obs_file, np.append(np.where(in_a, 0, 1), 2))
    assert rows["file obs_c.nc"]["n_obs"] == 1 and rows["file obs_c.nc"]["n_used"] == 0
    assert np.isnan(rows["file obs_c.nc"]["omb_rms"])
    for name, sel in (("state", kind == 0), ("t", kind == 1), ("all", np.ones(n, bool)),
                      ("file obs_a.nc", in_a), ("file obs_b.nc", ~in_a)):
        used = sel & (flags[:n] == 0)
        d_b = obs.value[used] - hb[:, used].mean(axis=0)
        d_a = obs.value[used] - ha[:, used].mean(axis=0)
        s_b = hb[:, used].var(axis=0, ddof=1)
        r = rows[name]
        assert r["n_obs"] == sel.sum() + (name in ("state", "all"))  # + the outside one
        assert r["n_used"] == used.sum()
        _close(r["omb_mean"], d_b.mean(), f"{name} omb_mean")
        _close(r["omb_rms"], np.sqrt(np.mean(d_b**2)), f"{name} omb_rms")
        _close(r["oma_mean"], d_a.mean(), f"{name} oma_mean")
        _close(r["oma_rms"], np.sqrt(np.mean(d_a**2)), f"{name} oma_rms")
        _close(r["spread_b_rms"], np.sqrt(np.mean(s_b)), f"{name} spread_b")
        _close(r["spread_a_rms"], np.sqrt(np.mean(ha[:, used].var(axis=0, ddof=1))), name)
        _close(r["error_rms"], np.sqrt(np.mean(obs.error[used] ** 2)), f"{name} error")
        _close(r["consistency"], np.mean(d_b**2) / np.mean(obs.error[used] ** 2 + s_b), name)
    # the log's innovation statistics are the file's 'all' row
    assert report.result.prior.count == rows["all"]["n_used"]
    _close(report.result.prior.rms, rows["all"]["omb_rms"], "prior rms")
    _close(report.result.posterior.rms, rows["all"]["oma_rms"], "posterior rms")


@needs.tools_mark("ncdump")
def test_diag_file_passes_ncdump(tmp_path):
    _, _, _, raw = _case(tmp_path)
    raw["output"] = {"diagnostics": "d.nc"}
    run_analysis(config_from_dict(raw, base_dir=tmp_path), MPI.COMM_SELF, cycle=0)
    out = subprocess.run(["ncdump", str(tmp_path / "d.nc")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert ':Conventions = "CF-1.8"' in out.stdout and "omb(obs)" in out.stdout


def test_default_path_beside_the_mean_and_false_writes_none(tmp_path):
    _, _, _, raw = _case(tmp_path)
    raw["output"] = {"mean": "products/mean.nc"}
    report = run_analysis(config_from_dict(raw, base_dir=tmp_path), MPI.COMM_SELF, cycle=7)
    assert report.diagnostics == tmp_path / "products" / "diag_007.nc"
    assert report.diagnostics.exists()
    assert any("diagnostics:" in line for line in report.lines())
    raw["output"] = {"diagnostics": False}
    report = run_analysis(config_from_dict(raw, base_dir=tmp_path), MPI.COMM_SELF, cycle=8,
                          force=True)  # fmt: skip
    assert report.diagnostics is None
    assert not list(tmp_path.rglob("diag_008*"))


def test_default_path_without_mean_is_the_config_directory(tmp_path):
    """Not among the member files (tiles: a directory of them), but where the config is."""
    members = tmp_path / "members"
    _, _, _, raw = _case(members)
    raw["observations"] = [{"file": str(members / o["file"])} for o in raw["observations"]]
    raw["ensemble"]["members"] = str(members / Path(raw["ensemble"]["members"]).name)
    base = tmp_path / "config"
    base.mkdir()
    report = run_analysis(config_from_dict(raw, base_dir=base), MPI.COMM_SELF, cycle=3)
    assert report.diagnostics == base / "diag_003.nc"
    assert report.diagnostics.exists() and not list(members.glob("diag*"))


@pytest.mark.parametrize("value", ["", "d_{member}.nc", 3])
def test_bad_diagnostics_key_names_it(tmp_path, value):
    _, _, _, raw = _case(tmp_path)
    raw["output"] = {"diagnostics": value}
    with pytest.raises(ConfigError, match="output.diagnostics"):
        config_from_dict(raw, base_dir=tmp_path)


def test_report_summarises_the_diag_files_per_cycle(tmp_path):
    """``ensio report DIR`` reads DIR/cycle_CCC/diag.nc: one table per cycle and per type."""
    work = tmp_path / "run"
    for cycle in (1, 2):
        root = tmp_path / f"c{cycle}"
        _, _, _, raw = _case(root)
        raw["output"] = {"diagnostics": str(work / f"cycle_{cycle:03d}" / "diag.nc")}
        run_analysis(config_from_dict(raw, base_dir=root), MPI.COMM_SELF, cycle=cycle)
    out = subprocess.run([*ENSIO, "report", str(work), "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "cycle 1" in out.stdout and "cycle 2" in out.stdout
    assert "ratio" in out.stdout and "O-B" in out.stdout
    lines = out.stdout.splitlines()
    tables = [ln for ln in lines if "cycle" not in ln and not ln.startswith("wrote ")]
    assert all(len(line) <= 80 for line in tables)  # the path of --json may be longer
    summary = json.loads((tmp_path / "r.json").read_text())
    cycles = summary["diagnostics"]
    assert [c["cycle"] for c in cycles] == [1, 2]
    for c in cycles:
        with netCDF4.Dataset(work / f"cycle_{c['cycle']:03d}" / "diag.nc") as ds:
            names = [str(x) for x in ds["type_name"][:]]
            assert [t["type"] for t in c["types"]] == names
            ds.set_auto_mask(False)
            for t, i in zip(c["types"], range(len(names)), strict=True):
                want = float(ds["omb_rms"][i])  # NaN (no accepted observation): JSON null
                assert (t["omb_rms"] is None) if np.isnan(want) else (
                    t["omb_rms"] == pytest.approx(want, rel=1e-12))
                assert t["n_used"] == int(ds["n_used"][i])


def test_report_of_a_broken_diag_file_is_one_line(tmp_path):
    work = tmp_path / "run"
    (work / "cycle_001").mkdir(parents=True)
    (work / "cycle_001" / "diag.nc").write_bytes(b"not netcdf")
    out = subprocess.run([*ENSIO, "report", str(work)], capture_output=True, text=True)
    assert out.returncode == 2, (out.stdout, out.stderr)
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "cycle_001/diag.nc" in err[0], err
    shutil.rmtree(work)




@pytest.mark.mpi
def test_cycle_writes_a_diag_file_per_cycle_in_both_modes(tmp_path):
    """``ensio cycle`` (offline pool and coupled online) writes DIR/cycle_CCC/diag.nc; the two
    modes' files agree; ``ensio report DIR`` shows every cycle's types."""
    fast = list(SYNTHETIC_FAST)
    runs = {}
    for mode in ("offline", "online"):
        workdir = tmp_path / mode
        cmd = [*ENSIO, "cycle", str(SYNTHETIC), "--mode", mode, "--workdir", str(workdir),
               "--cycles", "2", *fast]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        runs[mode] = workdir
    for cycle in (1, 2):
        files = [runs[m] / f"cycle_{cycle:03d}" / "diag.nc" for m in ("offline", "online")]
        with xr.open_dataset(files[0]) as a, xr.open_dataset(files[1]) as b:
            assert int(a.attrs["cycle"]) == cycle and a.sizes["obs"] > 0
            assert int((a["qc"] == 0).sum()) > 0
            for name in ("omb", "oma", "spread_b", "spread_a", "omb_rms", "consistency"):
                np.testing.assert_allclose(a[name].values, b[name].values, rtol=1e-10,
                                           atol=1e-12, err_msg=f"cycle {cycle} {name}")
            np.testing.assert_array_equal(a["qc"].values, b["qc"].values)
            # the analysis fits the observations better than the forecast did
            assert float(a["oma_rms"][-1]) < float(a["omb_rms"][-1])
    out = subprocess.run([*ENSIO, "report", str(runs["offline"]), "--json",
                          str(tmp_path / "r.json")], capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [c["cycle"] for c in doc["diagnostics"]] == [1, 2]
    assert doc["timing"]  # the records' table is still there
    assert "cycle 1" in out.stdout and "cycle 2" in out.stdout and "all" in out.stdout


def test_a_failed_diag_write_rolls_the_analysis_back(tmp_path):
    """The diagnostics file joins the run's transaction: when writing it fails (the disk
    fills after its bytes were written) the members, already written in place, are rolled
    back, no diag file or temporary is left, and the error is one line naming it."""
    paths, _, _, raw = _case(tmp_path)
    raw["output"] = {"diagnostics": "diag.nc"}
    before = {p: sha256(p) for p in paths}
    seen = []

    def full_disk(label: str) -> None:
        seen.append(label)
        if label == "diagnostics-written":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with faults.hooked(full_disk), pytest.raises(FileOpError) as err:
        run_analysis(config_from_dict(raw, base_dir=tmp_path), MPI.COMM_SELF, cycle=1)
    at = seen.index("diagnostics-written")
    assert "data-write" in seen[:at]  # the members were written in place before it
    assert "restore-range" in seen[at:]  # and restored after it
    assert str(tmp_path / "diag.nc") in str(err.value) and "\n" not in str(err.value)
    assert {p: sha256(p) for p in paths} == before
    assert not (tmp_path / "diag.nc").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_report_of_a_diag_file_without_statistics_names_it(tmp_path):
    work = tmp_path / "run"
    (work / "cycle_002").mkdir(parents=True)
    with netCDF4.Dataset(work / "cycle_002" / "diag.nc", "w") as ds:
        ds.createDimension("type", 1)
        ds.createVariable("type_name", str, ("type",))[0] = "all"
        ds.createVariable("omb_rms", "f8", ("type",))[0] = 1.0
    out = subprocess.run([*ENSIO, "report", str(work)], capture_output=True, text=True)
    assert out.returncode == 2, (out.stdout, out.stderr)
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "cycle_002/diag.nc" in err[0] and "n_obs" in err[0], err
