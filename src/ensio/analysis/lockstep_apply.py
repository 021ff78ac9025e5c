"""Functions of small symmetric matrices applied to a few vectors, without eigenvectors.

Why: the square-root filters need, per analysis point, ``A⁻¹ b`` (the mean
weights) and ``[(k−1)A⁻¹]^{1/2}`` applied to the anomalies of the point's
state rows. When a point has few rows (one level of one variable, or a
3-D point under vertical localization) forming the eigenvectors of A
(O(n³): accumulating the Householder reflections and rotating n-long
columns in QL) costs far more than the vectors need: with
``A = Q Z Λ Zᵀ Qᵀ`` (Q the tridiagonalization's reflections, Z the QL
rotations), ``f(A) x = Q Z f(Λ) Zᵀ Qᵀ x`` is the reflections and the
rotations applied to the vectors themselves, O(n²) per vector. The
eigenvalues and the rotations are exactly those of the lockstep
eigensolver (:mod:`~ensio.analysis.eigensolver`: same tridiagonalization,
same two QL passes, same lanes and masks), so the result agrees with
forming the transform to rounding and does not depend on the stack a
matrix comes in.

Compiled with numba (cached on disk); pure functions on numpy arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .eigensolver import _reduce, load_block
from .lockstep_ql import LANES, ql_vectors

__all__ = ["sqrt_apply_stack"]


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _reflect(V, d, W, forward):  # pragma: no cover - compiled
    """``W ← Qᵀ W`` (``forward``) or ``Q W`` per lane, from :func:`_reduce`'s reflections.

    ``W`` (n, m, B): m vectors per lane. Q is ``P_{n−2} ⋯ P_0`` with
    ``P_i = I − u_i u_iᵀ/h_i`` acting on the leading i + 1 entries.
    """
    n, m, B = W.shape
    g = np.empty((m, B))
    hinv = np.empty(B)
    for step in range(n - 1):
        i = n - 2 - step if forward else step
        for b in range(B):
            hinv[b] = 1.0 / d[i + 1, b] if d[i + 1, b] != 0.0 else 0.0
        for j in range(m):
            for b in range(B):
                g[j, b] = 0.0
        for k in range(i + 1):
            for j in range(m):
                for b in range(B):
                    g[j, b] += V[k, i + 1, b] * W[k, j, b]
        for j in range(m):
            for b in range(B):
                g[j, b] *= hinv[b]
        for k in range(i + 1):
            for j in range(m):
                for b in range(B):
                    W[k, j, b] -= g[j, b] * V[k, i + 1, b]


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _unrotate(W, rec_i, rec_c, rec_s, count):  # pragma: no cover - compiled
    """``W ← Z W`` per lane: the recorded rotations, last first, each transposed."""
    m, B = W.shape[1], W.shape[2]
    for t in range(count - 1, -1, -1):
        i = rec_i[t]
        x, y = W[i], W[i + 1]
        for k in range(m):
            for b in range(B):
                xv = x[k, b]
                yv = y[k, b]
                x[k, b] = rec_c[t, b] * xv + rec_s[t, b] * yv
                y[k, b] = rec_c[t, b] * yv - rec_s[t, b] * xv


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _solve_apply(A, shift, X, kk, s0, n_inv, lam, Y, ok, lanes):  # pragma: no cover - compiled
    """All blocks of ``lanes`` matrices: load, reduce, ``Qᵀ``, QL, ``f(Λ)``, Z, Q, store."""
    P, n, m = A.shape[0], A.shape[1], X.shape[2]
    V = np.empty((n, n, lanes))
    W = np.empty((n, m, lanes))
    d = np.empty((n, lanes))
    e = np.empty((n, lanes))
    mu = np.empty((n, lanes))
    scale = np.empty(lanes)
    okb = np.empty(lanes, dtype=np.bool_)
    cap = 8 * n * n
    rec_i = np.empty(cap, dtype=np.int64)
    rec_c = np.empty((cap, lanes))
    rec_s = np.empty((cap, lanes))
    nrec = np.zeros(1, dtype=np.int64)
    no_mu = np.empty((0, lanes))
    for b0 in range(0, P, lanes):
        nb = load_block(A, shift, b0, V, scale, okb)
        _reduce(V, d, e)
        for i in range(n):  # the tridiagonal matrix: diagonal of V, subdiagonal e[1:]
            for b in range(lanes):
                mu[i, b] = V[i, i, b]
        for b in range(lanes):
            e[0, b] = 0.0
        for i in range(n):
            for j in range(m):
                for b in range(lanes):
                    W[i, j, b] = X[b0 + b, i, j] if b < nb else 0.0
        _reflect(V, d, W, True)
        nrec[0] = 0
        ql_vectors(W, mu, e, no_mu, okb, rec_i, rec_c, rec_s, nrec)
        for b in range(nb):  # f(Λ): 1/λ on the first n_inv vectors, sqrt(kk/λ) − s0 on the rest
            for i in range(n):
                lb = mu[i, b] / scale[b]
                lam[b0 + b, i] = lb
                inv = 1.0 / lb
                root = np.sqrt(kk * inv) - s0[b0 + b]
                for j in range(m):
                    W[i, j, b] *= inv if j < n_inv else root
        _unrotate(W, rec_i, rec_c, rec_s, nrec[0])
        _reflect(V, d, W, False)
        for b in range(nb):
            ok[b0 + b] = okb[b]
            for i in range(n):
                for j in range(m):
                    Y[b0 + b, i, j] = W[i, j, b]


def sqrt_apply_stack(
    A: np.ndarray,
    shift: np.ndarray,
    X: np.ndarray,
    kk: float,
    s0: np.ndarray,
    n_inv: int = 1,
    lanes: int = LANES,
) -> tuple[np.ndarray, np.ndarray]:
    """``f(A + shift·I) X`` for a stack of symmetric matrices and a few vectors each.

    With ``λ`` the eigenvalues of ``A + shift·I``: ``f = 1/λ`` on the first
    ``n_inv`` vectors of every matrix (the mean weights ``A⁻¹ b``) and
    ``f = sqrt(kk/λ) − s0`` on the others (the square root's part beyond
    its prior ``s0 I``, see :class:`~ensio.analysis.basis.FactoredTransform`).

    Parameters
    ----------
    A : ndarray, shape (p, n, n)
        Symmetric (both triangles are read).
    shift : ndarray, shape (p,)
    X : ndarray, shape (p, n, m)
        The vectors, as columns.
    kk : float
        ``k − 1``.
    s0 : ndarray, shape (p,)
    n_inv : int
    lanes : int
        Matrices per lockstep block (tuning only).

    Returns
    -------
    lam : ndarray, shape (p, n)
        Eigenvalues, in no particular order.
    Y : ndarray, shape (p, n, m)
    """
    A = np.ascontiguousarray(A, dtype=np.float64)
    X = np.ascontiguousarray(X, dtype=np.float64)
    p, n, m = X.shape
    sh = np.ascontiguousarray(np.broadcast_to(np.asarray(shift, dtype=np.float64), (p,)))
    s0 = np.ascontiguousarray(np.broadcast_to(np.asarray(s0, dtype=np.float64), (p,)))
    lam, Y = np.empty((p, n)), np.empty((p, n, m))
    if p == 0 or n == 0:
        Y[:] = 0.0
        return lam, Y
    ok = np.ones(p, dtype=np.bool_)
    _solve_apply(A, sh, X, float(kk), s0, int(n_inv), lam, Y, ok, int(lanes))
    if not ok.all():  # no convergence or too many rotations (not seen in practice): LAPACK
        bad = np.flatnonzero(~ok)
        lb, U = np.linalg.eigh(A[bad] + sh[bad, None, None] * np.eye(n))
        f = np.sqrt(kk / lb) - s0[bad, None]
        f = np.broadcast_to(f[:, :, None], (bad.size, n, m)).copy()
        f[:, :, :n_inv] = (1.0 / lb)[:, :, None]
        Y[bad] = U @ (f * (np.swapaxes(U, -1, -2) @ X[bad]))
        lam[bad] = lb
    return lam, Y
