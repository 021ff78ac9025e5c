"""The lockstep eigensolver against LAPACK and against its own defining properties."""

from __future__ import annotations

import numpy as np
import pytest

from ensio.analysis.eigensolver import eigh_stack


def _check(A: np.ndarray, shift: np.ndarray, lam: np.ndarray, U: np.ndarray) -> None:
    """``(A + shift I) U = U diag(lam)``, ``UᵀU = I``, eigenvalues equal to LAPACK's."""
    n = A.shape[-1]
    M = A + shift[:, None, None] * np.eye(n)
    scale = np.abs(M).max(axis=(1, 2), keepdims=True)
    scale[scale == 0] = 1.0
    resid = np.abs(M @ U - U * lam[:, None, :]) / scale
    assert resid.max() <= 50 * n * np.finfo(float).eps
    assert np.abs(np.swapaxes(U, 1, 2) @ U - np.eye(n)).max() <= 50 * n * np.finfo(float).eps
    ref = np.linalg.eigvalsh(M)
    assert np.abs(np.sort(lam, axis=1) - ref).max() <= 50 * n * np.finfo(float).eps * scale.max()


def _spd_stack(rng, p: int, n: int, c: int) -> np.ndarray:
    """Matrices like the local analysis's ``Y R_loc⁻¹ Yᵀ``: centred anomalies, random weights."""
    Y = rng.standard_normal((n, c))
    Y -= Y.mean(axis=0)
    W = rng.random((p, c)) * rng.choice([0.0, 1.0], (p, c), p=[0.3, 0.7])
    return np.einsum("ac,pc,bc->pab", Y, W, Y)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 40])
def test_local_analysis_matrices(n, rng):
    p = 37  # not a multiple of the lanes: a partial last block
    C = _spd_stack(rng, p, n, 3 * n + 5)
    shift = rng.uniform(0.5, 2.0, p) * (n - 1 if n > 1 else 1)
    lam, U = eigh_stack(C, shift)
    _check(C, shift, lam, U)


def test_general_symmetric_and_special_structure(rng):
    n = 12
    A = rng.standard_normal((6, n, n))
    A = A + np.swapaxes(A, 1, 2)  # indefinite
    A[1] = np.diag(rng.standard_normal(n))  # already diagonal: zero Householder columns
    A[2] = 0.0  # all eigenvalues equal
    A[3] = np.ones((n, n))  # rank one: an eigenvalue of multiplicity n - 1
    A[4] = np.diag(np.repeat([1.0, 2.0, 3.0], 4))  # repeated, already diagonal
    A[5, :, :] = np.diag(np.full(n - 1, 1e-3), 1) + np.diag(np.full(n - 1, 1e-3), -1)  # tridiagonal
    shift = np.zeros(6)
    lam, U = eigh_stack(A, shift)
    _check(A, shift, lam, U)


@pytest.mark.parametrize("scale", [1e-200, 1e-8, 1e8, 1e200])
def test_extreme_scales(scale, rng):
    C = _spd_stack(rng, 5, 10, 30) * scale
    shift = np.full(5, scale)
    lam, U = eigh_stack(C, shift)
    _check(C, shift, lam, U)


def test_each_matrix_is_independent_of_its_block(rng):
    """Bitwise: lockstep does not mix matrices, so neither block size nor neighbours matter."""
    C = _spd_stack(rng, 45, 20, 60)
    shift = rng.uniform(10, 20, 45)
    lam, U = eigh_stack(C, shift)
    for lanes in (1, 5, 64):
        lam2, U2 = eigh_stack(C, shift, lanes=lanes)
        assert np.array_equal(lam, lam2) and np.array_equal(U, U2)
    perm = rng.permutation(45)
    lam3, U3 = eigh_stack(C[perm], shift[perm])
    assert np.array_equal(lam[perm], lam3) and np.array_equal(U[perm], U3)


def test_empty_stack():
    lam, U = eigh_stack(np.empty((0, 4, 4)))
    assert lam.shape == (0, 4) and U.shape == (0, 4, 4)
