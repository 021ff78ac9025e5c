"""H on real-looking states (issue 10 item 3): members written by CDO, curvilinear, masked.

Expected values come from scipy's RegularGridInterpolator on the clean arrays
read with netCDF4 (longitude wrap added by padding), never from ensio's own
interpolation; the curvilinear grid is a rotated regular grid, so the exact
answer is the interpolation in rotated coordinates.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
import yaml
from scipy.interpolate import RegularGridInterpolator

from ensio.config import config_from_dict
from ensio.errors import InputError
from ensio.io.scan.members import layout_from_member
from ensio.layout import state_index
from ensio.obs import ObsBatch, StateGrid, build_operator

ENSIO = [sys.executable, "-m", "ensio"]
LEVELS = (100000.0, 85000.0, 50000.0, 25000.0)
needs_cdo = needs.tools_mark("cdo")


def cdo(*args: str, cwd: Path) -> None:
    subprocess.run(["cdo", "-s", "-f", "nc4", *args], cwd=cwd, check=True)


def cdo_member(root: Path, m: int, *, post: tuple[str, ...] = (), mask: bool = False) -> Path:
    """ps(time, lat, lon) + t(time, plev, lat, lon) on r36x18, as CDO writes them."""
    (root / "z.txt").write_text(
        f"zaxistype = pressure\nsize = {len(LEVELS)}\nlevels = {' '.join(map(str, LEVELS))}\n"
    )
    levels = []
    for k in range(len(LEVELS)):
        levels += [f"-setlevel,{k + 1}", f"-random,r36x18,{100 * m + k + 1}"]
    cdo("-setname,t", "-setzaxis,z.txt", "-settaxis,2020-01-01,00:00:00", "-merge", *levels,
        f"t{m}.nc", cwd=root)  # fmt: skip
    inputs = [f"t{m}.nc"]
    if mask:
        cdo("-setname,land", "-gtc,0.35", "-random,r36x18,7", "land.nc", cwd=root)
        inputs.append("land.nc")
    out = f"mem{m:03d}.nc"
    cdo(*post, "-merge", "-setname,ps", "-settaxis,2020-01-01,00:00:00",
        f"-random,r36x18,{m}", *inputs, out, cwd=root)  # fmt: skip
    (root / f"t{m}.nc").unlink()
    return root / out


def read_clean(path: Path, names=("ps", "t")) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as ds:
        out = {n: np.asarray(ds[n][:], dtype=np.float64) for n in (*names, "lon", "lat")}
        if "plev" in ds.variables:
            out["plev"] = np.asarray(ds["plev"][:], dtype=np.float64)
        if "land" in ds.variables:
            out["land"] = np.asarray(ds["land"][:]).reshape(ds["land"].shape[-2:])
    return out


def interpolator(lon, lat, field, levels=None):
    """Linear interpolation on (lat, lon) [or (level, lat, lon)], periodic in lon by padding."""
    order = np.argsort(lat)
    lat, field = lat[order], field[..., order, :]
    lon360 = np.mod(lon, 360.0)
    lo = np.argsort(lon360)
    lon360, field = lon360[lo], field[..., lo]
    lon_p = np.concatenate([lon360, [lon360[0] + 360.0]])
    field = np.concatenate([field, field[..., :1]], axis=-1)
    if levels is None:
        f = RegularGridInterpolator((lat, lon_p), field)
        return lambda la, lo_: f(np.stack([la, np.mod(lo_, 360.0)], axis=1))
    lv = np.argsort(levels)
    f = RegularGridInterpolator((levels[lv], lat, lon_p), field[lv])
    return lambda la, lo_, z: f(np.stack([z, la, np.mod(lo_, 360.0)], axis=1))


def state_vector(clean) -> np.ndarray:
    return np.concatenate([clean["ps"].ravel(), clean["t"].ravel()])[None, :]


def cfg_dict(root: Path, n: int, variables=("ps", "t"), **coords) -> dict:
    return {
        "ensemble": {
            "members": str(root / "mem{member:03d}.nc"),
            "size": n,
            "variables": list(variables),
            **({"coordinates": coords} if coords else {}),
        }
    }


@needs_cdo
@pytest.mark.parametrize(
    "post",
    [(), ("-invertlat",), ("-sellonlatbox,-180,180,-90,90",)],
    ids=["plain", "invertlat", "lon-180"],
)
def test_h_on_cdo_state_with_time_and_levels(tmp_path, rng, post):
    path = cdo_member(tmp_path, 1, post=post)
    cfg = config_from_dict(cfg_dict(tmp_path, 1))
    layout = layout_from_member(cfg.ensemble, path)
    clean = read_clean(path)
    assert clean["ps"].shape == (1, 18, 36) and clean["t"].shape == (1, 4, 18, 36)
    X = state_vector(clean)
    m = 300
    lon = rng.uniform(-180.0, 360.0, m)  # both conventions, across the wrap
    lat = rng.uniform(-84.9, 84.9, m)
    z = rng.uniform(25000.0, 100000.0, m)
    grid = StateGrid(layout)
    obs_ps = ObsBatch(np.zeros(m), np.ones(m), lon, lat)
    op, inside = build_operator(obs_ps, layout.n_rows, grid)
    assert inside.all()
    ref = interpolator(clean["lon"], clean["lat"], clean["ps"][0])(lat, lon)
    np.testing.assert_allclose(op.apply(X)[0], ref, rtol=1e-12, atol=1e-12)
    obs_t = ObsBatch(np.zeros(m), np.ones(m), lon, lat, variable=np.ones(m, int), level=z)
    op, inside = build_operator(obs_t, layout.n_rows, grid)
    assert inside.all() and op.rows.shape[1] == 8
    ref = interpolator(clean["lon"], clean["lat"], clean["t"][0], clean["plev"])(lat, lon, z)
    np.testing.assert_allclose(op.apply(X)[0], ref, rtol=1e-12, atol=1e-12)
    # level_index: the plain horizontal interpolation on that level
    li = rng.integers(0, 4, m)
    obs_k = ObsBatch(np.zeros(m), np.ones(m), lon, lat, variable=np.ones(m, int), level_index=li)
    op, inside = build_operator(obs_k, layout.n_rows, grid)
    ref = [interpolator(clean["lon"], clean["lat"], clean["t"][0, k])(lat[i : i + 1],
           lon[i : i + 1])[0] for i, k in enumerate(li)]  # fmt: skip
    np.testing.assert_allclose(op.apply(X)[0], ref, rtol=1e-12, atol=1e-12)
    # outside: beyond the last latitude, outside the levels, a level index too large
    bad = ObsBatch(
        np.zeros(3), np.ones(3), np.array([10.0, 10.0, 10.0]), np.array([89.0, 0.0, 0.0]),
        variable=np.ones(3, int), level=np.array([50000.0, 101000.0, np.nan]),
        level_index=np.array([-1, -1, 4]),
    )  # fmt: skip
    _, inside = build_operator(bad, layout.n_rows, grid)
    assert inside.tolist() == [False, False, False]


def rotation(pole_lon: float, pole_lat: float) -> np.ndarray:
    """Matrix taking rotated-grid unit vectors to geographic ones (north pole → the pole)."""
    a, b = np.radians(pole_lon), np.radians(90.0 - pole_lat)
    rz = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    return rz @ ry


def to_unit(lon, lat):
    lo, la = np.radians(lon), np.radians(lat)
    return np.stack([np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)], -1)


def to_lonlat(v):
    return np.degrees(np.arctan2(v[..., 1], v[..., 0])), np.degrees(np.arcsin(v[..., 2]))


def write_curvilinear(path: Path, rlon, rlat, R, field, mask=None) -> None:
    """A curvilinear member (what `cdo setgrid,curvilinear` / ROMS / NEMO files look like)."""
    RL, RB = np.meshgrid(rlon, rlat)
    lon2, lat2 = to_lonlat(to_unit(RL, RB) @ R.T)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("y", rlat.size)
        ds.createDimension("x", rlon.size)
        ds.createVariable("time", "f8", ("time",))[:] = [0.0]
        ds.createVariable("lon", "f8", ("y", "x"))[:] = lon2
        ds.createVariable("lat", "f8", ("y", "x"))[:] = lat2
        ds.createVariable("sst", "f8", ("time", "y", "x"))[:] = field[None]
        if mask is not None:
            ds.createVariable("sea", "i1", ("y", "x"))[:] = mask


@pytest.mark.parametrize(
    "rlon, rlat",
    [
        (np.arange(-30.0, 30.01, 1.0), np.arange(-20.0, 20.01, 1.0)),  # regional
        (np.arange(0.0, 360.0, 4.0), np.arange(-60.0, 60.01, 4.0)),  # global, periodic in x
    ],
    ids=["regional", "global"],
)
def test_curvilinear_rotated_grid(tmp_path, rng, rlon, rlat):
    R = rotation(-170.0, 35.0)
    field = np.cos(np.radians(rlat))[:, None] * np.sin(np.radians(2 * rlon))[None, :] + 0.01 * (
        np.arange(rlat.size)[:, None]
    )
    write_curvilinear(tmp_path / "mem001.nc", rlon, rlat, R, field)
    cfg = config_from_dict(cfg_dict(tmp_path, 1, ["sst"]))
    layout = layout_from_member(cfg.ensemble, tmp_path / "mem001.nc")
    assert layout.geometry.grid.curvilinear
    m = 400
    lo_r = rng.uniform(rlon[0], rlon[-1] + (4.0 if rlon[-1] > 300 else 0.0), m)
    la_r = rng.uniform(rlat[0], rlat[-1], m)
    lon, lat = to_lonlat(to_unit(lo_r, la_r) @ R.T)
    op, inside = build_operator(ObsBatch(np.zeros(m), np.ones(m), lon, lat), layout.n_rows,
                                StateGrid(layout))  # fmt: skip
    assert inside.all()
    padded = np.concatenate([field, field[:, :1]], axis=1)
    ref = RegularGridInterpolator((rlat, np.append(rlon, rlon[-1] + rlon[1] - rlon[0])), padded)
    expected = ref(np.stack([la_r, lo_r], axis=1))
    # Index space of the curvilinear cell is found in the gnomonic plane, where rotated
    # parallels are slightly curved: the fractional position errs by O(h tan(rlat) / 8)
    # (h the cell size in radians), times the field's change across one cell.
    h = np.radians(rlon[1] - rlon[0])
    step = max(np.abs(np.diff(field, axis=0)).max(), np.abs(np.diff(field, axis=1)).max())
    bound = 2 * h * np.tan(np.radians(np.abs(rlat).max())) / 8 * step
    err = np.abs(op.apply(field.ravel()[None, :])[0] - expected)
    assert err.max() <= bound, (err.max(), bound)
    # outside the regional grid: not inside
    if rlon[-1] < 300:
        out_lon, out_lat = to_lonlat(to_unit(np.array([40.0, 0.0]), np.array([0.0, 25.0])) @ R.T)
        _, ins = build_operator(ObsBatch(np.zeros(2), np.ones(2), out_lon, out_lat),
                                layout.n_rows, StateGrid(layout))  # fmt: skip
        assert not ins.any()


def test_masked_curvilinear_rejects_cells_touching_the_mask(tmp_path, rng):
    rlon, rlat = np.arange(-20.0, 20.01, 2.0), np.arange(-10.0, 10.01, 2.0)
    R = rotation(20.0, 60.0)
    field = rng.standard_normal((rlat.size, rlon.size))
    sea = (rng.random(field.shape) > 0.3).astype("i1")
    write_curvilinear(tmp_path / "mem001.nc", rlon, rlat, R, field, mask=sea)
    raw = cfg_dict(tmp_path, 1)
    raw["ensemble"]["variables"] = [{"name": "sst", "mask": "sea"}]
    layout = layout_from_member(config_from_dict(raw).ensemble, tmp_path / "mem001.nc")
    assert layout.n_rows == int(sea.sum())
    m = 500
    lo_r, la_r = rng.uniform(-20, 20, m), rng.uniform(-10, 10, m)
    lon, lat = to_lonlat(to_unit(lo_r, la_r) @ R.T)
    op, inside = build_operator(ObsBatch(np.zeros(m), np.ones(m), lon, lat), layout.n_rows,
                                StateGrid(layout))  # fmt: skip
    # expected: inside iff the 4 corners of the rotated cell are sea
    i0 = np.minimum(np.floor((lo_r + 20) / 2).astype(int), rlon.size - 2)
    j0 = np.minimum(np.floor((la_r + 10) / 2).astype(int), rlat.size - 2)
    all_sea = sea[j0, i0] & sea[j0, i0 + 1] & sea[j0 + 1, i0] & sea[j0 + 1, i0 + 1]
    assert 0 < all_sea.sum() < m
    # The cell is found in the gnomonic plane, where rotated parallels curve: the
    # fractional position errs by up to tan(rlat)/8 of a cell (see the test above), so
    # an observation that close to a cell edge may fall in the neighbour. Compare the rest.
    band = np.tan(np.radians(np.abs(rlat).max())) / 8
    fx, fy = (lo_r + 20) / 2 - i0, (la_r + 10) / 2 - j0
    clear = (np.minimum(fx, 1 - fx) > band) & (np.minimum(fy, 1 - fy) > band)
    assert clear.sum() > m // 2
    np.testing.assert_array_equal(inside[clear], all_sea.astype(bool)[clear])
    state = field.ravel()[sea.ravel() != 0][None, :]  # the rows: sea points in C order
    ref = RegularGridInterpolator((rlat, rlon), field)(np.stack([la_r, lo_r], 1))
    err = np.abs(op.apply(state)[0] - ref)[inside]
    assert err.max() < 0.05 * np.abs(np.diff(field, axis=1)).max()


@needs_cdo
def test_masked_rectilinear_and_state_index(tmp_path, rng):
    path = cdo_member(tmp_path, 1, mask=True)
    raw = cfg_dict(tmp_path, 1)
    raw["ensemble"]["variables"] = [{"name": "ps", "mask": "land"}, "t"]
    layout = layout_from_member(config_from_dict(raw).ensemble, path)
    clean = read_clean(path)
    land = clean["land"] != 0
    rows_ps = clean["ps"][0][land]
    X = np.concatenate([rows_ps, clean["t"].ravel()])[None, :]
    m = 400
    lon, lat = rng.uniform(0, 360, m), rng.uniform(-84.9, 84.9, m)
    op, inside = build_operator(ObsBatch(np.zeros(m), np.ones(m), lon, lat), layout.n_rows,
                                StateGrid(layout))  # fmt: skip
    glon, glat = clean["lon"], clean["lat"]  # ascending, 10° apart, from 0 / -85
    i0 = np.floor(lon / 10).astype(int) % 36
    j0 = np.clip(np.searchsorted(glat, lat, side="right") - 1, 0, 16)
    i1 = (i0 + 1) % 36
    corners = land[j0, i0] & land[j0, i1] & land[j0 + 1, i0] & land[j0 + 1, i1]
    np.testing.assert_array_equal(inside, corners)
    ref = interpolator(glon, glat, clean["ps"][0])(lat, lon)
    np.testing.assert_allclose(op.apply(X)[0][inside], ref[inside], rtol=1e-12)
    # state_index: the nearest grid point by brute force (haversine), its row
    q_lon, q_lat = rng.uniform(-180, 180, 50), rng.uniform(-85, 85, 50)
    got = state_index(layout, q_lon, q_lat, variable="t", level=60000.0)
    L, B = np.meshgrid(glon, glat)
    for k in range(50):
        d = np.sin(np.radians(B - q_lat[k]) / 2) ** 2 + np.cos(np.radians(B)) * np.cos(
            np.radians(q_lat[k])
        ) * np.sin(np.radians(L - q_lon[k]) / 2) ** 2
        j, i = np.unravel_index(np.argmin(d), d.shape)
        lev = int(np.argmin(np.abs(clean["plev"] - 60000.0)))
        assert got[k] == int(land.sum()) + (lev * 18 + j) * 36 + i
    # on the masked variable: -1 where the nearest point is not a row
    rows = state_index(layout, q_lon, q_lat)
    assert np.all((rows >= 0) | (rows == -1)) and (rows[rows >= 0] < land.sum()).all()
    with pytest.raises(InputError, match="'t' is 3-D"):
        state_index(layout, 0.0, 0.0, variable="t")


@needs_cdo
def test_errors_are_one_line_naming_key_and_file(tmp_path):
    for m in (1, 2):
        cdo_member(tmp_path, m)
    obs = tmp_path / "obs.nc"
    with netCDF4.Dataset(obs, "w") as ds:
        ds.createDimension("obs", 2)
        for k, v in {"lon": [10.0, 20.0], "lat": [0.0, 5.0], "value": [0.5, 0.5],
                     "error": [0.1, 0.1]}.items():  # fmt: skip
            ds.createVariable(k, "f8", ("obs",))[:] = v
    raw = cfg_dict(tmp_path, 2)
    raw["observations"] = [{"file": str(obs), "variable": "t", "level": 70000.0}]
    raw["analysis"] = {"filter": "etkf"}
    cfg_path = tmp_path / "ensio.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))

    def ensio(*args):
        before = {p: p.read_bytes() for p in tmp_path.glob("mem*.nc")}
        r = subprocess.run([*ENSIO, *args], capture_output=True, text=True, timeout=120)
        after = {p: p.read_bytes() for p in tmp_path.glob("mem*.nc")}
        if r.returncode == 2:
            assert before == after
        return r

    r = ensio("analyse", str(cfg_path), "--set", "ensemble.coordinates.lon=longitude")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "ensemble.coordinates.lon" in r.stderr and "mem001.nc" in r.stderr
    assert "'longitude'" in r.stderr and "Traceback" not in r.stderr
    r = ensio("analyse", str(cfg_path), "--set", "ensemble.coordinates.level=depth")
    assert r.returncode == 2 and "ensemble.coordinates.level" in r.stderr and "'depth'" in r.stderr
    r = ensio("analyse", str(cfg_path), "--set", "observations=[{file: obs.nc, variable: q}]")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "obs.nc" in r.stderr and "'q'" in r.stderr and "observations[].variable" in r.stderr
    r = ensio("analyse", str(cfg_path), "--set", "observations=[{file: obs.nc, variable: t}]")
    assert r.returncode == 2 and "'t' is 3-D" in r.stderr and "obs.nc" in r.stderr
    r = ensio("index", str(cfg_path), "--lon", "10", "--lat", "45", "--variable", "t",
              "--level", "50000")  # fmt: skip
    assert r.returncode == 0, r.stderr
    row = int(r.stdout.split()[0])
    assert row == 18 * 36 + (2 * 18 + 13) * 36 + 1  # ps first; plev[2] = 50000, lat 45, lon 10
    assert "level 50000" in r.stdout
