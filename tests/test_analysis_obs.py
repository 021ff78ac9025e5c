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


def _layout_2d_3d():
    from ensio.config import Coordinates, VariableSpec
    from ensio.layout import VarMeta, build_layout

    metas = {
        "ps": VarMeta("ps", ("time", "lat", "lon"), (1, 3, 4), np.dtype("f4")),
        "t": VarMeta("t", ("time", "lev", "lat", "lon"), (1, 2, 3, 4), np.dtype("f8")),
        "lon": VarMeta("lon", ("lon",), (4,), np.dtype("f8")),
        "lat": VarMeta("lat", ("lat",), (3,), np.dtype("f8")),
        "lev": VarMeta("lev", ("lev",), (2,), np.dtype("f8")),
    }
    values = {"lon": np.arange(4) * 90.0, "lat": np.array([-45.0, 0.0, 45.0]),
              "lev": np.array([1000.0, 500.0])}  # fmt: skip
    specs = [VariableSpec("ps"), VariableSpec("t")]
    return build_layout(specs, metas, values.__getitem__, Coordinates(), "m.nc")


def _obs_file(path, attr=None, **cols):
    import netCDF4

    base = {"lon": [10.0, 20.0], "lat": [0.0, 5.0], "value": [1.0, 2.0], "error": [1.0, 1.0]}
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", 2)
        for name, v in {**base, **cols}.items():
            kind = "i4" if name == "level_index" else "f8"
            fill = -1 if name == "level_index" else np.nan
            var = ds.createVariable(name, kind, ("obs",), fill_value=fill)
            var[:] = np.ma.masked_invalid(np.asarray(v, float)) if kind == "f8" else v
        if attr is not None:
            ds.setncattr("variable", attr)
    return path


def test_sources_variable_and_levels(tmp_path):
    from ensio.obs import ObsSource, read_source

    layout = _layout_2d_3d()
    coords = layout.coordinates(0, layout.n_rows)
    assert np.isnan(coords["level"][:12]).all()  # 2-D rows: no level; horizontal only
    assert coords["level"][12:].tolist() == [1000.0] * 12 + [500.0] * 12
    plain = _obs_file(tmp_path / "ps.nc")
    b = read_source(ObsSource(plain), layout, id_offset=5)
    assert b.variable.tolist() == [0, 0] and b.level is None and b.ids.tolist() == [5, 6]
    b = read_source(ObsSource(plain, "t", level=700.0), layout)
    assert b.variable.tolist() == [1, 1] and b.level.tolist() == [700.0, 700.0]
    per_obs = _obs_file(tmp_path / "t.nc", attr="t", level=[900.0, np.nan])
    b = read_source(ObsSource(per_obs), layout)
    assert b.variable.tolist() == [1, 1] and b.level[0] == 900.0 and np.isnan(b.level[1])
    with pytest.raises(InputError, match=r"t\.nc.*'ps' differs .* variable = 't'"):
        read_source(ObsSource(per_obs, "ps"), layout)
    with pytest.raises(InputError, match=r"t\.nc.*per-observation 'level'.*observations\[\]"):
        read_source(ObsSource(per_obs, level_index=1), layout)
    with pytest.raises(InputError, match=r"ps\.nc: observed variable 't' is 3-D \(lev=2\)"):
        read_source(ObsSource(plain, "t"), layout)
    with pytest.raises(InputError, match=r"ps\.nc: observed variable 'ps' has no vertical"):
        read_source(ObsSource(plain, level=500.0), layout)
    with pytest.raises(InputError, match=r"'zz' \(observations\[\]\.variable\)"):
        read_source(ObsSource(plain, "zz"), layout)
    # H: the missing (fill) level is rejected, the other interpolated between levels
    from ensio.obs import StateGrid

    b = read_source(ObsSource(per_obs), layout)
    op, inside = build_operator(b, layout.n_rows, StateGrid(layout))
    assert inside.tolist() == [True, False]
    x = np.concatenate([np.zeros(12), np.full(12, 10.0), np.full(12, 20.0)])[None, :]
    assert np.isclose(op.apply(x)[0, 0], 10.0 + 10.0 * (900.0 - 1000.0) / (500.0 - 1000.0))


def test_config_observation_entry_keys():
    from ensio.config import ConfigError
    from ensio.config.analysis import ObservationFile

    assert ObservationFile("o.nc", "t", level=850.0).level == 850.0
    with pytest.raises(ConfigError, match="observations.level: give level or level_index"):
        ObservationFile("o.nc", level=1.0, level_index=1)
    with pytest.raises(ConfigError, match="observations.level_index: must be >= 0"):
        ObservationFile("o.nc", level_index=-2)
