"""``ensio synth``: the synthetic problem of Zheng et al. is written as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import needs
import netCDF4
import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from ensio.cli.synth import main as synth_main
from ensio.config import load_config
from ensio.models.synthetic import SyntheticSpec, write_synthetic

NX, NY, NE = 48, 30, 4


def _paper_truth(nx: int, ny: int, shift: float = 0.0) -> np.ndarray:
    """The formula written out on a full (j, i) index grid, as in the paper."""
    dx, dy = 2 * np.pi / nx, np.pi / ny
    j, i = np.mgrid[0:ny, 0:nx].astype(np.float64)
    return (np.sin(-3 + shift + 4 * i * dx / (2 * np.pi - dx)) ** 2
            * np.cos(-2 + 4 * j * dy / (np.pi - dy)) ** 3)


def _read(path: Path, name: str = "state") -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return np.asarray(ds[name][:])


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "case"
    rc = synth_main([str(out), "--nx", str(NX), "--ny", str(NY), "--members", str(NE),
                     "--seed", "7"])
    assert rc == 0
    return out


def test_files_exist_and_config_loads(case: Path) -> None:
    names = {p.name for p in case.iterdir()}
    assert names == {"mem001.nc", "mem002.nc", "mem003.nc", "mem004.nc", "truth.nc", "obs.nc",
                     "ensio.yaml"}
    cfg = load_config(case / "ensio.yaml")
    assert cfg.ensemble.size == NE
    assert [v.name for v in cfg.ensemble.variables] == ["state"]
    assert cfg.member_paths() == [case / f"mem{k:03d}.nc" for k in range(1, NE + 1)]
    with netCDF4.Dataset(case / "mem002.nc") as ds:
        assert ds["state"].dimensions == ("lat", "lon")
        assert ds["aux"].dimensions == ("lat", "lon")
        assert ds["lon"].units == "degrees_east" and ds["lat"].units == "degrees_north"
        np.testing.assert_allclose(ds["lon"][:], np.arange(NX) * 360.0 / NX)
        np.testing.assert_allclose(ds["lat"][:], -90 + (np.arange(NY) + 0.5) * 180.0 / NY)


@needs.tools_mark("ncdump")  # Debian package netcdf-bin
def test_ncdump_reads_every_file(case: Path) -> None:
    for path in sorted(case.glob("*.nc")):
        res = subprocess.run(["ncdump", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, f"{path.name}: {res.stderr}"
        assert "data:" in res.stdout


def test_truth_matches_formula(case: Path) -> None:
    np.testing.assert_allclose(_read(case / "truth.nc"), _paper_truth(NX, NY),
                               rtol=0, atol=1e-14)


def test_members_are_pure_longitude_shifts(case: Path) -> None:
    """Recover Δs_k by least squares over the shift; the fit must be exact and in range."""
    shifts = []
    for k in range(1, NE + 1):
        member = _read(case / f"mem{k:03d}.nc")

        def misfit(s: float, member: np.ndarray = member) -> float:
            return float(np.sum((_paper_truth(NX, NY, s) - member) ** 2))

        # sin² has period π: search well inside (-π/2, π/2) on a coarse grid, then refine.
        grid = np.linspace(-1.2, 1.2, 241)
        s0 = grid[np.argmin([misfit(s) for s in grid])]
        fit = minimize_scalar(misfit, bounds=(s0 - 0.02, s0 + 0.02), method="bounded",
                              options={"xatol": 1e-12})
        s = float(fit.x)
        assert -0.5 <= s <= 0.5
        np.testing.assert_allclose(member, _paper_truth(NX, NY, s), rtol=0, atol=1e-7)
        with netCDF4.Dataset(case / f"mem{k:03d}.nc") as ds:
            assert abs(ds.shift - s) < 1e-6  # the recorded shift is the one used
        shifts.append(s)
    assert len(set(np.round(shifts, 6))) == NE  # members differ from each other


def test_observations(case: Path) -> None:
    truth = _read(case / "truth.nc").ravel()
    with netCDF4.Dataset(case / "obs.nc") as ds:
        assert ds.dimensions["obs"].size == ds["index"].size
        obs = {n: np.asarray(ds[n][:]) for n in ("lon", "lat", "value", "error", "index")}
    idx = obs["index"]
    n = NX * NY
    assert idx.size == (n + 5) // 10  # 10 %, rounded half up (documented)
    assert np.unique(idx).size == idx.size
    assert idx.min() >= 0 and idx.max() < n
    np.testing.assert_array_equal(obs["error"], 0.25)
    np.testing.assert_allclose(obs["lon"], (idx % NX) * 360.0 / NX)
    np.testing.assert_allclose(obs["lat"], -90 + (idx // NX + 0.5) * 180.0 / NY)
    noise = obs["value"] - truth[idx]
    # Sample std of m = 144 normals: its standard error is ≈ σ/sqrt(2m) ≈ 0.0147;
    # allow 5 standard errors (the draw is seeded, so this is deterministic anyway).
    se = 0.25 / np.sqrt(2 * idx.size)
    assert abs(noise.std(ddof=1) - 0.25) < 5 * se
    assert abs(noise.mean()) < 5 * 0.25 / np.sqrt(idx.size)


def test_large_obs_noise_statistics(tmp_path: Path) -> None:
    """Tighter statistical check on a bigger grid (32 400 observations)."""
    case = write_synthetic(tmp_path, SyntheticSpec(nx=540, ny=600, members=1, seed=3))
    truth = _read(case.truth).ravel()
    with netCDF4.Dataset(case.obs) as ds:
        noise = np.asarray(ds["value"][:]) - truth[np.asarray(ds["index"][:])]
    se = 0.25 / np.sqrt(2 * noise.size)  # ≈ 0.00098
    assert abs(noise.std(ddof=1) - 0.25) < 5 * se


def _data(directory: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted(directory.glob("*.nc")):
        with netCDF4.Dataset(path) as ds:
            ds.set_auto_maskandscale(False)
            for name, var in ds.variables.items():
                out[f"{path.name}:{name}"] = np.asarray(var[:]).tobytes()
    return out


def test_seed_reproducible(tmp_path: Path) -> None:
    spec = SyntheticSpec(nx=20, ny=10, members=3, seed=11)
    write_synthetic(tmp_path / "a", spec)
    write_synthetic(tmp_path / "b", spec)
    write_synthetic(tmp_path / "c", SyntheticSpec(nx=20, ny=10, members=3, seed=12))
    a, b, c = _data(tmp_path / "a"), _data(tmp_path / "b"), _data(tmp_path / "c")
    assert a == b
    assert a.keys() == c.keys()
    for key in ("mem001.nc:state", "mem002.nc:aux", "obs.nc:index", "obs.nc:value"):
        assert a[key] != c[key], key
    assert a["truth.nc:state"] == c["truth.nc:state"]  # the truth does not depend on the seed


def test_netcdf4_state_is_contiguous(case: Path) -> None:
    with h5py.File(case / "mem001.nc", "r") as f:
        for name in ("state", "aux"):
            dset = f[name]
            assert dset.id.get_create_plist().get_layout() == h5py.h5d.CONTIGUOUS, name
            assert dset.compression is None
            assert dset.id.get_offset() is not None  # storage allocated: raw path applies


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cdf5_and_levels(tmp_path: Path, dtype: str) -> None:
    spec = SyntheticSpec(nx=16, ny=8, members=2, seed=5, format="cdf5", dtype=dtype, levels=3)
    case = write_synthetic(tmp_path, spec)
    with netCDF4.Dataset(case.members[0]) as ds:
        assert ds.data_model == "NETCDF3_64BIT_DATA"
        assert ds["state"].dimensions == ("lev", "lat", "lon")
        assert ds["state"].dtype == np.dtype(dtype)
    truth = _read(case.truth)
    ref = _paper_truth(16, 8)
    for lev in range(3):
        np.testing.assert_allclose(truth[lev], (1 + lev / 3) * ref, rtol=1e-6, atol=1e-6)
    cfg = load_config(case.config)
    assert cfg.ensemble.coordinates.level == "lev"
    with netCDF4.Dataset(case.obs) as ds:
        idx = np.asarray(ds["index"][:])
        assert idx.size == (3 * 16 * 8 + 5) // 10
        np.testing.assert_array_equal(np.asarray(ds["level"][:]), idx // (16 * 8))


def test_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert synth_main([str(tmp_path), "--nx", "1", "--ny", "4", "--members", "2",
                       "--seed", "0"]) == 2
    assert "nx=1" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_config_has_an_analysis_that_ensio_analyse_runs_as_is(tmp_path: Path) -> None:
    nx, ny, ne = 40, 20, 5
    out = tmp_path / "case"
    assert synth_main([str(out), "--nx", str(nx), "--ny", str(ny), "--members", str(ne),
                       "--seed", "4"]) == 0
    cfg = load_config(out / "ensio.yaml")
    assert cfg.analysis is not None and cfg.analysis.filter == "letkf"
    assert [cfg.resolve(e.file) for e in cfg.observations] == [out / "obs.nc"]
    # support radius: 8 of the larger grid spacing at the equator, on a 6371 km sphere
    spacing = max(2 * np.pi * 6371.0 / nx, np.pi * 6371.0 / ny)
    assert cfg.analysis.localization.radius_km == pytest.approx(8 * spacing, abs=1.0)
    before = [(_read(p), _read(p, "aux")) for p in sorted(out.glob("mem*.nc"))]
    res = subprocess.run([sys.executable, "-m", "ensio", "analyse", str(out / "ensio.yaml")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("observations: ")
    for k, (state, aux) in enumerate(before, start=1):
        path = out / f"mem{k:03d}.nc"
        after = _read(path)
        assert not np.allclose(after, state), path  # every member was analysed
        np.testing.assert_array_equal(_read(path, "aux"), aux)  # aux untouched
    analysis = np.stack([_read(out / f"mem{k:03d}.nc") for k in range(1, ne + 1)])
    with netCDF4.Dataset(out / "an" / "mean.nc") as ds:
        np.testing.assert_allclose(ds["state"][:], analysis.mean(0), rtol=1e-12)
    with netCDF4.Dataset(out / "an" / "spread.nc") as ds:
        np.testing.assert_allclose(ds["state"][:], analysis.std(0, ddof=1), rtol=1e-10)
    # the analysis mean is closer to the truth than the prior mean (10 % observed, sigma 0.25)
    truth = _read(out / "truth.nc")
    prior_mean = np.mean([s for s, _ in before], axis=0)
    rmse = lambda x: float(np.sqrt(np.mean((x - truth) ** 2)))  # noqa: E731
    assert rmse(analysis.mean(0)) < rmse(prior_mean)


def test_level_case_config_runs_as_is(tmp_path: Path) -> None:
    case = write_synthetic(tmp_path, SyntheticSpec(nx=24, ny=12, members=4, seed=9, levels=3,
                                                   dtype="float32"))
    before = _read(case.members[0])
    res = subprocess.run([sys.executable, "-m", "ensio", "analyse", str(case.config)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert not np.allclose(_read(case.members[0]), before)
    with netCDF4.Dataset(tmp_path / "an" / "mean.nc") as ds:
        assert ds["state"].dtype == np.float32
        assert ds["state"].dimensions == ("lev", "lat", "lon")
