"""``ensio analyse`` on members built by CDO and NCO the way models write restarts (issue 10).

Each test builds an ensemble with the real tools (tests/realfiles.py), runs
``ensio analyse`` as a user would (a subprocess), and checks:

* the analysis against an independent LETKF (tests/reference_letkf.py) on the
  clean arrays (physical values, inactive points excluded), with H assembled
  here from the reference's bilinear weights;
* every non-state variable, and every inactive or masked-out point of the
  state, byte-identical (netCDF4 raw reads before/after), and the attributes
  unchanged (``ncks -m -M`` text);
* ``ncdump -h``, ``cdo sinfon``, netCDF4 and xarray read every file after.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
import realfiles as rf
import reference_letkf as ref

ENSIO = [sys.executable, "-m", "ensio"]
TOL64 = 1e-10


# ------------------------------------------------------------------ helpers


def analyse(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ENSIO, "analyse", str(config), *args], capture_output=True,
                          text=True, timeout=120, env=os.environ.copy())  # fmt: skip


@dataclass
class Rows:
    """The clean state vector: per variable its offset, elements (flat indices) and grid."""

    X: np.ndarray  # (k, n)
    lonlat: np.ndarray  # (n, 2)
    active: np.ndarray  # (n,)
    where: dict  # var -> (offset, elements (sorted flat indices), horizontal size)


def state_rows(s: rf.Scenario, clean: dict[str, np.ndarray] | None = None) -> Rows:
    clean = clean or s.clean
    lon2, lat2 = (s.lon, s.lat) if s.lon.ndim == 2 else np.meshgrid(s.lon, s.lat)
    xs, ll, act, where, offset = [], [], [], {}, 0
    for v in s.state:
        A = clean[v]
        shape = A.shape[1:]
        nh = lon2.size
        keep = np.ones(shape, bool)
        if v in s.masks:
            keep = np.broadcast_to(s.masks[v], shape)
        elems = np.flatnonzero(keep)
        xs.append(A.reshape(A.shape[0], -1)[:, elems])
        ll.append(np.stack([lon2.ravel()[elems % nh], lat2.ravel()[elems % nh]], 1))
        act.append(~np.broadcast_to(s.inactive[v], shape).ravel()[elems])
        where[v] = (offset, elems, nh)
        offset += elems.size
    return Rows(np.concatenate(xs, 1), np.concatenate(ll), np.concatenate(act), where)


def _h_row(s: rf.Scenario, rows: Rows, o: rf.Obs, q: int) -> dict[int, float] | None:
    """Row → weight of observation ``q`` of ``o``; None when it must be dropped."""
    if o.index is not None:
        r = int(o.index[q])
        return {r: 1.0} if rows.active[r] else None
    var = o.entry.get("variable", s.state[0])
    off, elems, nh = rows.where[var]
    hz = o.h[q] if o.h is not None else ref.bilinear(s.lon, s.lat, o.lon[q], o.lat[q])
    if hz is None:
        return None
    levels = [(0, 1.0)]
    if "level" in o.entry:
        levels = ref.level_weights(s.levels, o.entry["level"])
        if levels is None:
            return None
    out: dict[int, float] = {}
    for kl, wl in levels:
        for f, w in zip(*hz, strict=True):
            e = kl * nh + int(f)
            pos = int(np.searchsorted(elems, e))
            if pos >= elems.size or elems[pos] != e or not rows.active[off + pos]:
                return None  # a corner is masked out or missing
            out[off + pos] = out.get(off + pos, 0.0) + wl * float(w)
    return out


def expected_analysis(s: rf.Scenario, rows: Rows, radius_km: float = rf.RADIUS_KM):
    """Reference analysis (k, n) and the number of observations kept."""
    Hs, ys, sig, ll = [], [], [], []
    for o in s.obs:
        for q in range(o.value.size):
            h = _h_row(s, rows, o, q)
            if h is None:
                continue
            line = np.zeros(rows.X.shape[1])
            for r, w in h.items():
                line[r] = w
            Hs.append(line)
            ys.append(o.value[q])
            sig.append(o.error[q])
            ll.append((o.lon[q], o.lat[q]))
    H = np.array(Hs).reshape(-1, rows.X.shape[1])
    Xa = ref.letkf(rows.X, rows.lonlat, rows.active, H, np.array(ys), np.array(sig),
                   np.array(ll).reshape(-1, 2), radius_km)  # fmt: skip
    return Xa, len(ys)


def raw(path: Path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return {n: np.array(v[...]) for n, v in ds.variables.items()}


def metadata(path: Path) -> str:
    return rf.run("ncks", "-m", "-M", path)


@dataclass
class Snapshot:
    """What must not change: raw arrays and attributes of every member."""

    raw: list[dict[str, np.ndarray]]
    meta: list[str]

    @classmethod
    def of(cls, s: rf.Scenario) -> Snapshot:
        return cls([raw(p) for p in s.paths], [metadata(p) for p in s.paths])


def frozen_points(s: rf.Scenario, v: str, shape: tuple) -> np.ndarray:
    """Points of ``v`` that must keep their bytes: inactive or masked out."""
    keep = np.broadcast_to(s.inactive[v], shape).copy()
    if v in s.masks:
        keep |= ~np.broadcast_to(s.masks[v], shape)
    return keep


def check_untouched(s: rf.Scenario, before: Snapshot) -> None:
    for p, old, meta in zip(s.paths, before.raw, before.meta, strict=True):
        new = raw(p)
        assert sorted(new) == sorted(old), p
        for name, a in old.items():
            b = new[name]
            assert b.dtype == a.dtype, f"{p}:{name} dtype"
            if name in s.state:
                f = frozen_points(s, name, a.shape)
                assert a[f].tobytes() == b[f].tobytes(), f"{p}:{name} inactive/masked bytes changed"
            else:
                assert a.tobytes() == b.tobytes(), f"{p}:{name} (not a state variable) changed"
        assert metadata(p) == meta, f"{p}: attributes changed"


def check_readers(path: Path) -> None:
    rf.run("ncdump", "-h", path)
    rf.run("cdo", "-s", "sinfon", path)
    with netCDF4.Dataset(path) as ds:
        for v in ds.variables.values():
            v[...]
    xr = needs.module("xarray")
    with xr.open_dataset(path) as ds:
        ds.load()


def analysed(s: rf.Scenario) -> dict[str, np.ndarray]:
    return {v: np.stack([rf.clean_values(p, v) for p in s.paths]) for v in s.state}


def rel(a, b) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def assert_close(s: rf.Scenario, got: np.ndarray, want: np.ndarray, rows: Rows) -> None:
    """float64: ≤ 1e-10 relative; float32: within float32 rounding of the reference."""
    with netCDF4.Dataset(s.paths[0]) as ds:
        kinds = {v: ds[v].dtype for v in s.state}
    for v in s.state:
        off, elems, _ = rows.where[v]
        sl = slice(off, off + elems.size)
        act = rows.active[sl]
        g, w = got[:, sl][:, act], want[:, sl][:, act]
        if kinds[v] == np.float64:
            assert rel(g, w) <= TOL64, f"{v}: {rel(g, w):.3g} relative to the reference"
        else:
            ulp = np.spacing(np.abs(w).astype(np.float32)).astype(np.float64)
            bad = np.abs(g - w) > ulp
            assert not bad.any(), f"{v}: {bad.sum()} values beyond float32 rounding"


def run_and_check(s: rf.Scenario, *, products: bool = True) -> np.ndarray:
    """Run ``ensio analyse`` on the scenario and check everything; returns the reference."""
    rows = state_rows(s)
    want, kept = expected_analysis(s, rows)
    assert rel(want[:, rows.active], rows.X[:, rows.active]) > 1e-4, "weak case: no update"
    before = Snapshot.of(s)
    proc = analyse(s.write_config())
    assert proc.returncode == 0, proc.stderr
    total = sum(o.value.size for o in s.obs)
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"observations: {total} read, {kept} accepted"), first
    got = state_rows(s, analysed(s)).X
    assert_close(s, got, want, rows)
    check_untouched(s, before)
    for p in s.paths:
        check_readers(p)
    if products:
        check_products(s, want, rows)
    return want


def check_products(s: rf.Scenario, want: np.ndarray, rows: Rows) -> None:
    """Mean and spread (ddof 1) of the reference; float32 members: within their rounding."""
    an = s.root / "an"
    with netCDF4.Dataset(s.paths[0]) as ds:
        tol = TOL64 if all(ds[v].dtype == np.float64 for v in s.state) else 1e-6
    for name, field in (("mean", want.mean(0)), ("spread", want.std(0, ddof=1))):
        path = an / f"{name}.nc"
        check_readers(path)
        got = {v: rf.clean_values(path, v)[None] for v in s.state}
        g = state_rows(s, got).X[0]
        a = rows.active
        assert rel(g[a], field[a]) <= tol, f"{name}: {rel(g[a], field[a]):.3g}"


@pytest.fixture(autouse=True, scope="module")
def _member_cache(tmp_path_factory):
    """Member sets built once per module and copied into each test that asks for them
    again (tests/realfiles.py: ``MEMBER_CACHE``)."""
    rf.MEMBER_CACHE = tmp_path_factory.mktemp("cdo-members")
    yield
    rf.MEMBER_CACHE = None


# ------------------------------------------------------ the reference itself


def test_reference_bilinear_reproduces_a_linear_field(rng):
    """Bilinear weights reproduce any field linear in (lon, lat) inside a cell, including
    the periodic cell across 0°/360° and a descending latitude axis."""
    lon = np.arange(0.0, 360.0, 10.0)
    for lat in (np.arange(-85.0, 90.0, 10.0), np.arange(85.0, -90.0, -10.0)):
        a, b, c = rng.standard_normal(3)
        for _ in range(50):
            x, y = rng.uniform(0.0, 350.0), rng.uniform(-84.0, 84.0)
            flat, w = ref.bilinear(lon, lat, x, y)
            L, P = np.meshgrid(lon, lat)
            field = a + b * L + c * P
            assert abs(w @ field.ravel()[flat] - (a + b * x + c * y)) < 1e-9
            assert abs(w.sum() - 1) < 1e-12 and (w >= 0).all()
        flat, w = ref.bilinear(lon, lat, 355.0, 5.0)  # between 350 and 0 (= 360)
        cols = flat % lon.size
        assert set(cols[w > 0]) == {35, 0} and np.allclose(w.reshape(2, 2).sum(0), 0.5)
    assert ref.bilinear(lon, np.arange(-85.0, 90.0, 10.0), 10.0, 87.0) is None


def test_reference_letkf_without_localization_has_the_kalman_mean(rng):
    k, n, m = 10, 30, 12
    X = rng.standard_normal((k, n)) + np.linspace(0, 3, n)
    H = np.zeros((m, n))
    H[np.arange(m), rng.choice(n, m, replace=False)] = 1.0
    y, sigma = rng.standard_normal(m), rng.uniform(0.5, 1.5, m)
    lonlat = np.stack([rng.uniform(0, 40, n), rng.uniform(-20, 20, n)], 1)
    obs_ll = H @ lonlat
    Xa = ref.letkf(X, lonlat, np.ones(n, bool), H, y, sigma, obs_ll, np.inf)
    assert rel(Xa.mean(0), ref.kalman_mean(X, H, y, sigma)) < 1e-12
    # and the analysis covariance is the Kalman one: P_a = (I - K H) P
    P = np.cov(X.T)
    K = P @ H.T @ np.linalg.inv(H @ P @ H.T + np.diag(sigma**2))
    assert rel(np.cov(Xa.T), (np.eye(n) - K @ H) @ P) < 1e-10


# ------------------------------------------------- scenarios ensio handles today


@pytest.mark.parametrize("seed", [1, 2])
def test_plain_cdo_members_float64(seed, tmp_path):
    run_and_check(rf.plain(tmp_path, seed))


def test_plain_cdo_members_float32(tmp_path):
    run_and_check(rf.plain(tmp_path, 3, bits="F32"))


def test_descending_latitude(tmp_path):
    s = rf.plain(tmp_path, 4, post=("-invertlat",))
    assert s.lat[0] > s.lat[-1]
    run_and_check(s)


def test_longitudes_minus_180_to_180(tmp_path):
    s = rf.plain(tmp_path, 5, post=("-sellonlatbox,-180,180,-90,90",))
    assert s.lon.min() < 0 < s.lon.max() < 180
    run_and_check(s)


def test_formats_chunking_and_deflation_differ_per_member(tmp_path):
    s = rf.chunked(tmp_path, 6)
    kinds = set()
    for p in s.paths:
        with netCDF4.Dataset(p) as ds:
            kinds.add(ds.data_model)
    assert len(kinds) >= 4, kinds
    run_and_check(s)


def test_member_with_extra_attributes_and_variable(tmp_path):
    s = rf.extra_metadata(tmp_path, 7)
    run_and_check(s)
    with netCDF4.Dataset(s.paths[2]) as ds:
        assert "sst_prev" in ds.variables


def _index_observations(s: rf.Scenario, seed: int) -> None:
    """Replace the scenario's observations by ``index`` ones on rows of both variables."""
    rng = np.random.default_rng(seed)
    n2, n3 = s.clean["sst"][0].size, s.clean["t"][0].size
    rows = np.sort(np.concatenate([rng.choice(n2, 12, replace=False),
                                   n2 + rng.choice(n3, 12, replace=False)]))  # fmt: skip
    hz = rows % n2  # the column of a row of either variable
    L, P = np.meshgrid(s.lon, s.lat)
    X = np.concatenate([s.clean["sst"].reshape(s.k, -1), s.clean["t"].reshape(s.k, -1)], 1)
    value, err = X.mean(0)[rows] + 1.0, rng.uniform(0.5, 1.0, rows.size)
    o = s.obs[0]
    o.lon, o.lat, o.value, o.error, o.index = L.ravel()[hz], P.ravel()[hz], value, err, rows
    rf.write_observations(o.path, {"lon": o.lon, "lat": o.lat, "value": value, "error": err,
                                   "index": rows})  # fmt: skip


def test_time_record_dimension_with_index_observations(tmp_path):
    """(time=1, lat, lon) and (time=1, plev, lat, lon), float32; H = identity at ``index``
    rows of both variables (the 3-D rows at a level of their column)."""
    s = rf.time_record(tmp_path, 8)
    _index_observations(s, 8)
    run_and_check(s, products=False)


def test_masked_variable_with_index_observations(tmp_path):
    run_and_check(rf.masked(tmp_path, 9, index=True))


# ------------------------------------- scenarios waiting for issue-10 features


def test_time_record_dimension_with_lonlat_observations(tmp_path):
    run_and_check(rf.time_record(tmp_path, 8), products=False)  # the members of seed 8


def test_observations_of_a_3d_variable_at_a_level(tmp_path):
    s = rf.time_record(tmp_path, 8)  # the members of seed 8
    o = s.obs[0]
    o.entry = {"variable": "t", "level": 60000.0}  # between 85000 and 50000 Pa
    s.config["observations"] = [{"file": str(o.path), **o.entry}]
    run_and_check(s, products=False)


def test_products_keep_the_members_structure(tmp_path):
    s = rf.time_record(tmp_path, 8)  # the members of seed 8
    _index_observations(s, 12)  # products only: H on this state is another feature
    proc = analyse(s.write_config())
    assert proc.returncode == 0, proc.stderr
    with netCDF4.Dataset(s.paths[0]) as m, netCDF4.Dataset(s.root / "an" / "mean.nc") as p:
        for name in ("time", "plev", "plev_bnds"):
            assert name in p.variables, name
        assert p["t"].dimensions == m["t"].dimensions and p["t"].dtype == m["t"].dtype
        fill = {
            a: p["t"].getncattr(a) for a in ("_FillValue", "missing_value") if a in p["t"].ncattrs()
        }
        assert len(set(fill.values())) <= 1, f"mean.nc t: inconsistent fill conventions {fill}"
    cdo = subprocess.run(["cdo", "sinfon", str(s.root / "an" / "mean.nc")], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert cdo.returncode == 0 and "Warning" not in cdo.stderr, cdo.stderr


def test_short_packed_members(tmp_path):
    s = rf.packed(tmp_path, 13)
    rows = state_rows(s)
    want, _ = expected_analysis(s, rows)
    before = Snapshot.of(s)
    proc = analyse(s.write_config())
    assert proc.returncode == 0, proc.stderr
    with netCDF4.Dataset(s.paths[0]) as ds:
        assert ds["sst"].dtype == np.int16
        scale = float(ds["sst"].scale_factor)
    got = state_rows(s, analysed(s)).X
    # ncpdq packs each member's own range onto the whole short range, so an
    # analysis value beyond it is clipped (and counted): compare the others to
    # within half a packing step, the clipped ones with their member's bound.
    lo, hi, step = _packed_bounds(s, "sst")
    inside = (want >= lo[:, None] + 2 * step[:, None]) & (want <= hi[:, None] - 2 * step[:, None])
    err = np.abs(got - want)[inside]
    assert inside.any() and np.max(err) <= 0.5 * np.max(step) * (1 + 1e-6) + 1e-10 * 300, scale
    clipped = ~inside & ((want < lo[:, None]) | (want > hi[:, None]))
    bound = np.where(want < lo[:, None], lo[:, None], hi[:, None])
    assert np.all(np.abs(got - bound)[clipped] <= 1.5 * np.broadcast_to(step[:, None], got.shape)
                  [clipped]), "clipped values not at the member's packing bound"
    if clipped.any():
        assert "values clipped" in proc.stdout + proc.stderr
    check_untouched(s, before)


def _packed_bounds(s, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per member: the physical range a short packed variable can hold, and its step."""
    lo, hi, step = [], [], []
    for p in s.paths:
        with netCDF4.Dataset(p) as ds:
            v = ds[name]
            scale = float(getattr(v, "scale_factor", 1.0))
            offset = float(getattr(v, "add_offset", 0.0))
            fill = int(getattr(v, "_FillValue", -32767))
        raw = np.array([-32768 + (fill == -32768), 32767 - (fill == 32767)], dtype=float)
        ends = np.sort(raw * scale + offset)
        lo.append(ends[0])
        hi.append(ends[1])
        step.append(abs(scale))
    return np.array(lo), np.array(hi), np.array(step)


def test_float_with_add_offset_only(tmp_path):
    s = rf.offset_only(tmp_path, 14)
    rows = state_rows(s)
    want, _ = expected_analysis(s, rows)
    assert analyse(s.write_config()).returncode == 0
    got = state_rows(s, analysed(s)).X
    ulp = np.spacing(np.abs(want - 273.15).astype(np.float32)).astype(float)
    assert (np.abs(got - want) <= 2 * ulp).all()


def test_missing_values_are_inactive(tmp_path):
    s = rf.missing(tmp_path, 15)
    run_and_check(s)


def test_curvilinear_rotated_pole_grid(tmp_path):
    run_and_check(rf.curvilinear(tmp_path, 16))


def test_masked_variable_with_lonlat_observations(tmp_path):
    run_and_check(rf.masked(tmp_path, 17))


def _refused(s: rf.Scenario, *names: str) -> None:
    """Exit 2, one line naming ``names``, and no file changed."""
    s.inactive = {v: np.ones_like(a) for v, a in s.inactive.items()}  # every point frozen
    before = Snapshot.of(s)
    proc = analyse(s.write_config())
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for n in names:
        assert n in lines[0], lines[0]
    check_untouched(s, before)


def test_member_with_inverted_latitude_is_refused(tmp_path):
    s = rf.plain(tmp_path, 18, k=5)
    bad = s.paths[3]
    tmp = bad.with_name(".inv.nc")
    rf.run("cdo", "-s", "invertlat", bad, tmp)
    tmp.replace(bad)
    _refused(s, bad.name, "lat")


def test_same_file_twice_through_a_symlink_is_refused(tmp_path):
    s = rf.plain(tmp_path, 18, k=5)  # the members of the test above
    s.paths[4].unlink()
    s.paths[4].symlink_to(s.paths[1].name)
    s.paths = s.paths[:4]  # the snapshot reads each real file once
    _refused(s, "mem002.nc", "mem005.nc")


def test_wrong_coordinate_name_is_one_line(tmp_path):
    s = rf.plain(tmp_path, 18, k=5)  # the members of the tests above
    s.config["ensemble"]["coordinates"]["lon"] = "longitude"
    _refused(s, "ensemble.coordinates.lon", "longitude")
