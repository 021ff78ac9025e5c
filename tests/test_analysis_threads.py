"""Threads, tile sizes and row splits do not change the local analysis (every filter)."""

from __future__ import annotations

import numpy as np
import pytest
from test_analysis_local import lonlat_case, rel

from ensio.analysis.local import ObsSpace, local_analysis
from ensio.analysis.localization import Geometry, Localization

LONLAT = Geometry("lonlat")


def _case(rng, method: str, k: int = 12):
    X, pts, obs = lonlat_case(rng, n=500, m=400, k=k)
    if method == "enkf":
        eps = rng.standard_normal(obs.hx.shape)
        obs = ObsSpace(obs.hx, obs.values, obs.errors, obs.coords, obs.ids, eps)
    loc = Localization(LONLAT, "gaspari-cohn", 2500.0)
    forget = rng.uniform(0.8, 1.0, X.shape[1])
    return X, pts, obs, loc, forget


@pytest.mark.parametrize("method", ["etkf", "estkf", "enkf"])
def test_threads_are_bitwise_identical(method, rng):
    X, pts, obs, loc, forget = _case(rng, method)
    kw = dict(method=method, forget=forget, tile_points=16)
    one = local_analysis(X, pts, obs, loc, threads=1, **kw)
    for threads in (2, 3):
        other = local_analysis(X, pts, obs, loc, threads=threads, **kw)
        assert np.array_equal(one.ensemble, other.ensemble)
        assert np.array_equal(one.dRd, other.dRd) and np.array_equal(one.n_obs, other.n_obs)


@pytest.mark.parametrize("method", ["etkf", "estkf", "enkf"])
def test_tile_size_and_row_split_change_only_rounding(method, rng):
    X, pts, obs, loc, forget = _case(rng, method)
    ref = local_analysis(X, pts, obs, loc, method=method, forget=forget, kernel="pointwise")
    base = local_analysis(X, pts, obs, loc, method=method, forget=forget, tile_points=128)
    assert rel(base.ensemble, ref.ensemble) <= 1e-10
    for tile_points in (1, 16, 300):
        other = local_analysis(
            X, pts, obs, loc, method=method, forget=forget, tile_points=tile_points, threads=2
        )
        assert rel(other.ensemble, base.ensemble) <= 1e-12
    # rows split like two ranks, each with its own tiles
    half = X.shape[1] // 2
    parts = [
        local_analysis(X[:, s], pts[s], obs, loc, method=method, forget=forget[s], threads=2)
        for s in (slice(None, half), slice(half, None))
    ]
    split = np.concatenate([p.ensemble for p in parts], axis=1)
    assert rel(split, base.ensemble) <= 1e-12


@pytest.mark.parametrize("method", ["etkf", "estkf", "enkf"])
def test_full_rank_large_ensemble_equals_pointwise(method, rng):
    """k = 40 full-rank anomalies: the lockstep solver on 40 × 40 (39 × 39) matrices."""
    X, pts, obs, loc, forget = _case(rng, method, k=40)
    a = local_analysis(X, pts, obs, loc, method=method, forget=forget, tile_points=64, threads=2)
    b = local_analysis(X, pts, obs, loc, method=method, forget=forget, kernel="pointwise")
    assert rel(a.ensemble, b.ensemble) <= 1e-10
    assert np.allclose(a.trace, b.trace, rtol=1e-10)


@pytest.mark.parametrize("name", ["letkf", "lenkf"])
def test_threads_key_of_the_config_reaches_the_kernel(name, rng):
    """``analysis.threads: 2`` through the public API: the same analysis, bit for bit."""
    from ensio.analysis.api import assimilate
    from ensio.analysis.filters import make_filter
    from ensio.config.analysis import AnalysisSection, LocalizationSection
    from ensio.obs import ObsBatch

    n, k, m = 300, 10, 80
    lon, lat = rng.uniform(0, 360, n), rng.uniform(-80, 80, n)
    X = rng.standard_normal((k, n)) + np.sin(np.radians(lon))
    idx = np.sort(rng.choice(n, m, replace=False))
    obs = ObsBatch(
        values=rng.standard_normal(m),
        errors=np.full(m, 0.7),
        lon=lon[idx],
        lat=lat[idx],
        index=idx,
    )
    loc = LocalizationSection(radius_km=3000.0)
    coords = np.stack([lon, lat], axis=1)
    out = []
    for threads in (1, 2):
        cfg = AnalysisSection(filter=name, localization=loc, tile_points=8, threads=threads)
        assert make_filter(cfg).threads == threads
        out.append(assimilate(X, obs, cfg, coords=coords))
    assert np.array_equal(out[0], out[1]) and not np.array_equal(out[0], X)
