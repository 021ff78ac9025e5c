"""The reduced anomaly basis of the batched kernel: exact, and equal to the plain formulas."""

from __future__ import annotations

import numpy as np
import pytest

import ensio.analysis.batched as batched_mod
from ensio.analysis.basis import (
    FactoredTransform,
    anomaly_basis,
    expand,
    prior_transform,
    sqrt_factors_in_basis,
)
from ensio.analysis.local import ObsSpace, local_analysis
from ensio.analysis.localization import Geometry, Localization, distances
from ensio.analysis.transforms import estkf_projection, sqrt_weights, transform_from_weights

LONLAT = Geometry("lonlat")


def rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def test_basis_of_low_rank_and_centred_anomalies():
    rng = np.random.default_rng(1)
    q, c = 12, 80
    Y = rng.standard_normal((q, 3)) @ rng.standard_normal((3, c))
    Q, coords = anomaly_basis(Y)
    assert Q.shape == (q, 3) and np.allclose(Q.T @ Q, np.eye(3), atol=1e-14)
    assert rel(Q @ coords, Y) <= 1e-14 and rel(coords, Q.T @ Y) <= 1e-15
    # anomalies (columns summing to zero over the members): at most q - 1
    hx = rng.standard_normal((q, c))
    Q, _ = anomaly_basis(hx - hx.mean(axis=0))
    assert Q.shape == (q, q - 1)
    assert anomaly_basis(hx) is None  # full rank: nothing to gain
    assert anomaly_basis(hx - hx.mean(axis=0), max_rank=q - 2) is None
    Q, coords = anomaly_basis(np.zeros((q, c)))
    assert Q.shape == (q, 0) and coords.shape == (0, c)


def test_basis_is_rejected_when_the_rest_is_above_rounding():
    rng = np.random.default_rng(2)
    q, c = 10, 50
    Y = rng.standard_normal((q, 2)) @ rng.standard_normal((2, c))
    Y += 1e-9 * rng.standard_normal((q, c))  # small, but far above rounding
    assert anomaly_basis(Y) is None


@pytest.mark.parametrize("method", ["etkf", "estkf"])
def test_factors_equal_the_dense_square_root(method):
    rng = np.random.default_rng(3)
    k, p, r = 9, 7, 4
    q = k - 1 if method == "estkf" else k
    Q, _ = np.linalg.qr(rng.standard_normal((q, r)))
    F = rng.standard_normal((p, r, 30))
    B = F @ np.swapaxes(F, -1, -2)
    br = rng.standard_normal((p, r))
    rho = rng.uniform(0.7, 1.0, p)
    T = estkf_projection(k) if method == "estkf" else None
    C = Q @ B @ Q.T
    expected = transform_from_weights(*sqrt_weights(C, br @ Q.T, rho, k), omega=T)
    Qk = Q if T is None else T @ Q
    f = sqrt_factors_in_basis(B, br, rho, k, Qk, centred=T is not None)
    assert rel(f.dense(), expected) <= 1e-12
    X = rng.standard_normal((p, k))
    X -= X.mean(axis=1, keepdims=True)
    assert rel(f.apply(X), np.einsum("pa,paj->pj", X, expected)) <= 1e-12
    counts = np.array([1, 0, 3, 1, 2, 1, 1])
    Xr = np.repeat(X, counts, axis=0)
    assert rel(f.repeat(counts).apply(Xr), np.repeat(f.apply(X), counts, axis=0)) <= 1e-15


def test_points_without_observations_keep_the_inflated_prior():
    rng = np.random.default_rng(4)
    k, r = 6, 2
    rho = np.array([0.8, 0.9, 1.0])
    has = np.array([True, False, True])
    Q, _ = np.linalg.qr(rng.standard_normal((k, r)))
    f = sqrt_factors_in_basis(np.eye(r)[None].repeat(2, 0), np.ones((2, r)), rho[has], k, Q)
    full = expand(f, has, rho)
    assert isinstance(full, FactoredTransform)
    assert np.allclose(full.dense()[1], np.eye(k) / np.sqrt(0.9), rtol=0, atol=1e-15)
    assert np.allclose(full.dense()[has], f.dense(), rtol=0, atol=1e-15)
    assert np.allclose(prior_transform(rho, k).dense(), np.eye(k) / np.sqrt(rho)[:, None, None])


def degenerate_case(rng, n=300, m=250, k=12, modes=3):
    """Members that differ by ``modes`` patterns only: low-rank anomalies everywhere."""
    lon = rng.uniform(-180, 180, n)
    lat = np.degrees(np.arcsin(rng.uniform(-1, 1, n)))
    lat[:20] = rng.uniform(84, 90, 20)
    lon[20:40] = rng.choice([-1, 1], 20) * rng.uniform(175, 180, 20)
    lon[40:60], lat[40:60] = rng.uniform(60, 70, 20), rng.uniform(-5, 5, 20)  # no observations
    pts = np.stack([lon, lat], axis=1)
    X = rng.standard_normal(n) + rng.standard_normal((k, modes)) @ rng.standard_normal((modes, n))
    far = distances(LONLAT, np.array([[65.0, 0.0]]), pts)[0] > 3500.0
    idx = rng.choice(np.flatnonzero(far), m, replace=True)
    obs = ObsSpace(
        hx=X[:, idx],
        values=X[:, idx].mean(axis=0) + rng.standard_normal(m),
        errors=rng.uniform(0.5, 2.0, m),
        coords=pts[idx],
        ids=np.arange(m) + 7,
    )
    return X, pts, obs


@pytest.mark.parametrize("method", ["etkf", "estkf"])
def test_batched_on_a_degenerate_ensemble_equals_pointwise(monkeypatch, method, rng):
    X, pts, obs = degenerate_case(rng)
    # a second variable at the same points: several rows per point
    X2 = np.hstack([X, 2.0 * X - 1.0])
    pts2 = np.vstack([pts, pts])
    forget = np.tile(rng.uniform(0.7, 1.0, X.shape[1]), 2)
    loc = Localization(LONLAT, "gaspari-cohn", 2500.0)
    ranks: list[int] = []

    def spy(Y, tol=1e-14, max_rank=None):
        found = anomaly_basis(Y, tol, max_rank)
        if found is not None:
            ranks.append(found[0].shape[1])
        return found

    monkeypatch.setattr(batched_mod, "anomaly_basis", spy)
    a = local_analysis(X2, pts2, obs, loc, method=method, forget=forget, tile_points=16)
    assert ranks and max(ranks) <= 3  # the reduced form was used
    b = local_analysis(X2, pts2, obs, loc, method=method, forget=forget, kernel="pointwise")
    assert rel(a.ensemble, b.ensemble) <= 1e-10
    assert np.array_equal(a.n_obs, b.n_obs) and np.any(a.n_obs == 0)
    assert np.allclose(a.dRd, b.dRd, rtol=1e-10)
    monkeypatch.setattr(batched_mod, "BASIS_TOLERANCE", 0.0)  # the full-size form
    c = local_analysis(X2, pts2, obs, loc, method=method, forget=forget, tile_points=16)
    assert rel(a.ensemble, c.ensemble) <= 1e-12
