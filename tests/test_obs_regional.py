"""Regional observation distribution, serial parts: the region geometry, the sliced read, config.

The geometry is checked against a brute-force great-circle distance (haversine,
written here independently of the code): every point within the support
radius of a row must lie in one of the rows' boxes, and the boxes must not be
much larger than the true region (a box of the whole globe would pass the
first check and be useless).
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from ensio.config import config_from_dict
from ensio.config.errors import ConfigError
from ensio.obs.read import read_obs_file
from ensio.obs.regions import circular_cover, cover, normalize_lonlat, runs

R_KM = 6371.0


def haversine_min(rows: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """Great-circle distance (km) from each point to the nearest row, by brute force."""
    lon1, lat1 = np.radians(rows[:, 0])[None, :], np.radians(rows[:, 1])[None, :]
    lon2, lat2 = np.radians(pts[:, 0])[:, None], np.radians(pts[:, 1])[:, None]
    a = np.sin((lat2 - lat1) / 2) ** 2
    a = a + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
    return (2 * R_KM * np.arcsin(np.sqrt(np.clip(a, 0, 1)))).min(axis=1)


def sphere_points(rng, n):
    """Uniform on the sphere, longitudes in any of the usual conventions."""
    z = rng.uniform(-1, 1, n)
    lon = rng.uniform(-180, 180, n) + rng.choice([0.0, 360.0], n)
    return np.stack([lon, np.degrees(np.arcsin(z))], axis=1)


def near_cluster(rng, n, lon0, lat0, spread_km):
    """Points within about ``spread_km`` of (lon0, lat0), also across the dateline/pole."""
    pts = sphere_points(rng, 200_000)
    d = haversine_min(np.array([[lon0, lat0]]), pts)
    close = pts[d < spread_km]
    return close[rng.choice(close.shape[0], size=min(n, close.shape[0]), replace=False)]


CLUSTERS = [  # (lon, lat, spread km): ordinary, on the dateline, at each pole, near a pole
    (30.0, 40.0, 800.0),
    (180.0, -10.0, 1200.0),
    (-179.5, 60.0, 500.0),
    (0.0, 90.0, 700.0),
    (123.0, -90.0, 400.0),
    (10.0, 78.0, 300.0),
]


@pytest.mark.parametrize("lon0,lat0,spread", CLUSTERS)
@pytest.mark.parametrize("radius_km", [150.0, 900.0, 2500.0])
def test_boxes_hold_every_point_within_the_radius(rng, lon0, lat0, spread, radius_km):
    rows = near_cluster(rng, 60, lon0, lat0, spread)
    boxes = cover(rows, "lonlat", radius_km, rank=3)
    assert boxes.size >= 1 and np.all(boxes.rank == 3)
    pts = sphere_points(rng, 40_000)
    # plus points just inside the radius of random rows (the edge is where a box could fail)
    k = rows[rng.integers(0, rows.shape[0], 4000)]
    bearing = rng.uniform(0, 2 * np.pi, 4000)
    ang = radius_km / R_KM * rng.uniform(0.97, 0.99999, 4000)
    la, lo = np.radians(k[:, 1]), np.radians(k[:, 0])
    lat2 = np.arcsin(np.sin(la) * np.cos(ang) + np.cos(la) * np.sin(ang) * np.cos(bearing))
    lon2 = lo + np.arctan2(
        np.sin(bearing) * np.sin(ang) * np.cos(la), np.cos(ang) - np.sin(la) * np.sin(lat2)
    )
    pts = np.concatenate([pts, np.degrees(np.stack([lon2, lat2], axis=1))])
    d = haversine_min(rows, pts)
    inside = boxes.contains(pts).any(axis=1)
    within = d <= radius_km
    assert within.sum() > 1000
    assert np.all(inside[within]), pts[within & ~inside][:5]
    # tight: a point in a box is not far beyond the radius of every row (the box's
    # corners are at most the cluster's size plus a bounded overshoot away)
    true_region = np.mean(d[:40_000] <= radius_km)
    box_region = np.mean(inside[:40_000])
    assert box_region <= max(4.0 * true_region, 0.01), (box_region, true_region)


def test_the_dateline_arc_is_short_and_a_polar_cap_covers_every_longitude():
    start, width = circular_cover(np.array([179.0, -179.0, 178.5, 181.5]), 360.0)
    assert width == pytest.approx(3.0) and start == pytest.approx(178.5)
    rows = np.array([[179.0, 10.0], [-179.0, 10.0]])
    b = cover(rows, "lonlat", 100.0, rank=0)
    probe = np.array([[180.0, 10.0], [0.0, 10.0], [-178.5, 10.5], [175.0, 10.0]])
    assert b.contains(probe).any(axis=1).tolist() == [True, False, True, False]
    cap = cover(np.array([[0.0, 85.0], [90.0, 86.0]]), "lonlat", 1000.0, rank=0)
    on_other_side = np.array([[200.0, 84.0], [-100.0, 88.0], [45.0, 70.0]])
    assert cap.contains(on_other_side).any(axis=1).tolist() == [True, True, False]


def test_a_block_over_two_levels_gives_two_boxes_not_the_globe():
    lon = np.arange(0.0, 360.0, 10.0)
    lat = np.linspace(-85.0, 85.0, 18)
    L, B = np.meshgrid(lon, lat)
    level = np.stack([L.ravel(), B.ravel()], axis=1)
    rows = np.concatenate([level[-72:], level[:72]])  # top of level 1, bottom of level 2
    assert len(runs(rows)) == 2
    b = cover(rows, "lonlat", 500.0, rank=1)
    assert b.size == 2
    equator = np.array([[50.0, 0.0]])
    assert not b.contains(equator).any()


def test_periodic_and_euclidean_boxes_against_brute_force(rng):
    period = 40.0
    rows = np.arange(37, 44, dtype=float)[:, None] % period  # wraps around 0
    b = cover(rows, "periodic", 3.5, rank=0, period=period)
    x = rng.uniform(-80, 80, 5000)[:, None]
    d = np.abs((x - rows.T + period / 2) % period - period / 2).min(axis=1)
    inside = b.contains(x).any(axis=1)
    assert np.all(inside[d <= 3.5]) and not np.any(inside[d > 3.6])
    pts = rng.uniform(-10, 10, (3000, 2))
    rows2 = rng.uniform(-2, 3, (50, 2))
    e = cover(rows2, "euclidean", 1.5, rank=0)
    d2 = np.sqrt(((pts[:, None, :] - rows2[None]) ** 2).sum(-1)).min(axis=1)
    assert np.all(e.contains(pts).any(axis=1)[d2 <= 1.5])


def test_beyond_pole_latitudes_are_the_points_the_embedding_sees():
    c = normalize_lonlat(np.array([[10.0, 95.0], [-30.0, -100.0], [np.nan, 0.0], [400.0, 20.0]]))
    assert c[0] == pytest.approx([-170.0, 85.0]) and c[1] == pytest.approx([150.0, -80.0])
    assert np.isnan(c[2, 0]) and c[3].tolist() == [400.0, 20.0]
    b = cover(np.array([[0.0, 0.0]]), "lonlat", 100.0, rank=0)
    assert not b.contains(np.array([[np.nan, 0.0], [0.0, np.nan]])).any()


def test_no_rows_no_boxes_and_an_infinite_radius_covers_everything(rng):
    assert cover(np.empty((0, 2)), "lonlat", 100.0, rank=0).size == 0
    b = cover(np.array([[5.0, 5.0]]), "lonlat", np.inf, rank=0)
    assert b.contains(sphere_points(rng, 1000)).all()


def write_obs(path, n, rng):
    import netCDF4

    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", n)
        for name in ("lon", "lat", "value", "error"):
            ds.createVariable(name, "f8", ("obs",))[:] = rng.standard_normal(n)
        ds.createVariable("index", "i8", ("obs",))[:] = rng.integers(0, 100, n)


def test_slices_read_the_same_records_as_the_whole_file(tmp_path, rng):
    path = tmp_path / "obs.nc"
    write_obs(path, 103, rng)
    whole, _ = read_obs_file(path, id_offset=7)
    cuts = [0, 1, 40, 40, 103]
    spans = zip(cuts[:-1], cuts[1:], strict=True)
    parts = [read_obs_file(path, 7, part=(a, b))[0] for a, b in spans]
    for name in ("values", "errors", "lon", "lat", "index", "ids"):
        got = np.concatenate([getattr(p, name) for p in parts])
        assert np.array_equal(got, getattr(whole, name)), name
    with pytest.raises(ValueError, match="outside"):
        read_obs_file(path, part=(100, 104))


def test_a_selection_read_in_windows_equals_the_fancy_index(tmp_path, rng, monkeypatch):
    import netCDF4

    import ensio.obs.read as read

    path = tmp_path / "obs.nc"
    write_obs(path, 500, rng)
    with netCDF4.Dataset(path, "a") as ds:
        ds.variables["value"][17] = np.ma.masked  # a fill value: NaN, as before
        ds.variables["index"][18] = np.ma.masked  # -1
        expect = {n: np.ma.filled(ds.variables[n][:].astype(float), np.nan)
                  for n in ("value", "index")}
    monkeypatch.setattr(read, "SELECT_WINDOW", 7)
    sel = np.sort(rng.choice(500, 120, replace=False))
    sel = np.union1d(sel, [17, 18])
    got, _ = read_obs_file(path, 3, select=sel)
    assert np.array_equal(got.values, expect["value"][sel], equal_nan=True)
    assert np.array_equal(got.index, np.where(np.isnan(expect["index"]), -1, expect["index"])[sel])
    assert np.array_equal(got.ids, sel + 3)
    shuffled = rng.permutation(sel)
    assert np.array_equal(read_obs_file(path, 0, select=shuffled)[0].values,
                          expect["value"][shuffled], equal_nan=True)


BASE = {"ensemble": {"members": "m{member}.nc", "size": 2, "variables": ["x"]}}


@pytest.mark.parametrize(
    "analysis,key",
    [
        ({"filter": "etkf", "observations": {"distribution": "regional"}},
         "analysis.observations.distribution: regional needs a local filter"),
        ({"filter": "letkf", "localization": {"radius_km": 500},
          "observations": {"distribution": "scattered"}},
         "analysis.observations.distribution: 'scattered' is not one of"),
        ({"filter": "letkf", "localization": {"radius_km": 500},
          "observations": {"regional_above": -1}},
         "analysis.observations.regional_above: must be >= 0"),
        ({"filter": "letkf", "localization": {"radius_km": 500},
          "observations": {"spread": 1}},
         "analysis.observations.spread: unknown config key"),
    ],
)
def test_config_errors_name_the_key(analysis, key):
    with pytest.raises(ConfigError) as err:
        config_from_dict({**BASE, "analysis": analysis})
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


def test_auto_chooses_regional_only_above_the_threshold_for_a_local_filter():
    from ensio.analysis.regional_obs import regional_wanted

    class Two:
        size, rank = 2, 0

    def cfg(**kw):
        return config_from_dict({**BASE, "analysis": kw}).analysis

    local = cfg(filter="letkf", localization={"radius_km": 500},
                observations={"regional_above": 100})
    assert not regional_wanted(local, Two(), 100) and regional_wanted(local, Two(), 101)
    assert not regional_wanted(local, MPI.COMM_SELF, 10**9)  # one rank holds everything anyway
    assert not regional_wanted(cfg(filter="etkf"), Two(), 10**9)
    forced = cfg(filter="letkf", localization={"radius_km": 500},
                 observations={"distribution": "regional"})
    assert regional_wanted(forced, MPI.COMM_SELF, 1)
    never = cfg(filter="letkf", localization={"radius_km": 500},
                observations={"distribution": "replicated", "regional_above": 0})
    assert not regional_wanted(never, Two(), 10**9)
    assert cfg(filter="letkf", localization={"radius_km": 500}).observations.distribution == "auto"
