"""Distances, tapers and regulated localization against formulas written here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ensio.analysis.localization import (
    EARTH_RADIUS_KM,
    Geometry,
    Localization,
    distances,
    exponential_taper,
    gaspari_cohn,
    gaussian_taper,
    prepare,
    regulate,
    step_taper,
)
from ensio.analysis.taperfused import lonlat_gc_weights
from ensio.analysis.tiles import CandidateFinder, make_tiles


def gc_eq_4_10(z: float, c: float) -> float:
    """Gaspari & Cohn (1999) eq. (4.10), written term by term."""
    r = abs(z) / c
    if r <= 1.0:
        return -0.25 * r**5 + 0.5 * r**4 + 5.0 / 8.0 * r**3 - 5.0 / 3.0 * r**2 + 1.0
    if r <= 2.0:
        return (
            r**5 / 12.0
            - 0.5 * r**4
            + 5.0 / 8.0 * r**3
            + 5.0 / 3.0 * r**2
            - 5.0 * r
            + 4.0
            - 2.0 / 3.0 / r
        )
    return 0.0


def haversine_km(lon1, lat1, lon2, lat2):
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dphi = p2 - p1
    dlam = math.radians(lon2 - lon1)
    a = math.sin(dphi / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dlam / 2) ** 2
    return 2 * 6371.0 * math.asin(math.sqrt(min(1.0, a)))


def test_gaspari_cohn_matches_eq_4_10(rng):
    radius = rng.uniform(10, 5000)
    d = np.concatenate([rng.uniform(0, 1.2 * radius, 2000), [0.0, radius / 2, radius, 2 * radius]])
    w = gaspari_cohn(d, radius)
    expected = np.array([gc_eq_4_10(x, radius / 2) for x in d])
    assert np.allclose(w, np.maximum(expected, 0.0), rtol=0, atol=1e-12)


def test_gaspari_cohn_endpoints():
    radius = 14.6
    assert gaspari_cohn(np.array([0.0]), radius)[0] == 1.0
    assert gaspari_cohn(np.array([radius / 2]), radius)[0] == pytest.approx(5.0 / 24.0, abs=1e-14)
    far = np.array([radius, radius * (1 + 1e-12), 1.5 * radius, 1e9])
    assert np.all(gaspari_cohn(far, radius) == 0.0)
    assert np.all(gaspari_cohn(np.linspace(0, radius, 10001), radius) >= 0.0)
    # infinite radius: no localization
    assert np.all(gaspari_cohn(np.array([0.0, 1e6]), np.inf) == 1.0)


@pytest.mark.parametrize("taper", [gaussian_taper, exponential_taper, step_taper])
def test_other_tapers_are_one_at_zero_and_zero_from_the_radius(taper):
    radius = 7.0
    assert taper(np.array([0.0]), radius)[0] == 1.0
    assert np.all(taper(np.array([radius, 2 * radius]), radius) == 0.0)
    inside = taper(np.linspace(0, radius * 0.999, 100), radius)
    assert np.all(inside > 0) and np.all(np.diff(inside) <= 0)


def test_gaussian_and_exponential_length_scales():
    radius = 100.0
    # both equal Gaspari-Cohn at half the support radius
    for taper in (gaussian_taper, exponential_taper):
        assert taper(np.array([50.0]), radius)[0] == pytest.approx(5.0 / 24.0, rel=1e-14)
    L = radius / (2 * math.sqrt(2 * math.log(24 / 5)))
    assert gaussian_taper(np.array([30.0]), radius)[0] == pytest.approx(
        math.exp(-(30.0**2) / (2 * L**2))
    )
    Le = radius / (2 * math.log(24 / 5))
    assert exponential_taper(np.array([30.0]), radius)[0] == pytest.approx(math.exp(-30.0 / Le))


def test_great_circle_distances_match_haversine(rng):
    a = np.stack([rng.uniform(-180, 360, 30), rng.uniform(-90, 90, 30)], axis=1)
    b = np.stack([rng.uniform(-180, 360, 20), rng.uniform(-90, 90, 20)], axis=1)
    a[0] = (179.9, 0.0)
    b[0] = (-179.9, 0.0)  # across the dateline: 0.2 degrees
    a[1] = (0.0, 90.0)
    b[1] = (123.0, 89.0)  # near the pole: 1 degree
    D = distances(Geometry("lonlat"), a, b)
    expected = np.array([[haversine_km(*p, *q) for q in b] for p in a])
    assert np.allclose(D, expected, rtol=1e-9, atol=1e-6)
    assert D[0, 0] == pytest.approx(0.2 * math.pi / 180 * EARTH_RADIUS_KM, rel=1e-9)
    assert D[1, 1] == pytest.approx(1.0 * math.pi / 180 * EARTH_RADIUS_KM, rel=1e-9)


def test_periodic_and_euclidean_distances():
    g = Geometry("periodic", 40.0)
    D = distances(g, np.array([0.0, 39.0, 20.0]), np.array([1.0, 0.0, 35.0]))
    assert np.allclose(D, [[1, 0, 5], [2, 1, 4], [19, 20, 15]])
    E = distances(Geometry("euclidean"), np.array([[0.0, 0.0]]), np.array([[3.0, 4.0]]))
    assert E[0, 0] == 5.0


def test_regulated_weight_reproduces_covariance_localization_for_one_observation(rng):
    """For one observation, R⁻¹ weight ρ_reg gives the gain of the Schur-product
    localized covariance with weight ρ (Nerger et al. 2012)."""
    rho = rng.uniform(0, 1, 50)
    sb2 = rng.uniform(0.1, 3.0, 50)  # HPHᵀ
    so2 = rng.uniform(0.1, 3.0, 50)
    w = regulate(rho[:, None], so2[:, None], sb2[:, None])[:, 0]
    gain_covariance_loc = rho * sb2 / (sb2 + so2)
    gain_r_loc = sb2 / (sb2 + so2 / w)
    assert np.allclose(gain_r_loc, gain_covariance_loc, rtol=1e-12)
    assert np.all(w <= rho + 1e-15)


def test_localization_weights_and_validation():
    loc = Localization(Geometry("periodic", 40.0), "step", 3.0)
    assert np.array_equal(loc.weights(np.array([0.0, 2.9, 3.0])), [1.0, 1.0, 0.0])
    with pytest.raises(ValueError):
        Localization(radius=0.0)
    with pytest.raises(ValueError):
        Geometry("periodic")


@pytest.mark.parametrize("kind", ["lonlat", "periodic", "euclidean"])
def test_tiles_partition_points_and_candidates_cover_the_radius(kind, rng):
    if kind == "lonlat":
        g = Geometry("lonlat")
        pts = np.stack([rng.uniform(-180, 180, 700), rng.uniform(-90, 90, 700)], axis=1)
        pts[:50, 0] = rng.uniform(179, 181, 50)  # dateline
        pts[50:100, 1] = rng.uniform(88, 90, 50)  # pole
        obs = np.stack([rng.uniform(0, 360, 900), rng.uniform(-90, 90, 900)], axis=1)
        radius = 900.0
    elif kind == "periodic":
        g = Geometry("periodic", 100.0)
        pts = rng.uniform(0, 100, (300, 1))
        obs = rng.uniform(0, 100, (200, 1))
        radius = 7.0
    else:
        g = Geometry("euclidean")
        pts = rng.uniform(0, 10, (300, 2))
        obs = rng.uniform(0, 10, (200, 2))
        radius = 1.5
    tiles = make_tiles(g, pts, max_points=40, max_extent=radius / 2)
    allpts = np.sort(np.concatenate(tiles))
    assert np.array_equal(allpts, np.arange(pts.shape[0]))
    finder = CandidateFinder(g, obs, radius)
    D = distances(g, pts, obs)
    for t in tiles:
        need = np.nonzero((D[t] < radius).any(axis=0))[0]
        cand = finder(pts[t])
        assert np.all(np.isin(need, cand))


@pytest.mark.parametrize("radius", [300.0, 5000.0, 20000.0, np.inf])
def test_fused_lonlat_gc_weights_equal_the_numpy_path(rng, radius):
    """The compiled weights of the batched kernel are bit for bit the numpy expression's
    (distances, Gaspari–Cohn, × R⁻¹), counts and used candidates included; pairs at the
    same point and antipodal pairs included."""
    pts = np.c_[rng.uniform(0, 360, 37), rng.uniform(-90, 90, 37)]
    obs = np.c_[rng.uniform(0, 360, 211), rng.uniform(-90, 90, 211)]
    obs[:3] = pts[:3]  # distance 0
    obs[3] = [(pts[0, 0] + 180.0) % 360.0, -pts[0, 1]]  # antipode
    geo = Geometry()
    pa, pb = prepare(geo, pts), prepare(geo, obs)
    rinv = rng.uniform(0.1, 10.0, obs.shape[0])
    loc = Localization(radius=radius)
    taper = loc.weights(distances(geo, pts, obs))
    out = np.empty((pts.shape[0], obs.shape[0]))
    n_obs = np.empty(pts.shape[0], np.int64)
    used = np.zeros(obs.shape[0], bool)
    lonlat_gc_weights(pa, pb, rinv, radius, out, n_obs, used)
    assert out.tobytes() == (taper * rinv).tobytes()
    np.testing.assert_array_equal(n_obs, np.count_nonzero(taper, axis=1))
    np.testing.assert_array_equal(used, taper.any(axis=0))
