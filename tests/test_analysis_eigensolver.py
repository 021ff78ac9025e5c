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


def _spectrum_stack(rng, n: int, kind: str, p: int = 35) -> tuple[np.ndarray, np.ndarray]:
    """``C`` and shifts α whose ``αI + C`` has the named kind of spectrum.

    ``few-obs``: C of rank 0 … 3 (a point with few observations: α of
    multiplicity n − rank); ``repeated``: C = Q diag(v) Qᵀ with every value of
    v repeated (exactly multiple eigenvalues, not tridiagonal-split); ``close``:
    a cluster of eigenvalues within 1e-9 relative; ``graded``: values over 11
    decades (a strongly observed point).
    """
    alpha = rng.uniform(0.5, 2.0, p) * max(n - 1, 1)
    C = np.empty((p, n, n))
    for i in range(p):
        Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
        if kind == "few-obs":
            r = int(rng.integers(0, min(4, n + 1)))
            Y = rng.standard_normal((n, r)) * rng.uniform(0.1, 30.0, r)
            C[i] = Y @ Y.T
            continue
        if kind == "repeated":
            v = np.repeat(rng.uniform(0.0, 50.0, (n + 2) // 3), 3)[:n]
        elif kind == "close":
            v = rng.uniform(0.0, 50.0, n)
            v[: n // 2] = 7.0 * (1.0 + 1e-9 * rng.standard_normal(n // 2))
        else:  # graded: A's condition up to ~1e5 (beyond, any double-precision
            # solver's A^{-1/2} is off by eps·cond > 1e-10, LAPACK's included)
            v = 10.0 ** rng.uniform(-6.0, 5.0, n)
        C[i] = (Q * v) @ Q.T
        C[i] = 0.5 * (C[i] + C[i].T)
    return C, alpha


@pytest.mark.parametrize("kind", ["few-obs", "repeated", "close", "graded"])
@pytest.mark.parametrize("n", [2, 3, 10, 40, 64, 65, 100])
def test_degenerate_and_clustered_spectra_against_lapack(n, kind, rng):
    """Eigenpairs, and the functions of them the analysis uses, equal LAPACK's.

    Clustered eigenvalues make individual eigenvectors arbitrary, so the
    comparison with ``numpy.linalg.eigh`` is of what the analysis computes
    from them: ``A⁻¹b`` and the symmetric root ``A^{-1/2}`` (≤ 1e-10
    relative, the batched kernel's bound), besides the residual and
    orthogonality checks of :func:`_check`.
    """
    C, alpha = _spectrum_stack(rng, n, kind)
    lam, U = eigh_stack(C, alpha)
    _check(C, alpha, lam, U)
    A = C + alpha[:, None, None] * np.eye(n)
    lr, Ur = np.linalg.eigh(A)
    b = rng.standard_normal((C.shape[0], n, 1))

    def funcs(lam, U):
        Ut = np.swapaxes(U, 1, 2)
        return U @ ((Ut @ b) / lam[:, :, None]), (U / np.sqrt(lam)[:, None, :]) @ Ut

    for got, ref in zip(funcs(lam, U), funcs(lr, Ur), strict=True):
        err = np.abs(got - ref).max(axis=(1, 2)) / np.abs(ref).max(axis=(1, 2))
        assert err.max() <= 1e-10
