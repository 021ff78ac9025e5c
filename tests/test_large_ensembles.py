"""Large ensembles (issue 14, item 5): N_e = 100 and 256 run and equal pointwise.

The seed NICAM-LETKF ran 256 members. The batched kernel's packed products
are ``k(k+1)/2`` wide (32 896 columns at k = 256), so these sizes exercise a
different balance of its phases than the 8–40 members of the other tests.
Each point sees more observations than members (full-rank local problems,
no reduced basis) except where the radius leaves it fewer.
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from ensio.analysis.local import ObsSpace, local_analysis
from ensio.analysis.localization import Geometry, Localization


def _case(rng: np.random.Generator, k: int, n: int, m: int, stochastic: bool):
    lon = rng.uniform(0, 360, n)
    lat = np.degrees(np.arcsin(rng.uniform(-1, 1, n)))
    olon = rng.uniform(0, 360, m)
    olat = np.degrees(np.arcsin(rng.uniform(-1, 1, m)))
    X = rng.standard_normal((k, n)) + rng.standard_normal(n)
    obs = ObsSpace(
        hx=rng.standard_normal((k, m)) + rng.standard_normal(m),
        values=rng.standard_normal(m),
        errors=rng.uniform(0.5, 2.0, m),
        coords=np.stack([olon, olat], axis=1),
        ids=rng.permutation(m),
        perturbations=rng.standard_normal((k, m)) if stochastic else None,
    )
    return X, np.stack([lon, lat], axis=1), obs


@pytest.mark.parametrize(
    ("k", "n", "m", "radius_km"),
    [(100, 48, 320, 12000.0), (256, 16, 300, 19000.0)],
)
@pytest.mark.parametrize("method", ["etkf", "estkf", "enkf"])
def test_large_ensemble_batched_equals_pointwise(k, n, m, radius_km, method, rng):
    X, pts, obs = _case(rng, k, n, m, stochastic=method == "enkf")
    loc = Localization(Geometry("lonlat"), "gaspari-cohn", radius_km)
    forget = rng.uniform(0.8, 1.0, n)
    # one BLAS thread, as the pipeline runs the local kernels (threads only contend here)
    with threadpool_limits(limits=1, user_api="blas"):
        a = local_analysis(X, pts, obs, loc, method=method, forget=forget, kernel="batched",
                           tile_points=16)
        b = local_analysis(X, pts, obs, loc, method=method, forget=forget, kernel="pointwise")
    assert a.ensemble.shape == (k, n)
    assert np.all(np.isfinite(a.ensemble))
    assert np.abs(a.ensemble - b.ensemble).max() <= 1e-10 * np.abs(b.ensemble).max()
    assert np.array_equal(a.n_obs, b.n_obs)
    assert a.n_obs.max() > k  # full-rank local problems are among them


@pytest.mark.parametrize("route", ["direct", "chunked"])
@pytest.mark.parametrize("method", ["etkf", "estkf", "enkf"])
def test_over_budget_products_equal_whole_and_pointwise(route, method, rng, monkeypatch):
    """Tiles over the work budget: per-point products or chunks of candidates.

    k = 40 takes the packed path in one GEMM. A zero budget forces every tile
    onto :meth:`Columns.direct` (the large-k path); a budget of about 70
    candidates, with chunks allowed that small, splits every tile's ~400
    candidates into several chunks. Either must give the analysis of the
    whole GEMM and of the pointwise reference.
    """
    from ensio.analysis import batched

    X, pts, obs = _case(rng, 40, 60, 400, stochastic=method == "enkf")
    loc = Localization(Geometry("lonlat"), "gaspari-cohn", 9000.0)
    forget = rng.uniform(0.8, 1.0, 60)
    run = {"method": method, "forget": forget, "tile_points": 16}
    q, s = (39 if method == "estkf" else 40), (40 if method == "enkf" else 1)
    budget = 0 if route == "direct" else 70 * 8 * (q * (q + 1) // 2 + q * s + 3)
    with threadpool_limits(limits=1, user_api="blas"):
        whole_t: dict[str, float] = {}
        whole = local_analysis(X, pts, obs, loc, kernel="batched", timings=whole_t, **run)
        monkeypatch.setattr(batched, "TILE_WORK_BYTES", budget)
        monkeypatch.setattr(batched, "MIN_CHUNK", 16)
        over_t: dict[str, float] = {}
        over = local_analysis(X, pts, obs, loc, kernel="batched", timings=over_t, **run)
        ref = local_analysis(X, pts, obs, loc, kernel="pointwise", **run)
    assert whole_t.get("direct_tiles_count", 0) == whole_t.get("chunked_tiles_count", 0) == 0
    assert over_t[f"{route}_tiles_count"] == over_t["tiles_count"] > 0
    other = "chunked" if route == "direct" else "direct"
    assert over_t.get(f"{other}_tiles_count", 0) == 0
    if route == "chunked":
        assert over_t["tile_work_bytes"] < whole_t["tile_work_bytes"]
    scale = np.abs(ref.ensemble).max()
    assert np.abs(over.ensemble - ref.ensemble).max() <= 1e-10 * scale
    assert np.abs(over.ensemble - whole.ensemble).max() <= 1e-10 * scale
    for name in ("dRd", "trace", "weight_sum"):
        np.testing.assert_allclose(getattr(over, name), getattr(ref, name), rtol=1e-10)


def test_tile_point_cap_bounds_the_matrices():
    """A tile's k × k stacks stay within the work budget; small ensembles are not capped."""
    from ensio.analysis.batched import TILE_WORK_BYTES, tile_point_cap

    assert tile_point_cap(40) >= 128 and tile_point_cap(256) < 128
    for k in (256, 512):
        cap = tile_point_cap(k)
        assert cap >= 16
        assert cap == 16 or 4 * 8 * cap * k * k <= TILE_WORK_BYTES


def test_large_ensemble_independent_of_tile_size(rng):
    """k = 256 (LAPACK eigensolver, per-point products): tile size changes nothing."""
    X, pts, obs = _case(rng, 256, 24, 300, stochastic=False)
    loc = Localization(Geometry("lonlat"), "gaspari-cohn", 19000.0)
    with threadpool_limits(limits=1, user_api="blas"):
        ta: dict[str, float] = {}
        tb: dict[str, float] = {}
        a = local_analysis(X, pts, obs, loc, kernel="batched", tile_points=4, timings=ta)
        b = local_analysis(X, pts, obs, loc, kernel="batched", tile_points=128, timings=tb)
    assert ta["tiles_count"] > tb["tiles_count"]  # really different tilings
    assert ta["direct_tiles_count"] == ta["tiles_count"]
    assert np.array_equal(a.ensemble, b.ensemble)
