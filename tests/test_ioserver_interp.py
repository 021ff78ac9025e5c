"""Interpolation kernels of the I/O server (ensio.ioserver.interp) against independent references.

* bilinear: scipy's ``RegularGridInterpolator`` (its own linear interpolation on the
  same centres; longitudes made periodic by copying the columns ±360°), ≤ 1e-12;
* conservative: the area-weighted global integral with exact spherical cell areas
  (R² Δλ Δsinφ, computed here) is preserved to 1e-12 relative, a constant stays
  constant, and cells that tile a target exactly give the area-weighted mean;
* missing sources: renormalised mean of the valid ones (or their sum without it);
* vertical: ``numpy.interp`` per column, outside the source range missing.

Grids are random (fresh seed per run, tests/seeds.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.interpolate import RegularGridInterpolator
from seeds import draw_seed

from ensio.ioserver.config import DomainDef
from ensio.ioserver.geometry import DomainGeometry
from ensio.ioserver.interp import HorizontalInterp, VerticalInterp


def _rng(label: str) -> np.random.Generator:
    return np.random.default_rng(draw_seed(label))


def _edges(rng: np.random.Generator, lo: float, hi: float, n: int) -> np.ndarray:
    """n random cells covering [lo, hi] (widths between 0.3 and 1.7 of the mean)."""
    w = rng.uniform(0.3, 1.7, n)
    return lo + (hi - lo) * np.concatenate([[0.0], np.cumsum(w) / w.sum()])


def _grid(did: str, lon_e: np.ndarray, lat_e: np.ndarray) -> DomainGeometry:
    lon_b = np.stack([lon_e[:-1], lon_e[1:]], axis=1)
    lat_b = np.stack([lat_e[:-1], lat_e[1:]], axis=1)
    d = DomainDef(id=did, type="rectilinear", ni_glo=lon_b.shape[0], nj_glo=lat_b.shape[0])
    return DomainGeometry(d, lon_b.mean(axis=1), lat_b.mean(axis=1),
                          lon_bounds=lon_b, lat_bounds=lat_b)


def _areas(g: DomainGeometry) -> np.ndarray:
    """Exact spherical cell areas on the unit sphere (Δλ in radians · Δ sin φ)."""
    dlon = np.deg2rad(g.lon_bounds[:, 1] - g.lon_bounds[:, 0])
    dsin = np.sin(np.deg2rad(g.lat_bounds[:, 1])) - np.sin(np.deg2rad(g.lat_bounds[:, 0]))
    return dsin[:, None] * dlon[None, :]


def test_bilinear_equals_scipy_on_a_regional_grid() -> None:
    rng = _rng("bilinear regional")
    src = _grid("s", _edges(rng, 10.0, 70.0, 23), _edges(rng, -40.0, 35.0, 17))
    tgt = _grid("t", _edges(rng, 5.0, 80.0, 31), _edges(rng, -50.0, 45.0, 29))
    f = rng.normal(size=(3, *src.shape))
    got = HorizontalInterp.plan(src, tgt, "bilinear", True).apply(f)
    inside_lat = (tgt.lat >= src.lat[0]) & (tgt.lat <= src.lat[-1])
    inside_lon = (tgt.lon >= src.lon[0]) & (tgt.lon <= src.lon[-1])
    pts = np.stack(np.meshgrid(tgt.lat, tgt.lon, indexing="ij"), axis=-1)
    for k in range(3):
        ref = RegularGridInterpolator((src.lat, src.lon), f[k], method="linear",
                                      bounds_error=False, fill_value=np.nan)(pts)
        sel = np.ix_(inside_lat, inside_lon)
        assert np.isfinite(got[k][sel]).all()
        np.testing.assert_allclose(got[k][sel], ref[sel], rtol=0, atol=1e-12)
    # beyond the outermost centre but inside its cell: that row's/column's value;
    # outside every source cell: missing
    out_lat = (tgt.lat < src.lat_bounds[0, 0]) | (tgt.lat > src.lat_bounds[-1, 1])
    out_lon = (tgt.lon < src.lon_bounds[0, 0]) | (tgt.lon > src.lon_bounds[-1, 1])
    assert np.isnan(got[:, out_lat, :]).all() and np.isnan(got[:, :, out_lon]).all()
    edge = np.nonzero((tgt.lat > src.lat[-1]) & (tgt.lat <= src.lat_bounds[-1, 1]))[0]
    for j in edge:
        ref = RegularGridInterpolator((src.lon,), f[0, -1], bounds_error=False,
                                      fill_value=np.nan)(tgt.lon[inside_lon, None])
        np.testing.assert_allclose(got[0, j, inside_lon], ref, atol=1e-12, rtol=0)


def test_bilinear_wraps_around_a_global_grid() -> None:
    rng = _rng("bilinear global")
    src = _grid("s", _edges(rng, -180.0, 180.0, 40), _edges(rng, -90.0, 90.0, 21))
    tgt = _grid("t", _edges(rng, 0.0, 360.0, 55), _edges(rng, -90.0, 90.0, 33))
    f = rng.normal(size=src.shape)
    got = HorizontalInterp.plan(src, tgt, "bilinear", False).apply(f)
    # periodic reference: the source columns copied at -360 and +360
    lon3 = np.concatenate([src.lon - 360.0, src.lon, src.lon + 360.0])
    f3 = np.concatenate([f, f, f], axis=1)
    interp = RegularGridInterpolator((src.lat, lon3), f3, method="linear")
    inside = (tgt.lat >= src.lat[0]) & (tgt.lat <= src.lat[-1])
    pts = np.stack(np.meshgrid(tgt.lat[inside], tgt.lon, indexing="ij"), axis=-1)
    np.testing.assert_allclose(got[inside], interp(pts), rtol=0, atol=1e-12)
    assert np.isfinite(got).all()  # polar rows take the outermost rows' values


def test_conservative_preserves_the_global_integral_and_constants() -> None:
    rng = _rng("conservative")
    src = _grid("s", _edges(rng, -30.0, 330.0, 47), _edges(rng, -90.0, 90.0, 29))
    tgt = _grid("t", _edges(rng, 0.0, 360.0, 19), _edges(rng, -90.0, 90.0, 13))
    f = rng.normal(size=(2, *src.shape)) + 5.0
    plan = HorizontalInterp.plan(src, tgt, "conservative", True)
    got = plan.apply(f)
    a_s, a_t = _areas(src), _areas(tgt)
    for k in range(2):
        want = (a_s * f[k]).sum()
        assert abs((a_t * got[k]).sum() - want) <= 1e-12 * abs(want)
    const = HorizontalInterp.plan(src, tgt, "conservative", False).apply(np.full(src.shape, 3.25))
    np.testing.assert_allclose(const, 3.25, rtol=1e-13, atol=0)


def test_conservative_on_nested_cells_is_the_area_weighted_mean() -> None:
    rng = _rng("conservative nested")
    lon_e, lat_e = _edges(rng, 0.0, 360.0, 12), _edges(rng, -90.0, 90.0, 8)
    src = _grid("s", lon_e, lat_e)
    tgt = _grid("t", lon_e[::3], lat_e[::2])       # each target = 2 x 3 source cells
    f = rng.normal(size=src.shape)
    got = HorizontalInterp.plan(src, tgt, "conservative", True).apply(f)
    a = _areas(src)
    want = ((a * f).reshape(4, 2, 4, 3).sum(axis=(1, 3))
            / a.reshape(4, 2, 4, 3).sum(axis=(1, 3)))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("renormalize", [True, False])
def test_missing_sources_are_left_out(renormalize: bool) -> None:
    rng = _rng("conservative missing")
    lon_e, lat_e = np.linspace(0.0, 360.0, 9), np.linspace(-90.0, 90.0, 5)
    src = _grid("s", lon_e, lat_e)
    tgt = _grid("t", lon_e[::2], lat_e[::2])       # 2 x 2 blocks
    f = rng.normal(size=src.shape)
    f[0, 0] = np.nan                               # one of target (0, 0)'s four cells
    f[2:4, 2:4] = np.nan                           # all four of target (1, 1)
    got = HorizontalInterp.plan(src, tgt, "conservative", renormalize).apply(f)
    a = _areas(src)
    block = (slice(0, 2), slice(0, 2))
    valid = np.isfinite(f[block])
    num = (a[block] * np.where(valid, f[block], 0.0)).sum()
    want = num / (a[block] * valid).sum() if renormalize else num / a[block].sum()
    assert got[0, 0] == pytest.approx(want, rel=1e-12)
    assert np.isnan(got[1, 1])
    assert np.isfinite(np.delete(got.ravel(), 1 * got.shape[1] + 1)).all()


def test_vertical_is_numpy_interp_per_column_and_missing_outside() -> None:
    rng = _rng("vertical")
    src = np.sort(rng.uniform(50.0, 1000.0, 9))[::-1]      # pressure-like, decreasing
    tgt = np.array([1100.0, src[0], *np.sort(rng.uniform(src[-1], src[0], 5)), src[-1], 10.0])
    f = rng.normal(size=(9, 4, 5))
    got = VerticalInterp.plan(src, tgt).apply(f)
    outside = (tgt < src.min()) | (tgt > src.max())
    assert np.isnan(got[outside]).all()
    for j in range(4):
        for i in range(5):
            ref = np.interp(tgt[~outside], src[::-1], f[::-1, j, i])
            np.testing.assert_allclose(got[~outside, j, i], ref, rtol=0, atol=1e-12)
    f[3, 1, 2] = np.nan                            # a missing level: the targets it brackets
    got = VerticalInterp.plan(src, tgt).apply(f)
    lo, hi = src[4], src[2]
    uses = (~outside) & (tgt > lo) & (tgt < hi)
    assert np.isnan(got[uses, 1, 2]).all()
    assert np.isfinite(got[~outside, 0, 0]).all()
