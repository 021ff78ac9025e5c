"""Ensemble-space kernels against the Kalman filter written out in state space."""

from __future__ import annotations

import numpy as np
import pytest

from ensio.analysis.transforms import (
    PERTURBATION_BLOCK,
    apply_transform,
    enkf_transform,
    estkf_projection,
    estkf_transform,
    etkf_transform,
    obs_perturbation,
    obs_perturbations,
    random_rotation,
    rotate,
)


def linear_gaussian_case(rng, n=12, k=9, m=7):
    """Random prior ensemble, dense linear H, diagonal R, observations."""
    X = rng.standard_normal((k, n)) * rng.uniform(0.5, 2.0, n) + rng.standard_normal(n)
    H = rng.standard_normal((m, n))
    sigma = rng.uniform(0.3, 1.5, m)
    y = H @ X.mean(axis=0) + rng.standard_normal(m) * 2.0
    return X, H, sigma, y


def kalman(X, H, sigma, y, inflate=1.0):
    """Mean and covariance of the exact Kalman analysis with P = sample covariance × inflate."""
    k = X.shape[0]
    xb = X.mean(axis=0)
    A = (X - xb).T
    P = inflate * A @ A.T / (k - 1)
    R = np.diag(sigma**2)
    K = P @ H.T @ np.linalg.inv(H @ P @ H.T + R)
    xa = xb + K @ (y - H @ xb)
    Pa = (np.eye(P.shape[0]) - K @ H) @ P
    return xa, Pa


def sample_moments(Xa):
    k = Xa.shape[0]
    A = Xa - Xa.mean(axis=0)
    return Xa.mean(axis=0), A.T @ A / (k - 1)


def rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def inputs(X, H, sigma, y):
    hx = X @ H.T
    return hx - hx.mean(axis=0), y - hx.mean(axis=0), 1.0 / sigma**2


@pytest.mark.parametrize("transform", [etkf_transform, estkf_transform])
@pytest.mark.parametrize("trial", range(5))
def test_square_root_filters_give_the_kalman_analysis(transform, trial, rng):
    X, H, sigma, y = linear_gaussian_case(
        rng, n=int(rng.integers(5, 20)), k=int(rng.integers(3, 15))
    )
    Xa = apply_transform(X, transform(*inputs(X, H, sigma, y)))
    xa, Pa = kalman(X, H, sigma, y)
    mean, cov = sample_moments(Xa)
    assert rel(mean, xa) <= 1e-10
    assert rel(cov, Pa) <= 1e-10


@pytest.mark.parametrize("transform", [etkf_transform, estkf_transform])
def test_forgetting_factor_inflates_the_prior_covariance(transform, rng):
    X, H, sigma, y = linear_gaussian_case(rng)
    rho = 0.8
    Xa = apply_transform(X, transform(*inputs(X, H, sigma, y), forget=rho))
    xa, Pa = kalman(X, H, sigma, y, inflate=1.0 / rho)
    mean, cov = sample_moments(Xa)
    assert rel(mean, xa) <= 1e-10
    assert rel(cov, Pa) <= 1e-10


def test_etkf_and_estkf_agree_member_by_member(rng):
    X, H, sigma, y = linear_gaussian_case(rng, k=17)
    args = inputs(X, H, sigma, y)
    a = apply_transform(X, etkf_transform(*args, forget=0.9))
    b = apply_transform(X, estkf_transform(*args, forget=0.9))
    assert rel(a, b) <= 1e-10


def test_square_root_is_symmetric_and_keeps_the_members_close(rng):
    # the symmetric root is the transform closest to the identity: with no
    # observation information it must be exactly the identity
    k, m = 6, 4
    Y = rng.standard_normal((k, m))
    Y -= Y.mean(axis=0)
    G = etkf_transform(Y, np.zeros(m), np.full(m, 1e-300))
    assert np.allclose(G, np.eye(k), atol=1e-12)


def test_estkf_projection_properties():
    for k in (2, 3, 10, 41):
        T = estkf_projection(k)
        assert T.shape == (k, k - 1)
        assert np.allclose(T.T @ T, np.eye(k - 1), atol=1e-14)
        assert np.allclose(T @ T.T, np.eye(k) - 1.0 / k, atol=1e-14)
    # entries as defined by Nerger et al. (2012)
    k = 5
    T = estkf_projection(k)
    c = 1.0 / (k * (1.0 / np.sqrt(k) + 1.0))
    assert T[0, 0] == pytest.approx(1.0 - c)
    assert T[1, 0] == pytest.approx(-c)
    assert T[k - 1, 2] == pytest.approx(-1.0 / np.sqrt(k))


def test_enkf_with_centred_perturbations_has_the_kalman_mean(rng):
    X, H, sigma, y = linear_gaussian_case(rng)
    Y, d, rinv = inputs(X, H, sigma, y)
    eps = rng.standard_normal(Y.shape) * sigma
    eps -= eps.mean(axis=0)
    Xa = apply_transform(X, enkf_transform(Y, d, rinv, eps))
    xa, _ = kalman(X, H, sigma, y)
    assert rel(Xa.mean(axis=0), xa) <= 1e-10


def test_enkf_matches_the_perturbed_observation_update_in_state_space(rng):
    X, H, sigma, y = linear_gaussian_case(rng)
    Y, d, rinv = inputs(X, H, sigma, y)
    eps = rng.standard_normal(Y.shape) * sigma
    rho = 0.7
    Xa = apply_transform(X, enkf_transform(Y, d, rinv, eps, forget=rho))
    # textbook: inflate the prior, then x_j + K (y + eps_j - H x_j)
    xb = X.mean(axis=0)
    Xi = xb + (X - xb) / np.sqrt(rho)
    A = (Xi - xb).T
    P = A @ A.T / (X.shape[0] - 1)
    K = P @ H.T @ np.linalg.inv(H @ P @ H.T + np.diag(sigma**2))
    expected = np.array([Xi[j] + K @ (y + eps[j] - H @ Xi[j]) for j in range(X.shape[0])])
    assert rel(Xa, expected) <= 1e-10


def test_enkf_is_unbiased_with_the_expected_covariance(rng):
    """Uncentred perturbations: over many draws the analysis mean is the Kalman
    mean and the analysis covariance is (I−KH)P in expectation.

    Tolerance: 5 standard errors of the Monte-Carlo average, computed from the
    draws themselves (fails by chance with probability < 1e-5 per entry).
    """
    X, H, sigma, y = linear_gaussian_case(rng, n=6, k=8, m=5)
    Y, d, rinv = inputs(X, H, sigma, y)
    xa, Pa = kalman(X, H, sigma, y)
    draws = 4000
    means, covs = [], []
    k = X.shape[0]
    for c in range(draws):
        z = obs_perturbations(7, c, np.arange(k), np.arange(Y.shape[1]))
        Xa = apply_transform(X, enkf_transform(Y, d, rinv, z * sigma))
        m, C = sample_moments(Xa)
        means.append(m)
        covs.append(C)
    means, covs = np.array(means), np.array(covs)
    se_m = means.std(axis=0, ddof=1) / np.sqrt(draws)
    assert np.all(np.abs(means.mean(axis=0) - xa) <= 5 * se_m + 1e-12)
    se_c = covs.std(axis=0, ddof=1) / np.sqrt(draws)
    assert np.all(np.abs(covs.mean(axis=0) - Pa) <= 5 * se_c + 1e-12)


def test_perturbations_do_not_depend_on_how_observations_are_split(rng):
    ids = np.arange(3 * PERTURBATION_BLOCK + 17)
    members = np.arange(5)
    full = obs_perturbations(3, 11, members, ids)
    assert full.shape == (5, ids.size)
    sub = rng.permutation(ids)[:500]
    part = obs_perturbations(3, 11, members[2:4], sub)
    assert np.array_equal(part, full[2:4][:, sub])
    assert obs_perturbation(3, 11, 4, int(ids[-1])) == full[4, -1]
    # different seed / cycle / member give different numbers
    assert not np.allclose(obs_perturbations(4, 11, members, ids[:50]), full[:, :50])
    assert not np.allclose(obs_perturbations(3, 12, members, ids[:50]), full[:, :50])
    assert not np.allclose(full[0], full[1])
    # and they look standard normal
    assert abs(full.mean()) < 0.05 and abs(full.std() - 1.0) < 0.05


def test_random_rotation_is_orthogonal_mean_preserving_and_seeded(rng):
    k = 11
    L = random_rotation(k, seed=5, cycle=2)
    assert np.allclose(L @ L.T, np.eye(k), atol=1e-13)
    assert np.allclose(L @ np.ones(k), np.ones(k), atol=1e-13)
    assert np.array_equal(L, random_rotation(k, seed=5, cycle=2))
    assert not np.allclose(L, random_rotation(k, seed=5, cycle=3))
    X = rng.standard_normal((k, 8))
    Xr = rotate(X, L)
    assert np.allclose(Xr.mean(axis=0), X.mean(axis=0), atol=1e-13)
    assert np.allclose(np.cov(Xr.T), np.cov(X.T), atol=1e-12)
    assert not np.allclose(Xr, X)


def test_apply_transform_per_row_equals_global(rng):
    X = rng.standard_normal((5, 7))
    G = rng.standard_normal((5, 5))
    assert np.allclose(apply_transform(X, np.broadcast_to(G, (7, 5, 5))), apply_transform(X, G))
