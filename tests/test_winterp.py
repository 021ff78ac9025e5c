"""Weight interpolation (``analysis.weight_interpolation``) against an independent interpolation.

The reference computes the transforms of the coarse nodes with the
pointwise kernel (one eigendecomposition per node, the formulas as
written) and interpolates them with a bilinear interpolation written here
in *grid-index* space (ensio's works on longitudes/latitudes in degrees):
coarse columns ``0, k, 2k, …`` with the last cell wrapping across the
dateline to column 0, coarse rows ``0, k, 2k, …`` and the last row (the
poles are grid rows).
"""

from __future__ import annotations

import numpy as np
import pytest

from ensio.analysis.api import analyse
from ensio.analysis.localization import Geometry, Localization
from ensio.analysis.obsspace import ObsSpace
from ensio.analysis.pointwise import pointwise_kernel
from ensio.analysis.variants import VARIANTS
from ensio.analysis.winterp import WeightGrid, interpolated_local
from ensio.config.analysis import (
    AnalysisSection,
    InflationSection,
    LocalizationSection,
    WeightInterpolationSection,
)
from ensio.config.errors import ConfigError
from ensio.config.load import from_plain
from ensio.obs import ObsBatch, RegularGrid
from ensio.stopwatch import Stopwatch

LON = np.arange(-180.0, 180.0, 15.0)  # 24 columns, the dateline between the last and the first
LAT = np.arange(-90.0, 90.1, 15.0)  # 13 rows, both poles
RADIUS = 3000.0


def grid_points() -> np.ndarray:
    lon2, lat2 = np.meshgrid(LON, LAT)
    return np.stack([lon2.ravel(), lat2.ravel()], axis=1)  # (lat, lon) C order


def obs_case(rng, k: int, m: int = 160, stochastic: bool = False) -> ObsSpace:
    """Observations clustered at the dateline and the poles, with a hole (no observations)."""
    olon = rng.uniform(-180, 180, m)
    olat = np.degrees(np.arcsin(rng.uniform(-1, 1, m)))
    olon[: m // 4] = rng.uniform(165, 195, m // 4)
    olat[m // 4 : m // 2] = rng.uniform(75, 90, m // 4) * rng.choice([-1, 1], m // 4)
    hole = (np.abs(olon - 60) < 50) & (np.abs(olat) < 40)
    olon[hole] -= 140.0
    olon = (olon + 180.0) % 360.0 - 180.0
    pert = rng.standard_normal((k, m)) if stochastic else None
    errors = rng.uniform(0.5, 2.0, m)
    return ObsSpace(
        hx=rng.standard_normal((k, m)) + rng.standard_normal(m),
        values=rng.standard_normal(m),
        errors=errors,
        coords=np.stack([olon, olat], axis=1),
        ids=rng.permutation(m),
        perturbations=None if pert is None else (pert - pert.mean(axis=0)) * errors,
    )


def coarse_index(n: int, k: int, closed: bool) -> list[int]:
    idx = list(range(0, n, k))
    if closed and idx[-1] != n - 1:
        idx.append(n - 1)
    return idx


def reference(X, obs, method, stride, rho):
    """Analysis with pointwise transforms at the coarse nodes, interpolated in index space."""
    nlat, nlon = LAT.size, LON.size
    cols, rows = coarse_index(nlon, stride, False), coarse_index(nlat, stride, True)
    nodes = np.array([(LON[i], LAT[j]) for j in rows for i in cols])
    k = X.shape[0]
    Gc = np.empty((len(nodes), k, k))

    def capture(points, G):
        Gc[points] = G

    variant = VARIANTS[method]
    loc = Localization(geometry=Geometry("lonlat"), radius=RADIUS)
    pointwise_kernel(nodes, obs, loc, variant, np.full(len(nodes), rho), variant.projection(k),
                     capture, Stopwatch(enabled=False))  # fmt: skip
    Gc = Gc.reshape(len(rows), len(cols), k, k)
    out = np.empty_like(X)
    xbar = X.mean(axis=0)
    for j in range(nlat):
        b = max(b for b in range(len(rows) - 1) if rows[b] <= j)
        fy = (j - rows[b]) / (rows[b + 1] - rows[b])
        for i in range(nlon):
            a = i // stride
            right = cols[a + 1] if a + 1 < len(cols) else nlon  # wraps to column 0
            fx = (i - cols[a]) / (right - cols[a])
            a1 = (a + 1) % len(cols)
            G = ((1 - fx) * (1 - fy) * Gc[b, a] + fx * (1 - fy) * Gc[b, a1]
                 + (1 - fx) * fy * Gc[b + 1, a] + fx * fy * Gc[b + 1, a1])  # fmt: skip
            r = j * nlon + i
            out[:, r] = xbar[r] + (X[:, r] - xbar[r]) @ G
    return out


def run(X, obs, method, stride, rho, kernel="batched", coords=None, band_bytes=None,
        tile_points=32):  # fmt: skip
    loc = Localization(geometry=Geometry("lonlat"), radius=RADIUS)
    coords = grid_points() if coords is None else coords
    return interpolated_local(X, coords, obs, loc, VARIANTS[method], rho, kernel, tile_points, 1,
                              Stopwatch(enabled=False), WeightGrid(LON, LAT, stride),
                              band_bytes=band_bytes)  # fmt: skip


@pytest.mark.parametrize("method", ["etkf", "estkf", "enkf"])
@pytest.mark.parametrize("stride", [2, 3, 5])
def test_interpolated_transforms_equal_an_independent_interpolation(method, stride, rng):
    k = 7
    obs = obs_case(rng, k, stochastic=method == "enkf")
    n = LON.size * LAT.size
    X = rng.standard_normal((k, n)) * 2.0 + rng.standard_normal(n)
    rho = 0.9
    got = run(X, obs, method, stride, rho)
    want = reference(X, obs, method, stride, rho)
    assert np.abs(got.ensemble - want).max() / np.abs(want).max() < 1e-10
    assert not np.allclose(got.ensemble, X)  # observations did act


@pytest.mark.parametrize("method", ["etkf", "estkf", "enkf"])
def test_bands_of_two_coarse_rows_give_the_same_analysis(method, rng):
    """The smallest bands (two coarse rows each, the shared row kept) against one band.

    One band holds every node (the default budget at this size); ``band_bytes=1``
    forces the most bands, so every carry-over of the shared row is exercised
    (factored transforms for the square-root filters, dense ones for the EnKF).
    """
    k, stride = 7, 2
    obs = obs_case(rng, k, stochastic=method == "enkf")
    n = LON.size * LAT.size
    X = rng.standard_normal((k, n)) * 2.0 + rng.standard_normal(n)
    one = run(X, obs, method, stride, 0.9)
    many = run(X, obs, method, stride, 0.9, band_bytes=1)
    want = reference(X, obs, method, stride, 0.9)
    assert np.abs(many.ensemble - one.ensemble).max() <= 1e-12 * np.abs(one.ensemble).max()
    assert np.abs(many.ensemble - want).max() < 1e-10 * np.abs(want).max()
    assert np.array_equal(many.n_obs, one.n_obs)


@pytest.mark.parametrize("method", ["etkf", "estkf"])
@pytest.mark.parametrize("band_bytes", [None, 1])
def test_transforms_applied_as_vectors_or_as_matrices_agree(method, band_bytes, rng, monkeypatch):
    """Stride 2, one row per point, 30 members: each node's transform goes to its (at most 9)
    rows as vectors; forced through k × k matrices instead, the same analysis, both equal to
    the reference (one band, and the most bands, whose last cells' terms are carried over)."""
    import ensio.analysis.winterp_bands as wb

    k = 30
    assert wb.vectors_route(9, k) and not wb.vectors_route(9, 7)  # the tests' usual 7 members
    obs = obs_case(rng, k)
    n = LON.size * LAT.size
    X = rng.standard_normal((k, n)) * 2.0 + rng.standard_normal(n)
    want = reference(X, obs, method, 2, 0.9)
    got, routes = {}, []
    for route, share in (("vectors", wb.VECTOR_SHARE), ("matrices", 10**6)):
        monkeypatch.setattr(wb, "VECTOR_SHARE", share)
        for sink in (wb._Vectors, wb._Matrices):
            monkeypatch.setattr(sink, "finish", _spy(sink.finish, sink.__name__, routes))
        got[route] = run(X, obs, method, 2, 0.9, band_bytes=band_bytes).ensemble
        monkeypatch.undo()
    bands = len(routes) // 2
    assert routes == ["_Vectors"] * bands + ["_Matrices"] * bands
    assert bands > 1 if band_bytes == 1 else bands == 1
    scale = np.abs(want).max()
    assert np.abs(got["vectors"] - got["matrices"]).max() <= 1e-12 * scale
    assert np.abs(got["vectors"] - want).max() < 1e-10 * scale


def _spy(method, name, calls):
    def wrapped(self, *args, **kwargs):
        calls.append(name)
        return method(self, *args, **kwargs)

    return wrapped


@pytest.mark.parametrize(
    ("lat_rows", "k", "tile_points", "band_bytes"),
    [
        ([0, 1, 7, 8, 9, 12], 6, 32, 1),
        ([4], 30, 1, None),
        ([4], 30, 32, None),
    ],
)
def test_a_ranks_subset_of_rows(lat_rows, k, tile_points, band_bytes, rng):
    """A rank's rows from some latitudes only (its row set of the group shuffle, say).

    Two groups of latitudes: the coarse rows it needs have a gap, and bands must not
    pair rows across it. One latitude on a coarse row (30 members: the vectors route):
    the next coarse row's nodes are corners of weight 0 and act on no row; with one node
    per tile such a node is a tile of its own.
    """
    stride = 2
    obs = obs_case(rng, k)
    pts = grid_points()
    n = pts.shape[0]
    X = rng.standard_normal((k, n)) + rng.standard_normal(n)
    want = reference(X, obs, "etkf", stride, 1.0)
    rows = np.flatnonzero(np.isin(np.arange(n) // LON.size, lat_rows))
    got = run(X[:, rows], obs, "etkf", stride, 1.0, coords=pts[rows], band_bytes=band_bytes,
              tile_points=tile_points)  # fmt: skip
    assert np.abs(got.ensemble - want[:, rows]).max() < 1e-10 * np.abs(want).max()


def test_levels_share_the_interpolated_transform(rng):
    """A 3-D state: every level of a column gets the column's interpolated transform."""
    k, levels = 6, 3
    obs = obs_case(rng, k)
    pts = grid_points()
    n = pts.shape[0]
    X = rng.standard_normal((k, levels * n))
    got = run(X, obs, "etkf", 3, 1.0, coords=np.tile(pts, (levels, 1)))
    for lev in range(levels):
        part = X[:, lev * n : (lev + 1) * n]
        want = reference(part, obs, "etkf", 3, 1.0)
        assert np.abs(got.ensemble[:, lev * n : (lev + 1) * n] - want).max() < 1e-10 * np.abs(
            want
        ).max()


def test_points_without_observations_keep_the_inflated_prior_exactly(rng):
    k = 5
    far = ObsSpace(hx=rng.standard_normal((k, 3)), values=np.zeros(3), errors=np.ones(3),
                   coords=np.array([[0.0, 0.0], [15.0, 0.0], [0.0, 15.0]]), ids=np.arange(3))
    n = LON.size * LAT.size
    X = rng.standard_normal((k, n))
    rho = 0.81
    got = run(X, far, "etkf", 2, rho).ensemble
    xbar = X.mean(axis=0)
    prior = xbar + (X - xbar) * (1.0 / np.sqrt(rho))  # I/√ρ, as the exact analysis has it
    pts = grid_points()
    untouched = np.abs(pts[:, 1]) >= 60  # every corner of their cells is > radius away
    assert np.array_equal(got[:, untouched], prior[:, untouched])
    assert not np.allclose(got[:, ~untouched], prior[:, ~untouched])


def config(stride: int | None, kernel: str = "batched") -> AnalysisSection:
    extra = {} if stride is None else {"weight_interpolation": WeightInterpolationSection(stride)}
    return AnalysisSection(
        filter="letkf",
        localization=LocalizationSection(radius_km=RADIUS),
        inflation=InflationSection(forget=0.95),
        kernel=kernel,
        **extra,
    )


def batch(rng, m=120) -> ObsBatch:
    return ObsBatch(
        values=rng.standard_normal(m),
        errors=rng.uniform(0.5, 1.5, m),
        lon=rng.uniform(-180, 180, m),
        lat=np.degrees(np.arcsin(rng.uniform(-1, 1, m))),
    )


def test_stride_one_is_the_exact_analysis_bit_for_bit(rng):
    n = LON.size * LAT.size
    X = rng.standard_normal((8, n))
    obs, grid = batch(rng), RegularGrid(LON, LAT)
    exact = analyse(X, obs, config(None), grid=grid).ensemble
    assert np.array_equal(analyse(X, obs, config(1), grid=grid).ensemble, exact)


@pytest.mark.parametrize("stride", [2, 4])
def test_through_the_pipeline_coarse_rows_are_exact(stride, rng):
    """``analyse`` with a stride: rows on coarse nodes get the exact analysis, others differ."""
    n = LON.size * LAT.size
    X = rng.standard_normal((8, n)) + np.linspace(0, 3, n)
    obs, grid = batch(rng), RegularGrid(LON, LAT)
    exact = analyse(X, obs, config(None, "pointwise"), grid=grid).ensemble
    got = analyse(X, obs, config(stride), grid=grid)
    jj, ii = np.divmod(np.arange(n), LON.size)
    on_node = (ii % stride == 0) & ((jj % stride == 0) | (jj == LAT.size - 1))
    assert np.abs(got.ensemble[:, on_node] - exact[:, on_node]).max() < 1e-10 * np.abs(exact).max()
    assert not np.allclose(got.ensemble[:, ~on_node], exact[:, ~on_node])
    assert got.n_obs.shape == (n,) and np.all(got.n_obs >= 0)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_stride_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match="analysis.weight_interpolation.stride"):
        WeightInterpolationSection(bad)  # type: ignore[arg-type]


def test_stride_needs_lonlat_and_no_adaptive_inflation():
    with pytest.raises(ConfigError, match="analysis.weight_interpolation.stride"):
        AnalysisSection(filter="letkf", localization=LocalizationSection(radius=3.0, periodic=40),
                        weight_interpolation=WeightInterpolationSection(2))  # fmt: skip
    with pytest.raises(ConfigError, match="analysis.weight_interpolation.stride"):
        AnalysisSection(filter="letkf", localization=LocalizationSection(radius_km=RADIUS),
                        inflation=InflationSection(adaptive=True),
                        weight_interpolation=WeightInterpolationSection(2))  # fmt: skip


def test_the_yaml_key_reaches_the_section():
    raw = {"filter": "letkf", "localization": {"radius_km": 500.0},
           "weight_interpolation": {"stride": 3}}  # fmt: skip
    assert from_plain(AnalysisSection, raw, "analysis").weight_interpolation.stride == 3
    raw["weight_interpolation"] = {"stride": 0}
    with pytest.raises(ConfigError, match="analysis.weight_interpolation.stride"):
        from_plain(AnalysisSection, raw, "analysis")


def test_margin_bounds_the_distance_to_every_corner():
    from ensio.analysis.localization import Geometry, distances

    for stride in (2, 3, 7):
        wg = WeightGrid(LON, LAT, stride)
        pts = grid_points()
        nodes, corner, _, _ = wg.cells(pts)
        d = distances(Geometry("lonlat"), pts, nodes)
        far = np.take_along_axis(d, corner, axis=1).max()
        assert far <= wg.margin_km()


def test_threads_do_not_change_the_result(rng):
    k = 6
    obs = obs_case(rng, k)
    n = LON.size * LAT.size
    X = rng.standard_normal((k, n))
    loc = Localization(geometry=Geometry("lonlat"), radius=RADIUS)
    wg = WeightGrid(LON, LAT, 2)
    one, two = (
        interpolated_local(X, grid_points(), obs, loc, VARIANTS["etkf"], 1.0, "batched", 16, t,
                           Stopwatch(enabled=False), wg).ensemble  # fmt: skip
        for t in (1, 2)
    )
    assert np.array_equal(one, two)


def test_longitude_convention_and_latitude_order_do_not_matter(rng):
    """The grid given as 0..345 E with descending latitudes: the same cells, the same analysis."""
    k, stride = 6, 3
    obs = obs_case(rng, k)
    n = LON.size * LAT.size
    X = rng.standard_normal((k, n))
    want = run(X, obs, "etkf", stride, 1.0).ensemble
    loc = Localization(geometry=Geometry("lonlat"), radius=RADIUS)
    shifted = grid_points().copy()
    shifted[:, 0] = np.mod(shifted[:, 0], 360.0)
    wg = WeightGrid(np.mod(LON, 360.0)[::-1], LAT[::-1], stride)
    got = interpolated_local(X, shifted, obs, loc, VARIANTS["etkf"], 1.0, "batched", 32, 1,
                             Stopwatch(enabled=False), wg).ensemble  # fmt: skip
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()


@pytest.mark.parametrize("r", [0, 2, 6])
def test_dense_transforms_written_in_place_equal_factored_dense(r, rng):
    """The band buffer's transforms equal ``FactoredTransform.dense()`` (reduced bases, ESTKF's
    centring and an empty basis included), written at scattered slots, others untouched."""
    from ensio.analysis.basis import FactoredTransform
    from ensio.analysis.winterp_bands import _dense_into

    p, k = 9, 6
    F = FactoredTransform(s0=rng.uniform(0.5, 2.0, p), M=rng.standard_normal((p, k, r)),
                          D=rng.standard_normal((p, r)), wbar=rng.standard_normal((p, k)),
                          centred=np.arange(p) % 2 == 0)  # fmt: skip
    buf = np.full((20, k, k), np.nan)
    slots = rng.permutation(20)[:p]
    _dense_into(buf, slots, F)
    want = F.dense()
    assert np.abs(buf[slots] - want).max() <= 1e-14 * np.abs(want).max()
    assert np.isnan(np.delete(buf, slots, axis=0)).all()
