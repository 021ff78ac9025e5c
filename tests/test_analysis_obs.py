"""Observations: batch, operators, quality control, reading."""

from __future__ import annotations

import numpy as np
import pytest

from ensio.errors import InputError
from ensio.obs import (
    ObsBatch,
    RegularGrid,
    bilinear_operator,
    build_operator,
    quality_control,
    read_obs_netcdf,
)


def batch(m, **kw):
    rng = np.random.default_rng(m)  # the values do not matter, only that they are finite
    args = dict(values=rng.standard_normal(m), errors=np.ones(m), lon=np.zeros(m), lat=np.zeros(m))
    args.update(kw)
    return ObsBatch(**args)


def test_batch_defaults_subset_and_concat():
    b = batch(5)
    assert len(b) == 5 and np.array_equal(b.ids, np.arange(5))
    s = b.subset(np.array([False, True, False, True, True]))
    assert np.array_equal(s.ids, [1, 3, 4])
    c = ObsBatch.concat([b, batch(3, ids=np.arange(5, 8), index=np.array([0, 1, 2]))])
    assert len(c) == 8 and np.array_equal(c.index, [-1] * 5 + [0, 1, 2])
    with pytest.raises(ValueError, match="ids repeat"):
        ObsBatch.concat([b, b])
    with pytest.raises(ValueError, match="errors"):
        ObsBatch(values=np.zeros(3), errors=np.zeros(2), lon=np.zeros(3), lat=np.zeros(3))


def global_grid():
    lon = np.arange(0.0, 360.0, 10.0)  # periodic
    lat = np.linspace(-85.0, 85.0, 18)
    return RegularGrid(lon, lat, offset=7)


def test_bilinear_reproduces_bilinear_fields_and_wraps_in_longitude(rng):
    g = global_grid()
    assert g.periodic
    L, B = np.meshgrid(g.lon, g.lat)
    f = 2.0 + 0.3 * L - 0.7 * B + 0.01 * L * B  # bilinear in (lon, lat) inside [0, 350]
    state = np.concatenate([np.full(7, np.nan), f.ravel()])[None, :]
    lon = rng.uniform(0, 350, 200)
    lat = rng.uniform(-85, 85, 200)
    op, inside = bilinear_operator(g, lon, lat)
    assert inside.all()
    expected = 2.0 + 0.3 * lon - 0.7 * lat + 0.01 * lon * lat
    assert np.allclose(op.apply(state)[0], expected, rtol=1e-12)
    # across the wrap: between lon 350 and 360 = 0
    op, inside = bilinear_operator(g, np.array([355.0, -5.0]), np.array([g.lat[3], g.lat[3]]))
    mid = 0.5 * (f[3, -1] + f[3, 0])
    assert inside.all() and np.allclose(op.apply(state)[0], [mid, mid])


def test_observations_outside_the_grid_are_flagged():
    g = global_grid()
    _, inside = bilinear_operator(
        g, np.array([10.0, 10.0, 10.0, np.nan]), np.array([89.0, -86.0, 0.0, 0.0])
    )
    assert inside.tolist() == [False, False, True, False]
    regional = RegularGrid(np.linspace(-20, 20, 9), np.linspace(30, 60, 7))
    assert not regional.periodic
    op, inside = bilinear_operator(regional, np.array([-25.0, 0.0, 21.0, 340.0]), np.full(4, 45.0))
    assert inside.tolist() == [False, True, False, True]  # 340E is -20E


def test_descending_latitudes():
    lat = np.linspace(80, -80, 9)
    lon = np.arange(0.0, 360.0, 45.0)
    g = RegularGrid(lon, lat)
    L, B = np.meshgrid(lon, lat)
    f = (1.0 + B).ravel()[None, :]
    op, inside = bilinear_operator(g, np.array([12.0, 100.0]), np.array([33.0, -71.0]))
    assert inside.all() and np.allclose(op.apply(f)[0], [34.0, -70.0])


def test_build_operator_mixes_index_and_bilinear():
    g = RegularGrid(np.arange(0.0, 360.0, 90.0), np.array([-45.0, 45.0]))
    n = g.size
    state = np.arange(n, dtype=float)[None, :]
    b = batch(
        4,
        lon=np.array([0, 45.0, 0, 0]),
        lat=np.array([0, -45.0, 0, 0]),
        index=np.array([3, -1, 2, 99]),
    )
    op, inside = build_operator(b, n, g)
    assert inside.tolist() == [True, True, True, False]
    assert np.allclose(op.apply(state)[0, :3], [3.0, 0.5, 2.0])
    with pytest.raises(ValueError, match="grid"):
        build_operator(batch(1), 10, None)


def test_quality_control_counts_each_reason_once():
    values = np.array([1.0, np.nan, 1.0, 1.0, 50.0, 1.0, np.nan])
    errors = np.array([1.0, 1.0, 0.0, -1.0, 1.0, 1.0, 0.0])
    inside = np.array([True, True, True, True, True, False, True])
    hx = np.zeros((4, 7))
    hx[:, 0] = [0.0, 0.2, -0.2, 0.0]
    ok, c = quality_control(values, errors, hx, max_sigma=5.0, inside=inside)
    assert ok.tolist() == [True, False, False, False, False, False, False]
    assert (c.total, c.accepted, c.bad_value, c.bad_error, c.outside, c.gross) == (7, 1, 2, 2, 1, 1)
    assert c.rejected == 6
    # the threshold grows with the prior spread
    hx[:, 4] = [-30.0, 30.0, -30.0, 30.0]
    ok, c = quality_control(values, errors, hx, max_sigma=5.0)
    assert ok[4] and c.gross == 0
    ok, c = quality_control(values, errors)  # no prior: only value/error checks
    assert c.accepted == 3


def test_read_obs_netcdf(tmp_path):
    import netCDF4

    path = tmp_path / "obs.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", 3)
        for name in ("lon", "lat", "value", "error"):
            v = ds.createVariable(name, "f8", ("obs",), fill_value=-999.0)
            v[:] = [1.0, 2.0, 3.0]
        ds["value"][1] = np.ma.masked
        idx = ds.createVariable("index", "i4", ("obs",), fill_value=-1)
        idx[:] = [5, 6, 7]
        idx[2] = np.ma.masked
    b = read_obs_netcdf(path, id_offset=10)
    assert np.array_equal(b.ids, [10, 11, 12])
    assert np.isnan(b.values[1]) and b.values[0] == 1.0
    assert b.index.tolist() == [5, 6, -1]


def test_read_obs_netcdf_errors_name_file_and_variable(tmp_path):
    import netCDF4

    path = tmp_path / "bad.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", 2)
        for name in ("lon", "lat", "value"):
            ds.createVariable(name, "f8", ("obs",))[:] = 0.0
    with pytest.raises(InputError, match=r"bad\.nc.*'error'"):
        read_obs_netcdf(path)
    with pytest.raises(InputError, match="missing.nc"):
        read_obs_netcdf(tmp_path / "missing.nc")
