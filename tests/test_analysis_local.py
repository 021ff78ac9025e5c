"""Local analysis: batched == pointwise == a plain LETKF written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg

from ensio.analysis.local import ObsSpace, local_analysis
from ensio.analysis.localization import Geometry, Localization, distances
from ensio.analysis.transforms import (
    apply_transform,
    enkf_transform,
    estkf_transform,
    etkf_transform,
)

LONLAT = Geometry("lonlat")


def rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def lonlat_case(rng, n=400, m=300, k=8):
    """Points clustered on the dateline and at both poles, plus a region without observations."""
    lon = rng.uniform(-180, 180, n)
    lat = np.degrees(np.arcsin(rng.uniform(-1, 1, n)))
    q = n // 5
    lon[:q] = rng.choice([-1, 1], q) * rng.uniform(175, 180, q)  # both sides of the dateline
    lat[q : 2 * q] = rng.uniform(84, 90, q)
    lat[2 * q : 3 * q] = rng.uniform(-90, -84, q)
    lat[3 * q] = 90.0
    lon[3 * q + 1 : 3 * q + 20] = rng.uniform(60, 70, 19)  # far from any observation
    lat[3 * q + 1 : 3 * q + 20] = rng.uniform(-5, 5, 19)
    pts = np.stack([lon, lat], axis=1)
    olon = rng.uniform(0, 360, m)
    olat = np.degrees(np.arcsin(rng.uniform(-1, 1, m)))
    olon[: m // 4] = rng.uniform(170, 190, m // 4)
    olat[m // 4 : m // 2] = rng.uniform(80, 90, m // 4) * rng.choice([-1, 1], m // 4)
    far = (np.abs(((olon - 65 + 180) % 360) - 180) < 40) & (np.abs(olat) < 35)
    olon[far] += 120.0  # keep a hole around (65E, 0N)
    obs_coords = np.stack([olon, olat], axis=1)
    X = rng.standard_normal((k, n)) * 2.0 + rng.standard_normal(n)
    hx = rng.standard_normal((k, m)) + rng.standard_normal(m)
    obs = ObsSpace(
        hx=hx,
        values=rng.standard_normal(m),
        errors=rng.uniform(0.5, 2.0, m),
        coords=obs_coords,
        ids=rng.permutation(m) + 1000,
    )
    return X, pts, obs


@pytest.mark.parametrize("method", ["etkf", "estkf", "enkf"])
@pytest.mark.parametrize("taper", ["gaspari-cohn", "gaussian", "exponential", "step"])
def test_batched_equals_pointwise_on_the_sphere(method, taper, rng):
    X, pts, obs = lonlat_case(rng)
    if method == "enkf":
        obs = ObsSpace(
            obs.hx, obs.values, obs.errors, obs.coords, obs.ids, rng.standard_normal(obs.hx.shape)
        )
    loc = Localization(LONLAT, taper, float(rng.uniform(1500, 3000)))
    forget = rng.uniform(0.7, 1.0, X.shape[1])
    a = local_analysis(
        X, pts, obs, loc, method=method, forget=forget, kernel="batched", tile_points=16
    )
    b = local_analysis(X, pts, obs, loc, method=method, forget=forget, kernel="pointwise")
    assert rel(a.ensemble, b.ensemble) <= 1e-10
    assert np.array_equal(a.n_obs, b.n_obs)
    assert np.any(a.n_obs == 0) and np.any(a.n_obs > 5)
    assert np.allclose(a.dRd, b.dRd, rtol=1e-10) and np.allclose(a.trace, b.trace, rtol=1e-10)


def test_regulated_batched_equals_pointwise(rng):
    X, pts, obs = lonlat_case(rng)
    loc = Localization(LONLAT, "gaspari-cohn", 2500.0, regulated=True)
    a = local_analysis(X, pts, obs, loc, kernel="batched", tile_points=32)
    b = local_analysis(X, pts, obs, loc, kernel="pointwise")
    plain = local_analysis(X, pts, obs, Localization(LONLAT, "gaspari-cohn", 2500.0))
    assert rel(a.ensemble, b.ensemble) <= 1e-10
    assert rel(a.ensemble, plain.ensemble) > 1e-6  # regulation changes the analysis


def test_points_without_observations_keep_the_inflated_prior(rng):
    X, pts, obs = lonlat_case(rng)
    loc = Localization(LONLAT, "gaspari-cohn", 1000.0)
    rho = 0.81
    res = local_analysis(X, pts, obs, loc, forget=rho)
    empty = res.n_obs == 0
    assert empty.sum() >= 19
    xb = X.mean(axis=0)
    expected = xb + (X - xb) / math.sqrt(rho)
    assert np.allclose(res.ensemble[:, empty], expected[:, empty], rtol=0, atol=1e-13)


@pytest.mark.parametrize("geometry", [LONLAT, Geometry("periodic", 40.0)])
def test_infinite_radius_is_the_global_filter(geometry, rng):
    if geometry.kind == "lonlat":
        X, pts, obs = lonlat_case(rng, n=150, m=60)
    else:
        X = rng.standard_normal((9, 40))
        pts = np.arange(40.0)
        idx = rng.choice(40, 25, replace=False)
        obs = ObsSpace(X[:, idx] * 1.3, rng.standard_normal(25), np.ones(25), pts[idx], idx)
    loc = Localization(geometry, "gaspari-cohn", np.inf)
    for method, glob in (("etkf", etkf_transform), ("estkf", estkf_transform)):
        local = local_analysis(X, pts, obs, loc, method=method, forget=0.9)
        G = glob(obs.Y, obs.d, obs.rinv, forget=0.9)
        assert rel(local.ensemble, apply_transform(X, G)) <= 1e-10
    eps = rng.standard_normal(obs.hx.shape)
    sto = ObsSpace(obs.hx, obs.values, obs.errors, obs.coords, obs.ids, eps)
    local = local_analysis(X, pts, sto, loc, method="enkf", forget=0.9)
    G = enkf_transform(sto.Y, sto.d, sto.rinv, sto.perturbations, forget=0.9)
    assert rel(local.ensemble, apply_transform(X, G)) <= 1e-10


def test_lestkf_equals_letkf(rng):
    X, pts, obs = lonlat_case(rng)
    loc = Localization(LONLAT, "gaspari-cohn", 2000.0)
    for kernel in ("batched", "pointwise"):
        a = local_analysis(X, pts, obs, loc, method="etkf", kernel=kernel, forget=0.95)
        b = local_analysis(X, pts, obs, loc, method="estkf", kernel=kernel, forget=0.95)
        assert rel(a.ensemble, b.ensemble) <= 1e-10


def haversine_km(p, q):
    (lon1, lat1), (lon2, lat2) = np.radians(p), np.radians(q)
    a = (
        math.sin((lat2 - lat1) / 2) ** 2
        + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    )
    return 2 * 6371.0 * math.asin(math.sqrt(min(1.0, a)))


def gc(z, c):
    r = z / c
    if r <= 1:
        return -(r**5) / 4 + r**4 / 2 + 5 * r**3 / 8 - 5 * r**2 / 3 + 1
    if r < 2:
        return r**5 / 12 - r**4 / 2 + 5 * r**3 / 8 + 5 * r**2 / 3 - 5 * r + 4 - 2 / (3 * r)
    return 0.0


def plain_letkf(X, pts, hx, y, sigma, obs_pts, radius, rho):
    """Point by point, Kalman-gain form for the mean and scipy's sqrtm for the anomalies."""
    k, n = X.shape
    out = np.empty_like(X)
    ybar = hx.mean(axis=0)
    Yall = hx - ybar
    for i in range(n):
        w = np.array([gc(haversine_km(pts[i], q), radius / 2) for q in obs_pts])
        use = w > 1e-14
        xb = X[:, i].mean()
        xp = X[:, i] - xb
        if not use.any():
            out[:, i] = xb + xp / math.sqrt(rho)
            continue
        Y = Yall[:, use]
        Rloc = np.diag(sigma[use] ** 2 / w[use])
        Pxy = xp @ Y / ((k - 1) * rho)
        Pyy = Y.T @ Y / ((k - 1) * rho)
        mean = xb + Pxy @ np.linalg.solve(Pyy + Rloc, y[use] - ybar[use])
        Pa = np.linalg.inv((k - 1) * rho * np.eye(k) + Y @ np.linalg.inv(Rloc) @ Y.T)
        W = np.real(scipy.linalg.sqrtm((k - 1) * Pa))
        out[:, i] = mean + xp @ W
    return out


def test_batched_equals_a_plain_point_by_point_letkf(rng):
    X, pts, obs = lonlat_case(rng, n=150, m=120, k=6)
    radius, rho = 2500.0, 0.9
    res = local_analysis(
        X, pts, obs, Localization(LONLAT, "gaspari-cohn", radius), forget=rho, tile_points=8
    )
    expected = plain_letkf(X, pts, obs.hx, obs.values, obs.errors, obs.coords, radius, rho)
    assert rel(res.ensemble, expected) <= 1e-10


def test_rows_split_like_ranks_give_the_same_analysis(rng):
    """Each "rank" gets a block of rows and only the observations within the
    radius of its rows; the union of the results equals the one-process analysis."""
    X, pts, obs = lonlat_case(rng, n=500)
    radius = 2000.0
    loc = Localization(LONLAT, "gaspari-cohn", radius)
    full = local_analysis(X, pts, obs, loc, forget=0.9).ensemble
    D = distances(LONLAT, pts, obs.coords)
    parts = []
    for rows in np.array_split(np.arange(X.shape[1]), 3):
        near = (D[rows] < radius).any(axis=0)
        sub = ObsSpace(
            obs.hx[:, near], obs.values[near], obs.errors[near], obs.coords[near], obs.ids[near]
        )
        parts.append(local_analysis(X[:, rows], pts[rows], sub, loc, forget=0.9).ensemble)
    assert rel(np.hstack(parts), full) <= 1e-12


def test_rows_at_one_location_share_the_transform(rng):
    X, pts, obs = lonlat_case(rng, n=120)
    loc = Localization(LONLAT, "gaspari-cohn", 2500.0)
    # a second variable at the same points, stored after the first
    X2 = np.hstack([X, 3.0 * X + 1.0])
    pts2 = np.vstack([pts, pts])
    for kernel in ("batched", "pointwise"):
        one = local_analysis(X, pts, obs, loc, kernel=kernel).ensemble
        two = local_analysis(X2, pts2, obs, loc, kernel=kernel).ensemble
        assert rel(two[:, :120], one) <= 1e-12
        assert rel(two[:, 120:], 3.0 * one + 1.0) <= 1e-12


def test_periodic_batched_equals_pointwise(rng):
    n, k = 40, 10
    X = rng.standard_normal((k, n))
    idx = np.sort(rng.choice(n, 30, replace=False))
    obs = ObsSpace(X[:, idx] + 0.1, rng.standard_normal(30), np.ones(30), idx.astype(float), idx)
    loc = Localization(Geometry("periodic", 40.0), "gaspari-cohn", 14.6)
    a = local_analysis(X, np.arange(n), obs, loc, tile_points=4)
    b = local_analysis(X, np.arange(n), obs, loc, kernel="pointwise")
    assert rel(a.ensemble, b.ensemble) <= 1e-10


def test_timings_are_reported_per_phase(rng):
    X, pts, obs = lonlat_case(rng, n=100)
    tm: dict[str, float] = {}
    local_analysis(X, pts, obs, Localization(LONLAT, "gaspari-cohn", 2000.0), timings=tm)
    assert {"select", "weights", "gemm", "transform", "update", "gemm_flops"} <= set(tm)
    assert all(v >= 0 for v in tm.values()) and tm["gemm_flops"] > 0


def test_threads_do_not_change_the_result(rng):
    X, pts, obs = lonlat_case(rng, n=600)
    loc = Localization(LONLAT, "gaspari-cohn", 2000.0)
    one = local_analysis(X, pts, obs, loc, tile_points=16)
    tm: dict[str, float] = {}
    two = local_analysis(X, pts, obs, loc, tile_points=16, threads=3, timings=tm)
    assert np.array_equal(one.ensemble, two.ensemble)
    assert np.array_equal(one.n_obs, two.n_obs)
    assert tm["gemm_flops"] > 0 and tm["transform"] > 0


@pytest.mark.parametrize("method", ["etkf", "estkf", "enkf"])
@pytest.mark.parametrize("kernel", ["batched", "pointwise"])
def test_points_no_observation_reaches_keep_their_prior_bit_for_bit(method, kernel, rng):
    """Without inflation a point outside every observation's support is its prior exactly.

    An analysis that changes nothing must leave the member files byte-identical
    (issue 26's round trip); x̄ + (x − x̄) is not x in floating point.
    """
    X, pts, obs = lonlat_case(rng)
    if method == "enkf":
        obs = ObsSpace(
            obs.hx, obs.values, obs.errors, obs.coords, obs.ids, rng.standard_normal(obs.hx.shape)
        )
    X = X * 1e3 + 0.1  # magnitudes at which x̄ + (x − x̄) is seldom x
    loc = Localization(LONLAT, "gaspari-cohn", 1500.0)
    forget = np.ones(X.shape[1])
    forget[::7] = 0.9  # inflated points without observations are changed: not a copy
    a = local_analysis(
        X, pts, obs, loc, method=method, forget=forget, kernel=kernel, tile_points=16
    )
    free = a.n_obs == 0
    plain = free & (forget == 1.0)
    assert plain.any() and (free & (forget < 1.0)).any()
    assert np.array_equal(a.ensemble[:, plain], X[:, plain])
    inflated = free & (forget < 1.0)
    dev = X[:, inflated] - X[:, inflated].mean(axis=0)
    expect = X[:, inflated].mean(axis=0) + dev / np.sqrt(forget[inflated])
    assert rel(a.ensemble[:, inflated], expect) <= 1e-12
    assert not np.array_equal(a.ensemble[:, a.n_obs > 0], X[:, a.n_obs > 0])
