"""Transforms applied to few rows as vectors: against LAPACK, the formed transform, pointwise."""

from __future__ import annotations

import numpy as np
import pytest
from test_analysis_eigensolver import _spectrum_stack
from test_analysis_local import LONLAT, lonlat_case, rel

from ensio.analysis.basis import anomaly_basis, expand, sqrt_factors_in_basis
from ensio.analysis.deferred import VECTOR_MAX_ROWS, DeferredTransform
from ensio.analysis.local import local_analysis
from ensio.analysis.localization import Localization
from ensio.analysis.lockstep_apply import sqrt_apply_stack
from ensio.analysis.variants import VARIANTS
from ensio.stopwatch import Stopwatch


def lapack_apply(A, shift, X, kk, s0, n_inv):
    """``f(A + shift I) X`` from ``numpy.linalg.eigh``: the independent reference."""
    n = A.shape[-1]
    lam, U = np.linalg.eigh(A + shift[:, None, None] * np.eye(n))
    f = np.repeat((np.sqrt(kk / lam) - s0[:, None])[:, :, None], X.shape[2], axis=2)
    f[:, :, :n_inv] = (1.0 / lam)[:, :, None]
    return lam, U @ (f * (np.swapaxes(U, 1, 2) @ X))


CASES = [(1, "few-obs")] + [
    (n, kind) for n in (2, 3, 10, 40, 64, 99) for kind in ("few-obs", "repeated", "close", "graded")
]


@pytest.mark.parametrize(("n", "kind"), CASES)
@pytest.mark.parametrize("m", [1, 2, 9])
def test_functions_applied_to_vectors_equal_lapack(n, m, kind, rng):
    C, alpha = _spectrum_stack(rng, n, kind)
    X = rng.standard_normal((C.shape[0], n, m))
    s0 = rng.uniform(0.9, 1.2, C.shape[0])
    kk = float(max(n - 1, 1))
    lam, Y = sqrt_apply_stack(C, alpha, X, kk, s0, n_inv=1)
    lr, ref = lapack_apply(C, alpha, X, kk, s0, 1)
    assert np.abs(np.sort(lam, axis=1) - lr).max() <= 1e-13 * np.abs(lr).max()
    err = np.abs(Y - ref).max(axis=(1, 2)) / np.abs(ref).max(axis=(1, 2))
    assert err.max() <= 1e-10


def test_each_matrix_is_independent_of_its_stack(rng):
    """Lanes never mix: a matrix's result is bitwise the same alone, in any position."""
    n, p = 12, 45  # more than one block of lanes, the last one partly padding
    Y = rng.standard_normal((p, n, 30))
    C = Y @ np.swapaxes(Y, 1, 2)
    alpha = rng.uniform(1.0, 20.0, p)
    X = rng.standard_normal((p, n, 3))
    s0 = rng.uniform(0.9, 1.1, p)
    _, full = sqrt_apply_stack(C, alpha, X, n - 1.0, s0)
    perm = rng.permutation(p)
    _, shuffled = sqrt_apply_stack(C[perm], alpha[perm], X[perm], n - 1.0, s0[perm])
    assert np.array_equal(shuffled, full[perm])
    for i in rng.choice(p, 5, replace=False):
        one_of = slice(i, i + 1)
        _, one = sqrt_apply_stack(C[one_of], alpha[one_of], X[one_of], n - 1.0, s0[one_of])
        assert np.array_equal(one[0], full[i])


def test_blocks_without_room_for_their_rotations_fall_back_to_lapack(monkeypatch, rng):
    """A block whose QL needs more rotations than recorded is redone exactly (LAPACK)."""
    import ensio.analysis.lockstep_apply as la

    n = 40  # needs about 1.2 n² rotations per block
    C, alpha = _spectrum_stack(rng, n, "graded")
    X = rng.standard_normal((C.shape[0], n, 3))
    s0 = rng.uniform(0.9, 1.1, C.shape[0])
    monkeypatch.setattr(la, "ROTATION_ROOM", 0)  # room for 16 n rotations only
    lam, Y = la.sqrt_apply_stack(C, alpha, X, n - 1.0, s0)
    lr, ref = lapack_apply(C, alpha, X, n - 1.0, s0, 1)
    assert np.array_equal(lam, lr)  # LAPACK's own eigenvalues: the fallback ran
    assert np.abs(Y - ref).max() <= 1e-12 * np.abs(ref).max()


def test_zero_and_empty_stacks():
    none = np.zeros(0)
    lam, Y = sqrt_apply_stack(np.zeros((0, 4, 4)), none, np.zeros((0, 4, 2)), 3.0, none)
    assert lam.shape == (0, 4) and Y.shape == (0, 4, 2)
    X = np.arange(8.0).reshape(1, 4, 2)  # A = 0: f is constant, f(αI) X = f(α) X
    lam, Y = sqrt_apply_stack(np.zeros((1, 4, 4)), np.array([2.0]), X, 3.0, np.array([1.0]))
    assert np.allclose(lam, 2.0, rtol=1e-15)
    assert np.allclose(Y[0, :, 0], X[0, :, 0] / 2.0, rtol=1e-14)
    assert np.allclose(Y[0, :, 1], X[0, :, 1] * (np.sqrt(1.5) - 1.0), rtol=1e-14)


def _deferred_case(rng, method: str, reduced: bool):
    """Sums of p points as the batched kernel makes them, and the same as factors."""
    k, p, c = 9, 23, 40
    variant = VARIANTS[method]
    T = variant.projection(k)
    Y = rng.standard_normal((k, c))
    if reduced:  # anomalies in a 4-dimensional span: a reduced basis
        Y = rng.standard_normal((k, 4)) @ rng.standard_normal((4, c))
    Y -= Y.mean(axis=0)
    Yq = Y if T is None else T.T @ Y
    Q, Qk = None, T
    if reduced:
        Q, Yq = anomaly_basis(Yq, max_rank=k - 2)
        Qk = Q if T is None else T @ Q
    r = Yq.shape[0]
    W = rng.uniform(0.0, 2.0, (p, c)) * (rng.uniform(size=(p, c)) < 0.7)
    B = np.einsum("pc,ic,jc->pij", W, Yq, Yq)
    br = W @ (Yq * rng.standard_normal(c)).T  # (p, r)
    rho = rng.uniform(0.8, 1.0, p)
    has = rng.uniform(size=p) < 0.8
    has[0] = True
    counts = rng.choice([1, 2, 3, VECTOR_MAX_ROWS, VECTOR_MAX_ROWS + 4], p)
    f = sqrt_factors_in_basis(B[has], br[has], rho[has], k, Qk, centred=T is not None)
    dense = expand(f, has, rho).dense()
    d = DeferredTransform(B[has], br[has], rho, has, k, Qk, T is not None, None, Stopwatch())
    assert r == B.shape[1]
    return d, dense, counts, k


@pytest.mark.parametrize("reduced", [False, True])
@pytest.mark.parametrize("method", ["etkf", "estkf"])
def test_deferred_rows_equal_the_formed_transform(method, reduced, rng):
    """Rows through vectors (few per point) or factors (many) equal ``x'ᵀ G`` with G formed."""
    d, dense, counts, k = _deferred_case(rng, method, reduced)
    Xr = rng.standard_normal((int(counts.sum()), k))
    point = np.repeat(np.arange(counts.size), counts)
    got = d.apply_rows(Xr, counts)
    want = np.einsum("rk,rkj->rj", Xr, dense[point])
    assert rel(got, want) <= 1e-12
    one = np.ones_like(counts)  # one row per point: the gather-free branch
    got1 = d.apply_rows(Xr[: counts.size], one)
    assert rel(got1, np.einsum("rk,rkj->rj", Xr[: counts.size], dense)) <= 1e-12


@pytest.mark.parametrize("method", ["etkf", "estkf"])
def test_points_without_rows_are_skipped(method, rng):
    """Points with no rows among the others and last (a coarse node of weight
    interpolation whose rows all have weight 0 there): the other points' rows as before."""
    d, dense, counts, k = _deferred_case(rng, method, False)
    counts[[0, 5, 6, counts.size - 1]] = 0
    Xr = rng.standard_normal((int(counts.sum()), k))
    point = np.repeat(np.arange(counts.size), counts)
    got = d.apply_rows(Xr, counts)
    assert rel(got, np.einsum("rk,rkj->rj", Xr, dense[point])) <= 1e-12


@pytest.mark.parametrize("method", ["etkf", "estkf"])
@pytest.mark.parametrize("levels", [1, 3, VECTOR_MAX_ROWS + 3])
def test_batched_equals_pointwise_with_rows_per_point(method, levels, rng):
    """Several levels share a location: both paths of the transform agree with pointwise."""
    X, pts, obs = lonlat_case(rng, n=150)
    Xl = np.hstack([X * (1.0 + 0.3 * lev) + lev for lev in range(levels)])
    pl = np.vstack([pts] * levels)
    loc = Localization(LONLAT, "gaspari-cohn", 2500.0)
    a = local_analysis(Xl, pl, obs, loc, method=method, forget=0.9, tile_points=16)
    b = local_analysis(Xl, pl, obs, loc, method=method, forget=0.9, kernel="pointwise")
    assert rel(a.ensemble, b.ensemble) <= 1e-10
