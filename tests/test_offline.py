"""End to end, serially: ``run_analysis`` / ``ensio analyse`` on member files (issue 3).

Expected values never come from the offline path itself: the prior is read
with the plain netCDF4 library (tests/cases.py), the observations are the
arrays the test wrote, the row coordinates and the lon/lat grid are built
here, and the analysis is the in-memory :func:`ensio.analysis.api.analyse`
(plus the textbook Kalman formula with an H built from scratch in
``cases.bilinear_matrix`` for the deterministic global filters).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
import xarray as xr
import yaml
from cases import (
    EnsembleCase,
    ObsCase,
    VarCase,
    make_obs_case,
    reference_matrix,
    row_lonlat,
    sha256,
    variable_bytes,
    write_observations,
)
from mpi4py import MPI

from ensio.analysis.api import analyse
from ensio.analysis.result import AnalysisResult
from ensio.config import config_from_dict
from ensio.config.analysis import (
    AnalysisSection,
    InflationSection,
    LocalizationSection,
    QCSection,
)
from ensio.obs import ObsBatch, RegularGrid
from ensio.offline import run_analysis

ENSIO = [sys.executable, "-m", "ensio"]
VARS = [VarCase("state", ("lat", "lon")), VarCase("t", ("lev", "lat", "lon"))]
STATE_NAMES = {v.name for v in VARS}
FILTERS = ("etkf", "estkf", "letkf", "lestkf", "enkf", "lenkf")
LOCAL = {"letkf", "lestkf", "lenkf"}
RADIUS_KM = 5000.0
FORGET = 0.9
SEED = 11
CYCLE = 2


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))


@dataclass
class Setup:
    root: Path
    paths: list[Path]
    X: np.ndarray  # prior (N_e, N_x), read with netCDF4
    coords: np.ndarray  # (N_x, 2) lon/lat of every row
    grid: RegularGrid  # the first variable's grid (bilinear H of the reference)
    obs: ObsCase
    obs_files: list[Path]


def _setup(root: Path, seed: int = 3, members: int = 5, **obs_kw) -> Setup:
    """Members by tests/cases.py (netCDF4), two observation files, everything read back."""
    case = EnsembleCase(members=members, nlat=7, nlon=11, nlev=3, variables=VARS, seed=seed)
    paths = case.write(root)
    X = reference_matrix(paths, VARS)
    coords = row_lonlat(paths[0], VARS)
    with netCDF4.Dataset(paths[0]) as ds:
        lon = np.asarray(ds["lon"][:], dtype=float)
        lat = np.asarray(ds["lat"][:], dtype=float)
    obs = make_obs_case(X, coords, lon, lat, np.random.default_rng(seed + 100), **obs_kw)
    return Setup(root, paths, X, coords, RegularGrid(lon, lat), obs, obs.write(root))


def _analysis(name: str, **extra) -> tuple[dict, AnalysisSection]:
    """The YAML ``analysis:`` section and the same section built directly."""
    raw: dict = {"filter": name, "inflation": {"forget": FORGET}, "seed": SEED}
    kw: dict = {"filter": name, "inflation": InflationSection(forget=FORGET), "seed": SEED}
    if name in LOCAL:
        raw["localization"] = {"taper": "gaspari-cohn", "radius_km": RADIUS_KM}
        kw["localization"] = LocalizationSection(taper="gaspari-cohn", radius_km=RADIUS_KM)
    if "max_sigma" in extra:
        raw["qc"] = {"max_sigma": extra["max_sigma"]}
        kw["qc"] = QCSection(max_sigma=extra["max_sigma"])
    return raw, AnalysisSection(**kw)


def _raw_config(s: Setup, analysis: dict, *, in_place: bool = True, **output) -> dict:
    raw = EnsembleCase(variables=VARS, members=len(s.paths)).config(s.root)
    raw["io"]["in_place"] = in_place
    raw["observations"] = [{"file": p.name} for p in s.obs_files]
    raw["analysis"] = analysis
    if output:
        raw["output"] = output
    return raw


def _run(s: Setup, raw: dict):
    return run_analysis(config_from_dict(raw, base_dir=s.root), MPI.COMM_SELF, cycle=CYCLE)


def _batch(obs: ObsCase, keep: np.ndarray | None = None) -> ObsBatch:
    """The observations as the reference sees them (ids = position over both files)."""
    keep = np.ones(obs.value.size, bool) if keep is None else keep
    ids = np.arange(obs.value.size)
    return ObsBatch(
        values=obs.value[keep],
        errors=obs.error[keep],
        lon=obs.lon[keep],
        lat=obs.lat[keep],
        index=obs.index[keep],
        ids=ids[keep],
    )


def _reference(s: Setup, section: AnalysisSection, keep=None) -> AnalysisResult:
    return analyse(s.X, _batch(s.obs, keep), section, coords=s.coords, grid=s.grid, cycle=CYCLE)


def _innovation_stats(values: np.ndarray, H: np.ndarray, X: np.ndarray) -> tuple[float, float]:
    d = values - (X @ H.T).mean(axis=0)
    return float(d.mean()), float(np.sqrt(np.mean(d**2)))


def _no_temporaries(root: Path) -> None:
    for _, _, files in os.walk(root):
        left = [f for f in files if "ensio-partial" in f or "ensio-tmp" in f]
        assert not left, left


# --------------------------------------------------------------------------- equality


@pytest.mark.parametrize("name", FILTERS)
def test_run_analysis_equals_in_memory_analyse(name, tmp_path):
    s = _setup(tmp_path)
    assert np.any(s.obs.index < 0) and np.any(s.obs.index >= 0) and np.any(s.obs.missing)
    raw_an, section = _analysis(name)
    report = _run(s, _raw_config(s, raw_an))
    got = reference_matrix(s.paths, VARS)
    ref = _reference(s, section)
    assert ref.qc.accepted == s.obs.value.size  # nothing rejected: all observations used
    assert rel(got, ref.ensemble) <= 1e-12
    assert rel(got, s.X) > 1e-3  # it did change something
    assert report.result.qc == ref.qc
    assert report.n_obs_read == s.obs.value.size


@pytest.mark.parametrize("name", ["etkf", "estkf"])
def test_global_square_root_filters_give_the_kalman_analysis(name, tmp_path):
    """Independent of ensio's H: dense H from scratch, P/ρ, K = PHᵀ(HPHᵀ+R)⁻¹."""
    s = _setup(tmp_path)
    raw_an, _ = _analysis(name)
    _run(s, _raw_config(s, raw_an))
    Xa = reference_matrix(s.paths, VARS)
    k = s.X.shape[0]
    A = (s.X - s.X.mean(0)).T
    P = A @ A.T / (k - 1) / FORGET
    H, R = s.obs.H, np.diag(s.obs.error**2)
    K = P @ H.T @ np.linalg.inv(H @ P @ H.T + R)
    xa = s.X.mean(0) + K @ (s.obs.value - H @ s.X.mean(0))
    Aa = (Xa - Xa.mean(0)).T
    assert rel(Xa.mean(0), xa) <= 1e-10
    assert rel(Aa @ Aa.T / (k - 1), (np.eye(P.shape[0]) - K @ H) @ P) <= 1e-10


# --------------------------------------------------------------------------- files


def _attrs(path: Path) -> dict:
    """Global and per-variable attributes, dimensions and dtypes of a file."""
    with netCDF4.Dataset(path) as ds:
        out: dict = {"": {a: _plain(ds.getncattr(a)) for a in ds.ncattrs()}}
        out["dims"] = {n: len(d) for n, d in ds.dimensions.items()}
        for name, var in ds.variables.items():
            out[name] = {a: _plain(var.getncattr(a)) for a in var.ncattrs()}
            out[name]["__dims__"] = var.dimensions
            out[name]["__dtype__"] = str(var.dtype)
    return out


def _plain(v):
    return v.tolist() if isinstance(v, np.ndarray | np.generic) else v


def _fields(path: Path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return {n: np.asarray(ds[n][:]) for n in STATE_NAMES}


def _ncdump(path: Path) -> str | None:
    exe = shutil.which("ncdump")
    if exe is None:
        return None
    out = subprocess.run([exe, str(path)], capture_output=True, text=True, check=True)
    return out.stdout


def test_analysis_files_products_and_readers(tmp_path):
    s = _setup(tmp_path)
    others = ["aux", "lon", "lat", "landmask"]
    before_bytes = [{n: variable_bytes(p, n) for n in others} for p in s.paths]
    before_attrs = [_attrs(p) for p in s.paths]
    before_fields = [_fields(p) for p in s.paths]
    raw_an, section = _analysis("letkf")
    raw = _raw_config(s, raw_an, mean="an/mean.nc", spread="an/spread.nc")
    _run(s, raw)
    Xa = reference_matrix(s.paths, VARS)
    assert rel(Xa, _reference(s, section).ensemble) <= 1e-12
    nx2 = 7 * 11
    have_ncdump = True
    for m, p in enumerate(s.paths):
        after = _fields(p)
        for n in STATE_NAMES:
            assert not np.allclose(after[n], before_fields[m][n]), (p, n)
        assert {n: variable_bytes(p, n) for n in others} == before_bytes[m]
        assert _attrs(p) == before_attrs[m]
        with xr.open_dataset(p) as ds:
            got = np.concatenate([ds["state"].values.ravel(), ds["t"].values.ravel()])
            np.testing.assert_array_equal(got, Xa[m])
            np.testing.assert_array_equal(ds["aux"].values, _aux(p))
        dump = _ncdump(p)
        have_ncdump = dump is not None
        if dump is not None:
            assert "state =" in dump and "aux =" in dump
    # products: numpy mean and std (ddof=1) of the analysis read back, in the variables' shapes
    template = _attrs(s.paths[0])
    for fname, expect in (
        ("mean.nc", Xa.mean(axis=0)),
        ("spread.nc", Xa.std(axis=0, ddof=1)),
    ):
        path = tmp_path / "an" / fname
        with netCDF4.Dataset(path) as ds:
            assert ds.getncattr("title") == template[""]["title"]
            for c in ("lon", "lat"):
                with netCDF4.Dataset(s.paths[0]) as src:
                    np.testing.assert_array_equal(ds[c][:], src[c][:])
                assert ds[c].units == template[c]["units"]
            np.testing.assert_allclose(
                np.asarray(ds["state"][:]).ravel(), expect[:nx2], rtol=1e-12, atol=0
            )
            np.testing.assert_allclose(
                np.asarray(ds["t"][:]).ravel(), expect[nx2:], rtol=1e-12, atol=0
            )
            assert ds["t"].dimensions == ("lev", "lat", "lon")
            for n in STATE_NAMES:
                member_name = template[n]["long_name"]
                if fname == "spread.nc":
                    member_name = f"ensemble spread (standard deviation, ddof=1) of {member_name}"
                assert ds[n].long_name == member_name
        with xr.open_dataset(path) as ds:
            np.testing.assert_allclose(ds["state"].values.ravel(), expect[:nx2], rtol=1e-12)
            np.testing.assert_array_equal(ds["lat"].values, s.grid.lat)
        dump = _ncdump(path)
        if dump is not None:
            assert "state =" in dump and "t =" in dump
    _no_temporaries(tmp_path)
    if not have_ncdump:  # xarray checked above; ncdump not (Debian netcdf-bin)
        needs.tool("ncdump")


def _aux(path: Path) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        return np.asarray(ds["aux"][:])


def test_copies_leave_the_originals_untouched(tmp_path):
    s = _setup(tmp_path)
    before = [sha256(p) for p in s.paths]
    originals = [_attrs(p) for p in s.paths]
    raw_an, section = _analysis("lenkf")
    raw = _raw_config(s, raw_an, in_place=False, members="an/mem{member:03d}.nc", mean="an/mean.nc")
    _run(s, raw)
    assert [sha256(p) for p in s.paths] == before
    copies = [tmp_path / "an" / f"mem{m:03d}.nc" for m in range(1, len(s.paths) + 1)]
    Xa = reference_matrix(copies, VARS)
    assert rel(Xa, _reference(s, section).ensemble) <= 1e-12
    for src, dst, attrs in zip(s.paths, copies, originals, strict=True):
        assert _attrs(dst) == attrs
        with netCDF4.Dataset(src) as ds:
            names = [n for n in ds.variables if n not in STATE_NAMES]
        assert set(names) == {"aux", "lon", "lat", "landmask"}
        for n in names:
            assert variable_bytes(dst, n) == variable_bytes(src, n), (dst, n)
    with netCDF4.Dataset(tmp_path / "an" / "mean.nc") as ds:
        np.testing.assert_allclose(
            np.asarray(ds["state"][:]).ravel(), Xa.mean(0)[: 7 * 11], rtol=1e-12
        )
    _no_temporaries(tmp_path)


# --------------------------------------------------------------------------- report and CLI

_STAT = re.compile(
    r"^(prior|posterior)\s+innovation: mean (\S+)\s+rms (\S+)\s+accepted (\d+)\s+rejected (\d+)$"
)
_TIMING = re.compile(r"^timing: (?:\w+ \d+\.\d+ s\s*)+$")


def _check_stats_lines(lines: list[str], s: Setup, Xa: np.ndarray, accepted: np.ndarray) -> None:
    """The innovation lines against numpy (4 significant digits are printed)."""
    H, y = s.obs.H[accepted], s.obs.value[accepted]
    expect = {
        "prior": _innovation_stats(y, H, s.X),
        "posterior": _innovation_stats(y, H, Xa),
    }
    seen = set()
    for line in lines:
        m = _STAT.match(line)
        if m is None:
            continue
        name = m.group(1)
        seen.add(name)
        mean, rms = expect[name]
        assert float(m.group(2)) == pytest.approx(mean, rel=1e-3, abs=1e-4 * rms)
        assert float(m.group(3)) == pytest.approx(rms, rel=1e-3)
        assert int(m.group(4)) == int(accepted.sum())
        assert int(m.group(5)) == int((~accepted).sum())
    assert seen == {"prior", "posterior"}, lines
    assert sum(bool(_TIMING.match(line)) for line in lines) == 1, lines
    timing = next(line for line in lines if line.startswith("timing:"))
    for phase in ("read", "analysis", "write", "total"):
        assert f" {phase} " in timing


def test_report_statistics_match_numpy(tmp_path):
    s = _setup(tmp_path)
    raw_an, _ = _analysis("lestkf")
    report = _run(s, _raw_config(s, raw_an))
    Xa = reference_matrix(s.paths, VARS)
    everything = np.ones(s.obs.value.size, bool)
    for name, X in (("prior", s.X), ("posterior", Xa)):
        mean, rms = _innovation_stats(s.obs.value, s.obs.H, X)
        st = getattr(report.result, name)
        assert st.count == s.obs.value.size
        assert abs(st.mean - mean) <= 1e-10 * rms
        assert st.rms == pytest.approx(rms, rel=1e-10)
    assert report.result.posterior.rms < report.result.prior.rms
    lines = report.lines()
    assert lines[0].startswith(f"observations: {s.obs.value.size} read")
    _check_stats_lines(lines, s, Xa, everything)


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*ENSIO, *map(str, args)], capture_output=True, text=True, timeout=120)


def _write_yaml(s: Setup, raw: dict) -> Path:
    cfg = s.root / "ensio.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return cfg


def test_cli_analyse_prints_statistics_and_timing(tmp_path):
    s = _setup(tmp_path)
    raw_an, section = _analysis("letkf")
    cfg = _write_yaml(s, _raw_config(s, raw_an))
    proc = _cli("analyse", cfg, "--cycle", CYCLE)
    assert proc.returncode == 0, proc.stderr
    Xa = reference_matrix(s.paths, VARS)
    assert rel(Xa, _reference(s, section).ensemble) <= 1e-12
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith(
        f"observations: {s.obs.value.size} read, {s.obs.value.size} accepted"
    )
    _check_stats_lines(lines, s, Xa, np.ones(s.obs.value.size, bool))


# --------------------------------------------------------------------------- bad input


def _obs_not_found(s: Setup, raw: dict) -> list[str]:
    s.obs_files[1].unlink()
    return [str(s.obs_files[1]), "not found"]


def _obs_not_netcdf(s: Setup, raw: dict) -> list[str]:
    s.obs_files[0].write_text("value,error\n1.0,0.5\n")
    return [str(s.obs_files[0])]


def _obs_without_error(s: Setup, raw: dict) -> list[str]:
    o = s.obs
    write_observations(
        s.obs_files[1], o.lon[:3], o.lat[:3], o.value[:3], o.error[:3], omit=("error",)
    )
    return [str(s.obs_files[1]), "error", "missing"]


def _unknown_key(s: Setup, raw: dict) -> list[str]:
    raw["analysis"]["filtr"] = raw["analysis"]["filter"]
    return ["analysis.filtr"]


def _unknown_filter(s: Setup, raw: dict) -> list[str]:
    raw["analysis"]["filter"] = "foo"
    return ["analysis.filter", "foo"]


def _local_without_localization(s: Setup, raw: dict) -> list[str]:
    raw["analysis"] = {"filter": "letkf"}
    return ["analysis.localization", "letkf"]


def _copies_without_members(s: Setup, raw: dict) -> list[str]:
    raw["io"]["in_place"] = False
    raw["output"] = {"mean": "an/mean.nc"}
    return ["output.members"]


BAD = {
    f.__name__.lstrip("_"): f
    for f in (
        _obs_not_found,
        _obs_not_netcdf,
        _obs_without_error,
        _unknown_key,
        _unknown_filter,
        _local_without_localization,
        _copies_without_members,
    )
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_bad_input_is_one_line_and_modifies_nothing(what, tmp_path):
    s = _setup(tmp_path)
    raw = _raw_config(s, _analysis("etkf")[0])
    needles = BAD[what](s, raw)
    cfg = _write_yaml(s, raw)
    before = [sha256(p) for p in s.paths]
    proc = _cli("analyse", cfg)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ensio: error:"), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert [sha256(p) for p in s.paths] == before
    assert not (tmp_path / "an").exists()


def test_nan_values_and_bad_errors_are_rejected_and_counted(tmp_path):
    s = _setup(tmp_path)
    o = s.obs
    o.value[[1, 20]] = np.nan  # an index observation and a bilinear one
    o.error[3] = 0.0
    o.error[30] = -0.5
    o.error[5] = np.nan
    bad_value, bad_error = 2, 3
    s.obs_files = o.write(tmp_path)
    keep = np.isfinite(o.value) & np.isfinite(o.error) & (o.error > 0)
    raw_an, section = _analysis("letkf")
    report = _run(s, _raw_config(s, raw_an))
    qc = report.result.qc
    assert (qc.total, qc.bad_value, qc.bad_error) == (o.value.size, bad_value, bad_error)
    assert qc.accepted == int(keep.sum()) == o.value.size - bad_value - bad_error
    Xa = reference_matrix(s.paths, VARS)
    assert rel(Xa, _reference(s, section, keep).ensemble) <= 1e-12
    lines = report.lines()
    assert f"{bad_value + bad_error} rejected" in lines[0]
    assert f"bad_value {bad_value}" in lines[0] and f"bad_error {bad_error}" in lines[0]
    _check_stats_lines(lines, s, Xa, keep)


def test_gross_error_check_rejects_a_huge_innovation(tmp_path):
    s = _setup(tmp_path)
    o = s.obs
    o.value[7] += 1.0e3
    o.value[25] -= 1.0e3  # a bilinear one
    s.obs_files = o.write(tmp_path)
    max_sigma = 4.0
    # the numpy check the QC should make: |y - mean Hx| > max_sigma sqrt(σo² + var Hx)
    HX = s.X @ o.H.T
    d = np.abs(o.value - HX.mean(0))
    limit = max_sigma * np.sqrt(o.error**2 + HX.var(axis=0, ddof=1))
    keep = d <= limit
    assert np.flatnonzero(~keep).tolist() == [7, 25]
    raw_an, section = _analysis("letkf", max_sigma=max_sigma)
    report = _run(s, _raw_config(s, raw_an))
    qc = report.result.qc
    assert (qc.gross, qc.accepted, qc.rejected) == (2, o.value.size - 2, 2)
    Xa = reference_matrix(s.paths, VARS)
    assert rel(Xa, _reference(s, section, keep).ensemble) <= 1e-12
    assert "gross 2" in report.lines()[0]
    _check_stats_lines(report.lines(), s, Xa, keep)
