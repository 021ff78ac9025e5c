"""Spatial operations of the I/O server against independent formulas and explicit loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ensio.ioserver.config import Box, DomainDef
from ensio.ioserver.geometry import DomainGeometry, cell_weights, regular_geometry
from ensio.ioserver.spatial import extract, global_mean, plan_extract, zonal_bands, zonal_mean


def _rect(ni: int, nj: int, **kw) -> DomainGeometry:
    return regular_geometry(DomainDef("atm", "rectilinear", ni, nj), **kw)


def _loop_weights(g: DomainGeometry) -> np.ndarray:
    """Spherical cell areas R^2 dlon (sin phi2 - sin phi1), one cell at a time."""
    nj, ni = g.shape
    w = np.zeros((nj, ni))
    for j in range(nj):
        for i in range(ni):
            dlon = math.radians(g.lon_bounds[i, 1] - g.lon_bounds[i, 0])
            s2 = math.sin(math.radians(g.lat_bounds[j, 1]))
            s1 = math.sin(math.radians(g.lat_bounds[j, 0]))
            w[j, i] = 6371000.0**2 * dlon * (s2 - s1)
    return w


def _loop_mean(values: np.ndarray, weights: np.ndarray) -> float:
    num = den = 0.0
    for v, w in zip(values.ravel(), weights.ravel(), strict=True):
        if not math.isnan(v) and w > 0:
            num += w * v
            den += w
    return num / den if den > 0 else math.nan


# ------------------------------------------------------------------ means

def test_global_mean_of_a_latitude_function_is_the_analytic_integral() -> None:
    # f = cos^2(phi): int f cos / int cos over [-pi/2, pi/2] = (4/3) / 2 = 2/3
    g = _rect(720, 360)
    lat = np.deg2rad(g.lat)
    field = np.broadcast_to((np.cos(lat) ** 2)[:, None], g.shape)
    assert global_mean(field, g) == pytest.approx(2.0 / 3.0, rel=1e-5)
    # f = sin(phi) + 3: the odd part cancels exactly
    field = np.broadcast_to((np.sin(lat) + 3.0)[:, None], g.shape)
    assert global_mean(field, g) == pytest.approx(3.0, rel=1e-12)


def test_zonal_mean_of_lat_function_plus_zero_mean_wave_is_the_function() -> None:
    g = _rect(72, 36)
    f = 250.0 + 30.0 * np.cos(np.deg2rad(g.lat))
    wave = 5.0 * np.cos(3.0 * np.deg2rad(g.lon))  # sums to zero over equal cells
    field = f[:, None] + wave[None, :]
    np.testing.assert_allclose(zonal_mean(field, g), f, rtol=1e-12)
    three = np.stack([field, 2.0 * field])
    np.testing.assert_allclose(zonal_mean(three, g), np.stack([f, 2.0 * f]), rtol=1e-12)


def test_global_and_zonal_mean_of_random_field_with_missing_match_loops(rng) -> None:
    base = _rect(16, 9)
    mask = rng.random(base.shape) > 0.2
    g = DomainGeometry(base.domain, base.lon, base.lat, base.lon_bounds, base.lat_bounds,
                       mask=mask)
    data = rng.normal(size=(3, *g.shape))
    data[rng.random(data.shape) < 0.15] = np.nan
    data[2] = np.nan  # a level without any valid point
    w = _loop_weights(g) * mask
    gm = global_mean(data, g)
    assert gm.shape == (3,)
    for k in range(2):
        assert gm[k] == pytest.approx(_loop_mean(data[k], w), rel=1e-12)
    assert np.isnan(gm[2])
    zm = zonal_mean(data, g)
    assert zm.shape == (3, 9)
    for k in range(3):
        for j in range(9):
            want = _loop_mean(data[k, j], w[j])
            if math.isnan(want):
                assert np.isnan(zm[k, j])
            else:
                assert zm[k, j] == pytest.approx(want, rel=1e-12)
    assert global_mean(data[0], g).shape == ()


def test_weights_prefer_area_then_bounds_then_cos_lat(rng) -> None:
    g = _rect(8, 4)
    np.testing.assert_allclose(cell_weights(g), _loop_weights(g), rtol=1e-12)
    area = rng.random(g.shape) + 0.5
    ga = DomainGeometry(g.domain, g.lon, g.lat, g.lon_bounds, g.lat_bounds, area=area)
    data = rng.normal(size=g.shape)
    assert global_mean(data, ga) == pytest.approx(_loop_mean(data, area), rel=1e-12)
    nb = _rect(8, 4, bounds=False)
    cos = np.broadcast_to(np.cos(np.deg2rad(nb.lat))[:, None], nb.shape)
    assert global_mean(data, nb) == pytest.approx(_loop_mean(data, cos), rel=1e-12)


def _curvilinear(nj: int, ni: int, *, bounds: bool = False) -> DomainGeometry:
    """A sheared lon/lat grid (2-D coordinates that are not a product)."""
    jj, ii = np.meshgrid(np.arange(nj), np.arange(ni), indexing="ij")
    lat = -80.0 + 160.0 * (jj + 0.5) / nj + 3.0 * np.sin(ii / 3.0)
    lon = (360.0 * (ii + 0.5) / ni + 4.0 * jj) % 360.0
    b = {}
    if bounds:
        off = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], dtype=float)
        b = dict(lon_bounds=lon[..., None] + off[:, 0], lat_bounds=lat[..., None] + off[:, 1])
    return DomainGeometry(DomainDef("ocn", "curvilinear", ni, nj), lon, lat, **b)


def _unstructured(n: int, rng) -> DomainGeometry:
    lat = np.rad2deg(np.arcsin(rng.uniform(-1, 1, n)))
    lon = rng.uniform(0, 360, n)
    return DomainGeometry(DomainDef("ico", "unstructured", n, 1, 6), lon, lat,
                          area=rng.uniform(1.0, 2.0, n))


def test_zonal_mean_on_bands_of_curvilinear_and_unstructured_match_loops(rng) -> None:
    for g, nb in ((_curvilinear(12, 20), 12), (_unstructured(500, rng), 180)):
        data = rng.normal(size=(2, *g.shape))
        data[rng.random(data.shape) < 0.1] = np.nan
        w = cell_weights(g)
        lat, bounds = zonal_bands(g)
        assert lat.shape == (nb,) and bounds.shape == (nb, 2)
        np.testing.assert_allclose(bounds[:, 1] - bounds[:, 0], 180.0 / nb)
        zm = zonal_mean(data, g)
        assert zm.shape == (2, nb)
        flat_lat = g.lat.ravel()
        for k in range(2):
            d = data[k].ravel()
            for b in range(nb):
                lo, hi = bounds[b]
                inside = (flat_lat >= lo) & ((flat_lat < hi) | (b == nb - 1))
                want = _loop_mean(d[inside], w.ravel()[inside])
                if math.isnan(want):
                    assert np.isnan(zm[k, b])
                else:
                    assert zm[k, b] == pytest.approx(want, rel=1e-12)
        assert global_mean(data[0], g) == pytest.approx(_loop_mean(data[0], w), rel=1e-12)


# ------------------------------------------------------------------ extraction

def _lonlat_field(g: DomainGeometry) -> np.ndarray:
    """A field that encodes each point's own (lon mod 360, lat)."""
    return np.mod(g.lon_points(), 360.0) * 1000.0 + g.lat_points()


def test_rectilinear_box_selects_the_points_inside(rng) -> None:
    g = _rect(36, 18)
    data = np.stack([_lonlat_field(g), -_lonlat_field(g)])
    out, sub = extract(data, g, Box(lon=(0.0, 90.0), lat=(-30.0, 30.0)))
    want_i = [i for i in range(36) if 0.0 <= g.lon[i] <= 90.0]
    want_j = [j for j in range(18) if -30.0 <= g.lat[j] <= 30.0]
    np.testing.assert_array_equal(out, data[:, want_j][:, :, want_i])
    np.testing.assert_array_equal(sub.lon, g.lon[want_i])
    np.testing.assert_array_equal(sub.lat, g.lat[want_j])
    np.testing.assert_array_equal(sub.lat_bounds, g.lat_bounds[want_j])
    assert sub.domain.ni_glo == len(want_i) and sub.domain.nj_glo == len(want_j)


@pytest.mark.parametrize("box_lon", [(-30.0, 30.0), (330.0, 30.0), (330.0, 390.0)])
def test_box_across_the_meridian_is_the_same_on_0_360_and_180_grids(box_lon) -> None:
    g360 = _rect(36, 18)
    shifted = np.where(g360.lon > 180.0, g360.lon - 360.0, g360.lon)
    order = np.argsort(shifted)
    g180 = DomainGeometry(g360.domain, shifted[order], g360.lat,
                          g360.lon_bounds[order] - (g360.lon[order] - shifted[order])[:, None],
                          g360.lat_bounds)
    box = Box(lon=box_lon, lat=(-90.0, 90.0))
    a, sa = extract(_lonlat_field(g360), g360, box)
    b, sb = extract(_lonlat_field(g180), g180, box)
    want = [lon for lon in g360.lon if lon >= 330.0 or lon <= 30.0]
    assert a.shape == (18, len(want))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(sa.lon, sb.lon)
    assert np.all(np.diff(sa.lon) > 0)  # a CF coordinate stays monotonic across 0
    np.testing.assert_allclose(sa.lon_bounds[:, 1] - sa.lon, 5.0)
    # longitudes continue east from the box's west edge: [-30, 30] -> -25..25,
    # [330, 30] and [330, 390] -> 335..385
    west = box_lon[0]
    np.testing.assert_allclose(sa.lon, sorted(west + (w - west) % 360.0 for w in want))
    # each value is still its own point's: the field encodes lon mod 360
    np.testing.assert_allclose(np.round(a[0] - g360.lat[0]) / 1000.0, np.mod(sa.lon, 360.0))


def test_curvilinear_box_is_the_bounding_index_box_with_outside_points_missing() -> None:
    g = _curvilinear(20, 30, bounds=True)
    box = Box(lon=(40.0, 120.0), lat=(-20.0, 35.0))
    data = np.stack([_lonlat_field(g), _lonlat_field(g) + 1.0])
    out, sub = extract(data, g, box)
    inside = np.zeros(g.shape, bool)
    for j in range(20):
        for i in range(30):
            inside[j, i] = (40.0 <= g.lon[j, i] <= 120.0) and (-20.0 <= g.lat[j, i] <= 35.0)
    jj, ii = np.nonzero(inside)
    rows, cols = slice(jj.min(), jj.max() + 1), slice(ii.min(), ii.max() + 1)
    want = np.where(inside[rows, cols], data[:, rows, cols], np.nan)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(sub.mask, inside[rows, cols])
    np.testing.assert_array_equal(sub.lat_bounds, g.lat_bounds[rows, cols])


def test_unstructured_box_keeps_the_cells_inside(rng) -> None:
    g = _unstructured(300, rng)
    box = Box(lon=(300.0, 20.0), lat=(-10.0, 60.0))
    data = rng.normal(size=(4, 300))
    out, sub = extract(data, g, box)
    keep = [c for c in range(300) if -10.0 <= g.lat[c] <= 60.0
            and (g.lon[c] >= 300.0 or g.lon[c] <= 20.0)]
    np.testing.assert_array_equal(out, data[:, keep])
    np.testing.assert_array_equal(sub.area, g.area[keep])
    assert sub.domain.ni_glo == len(keep)


def test_empty_box_and_bad_geometry_are_errors_naming_the_domain() -> None:
    g = _rect(4, 2)  # lats -45, 45
    with pytest.raises(ValueError, match="domain atm: no point in the extract box"):
        plan_extract(g, Box(lon=(0.0, 360.0), lat=(-10.0, 10.0)))
    with pytest.raises(ValueError, match="domain atm: lat has shape"):
        DomainGeometry(g.domain, g.lon, np.zeros(3))
