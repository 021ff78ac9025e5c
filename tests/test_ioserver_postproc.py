"""Issue 27 item 6 through the graph and the writer: interpolation, freq_offset, packing,
region reductions, XIOS time names, sync_freq; and the one-line errors of the new keys.

Expected values are computed here with numpy/scipy from the series the pipeline is
fed (area-weighted block means for the conservative remapping of nested cells,
scipy's RegularGridInterpolator for bilinear, numpy.interp for levels, XIOS's
sampling rule ``start + freq_offset + timestep + k·freq_op`` written out as steps),
never by the code under test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import needs
import netCDF4
import numpy as np
import pytest
from scipy.interpolate import RegularGridInterpolator

from ensio.config.errors import ConfigError
from ensio.ioserver.configload import ioserver_from_dict
from ensio.ioserver.geometry import regular_geometry
from ensio.ioserver.graph import Graph
from ensio.ioserver.pipeline import OutputPipeline

NI, NJ, NK = 24, 12, 4
LEVELS = [1000.0, 850.0, 500.0, 200.0]
PLEV = [925.0, 700.0, 300.0, 100.0]          # 100 is above the top: missing


def _raw(files: list[dict], *, fields: list[dict] | None = None, timestep: str = "1h",
         **extra: Any) -> dict:
    raw = {
        "calendar": {"type": "noleap", "start": "2000-01-01 00:00:00", "timestep": timestep},
        "axes": [{"id": "lev", "n": NK, "values": LEVELS, "units": "hPa", "positive": "down",
                  "standard_name": "air_pressure"},
                 {"id": "plev", "n": len(PLEV), "values": PLEV, "units": "hPa",
                  "positive": "down", "standard_name": "air_pressure",
                  "interpolate": {"from": "lev"}}],
        "domains": [{"id": "atm", "type": "rectilinear", "ni_glo": NI, "nj_glo": NJ},
                    {"id": "coarse", "type": "rectilinear", "ni_glo": NI // 3,
                     "nj_glo": NJ // 2, "interpolate": {"from": "atm"}},
                    {"id": "fine", "type": "rectilinear", "ni_glo": 7, "nj_glo": 5,
                     "lon": [3.0, 50.0, 101.5, 180.0, 250.0, 300.0, 358.0],
                     "lat": [-70.0, -30.5, 0.0, 41.0, 80.0],
                     "interpolate": {"from": "atm", "method": "bilinear"}}],
        "grids": [{"id": "g2", "domain": "atm"}, {"id": "g3", "domain": "atm", "axis": "lev"},
                  {"id": "c2", "domain": "coarse"}, {"id": "f2", "domain": "fine"},
                  {"id": "p3", "domain": "atm", "axis": "plev"}],
        "fields": fields if fields is not None else [
            {"id": "tas", "grid": "g2", "units": "K", "standard_name": "air_temperature"},
            {"id": "ta", "grid": "g3", "units": "K", "standard_name": "air_temperature"}],
        "files": files,
        **extra,
    }
    return raw


def _cfg(tmp_path: Path, files: list[dict], **kw: Any):
    return ioserver_from_dict(_raw(files, **kw), tmp_path)


def _run(cfg, tmp_path: Path, data: dict[str, np.ndarray], nsteps: int) -> Path:
    """The pipeline of a server (graph + writer) fed steps 1..nsteps; the output dir."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    geo = {"atm": regular_geometry(cfg.domains["atm"])}
    pipe = OutputPipeline(cfg, [f.id for f in cfg.enabled_files], geo, out, "test")
    for n in range(1, nsteps + 1):
        for fid, series in data.items():
            if pipe._graph.needs(fid, n):
                pipe.push(fid, n, series[n - 1])
        pipe.advance(n)
    pipe.finish(nsteps)
    pipe.close()
    return out


def _read(path: Path, name: str) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        return np.ma.filled(ds[name][...].astype(np.float64), np.nan)


def _areas(lon_e: np.ndarray, lat_e: np.ndarray) -> np.ndarray:
    dsin = np.diff(np.sin(np.deg2rad(lat_e)))
    return dsin[:, None] * np.diff(np.deg2rad(lon_e))[None, :]


def _cf_clean(path: Path, tmp_path: Path, order_ok: tuple[str, ...] = ()) -> None:
    """compliance-checker cf:1.8: no high or medium failure; ncdump and cdo read it.

    ``order_ok``: variables whose (time, level, region) order may draw CF §2.4's
    *recommendation* "further dimensions left of T, Z, Y, X" (the record dimension
    comes first in a classic-layout file, so the region dimension cannot)."""
    for cmd in (["ncdump", "-h", str(path)], ["cdo", "-s", "sinfon", str(path)]):
        needs.tool(cmd[0])
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"{cmd}: {run.stderr}"
    needs.module("compliance_checker")
    report = tmp_path / f"{path.stem}.cc.json"
    subprocess.run([str(Path(sys.executable).parent / "compliance-checker"), "--test",
                    "cf:1.8", "--format", "json", "--output", str(report), str(path)],
                   capture_output=True, text=True, timeout=300)
    result = json.loads(report.read_text())["cf:1.8"]
    assert result["high_count"] == 0, result["high_priorities"]
    bad = [(c["name"], m) for c in result["medium_priorities"] for m in c["msgs"]
           if not (m.split("'s spatio-temporal dimensions are not in the recommended")[0]
                   in order_ok and "region (U)" in m)]
    assert not bad, bad


# ---------------------------------------------------------------- interpolation


def test_interpolated_files_equal_independent_references(tmp_path: Path, rng) -> None:
    nsteps = 48
    cfg = _cfg(tmp_path, [{"id": "d", "name": "day", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "tas_coarse", "grid": "c2", "operation": "average",
         "precision": 8},
        {"field_ref": "tas", "name": "tas_fine", "grid": "f2", "operation": "average",
         "precision": 8},
        {"field_ref": "ta", "name": "ta_plev", "grid": "p3", "operation": "instant",
         "precision": 8}]}])
    tas = rng.normal(280.0, 10.0, (nsteps, NJ, NI))
    ta = rng.normal(250.0, 20.0, (nsteps, NK, NJ, NI))
    out = _run(cfg, tmp_path, {"tas": tas, "ta": ta}, nsteps)
    path = out / "day.nc"
    daily = tas.reshape(2, 24, NJ, NI).mean(axis=1)
    # conservative onto 3 x 2 blocks of the regular grid: area-weighted block means
    a = _areas(np.linspace(0, 360, NI + 1), np.linspace(-90, 90, NJ + 1))
    blocks = (a * daily).reshape(2, NJ // 2, 2, NI // 3, 3).sum(axis=(2, 4))
    want = blocks / a.reshape(NJ // 2, 2, NI // 3, 3).sum(axis=(1, 3))
    np.testing.assert_allclose(_read(path, "tas_coarse"), want, rtol=1e-12, atol=0)
    # bilinear at the configured points: scipy on the periodic source grid
    g = regular_geometry(cfg.domains["atm"])
    lon3 = np.concatenate([g.lon - 360, g.lon, g.lon + 360])
    fine = cfg.domains["fine"]
    pts = np.stack(np.meshgrid(fine.lat, fine.lon, indexing="ij"), axis=-1)
    inside = (np.asarray(fine.lat) >= g.lat[0]) & (np.asarray(fine.lat) <= g.lat[-1])
    got = _read(path, "tas_fine")
    for k in range(2):
        ref = RegularGridInterpolator((g.lat, lon3), np.concatenate([daily[k]] * 3, axis=1))(
            pts[inside])
        np.testing.assert_allclose(got[k][inside], ref, rtol=0, atol=1e-9)
    # levels: numpy.interp of each column of the last sample of the day
    got = _read(path, "ta_plev")
    for k, step in enumerate((24, 48)):
        col = ta[step - 1]
        for j in range(0, NJ, 5):
            for i in range(0, NI, 7):
                ref = np.interp(PLEV[:3], LEVELS[::-1], col[::-1, j, i])
                np.testing.assert_allclose(got[k, :3, j, i], ref, rtol=0, atol=1e-9)
    assert np.isnan(got[:, 3]).all()                     # 100 hPa: above the top level
    with netCDF4.Dataset(path) as ds:
        assert ds["tas_coarse"].shape == (2, NJ // 2, NI // 3)
        _, lat, lon = ds["tas_fine"].dimensions
        np.testing.assert_allclose(ds[lat][:], fine.lat)
        np.testing.assert_allclose(ds[lon][:], fine.lon)
    _cf_clean(path, tmp_path)


E2E = Path(__file__).parent / "data" / "ioserver_e2e"


def _e2e_iodef(tmp: Path, mode: str, servers: int) -> Path:
    """The end-to-end model's grid (24 x 12, land mask, 3 levels, 3 h steps) with
    interpolated, packed and region-reduced outputs in two files (one per server)."""
    import yaml

    with netCDF4.Dataset(tmp / "halves.nc", "w") as ds:
        ds.createDimension("lat", 12)
        ds.createDimension("lon", 24)
        ds.createVariable("half", "i4", ("lat", "lon"))[:] = np.repeat([1, 2], 6)[:, None] \
            * np.ones((1, 24), int)
    ioserver = {
        "mode": mode, "servers": servers, "output_dir": str(tmp / "out"),
        "calendar": {"type": "noleap", "start": "2001-02-27 00:00:00", "timestep": "3h"},
        "axes": [{"id": "lev", "n": 3, "values": [1.0, 2.0, 3.0], "units": "1",
                  "positive": "down"},
                 {"id": "lev_i", "n": 2, "values": [1.5, 2.75], "units": "1",
                  "positive": "down", "interpolate": {"from": "lev"}}],
        "domains": [{"id": "atm", "type": "rectilinear", "ni_glo": 24, "nj_glo": 12},
                    {"id": "half", "type": "rectilinear", "ni_glo": 12, "nj_glo": 6,
                     "interpolate": {"from": "atm", "method": "conservative"}},
                    {"id": "pts", "type": "rectilinear", "ni_glo": 9, "nj_glo": 7,
                     "interpolate": {"from": "atm", "method": "bilinear"}}],
        "grids": [{"id": "g2", "domain": "atm"}, {"id": "g3", "domain": "atm", "axis": "lev"},
                  {"id": "h2", "domain": "half"}, {"id": "p2", "domain": "pts"},
                  {"id": "h3", "domain": "half", "axis": "lev_i"}],
        "fields": [{"id": "tas", "grid": "g2", "units": "K"},
                   {"id": "ta", "grid": "g3", "units": "K"},
                   {"id": "pr", "grid": "g2", "units": "kg m-2 s-1"}],
        "files": [
            {"id": "a", "name": "interp_a", "output_freq": "1d", "fields": [
                {"field_ref": "tas", "name": "tas_half", "grid": "h2", "operation": "average",
                 "precision": 8},
                {"field_ref": "tas", "name": "tas_pts", "grid": "p2", "operation": "maximum",
                 "precision": 8},
                {"field_ref": "ta", "name": "ta_half", "grid": "h3", "operation": "average",
                 "precision": 8}]},
            {"id": "b", "name": "interp_b", "output_freq": "1d", "time_naming": "xios",
             "fields": [
                {"field_ref": "pr", "name": "pr_half", "grid": "h2", "operation": "accumulate",
                 "precision": 8, "freq_offset": "0ts"},
                {"field_ref": "tas", "name": "tas_packed", "operation": "average",
                 "precision": 2, "valid_min": 200.0, "valid_max": 330.0},
                {"field_ref": "tas", "name": "tas_halves", "operation": "average",
                 "precision": 8,
                 "reduce": {"op": "mean", "mask": {"file": "halves.nc", "variable": "half"}}}]},
        ],
    }
    path = tmp / "iodef.yaml"
    path.write_text(yaml.safe_dump({"ioserver": ioserver}))
    return path


def test_interpolation_does_not_depend_on_the_number_of_servers_or_the_mode(
        tmp_path: Path) -> None:
    """The model of the end-to-end tests (Python client under mpiexec, land mask):
    the post-processed files of 1 and 2 servers and of the attached mode are equal
    bit for bit (each file is post-processed from the global field)."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    needs.tool(str(mpiexec))
    runs = {}
    for mode, servers, nprocs in (("server", 1, 3), ("server", 2, 4), ("attached", 1, 2)):
        tmp = tmp_path / f"{mode}{servers}"
        tmp.mkdir()
        iodef = _e2e_iodef(tmp, mode, servers)
        proc = subprocess.run([str(mpiexec), "-n", str(nprocs), sys.executable,
                               str(E2E / "model.py"), str(iodef), "16"], capture_output=True,
                              text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = tmp / "out"
        runs[(mode, servers)] = {
            (f, n): _read(out / f"{f}.nc", n)
            for f, names in (("interp_a", ("tas_half", "tas_pts", "ta_half")),
                             ("interp_b", ("pr_half", "tas_packed", "tas_halves")))
            for n in names}
    base = runs[("server", 1)]
    for key, values in base.items():
        assert np.isfinite(values).any(), key
        for other in (("server", 2), ("attached", 1)):
            np.testing.assert_array_equal(values, runs[other][key], err_msg=str((key, other)))
    assert base[("interp_a", "tas_half")].shape == (2, 6, 12)
    assert base[("interp_a", "ta_half")].shape == (2, 2, 6, 12)
    assert base[("interp_b", "tas_halves")].shape == (2, 2)


# ---------------------------------------------------------------- freq_offset


def test_freq_offset_samples_as_xios(tmp_path: Path, rng) -> None:
    """XIOS: samples at start + freq_offset + timestep + k·freq_op."""
    nsteps = 48
    cfg = _cfg(tmp_path, [{"id": "d", "name": "d", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "a0", "operation": "average", "freq_op": "6h",
         "freq_offset": "0ts", "precision": 8},
        {"field_ref": "tas", "name": "a2", "operation": "average", "freq_op": "6h",
         "freq_offset": "2h", "precision": 8},
        {"field_ref": "tas", "name": "plain", "operation": "average", "freq_op": "6h",
         "precision": 8}]}, {"id": "i", "name": "i", "output_freq": "6h", "fields": [
        {"field_ref": "tas", "name": "inst", "operation": "instant", "freq_op": "6h",
         "freq_offset": "2h", "precision": 8}]}])
    tas = rng.normal(280.0, 10.0, (nsteps, NJ, NI))
    out = _run(cfg, tmp_path, {"tas": tas}, nsteps)
    steps = np.arange(1, nsteps + 1)
    for name, offset_h in (("a0", 0), ("a2", 2), ("plain", None)):
        # sample steps: (n - 1 - offset) a multiple of 6 and >= 0; default: n % 6 == 0
        if offset_h is None:
            sampled = steps % 6 == 0
        else:
            sampled = ((steps - 1 - offset_h) % 6 == 0) & (steps - 1 - offset_h >= 0)
        want = np.stack([tas[(sampled & ((steps - 1) // 24 == d))].mean(axis=0)
                         for d in range(2)])
        np.testing.assert_allclose(_read(out / "d.nc", name), want, rtol=1e-13, atol=0)
    # instant, 6-hourly output, offset 2h: samples at steps 3, 9, 15, ...; the period
    # (0, 6h] keeps step 3's value and its time
    inst = _read(out / "i.nc", "inst")
    np.testing.assert_allclose(inst, tas[2::6], rtol=1e-13)
    np.testing.assert_allclose(_read(out / "i.nc", "time_instant"),
                               np.arange(3, nsteps + 1, 6) * 3600.0)


def test_freq_offset_is_active_rule_is_exact_and_the_periods_a_superset(tmp_path: Path):
    cfg = _cfg(tmp_path, [{"id": "d", "name": "d", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "a", "operation": "average", "freq_op": "6h",
         "freq_offset": "3h"}]}])
    g = Graph(cfg)
    need = [n for n in range(1, 49) if g.needs("tas", n)]
    assert need == [n for n in range(1, 49) if (n - 4) % 6 == 0 and n >= 4]
    periods = g.period_steps("tas")
    assert all(any(n % p == 0 for p in periods) for n in need)


# ---------------------------------------------------------------- packing, regions


@pytest.mark.parametrize("fmt", ["netcdf4", "cdf5"])
def test_precision_2_packs_and_xarray_and_cdo_unpack_within_half_a_quantum(
        tmp_path: Path, rng, fmt: str) -> None:
    nsteps = 24
    cfg = _cfg(tmp_path, [{"id": "p", "name": "packed", "output_freq": "6h", "format": fmt,
                           "fields": [
        {"field_ref": "tas", "name": "t_range", "operation": "average", "precision": 2,
         "valid_min": 200.0, "valid_max": 350.0},
        {"field_ref": "tas", "name": "t_scale", "operation": "instant", "precision": 2,
         "scale_factor": 0.01, "add_offset": 280.0}]}])
    tas = rng.normal(280.0, 15.0, (nsteps, NJ, NI))
    tas[3, 2, 5] = np.nan
    tas[5, 1, 1] = 400.0                      # outside both packable ranges: missing
    out = _run(cfg, tmp_path, {"tas": tas}, nsteps)
    path = out / "packed.nc"
    with netCDF4.Dataset(path) as ds:
        for name in ("t_range", "t_scale"):
            assert ds[name].dtype == np.int16
            assert ds[name]._FillValue == -32768
    mean6 = tas.reshape(4, 6, NJ, NI)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean6 = np.nanmean(mean6, axis=1)
    inst6 = tas[5::6]
    xr = needs.module("xarray")
    with xr.open_dataset(path, decode_times=False) as ds:
        for name, want, q, lo, hi in (("t_range", mean6, 150.0 / 65534, 200.0, 350.0),
                                      ("t_scale", inst6, 0.01, 280 - 327.67, 280 + 327.67)):
            got = ds[name].values.astype(np.float64)
            bad = ~np.isfinite(want) | (want < lo) | (want > hi)
            assert np.isnan(got[bad]).all()
            assert np.abs(got[~bad] - want[~bad]).max() <= 0.5 * q * (1 + 1e-9)
    needs.tool("cdo")
    txt = tmp_path / "cdo.nc"
    run = subprocess.run(["cdo", "-s", "-b", "F64", "copy", str(path), str(txt)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got = _read(txt, "t_scale")
    ok = np.isfinite(inst6) & (np.abs(inst6 - 280.0) <= 327.67)
    assert np.abs(got[ok] - inst6[ok]).max() <= 0.005 * (1 + 1e-9)
    _cf_clean(path, tmp_path)


def test_region_reductions_equal_numpy_per_region(tmp_path: Path, rng) -> None:
    ids = rng.integers(0, 4, (NJ, NI)).astype(np.int32)     # 0 = no region
    ids[0, 0], ids[1, 1], ids[2, 2] = 1, 2, 3
    with netCDF4.Dataset(tmp_path / "regions.nc", "w") as ds:
        ds.createDimension("lat", NJ)
        ds.createDimension("lon", NI)
        ds.createVariable("basin", "i4", ("lat", "lon"))[:] = ids
    nsteps = 12
    fields = [{"field_ref": "tas", "name": f"r_{op}", "operation": "average", "precision": 8,
               "reduce": {"op": op, "mask": {"file": "regions.nc", "variable": "basin"}}}
              for op in ("mean", "sum", "min", "max")]
    fields.append({"field_ref": "ta", "name": "r3", "operation": "average", "precision": 8,
                   "reduce": {"op": "mean", "mask": {"file": "regions.nc",
                                                     "variable": "basin"}}})
    cfg = _cfg(tmp_path, [{"id": "r", "name": "regions", "output_freq": "6h",
                           "fields": fields}])
    tas = rng.normal(280.0, 10.0, (nsteps, NJ, NI))
    tas[:, 3, 4] = np.nan
    ta = rng.normal(250.0, 10.0, (nsteps, NK, NJ, NI))
    out = _run(cfg, tmp_path, {"tas": tas, "ta": ta}, nsteps)
    path = out / "regions.nc"
    a = _areas(np.linspace(0, 360, NI + 1), np.linspace(-90, 90, NJ + 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        avg = np.nanmean(tas.reshape(2, 6, NJ, NI), axis=1)
    avg3 = ta.reshape(2, 6, NK, NJ, NI).mean(axis=1)
    for op in ("mean", "sum", "min", "max"):
        got = _read(path, f"r_{op}")
        assert got.shape == (2, 3)
        for r in (1, 2, 3):
            sel = (ids == r) & np.isfinite(avg[0])
            for k in range(2):
                v, w = avg[k][sel], a[sel]
                want = {"mean": (v * w).sum() / w.sum(), "sum": v.sum(), "min": v.min(),
                        "max": v.max()}[op]
                assert got[k, r - 1] == pytest.approx(want, rel=1e-12)
    got3 = _read(path, "r3")
    for r in (1, 2, 3):
        sel = ids == r
        want = (avg3[:, :, sel] * a[sel]).sum(axis=-1) / a[sel].sum()
        np.testing.assert_allclose(got3[:, :, r - 1], want, rtol=1e-12)
    np.testing.assert_array_equal(_read(path, "region"), [1, 2, 3])
    _cf_clean(path, tmp_path, order_ok=("r3",))


# ---------------------------------------------------------------- time names, sync_freq


@pytest.mark.parametrize("counter", ["centered", "instant", "record", "none"])
def test_xios_time_names(tmp_path: Path, rng, counter: str) -> None:
    nsteps = 12
    cfg = _cfg(tmp_path, [{"id": "x", "name": "xios", "output_freq": "6h",
                           "time_naming": "xios", "time_counter": counter, "fields": [
        {"field_ref": "tas", "name": "tmean", "operation": "average"},
        {"field_ref": "tas", "name": "tinst", "operation": "instant"}]}])
    out = _run(cfg, tmp_path, {"tas": rng.normal(size=(nsteps, NJ, NI))}, nsteps)
    path = out / "xios.nc"
    with netCDF4.Dataset(path) as ds:
        assert ds.dimensions["time_counter"].isunlimited()
        assert "time" not in ds.variables and "time" not in ds.dimensions
        np.testing.assert_allclose(ds["time_centered"][:], [3 * 3600.0, 9 * 3600.0])
        np.testing.assert_allclose(ds["time_centered_bounds"][:],
                                   [[0, 6 * 3600.0], [6 * 3600.0, 12 * 3600.0]])
        np.testing.assert_allclose(ds["time_instant"][:], [6 * 3600.0, 12 * 3600.0])
        assert ds["tmean"].dimensions[0] == "time_counter"
        assert ds["tmean"].coordinates.split()[0] == "time_centered"
        assert ds["tinst"].coordinates.split()[0] == "time_instant"
        want = {"centered": [3 * 3600.0, 9 * 3600.0], "instant": [6 * 3600.0, 12 * 3600.0],
                "record": [1.0, 2.0]}
        if counter == "none":
            assert "time_counter" not in ds.variables
        else:
            np.testing.assert_allclose(ds["time_counter"][:], want[counter])
    _cf_clean(path, tmp_path)


def test_sync_freq_flushes_every_that_much_model_time(tmp_path: Path, rng,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Hourly records, sync_freq 6h: the publishes of the records ending at 6, 12, 18
    and 24 h are durable (flushed), the others not; a file without sync_freq never
    flushes before it is closed."""
    from ensio.ioserver import staged

    calls: list[tuple[str, int, bool]] = []
    real = staged.StagedFile.publish

    def spy(self, numrecs: int, *, durable: bool = False) -> None:
        calls.append((self.final.name, numrecs, durable))
        real(self, numrecs, durable=durable)

    monkeypatch.setattr(staged.StagedFile, "publish", spy)
    nsteps = 24
    cfg = _cfg(tmp_path, [
        {"id": "s", "name": "synced", "output_freq": "1h", "sync_freq": "6h",
         "fields": [{"field_ref": "tas", "name": "t", "precision": 8}]},
        {"id": "u", "name": "unsynced", "output_freq": "1h",
         "fields": [{"field_ref": "tas", "name": "t", "precision": 8}]}])
    tas = rng.normal(size=(nsteps, NJ, NI))
    out = _run(cfg, tmp_path, {"tas": tas}, nsteps)
    durable = [n for name, n, d in calls if name == "synced.nc" and d]
    assert durable == [6, 12, 18, 24]
    assert not [n for name, n, d in calls if name == "unsynced.nc" and d]
    np.testing.assert_array_equal(_read(out / "synced.nc", "t"), tas)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("patch, key", [
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "x", "freq_offset": "1x"}]}]},
     "ioserver.files.f.fields.x.freq_offset"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "x", "freq_offset": "90mi"}]}]},
     "ioserver.files.f.fields.x.freq_offset"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "x", "precision": 2}]}]},
     "ioserver.files.f.fields.x.precision"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "x", "precision": 2, "valid_min": 3.0,
         "valid_max": 1.0}]}]}, "ioserver.files.f.fields.x.valid_max"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "x", "precision": 3}]}]},
     "ioserver.files.f.fields.x.precision"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "x", "grid": "p3"}]}]},
     "ioserver.files.f.fields.x.grid"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"name": "x", "grid": "c2", "expr": "tc + 1"}]}],
      "fields": [{"id": "tas", "grid": "g2"}, {"id": "ta", "grid": "g3"},
                 {"id": "tc", "field_ref": "tas", "grid": "c2"}]},
     "ioserver.files.f.fields.x.expr"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "time_counter": "record",
                 "fields": [{"field_ref": "tas", "name": "x"}]}]},
     "ioserver.files.f.time_counter"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "time_naming": "xios",
                 "fields": [{"field_ref": "tas", "name": "time_centered"}]}]},
     "ioserver.files.f.fields"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "sync_freq": "2q",
                 "fields": [{"field_ref": "tas", "name": "x"}]}]},
     "ioserver.files.f.sync_freq"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "x", "mean": "global",
         "reduce": {"op": "sum", "mask": {"file": "nothere.nc", "variable": "b"}}}]}]},
     "ioserver.files.f.fields.x.reduce"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "x",
         "reduce": {"op": "sum", "mask": {"file": "nothere.nc", "variable": "b"}}}]}]},
     "ioserver.files.f.fields.x.reduce.mask.file"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "x", "reduce": {"op": "median", "mask": {
            "file": "r.nc", "variable": "b"}}}]}]},
     "ioserver.files.f.fields.x.reduce.op"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "format": "cdf5",
                 "shared": True, "fields": [{"field_ref": "tas", "name": "x", "grid": "c2"}]}]},
     "ioserver.files.f.fields.x.grid"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "format": "cdf5",
                 "shared": True, "time_naming": "xios",
                 "fields": [{"field_ref": "tas", "name": "x"}]}]},
     "ioserver.files.f.time_naming"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "format": "cdf5",
                 "shared": True, "fields": [{"field_ref": "tas", "name": "x", "precision": 2,
                                             "scale_factor": 0.1}]}]},
     "ioserver.files.f.fields.x.precision"),
    ({"files": [{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "x", "scale_factor": 0.1}]}]},
     "ioserver.files.f.fields.x.scale_factor"),
])
def test_bad_values_are_one_line_errors_naming_the_key(tmp_path: Path, patch: dict,
                                                       key: str) -> None:
    raw = _raw([])
    raw.update(patch)
    with pytest.raises(ConfigError) as err:
        ioserver_from_dict(raw, tmp_path)
    msg = str(err.value)
    assert msg.startswith(key + ":") or msg.startswith(key + "."), msg
    assert "\n" not in msg


@pytest.mark.parametrize("where, value, key", [
    ("domain", {"from": "nowhere"}, "ioserver.domains.coarse.interpolate.from"),
    ("domain", {"from": "coarse"}, "ioserver.domains.coarse.interpolate.from"),
    ("domain", {"from": "atm", "method": "patch"}, "ioserver.domains.coarse.interpolate.method"),
    ("axis", {"from": "lev", "coordinate": "pres"}, "ioserver.axes.plev.interpolate"),
    ("axis", {"from": "nowhere"}, "ioserver.axes.plev.interpolate.from"),
])
def test_bad_interpolation_definitions_name_the_key(tmp_path: Path, where: str, value: dict,
                                                    key: str) -> None:
    raw = _raw([])
    if where == "domain":
        raw["domains"][1]["interpolate"] = value
    else:
        raw["axes"][1]["interpolate"] = value
    with pytest.raises(ConfigError) as err:
        ioserver_from_dict(raw, tmp_path)
    assert str(err.value).startswith(key), str(err.value)


def test_configured_coordinates_only_on_an_interpolation_target(tmp_path: Path) -> None:
    raw = _raw([])
    raw["domains"][0]["lon"] = [float(x) for x in range(NI)]
    raw["domains"][0]["lat"] = [float(x) for x in range(NJ)]
    with pytest.raises(ConfigError, match=r"^ioserver\.domains\.atm\.lon: "):
        ioserver_from_dict(raw, tmp_path)
