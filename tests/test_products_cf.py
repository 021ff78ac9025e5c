"""Analysis mean and spread files are CF fields like the members (issue 10 item 8).

Members are written by CDO and NCO the way models and post-processing write
restarts (time record dimension with bounds, a level axis with bounds, lon/lat
bounds, float32, a rotated-pole curvilinear grid with 2-D lon/lat, packing,
``missing_value``, ``_FillValue = NaN``). The expected values are computed
here with numpy from the member files read through netCDF4 (masking and
scaling on), independently of ensio. The IOOS compliance checker
(``cf:1.8``) must find nothing in a product that it does not find in the
members.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
import yaml

from ensio.config.schema import Coordinates
from ensio.io.products.products import cf, write_field_file
from ensio.layout.state import StateLayout, VariableLayout

CDO = shutil.which("cdo")
NCAP2 = shutil.which("ncap2")
NCATTED = shutil.which("ncatted")
NCPDQ = shutil.which("ncpdq")
NCDUMP = shutil.which("ncdump")

needs_tools = needs.tools_mark("cdo", "ncap2", "ncatted", "ncpdq", "ncdump")  # cdo nco netcdf-bin
pytestmark = needs_tools

NE = 4
NX, NY = 12, 6
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ): (.*)$")


def _sh(*cmd: str, cwd: Path) -> None:
    res = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-500:]}{res.stderr[-2000:]}"


def _grid_file(path: Path) -> None:
    """A regular lon/lat grid description with cell bounds (CDO writes lon_bnds/lat_bnds)."""
    dx, dy = 360 / NX, 180 / NY
    xs = [dx * (i + 0.5) for i in range(NX)]
    ys = [-90 + dy * (j + 0.5) for j in range(NY)]
    path.write_text(
        "gridtype = lonlat\n"
        f"xsize = {NX}\nysize = {NY}\nxname = lon\nyname = lat\n"
        f"xvals = {' '.join(map(str, xs))}\n"
        f"xbounds = {' '.join(f'{x - dx / 2} {x + dx / 2}' for x in xs)}\n"
        f"yvals = {' '.join(map(str, ys))}\n"
        f"ybounds = {' '.join(f'{y - dy / 2} {y + dy / 2}' for y in ys)}\n"
    )


def _cdo_members(root: Path) -> list[Path]:
    """CDO: T(time, level, lat, lon) + ps(time, lat, lon), float32, all bounds; NCO perturbs."""
    _grid_file(root / "grid.txt")
    taxis = ("-settbounds,6hour", "-settaxis,2026-01-01,06:00:00,6hour")
    _sh(CDO, "-s", "-f", "nc4", "-b", "F32", *taxis, "-genlevelbounds",
        "-remapnn,grid.txt", "-stdatm,0,1000,5000", "base.nc", cwd=root)
    _sh(CDO, "-s", "-f", "nc4", "-b", "F32", "-setzaxis,surface", "-setname,ps",
        "-setattribute,P@standard_name=surface_air_pressure,P@long_name=surface pressure",
        "-sellevidx,1", "-selname,P", "base.nc", "ps.nc", cwd=root)
    _sh(CDO, "-s", "-f", "nc4", "-b", "F32", "merge", "-selname,T", "base.nc", "ps.nc",
        "m0.nc", cwd=root)
    paths = []
    for k in range(1, NE + 1):
        name = f"mem{k:03d}.nc"
        # (T*0+1) first: ncap2 broadcasts lat and lon to T's shape from the left
        # (float: lat and lon are double and would promote the sums)
        script = (f"T=float(T+(T*0.0f+{0.4 * k}f)*cos(lat*0.05f)*sin(lon*0.02f*{k}f)+{0.1 * k}f);"
                  f"ps=float(ps+(ps*0.0f+{0.3 * k}f)*sin(lat*0.03f*{k}f))")
        _sh(NCAP2, "-O", "-s", script, "m0.nc", name, cwd=root)
        paths.append(root / name)
    return paths


def _observations(path: Path, index: np.ndarray, values: np.ndarray) -> None:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", index.size)
        for name, data, dtype in (("index", index, "i8"), ("value", values, "f8"),
                                  ("error", np.full(index.size, 0.5), "f8"),
                                  ("lon", np.zeros(index.size), "f8"),
                                  ("lat", np.zeros(index.size), "f8")):
            ds.createVariable(name, dtype, ("obs",))[:] = data


def _compliance_exe() -> str:
    return str(needs.venv_tool("compliance-checker", path_fallback=True))  # ensio[test]


#: CF 1.8 section 7.3 allows a standard name (``realization``) as the name of a
#: ``cell_methods`` entry; compliance-checker 6 accepts only dimensions and
#: auxiliary coordinates and warns. The products follow CF: that warning is expected.
_REALIZATION = re.compile(r"cell_methods name component realization does not match")


def _compliance(path: Path) -> tuple[set[str], set[str]]:
    """(errors, warnings) of ``compliance-checker --test=cf:1.8`` (its high/medium messages).

    The checker's warning about ``realization`` in ``cell_methods`` is left
    out (see ``_REALIZATION``).
    """
    res = subprocess.run(
        [_compliance_exe(), "--test=cf:1.8", "-f", "json", "-o", "-", str(path)],
        capture_output=True, text=True,
    )
    start = res.stdout.find("{")
    assert start >= 0, f"compliance-checker gave no report for {path}: {res.stderr[-2000:]}"
    report = json.JSONDecoder().raw_decode(res.stdout[start:])[0]["cf:1.8"]
    msgs = {}
    for level in ("high_priorities", "medium_priorities"):
        msgs[level] = {m.replace(path.name, "FILE") for r in report[level] for m in _msgs(r)
                       if not _REALIZATION.search(m)}
    return msgs["high_priorities"], msgs["medium_priorities"]


def _msgs(result: dict) -> list[str]:
    return list(result.get("msgs", [])) + [m for c in result.get("children", []) for m in _msgs(c)]


def _masked_stack(paths: list[Path], name: str) -> np.ma.MaskedArray:
    """(N_e, *shape) physical values of ``name`` read by netCDF4 with masking and scaling."""
    out = []
    for p in paths:
        with netCDF4.Dataset(p) as ds:
            out.append(np.ma.masked_invalid(ds[name][...]))
    return np.ma.stack(out)


def _run_analyse(config: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "ensio", "analyse", str(config)],
                          capture_output=True, text=True, env=env)


# ------------------------------------------------------------------ CDO members, ensio analyse


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """CDO members analysed by ``ensio analyse`` (LETKF), with mean and spread."""
    root = tmp_path_factory.mktemp("cdo")
    paths = _cdo_members(root)
    n_state = 3 * NY * NX + NY * NX
    index = np.arange(5, n_state, 23, dtype=np.int64)
    prior = np.concatenate([_masked_stack(paths, n).reshape(NE, -1) for n in ("T", "ps")], 1)
    _observations(root / "obs.nc", index, prior.mean(0)[index].filled() + 1.0)
    config = {
        "ensemble": {"members": "mem{member:03d}.nc", "size": NE, "variables": ["T", "ps"],
                     "coordinates": {"lon": "lon", "lat": "lat"}},
        "observations": ["obs.nc"],
        "analysis": {"filter": "letkf", "localization": {"radius_km": 4000}},
        "output": {"mean": "an/mean.nc", "spread": "an/spread.nc"},
    }
    (root / "ensio.yaml").write_text(yaml.safe_dump(config))
    members_report = {p.name: _compliance(p) for p in paths[:1]}
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    res = _run_analyse(root / "ensio.yaml")
    after = datetime.datetime.now(datetime.UTC)
    assert res.returncode == 0, res.stderr
    return root, paths, members_report, (before, after)


def test_members_pass_the_checker_then_the_products_do(analysed):
    root, paths, members_report, _ = analysed
    errors, warnings = members_report[paths[0].name]
    assert errors == set(), f"the CDO members themselves fail cf:1.8: {errors}"
    for product in ("mean.nc", "spread.nc"):
        p_errors, p_warnings = _compliance(root / "an" / product)
        assert p_errors == set(), (product, p_errors)
        assert p_warnings <= warnings, (product, p_warnings - warnings)


def test_products_carry_the_members_coordinates_and_dtype(analysed):
    root, paths, _, _ = analysed
    with netCDF4.Dataset(paths[0]) as m:
        m.set_auto_maskandscale(False)
        carried = ["time", "time_bnds", "lon", "lon_bnds", "lat", "lat_bnds", "level",
                   "level_bnds"]
        for product in ("mean.nc", "spread.nc"):
            with netCDF4.Dataset(root / "an" / product) as p:
                p.set_auto_maskandscale(False)
                assert p.dimensions["time"].isunlimited()
                assert len(p.dimensions["time"]) == 1
                for name in carried:
                    assert p[name].dimensions == m[name].dimensions, (product, name)
                    assert p[name].dtype == m[name].dtype, (product, name)
                    np.testing.assert_array_equal(p[name][...], m[name][...])
                    assert {a: m[name].getncattr(a) for a in m[name].ncattrs()} == {
                        a: p[name].getncattr(a) for a in p[name].ncattrs()
                    }, (product, name)
                for name in ("T", "ps"):
                    assert p[name].dtype == np.float32, (product, name)
                    assert p[name].dimensions == m[name].dimensions
                assert p.getncattr("Conventions") == m.getncattr("Conventions")


def test_product_values_and_descriptions(analysed):
    root, paths, _, _ = analysed
    for name, std_name in (("T", "air_temperature"), ("ps", "surface_air_pressure")):
        stack = _masked_stack(paths, name).astype(np.float64)
        with netCDF4.Dataset(paths[0]) as m:
            long_name = m[name].long_name
        with netCDF4.Dataset(root / "an" / "mean.nc") as p:
            v = p[name]
            np.testing.assert_allclose(v[...], stack.mean(0), rtol=2e-6)
            assert v.standard_name == std_name
            assert v.long_name == long_name
            assert v.cell_methods == "realization: mean"
        with netCDF4.Dataset(root / "an" / "spread.nc") as p:
            v = p[name]
            np.testing.assert_allclose(v[...], stack.std(0, ddof=1), rtol=1e-4, atol=1e-5)
            assert "standard_name" not in v.ncattrs()
            assert v.long_name == f"ensemble spread (standard deviation, ddof=1) of {long_name}"
            assert v.units == p[name].units
            assert v.cell_methods == "realization: standard_deviation"


def test_history_line_has_a_utc_timestamp_first(analysed):
    from ensio import __version__

    root, paths, _, (before, after) = analysed
    with netCDF4.Dataset(paths[0]) as m:
        member_history = m.history
    for product, what in (("mean.nc", "mean"), ("spread.nc", "spread")):
        with netCDF4.Dataset(root / "an" / product) as p:
            lines = p.history.split("\n")
        match = STAMP.match(lines[0])
        assert match, lines[0]
        stamp = datetime.datetime.strptime(match[1], "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.UTC
        )
        assert before <= stamp <= after
        assert match[2] == f"ensio analyse (ensio {__version__}): analysis ensemble {what}"
        assert "\n".join(lines[1:]) == member_history


def test_cdo_ncdump_and_xarray_read_the_products(analysed):
    root, paths, _, _ = analysed
    for product in ("mean.nc", "spread.nc"):
        path = root / "an" / product
        res = subprocess.run([CDO, "sinfon", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        assert "Time variable not found" not in res.stdout + res.stderr
        assert "2026-01-01 06:00:00" in res.stdout  # the members' time axis
        dump = subprocess.run([NCDUMP, "-h", str(path)], capture_output=True, text=True)
        assert dump.returncode == 0 and "T(time, level, lat, lon)" in dump.stdout
    xr = needs.module("xarray")
    with xr.open_dataset(root / "an" / "mean.nc") as ds:
        assert str(ds["time"].values[0]).startswith("2026-01-01T06:00")
        assert ds["T"].dtype == np.float32
        assert ds["T"].dims == ("time", "level", "lat", "lon")


# ------------------------------------------------ curvilinear grid with a grid mapping (direct)


def _rotated_members(root: Path) -> list[Path]:
    """CDO rotated-pole grid → curvilinear (2-D lon/lat with bounds, ``coordinates``)."""
    (root / "rot.txt").write_text(
        "gridtype = projection\nxsize = 8\nysize = 6\nxname = rlon\nyname = rlat\n"
        "xunits = \"degrees\"\nyunits = \"degrees\"\nxfirst = -10\nxinc = 2.5\n"
        "yfirst = -5\nyinc = 2\ngrid_mapping = rotated_pole\n"
        "grid_mapping_name = rotated_latitude_longitude\n"
        "grid_north_pole_latitude = 39.25\ngrid_north_pole_longitude = -162\n"
    )
    _sh(CDO, "-s", "-f", "nc4", "-b", "F32", "-settbounds,6hour",
        "-settaxis,2026-01-01,06:00:00,6hour",
        "-setattribute,tas@units=K,tas@standard_name=air_temperature,tas@long_name=temperature",
        "-setname,tas", "-const,280,rot.txt", "r1.nc", cwd=root)
    # CDO 2.1 names rlon/rlat projection_x/y_coordinate, CF wants grid_longitude/latitude;
    # with axis X/Y on rlon/rlat the checker sees lon/lat as duplicate axes: dropped.
    # The auxiliary 2-D lon/lat a model writes beside a rotated grid (values: a stand-in).
    aux = ("lon[$rlat,$rlon]=rlon+0.1*rlat+200.0; lat[$rlat,$rlon]=rlat+50.0+0.05*rlon;"
           'lon@units="degrees_east"; lon@standard_name="longitude";'
           'lat@units="degrees_north"; lat@standard_name="latitude";'
           'tas@coordinates="lat lon";')
    _sh(NCAP2, "-O", "-s", aux, "r1.nc", "r0.nc", cwd=root)
    _sh(NCATTED, "-O", "-a", "standard_name,rlon,o,c,grid_longitude",
        "-a", "standard_name,rlat,o,c,grid_latitude", "-a", "axis,rlon,d,,",
        "-a", "axis,rlat,d,,", "r0.nc", cwd=root)
    paths = []
    for k in range(1, NE + 1):
        name = f"rot{k:03d}.nc"
        script = f"tas=float(tas+(tas*0.0f+{0.5 * k}f)*cos(lat*0.1f*{k}f))"
        _sh(NCAP2, "-O", "-s", script, "r0.nc", name, cwd=root)
        paths.append(root / name)
    return paths


def _layout(path: Path, names: list[str]) -> StateLayout:
    """The layout of ``names`` in ``path`` (all elements active), built here, not by ensio."""
    variables, offset = [], 0
    with netCDF4.Dataset(path) as ds:
        for n in names:
            v = ds[n]
            size = int(np.prod(v.shape))
            variables.append(VariableLayout(n, v.dimensions, v.shape, v.dtype, offset, size))
            offset += size
    return StateLayout(tuple(variables), offset)


def _write(path: Path, template: Path, layout: StateLayout, rows: np.ndarray,
           statistic: cf.Statistic, coords: Coordinates | None = None) -> None:
    write_field_file(path, template, layout, rows, coords or Coordinates(), "test product",
                     statistic=statistic, ddof=1)


def test_curvilinear_grid_mapping_and_auxiliary_coordinates(tmp_path):
    paths = _rotated_members(tmp_path)
    stack = _masked_stack(paths, "tas").astype(np.float64).reshape(NE, -1)
    layout = _layout(paths[0], ["tas"])
    _write(tmp_path / "mean.nc", paths[0], layout, stack.mean(0).filled(), cf.MEAN)
    _write(tmp_path / "spread.nc", paths[0], layout, stack.std(0, ddof=1).filled(), cf.SPREAD)
    errors, warnings = _compliance(paths[0])
    assert errors == set(), f"the members themselves fail cf:1.8: {errors}"
    for product in ("mean.nc", "spread.nc"):
        p_errors, p_warnings = _compliance(tmp_path / product)
        assert p_errors == set() and p_warnings <= warnings, (product, p_errors, p_warnings)
        with netCDF4.Dataset(tmp_path / product) as p, netCDF4.Dataset(paths[0]) as m:
            assert p["tas"].coordinates == m["tas"].coordinates == "lat lon"
            assert p["tas"].grid_mapping == "rotated_pole"
            for name in ("lon", "lat", "rotated_pole", "rlon", "rlat", "time", "time_bnds"):
                np.testing.assert_array_equal(p[name][...], m[name][...])
                assert p[name].dimensions == m[name].dimensions
            assert p["lon"].dimensions == ("rlat", "rlon")


# --------------------------------------------------- fill conventions and packing (direct)


def _missing_members(root: Path, rng: np.random.Generator) -> tuple[list[Path], np.ndarray]:
    """Members with ``missing_value = -9e33`` (no ``_FillValue``) on random points (NCO)."""
    paths = _cdo_members(root)
    holes = rng.choice(NY * NX, size=7, replace=False)
    cond = " || ".join(f"(la == {_lat(j // NX)} && lo == {_lon(j % NX)})" for j in holes)
    out = []
    for k, p in enumerate(paths, 1):
        name = f"miss{k:03d}.nc"
        script = ("*la[$time,$lat,$lon]=lat; *lo[$time,$lat,$lon]=lon; ps_m=ps;"
                  f"where({cond}) ps_m=-9e33f;")
        _sh(NCAP2, "-O", "-s", script, p.name, "t.nc", cwd=root)
        _sh(NCATTED, "-O", "-a", "missing_value,ps_m,o,f,-9e33", "t.nc", name, cwd=root)
        out.append(root / name)
    return out, holes


def _lat(j: int) -> float:
    return -90 + 180 / NY * (j + 0.5)


def _lon(i: int) -> float:
    return 360 / NX * (i + 0.5)


def test_missing_value_points_hold_the_members_missing_value(tmp_path, rng):
    paths, holes = _missing_members(tmp_path, rng)
    with netCDF4.Dataset(paths[0]) as m:
        assert "_FillValue" not in m["ps_m"].ncattrs()
        assert m["ps_m"].dtype == np.float32
    stack = _masked_stack(paths, "ps_m").astype(np.float64).reshape(NE, -1)
    assert stack.mask.any(axis=0).sum() == holes.size
    mean = stack.mean(0).filled(np.nan)
    layout = _layout(paths[0], ["ps_m"])
    _write(tmp_path / "mean.nc", paths[0], layout, mean, cf.MEAN)
    with netCDF4.Dataset(tmp_path / "mean.nc") as p:
        p.set_auto_maskandscale(False)
        v = p["ps_m"]
        assert v.dtype == np.float32
        assert np.float32(v.missing_value) == np.float32(-9e33)
        raw = np.asarray(v[...]).ravel()
        np.testing.assert_array_equal(raw[holes], np.float32(-9e33))
        keep = np.setdiff1d(np.arange(raw.size), holes)
        np.testing.assert_allclose(raw[keep], mean[keep], rtol=2e-7)
    with netCDF4.Dataset(tmp_path / "mean.nc") as p:  # a masking reader masks exactly the holes
        np.testing.assert_array_equal(np.flatnonzero(np.ma.getmaskarray(p["ps_m"][...])),
                                      np.sort(holes))


def test_nan_fill_value_and_rows_missing_in_any_member(tmp_path, rng):
    paths = _cdo_members(tmp_path)
    for p in paths:
        _sh(NCATTED, "-O", "-a", "_FillValue,ps,o,f,NaN", p.name, cwd=tmp_path)
    layout = _layout(paths[0], ["ps"])
    rows = rng.normal(size=NY * NX)
    inactive = rng.choice(NY * NX, size=5, replace=False)
    rows[inactive] = np.nan  # what write_products gives for rows missing in some member
    _write(tmp_path / "mean.nc", paths[0], layout, rows, cf.MEAN)
    with netCDF4.Dataset(tmp_path / "mean.nc") as p:
        p.set_auto_maskandscale(False)
        assert np.isnan(p["ps"].getncattr("_FillValue"))
        raw = np.asarray(p["ps"][...]).ravel()
    assert np.flatnonzero(np.isnan(raw)).tolist() == sorted(inactive.tolist())
    ok = np.isfinite(rows)
    np.testing.assert_allclose(raw[ok], rows[ok].astype(np.float32), rtol=0)


def test_packed_members_give_unpacked_products(tmp_path, rng):
    paths = _cdo_members(tmp_path)
    packed = []
    for k, p in enumerate(paths, 1):
        name = f"pk{k:03d}.nc"
        _sh(NCPDQ, "-O", "-P", "all_new", "-v", "ps,time,time_bnds,lat,lat_bnds,lon,lon_bnds",
            p.name, name, cwd=tmp_path)
        packed.append(tmp_path / name)
    with netCDF4.Dataset(packed[0]) as m:
        assert m["ps"].dtype == np.int16 and "scale_factor" in m["ps"].ncattrs()
        physical = np.result_type(m["ps"].scale_factor, m["ps"].add_offset)
    stack = _masked_stack(packed, "ps").astype(np.float64).reshape(NE, -1)
    layout = _layout(packed[0], ["ps"])
    spread = stack.std(0, ddof=1).filled()
    _write(tmp_path / "spread.nc", packed[0], layout, spread, cf.SPREAD)
    with netCDF4.Dataset(tmp_path / "spread.nc") as p:
        v = p["ps"]
        assert v.dtype == physical and v.dtype.kind == "f"
        for attr in ("scale_factor", "add_offset", "valid_min", "valid_max", "valid_range"):
            assert attr not in v.ncattrs()
        np.testing.assert_allclose(np.asarray(v[...]).ravel(), spread, rtol=1e-6)
        assert v.long_name.startswith("ensemble spread (standard deviation, ddof=1) of ")


# ------------------------------------------------------------------------------- cf helpers


class _Var:
    def __init__(self, dims: tuple[str, ...], **attrs: object) -> None:
        self.dimensions, self.attrs = dims, attrs

    def ncattrs(self) -> list[str]:
        return list(self.attrs)

    def getncattr(self, name: str) -> object:
        return self.attrs[name]


def test_referenced_variables_follow_every_cf_reference():
    variables = {
        "time": _Var(("time",), bounds="time_bnds"),
        "time_bnds": _Var(("time", "nv")),
        "lev": _Var(("lev",), formula_terms="a: hyam b: hybm ps: ps", bounds="lev_bnds"),
        "lev_bnds": _Var(("lev", "nv")),
        "hyam": _Var(("lev",)), "hybm": _Var(("lev",)), "ps": _Var(("time", "y", "x")),
        "y": _Var(("y",)), "x": _Var(("x",)),
        "lat": _Var(("y", "x"), bounds="lat_bnds"), "lat_bnds": _Var(("y", "x", "nv4")),
        "lon": _Var(("y", "x")), "crs": _Var(()), "area": _Var(("y", "x")),
        "height": _Var(()),
        "t": _Var(("time", "lev", "y", "x"), coordinates="lat lon height",
                  grid_mapping="crs: x y", cell_measures="area: area volume: outside"),
        "unrelated": _Var(("y", "x")),
    }
    got = cf.referenced_variables(variables, ["t"])
    assert got == ["time", "time_bnds", "lev", "lev_bnds", "hyam", "hybm", "ps", "y", "x",
                   "lat", "lat_bnds", "lon", "crs", "area", "height"]


def test_missing_mask_rules():
    raw = np.array([1, -32767, 5, 30000, -5, 7], dtype=np.int16)
    got = cf.missing_mask(raw, {"_FillValue": np.int16(-32767), "valid_range": [-10, 10],
                                "missing_value": np.array([7, 5], dtype=np.int16)})
    assert got.tolist() == [False, True, True, True, False, True]
    f = np.array([np.nan, 9.969209968386869e36, 1.0], dtype=np.float32)
    assert cf.missing_mask(f, {}).tolist() == [True, True, False]
    assert cf.missing_mask(f, {"_FillValue": np.float32(1.0)}).tolist() == [True, False, True]


def test_history_line_format_and_prepend():
    when = datetime.datetime(2026, 11, 25, 4, 14, 10, tzinfo=datetime.timezone(
        datetime.timedelta(hours=1)))
    line = cf.history_line("ensio analyse (ensio 0.1.0)", when)
    assert line == "2026-11-25T03:14:10Z: ensio analyse (ensio 0.1.0)"
    assert cf.prepend_history("old one\nolder\n", line) == f"{line}\nold one\nolder"
    assert cf.prepend_history("", line) == line


def test_write_products_masks_inactive_rows_and_names_the_statistic(tmp_path, rng):
    from mpi4py import MPI

    from ensio.io.products.products import write_products

    paths = _cdo_members(tmp_path)
    layout = _layout(paths[0], ["ps"])
    rows = rng.normal(size=(NE, layout.n_rows))
    inactive = np.zeros(layout.n_rows, dtype=bool)
    inactive[rng.choice(layout.n_rows, size=4, replace=False)] = True
    targets = {"mean": tmp_path / "an" / "mean.nc", "spread": tmp_path / "an" / "spread.nc"}
    write_products(MPI.COMM_SELF, layout, rows, paths[0], "ensio test", targets, Coordinates(),
                   inactive=inactive)
    for key, expect in (("mean", rows.mean(0)), ("spread", rows.std(0, ddof=1))):
        with netCDF4.Dataset(targets[key]) as p:
            got = p["ps"][...].ravel()
            assert STAMP.match(p.history.split("\n")[0])[2].endswith(
                f"ensio test (ensio {__import__('ensio').__version__}): analysis ensemble {key}"
            )
        np.testing.assert_array_equal(np.ma.getmaskarray(got), inactive)
        np.testing.assert_allclose(got.compressed(), expect[~inactive].astype(np.float32),
                                   rtol=1e-7)
