"""A symmetric eigensolver for stacks of small matrices, vectorized across the stack.

Why: after the GEMM, the batched local analysis needs one symmetric
eigendecomposition per grid point (q = 40 for 40 members). LAPACK solves
each matrix on its own, and at this size its cost is latency, not
arithmetic: ``numpy.linalg.eigh`` (``dsyevd``) takes about 120 µs for a
40 × 40 matrix here, some 1 GFLOP/s. GPU libraries solve batches of small
matrices in **lockstep**: every matrix of a block goes through the same
sequence of operations, one per SIMD lane. This module does the same on the
CPU with numba (compiled once, cached on disk; no compiler at run time):
a block of :data:`LANES` matrices is stored with the block index innermost,
so every inner loop runs over the lanes with contiguous loads and no
branches, and the dependent chains of the rotations of different matrices
overlap.

The algorithm is the classic one of EISPACK (``tred2`` + ``tql2``, as in
JAMA): Householder reduction to tridiagonal form with the transformation
accumulated, then implicit QL. It runs in two passes: the eigenvalues alone
(cheap), then QL again with the rotations applied to the eigenvectors,
shifted by those eigenvalues (:func:`~ensio.analysis.lockstep_ql.ql_vectors`; both QL
passes live in :mod:`~ensio.analysis.lockstep_ql`), which halves the
rotations, the bulk of the cost. Both steps are backward stable
(eigenvalues to ``O(eps ‖A‖)``, eigenvectors orthonormal to ``O(n eps)``),
like LAPACK; the shifts only change how fast QL converges, not to what.
Lockstep needs masks where matrices differ: a matrix whose current
eigenvalue has converged (or whose off-diagonal has split earlier) takes
identity rotations while the others iterate; a zero Householder column
takes an identity reflection. No matrix's arithmetic depends on the others
of its block (identity rotations are exact), so the result of a matrix is
bitwise the same whatever stack it comes in: the analysis does not depend
on tiles or threads through it.

Measured on 40 × 40 matrices of the local analysis (2026-11-25, CPU time,
shared 2-core AMD EPYC VM, tiles of 128): 46 µs per matrix (59 before the
perfect-shift tolerance and the vectorized eigenvalue sweep of issue 14)
against about 120 µs for ``numpy.linalg.eigh`` — load and store 5,
tridiagonalization 16, eigenvalues 10, vectors 16. All kernels compile with
``error_model="numpy"``: a division that may not raise is what lets LLVM
vectorize a sweep over the lanes (with Python's error model the eigenvalue
sweep ran lane by lane); ``fastmath`` stays off, so no contraction changes
bits between the vector loop and its remainder.

Pure function on numpy arrays: no MPI, no I/O. Eigenvalues come back in no
particular order (the transforms use them element-wise, with their vectors).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .lockstep_ql import LANES, ql_vectors, tql2

__all__ = ["LANES", "eigh_stack", "warm_up"]


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _reduce(V, d, e):  # pragma: no cover - compiled
    """The reduction of JAMA's ``tred2`` on the lanes of ``V`` (n, n, B), in place.

    Over 80 lines: one classic algorithm kept whole, so that it can be read
    line by line against its reference; pieces would pass a dozen lane
    arrays around.

    On return, per lane: the diagonal of the tridiagonal matrix is the
    diagonal of ``V``, its subdiagonal ``e[1:]``; the reflection that
    reduced row i + 1 is ``I − u uᵀ/h`` with ``u = V[:i+1, i+1]`` and
    ``h = d[i+1]`` (a zero ``u`` where the column was already reduced).
    :func:`_tred2` accumulates these into the transformation;
    :mod:`~ensio.analysis.lockstep_apply` applies them to vectors instead.
    """
    n, B = V.shape[0], V.shape[2]
    for j in range(n):
        for b in range(B):
            d[j, b] = V[n - 1, j, b]
    scale = np.empty(B)
    h = np.empty(B)
    hs = np.empty(B)
    f = np.empty(B)
    g = np.empty(B)
    hh = np.empty(B)
    for i in range(n - 1, 0, -1):
        for b in range(B):
            scale[b] = 0.0
            h[b] = 0.0
        for k in range(i):
            for b in range(B):
                scale[b] += abs(d[k, b])
        for b in range(B):  # a zero column: identity reflection (all products stay 0)
            scale[b] = scale[b] if scale[b] != 0.0 else 1.0
        for k in range(i):
            for b in range(B):
                d[k, b] /= scale[b]
                h[b] += d[k, b] * d[k, b]
        for b in range(B):
            fb = d[i - 1, b]
            gb = np.sqrt(h[b])
            gb = -gb if fb > 0.0 else gb
            e[i, b] = scale[b] * gb
            h[b] = h[b] - fb * gb
            d[i - 1, b] = fb - gb
            hs[b] = h[b] if h[b] != 0.0 else 1.0
        for j in range(i):
            for b in range(B):
                e[j, b] = 0.0
        for j in range(i):
            for b in range(B):
                f[b] = d[j, b]
                V[j, i, b] = f[b]
                g[b] = e[j, b] + V[j, j, b] * f[b]
            for k in range(j + 1, i):
                for b in range(B):
                    g[b] += V[k, j, b] * d[k, b]
                    e[k, b] += V[k, j, b] * f[b]
            for b in range(B):
                e[j, b] = g[b]
        for b in range(B):
            f[b] = 0.0
        for j in range(i):
            for b in range(B):
                e[j, b] /= hs[b]
                f[b] += e[j, b] * d[j, b]
        for b in range(B):
            hh[b] = f[b] / (hs[b] + hs[b])
        for j in range(i):
            for b in range(B):
                e[j, b] -= hh[b] * d[j, b]
        for k in range(i):  # row by row: contiguous (j, lane) runs; same arithmetic
            for j in range(k + 1):
                for b in range(B):
                    V[k, j, b] -= d[j, b] * e[k, b] + e[j, b] * d[k, b]
        for j in range(i):
            for b in range(B):
                d[j, b] = V[i - 1, j, b]
                V[i, j, b] = 0.0
        for b in range(B):
            d[i, b] = h[b]


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _tred2(V, d, e, h_of):  # pragma: no cover - compiled
    """Householder tridiagonalization of the lanes of ``V`` (n, n, B), in place.

    On return ``V`` holds the orthogonal transformation, ``d`` the diagonal
    and ``e`` the subdiagonal (``e[0] = 0``) of every lane; JAMA's ``tred2``
    with its branches turned into lane selects (the reduction is
    :func:`_reduce`, the accumulation of the reflections follows).
    """
    n, B = V.shape[0], V.shape[2]
    _reduce(V, d, e)
    G = np.empty((n, B))
    # accumulate the transformations
    for i in range(n - 1):
        for b in range(B):
            V[n - 1, i, b] = V[i, i, b]
            V[i, i, b] = 1.0
            h_of[b] = d[i + 1, b] if d[i + 1, b] != 0.0 else 1.0
        for k in range(i + 1):
            for b in range(B):
                d[k, b] = V[k, i + 1, b] / h_of[b]
        # g_j = Σ_k V[k, i+1] V[k, j], then V[k, j] -= g_j d[k]: row by row, so
        # the inner loops run over contiguous (j, lane) runs (same sums, same order)
        for j in range(i + 1):
            for b in range(B):
                G[j, b] = 0.0
        for k in range(i + 1):
            for j in range(i + 1):
                for b in range(B):
                    G[j, b] += V[k, i + 1, b] * V[k, j, b]
        for k in range(i + 1):
            for j in range(i + 1):
                for b in range(B):
                    V[k, j, b] -= G[j, b] * d[k, b]
        for k in range(i + 1):
            for b in range(B):
                V[k, i + 1, b] = 0.0
    for j in range(n):
        for b in range(B):
            d[j, b] = V[n - 1, j, b]
            V[n - 1, j, b] = 0.0
    for b in range(B):
        V[n - 1, n - 1, b] = 1.0
        e[0, b] = 0.0


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def load_block(A, shift, b0, V, scale, okb):  # pragma: no cover - compiled
    """Lanes of ``V`` (n, n, B) ← ``(A + shift·I)[b0 : b0 + B]``, scaled; returns their count.

    Each lane is scaled by a power of 2 (exact) that brings its entries to
    order one (``scale``); padding lanes past the stack get the identity,
    which converges at once. ``okb`` is set. Row by row: one row of V
    (n × B) stays in the L1 cache while every matrix's row is copied in
    contiguously.
    """
    P, n, lanes = A.shape[0], A.shape[1], V.shape[2]
    nb = min(lanes, P - b0)
    big = np.zeros(lanes)
    for i in range(n):
        for b in range(nb):
            row = A[b0 + b, i]
            sh = shift[b0 + b]
            m = big[b]
            for j in range(n):
                x = row[j] + (sh if i == j else 0.0)
                V[i, j, b] = x
                ax = abs(x)
                m = ax if ax > m else m
            big[b] = m
        for b in range(nb, lanes):
            for j in range(n):
                V[i, j, b] = 1.0 if i == j else 0.0
    for b in range(lanes):
        okb[b] = True
        bg = big[b]
        unit = b >= nb or bg == 0.0 or not np.isfinite(bg)
        scale[b] = 1.0 if unit else 2.0 ** (-np.ceil(np.log2(bg)))
    for i in range(n):
        for j in range(n):
            for b in range(lanes):
                V[i, j, b] *= scale[b]
    return nb


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _solve(A, shift, lam, U, ok, lanes):  # pragma: no cover - compiled
    """All blocks of ``lanes`` matrices: load (scaled), tred2, tql2, store."""
    P, n = A.shape[0], A.shape[1]
    V = np.empty((n, n, lanes))
    Vt = np.empty((n, n, lanes))
    d = np.empty((n, lanes))
    e = np.empty((n, lanes))
    mu = np.empty((n, lanes))
    e2 = np.empty((n, lanes))
    h = np.empty(lanes)
    scale = np.empty(lanes)
    okb = np.empty(lanes, dtype=np.bool_)
    for b0 in range(0, P, lanes):
        nb = load_block(A, shift, b0, V, scale, okb)
        _tred2(V, d, e, h)
        for i in range(n):
            for j in range(n):
                for b in range(lanes):
                    Vt[j, i, b] = V[i, j, b]
        mu[:] = d
        e2[:] = e
        tql2(mu, e2, okb)
        ql_vectors(Vt, d, e, mu, okb)
        for b in range(nb):
            ok[b0 + b] = okb[b]
            for j in range(n):
                lam[b0 + b, j] = d[j, b] / scale[b]
        for b in range(nb):
            for i in range(n):
                for j in range(n):
                    U[b0 + b, i, j] = Vt[j, i, b]


def eigh_stack(
    A: np.ndarray, shift: np.ndarray | float = 0.0, lanes: int = LANES
) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues and eigenvectors of ``A + shift·I`` for a stack of symmetric matrices.

    Parameters
    ----------
    A : ndarray, shape (p, n, n)
        Symmetric (both triangles are read).
    shift : float or ndarray, shape (p,)
        Added to every diagonal (the prior precision ``(k−1)ρ``) without a copy of A.
    lanes : int
        Matrices per lockstep block (tuning; the result does not depend on it
        beyond rounding).

    Returns
    -------
    lam : ndarray, shape (p, n)
        Eigenvalues, in no particular order.
    U : ndarray, shape (p, n, n)
        Orthonormal eigenvectors: column ``U[i, :, j]`` belongs to ``lam[i, j]``.
    """
    A = np.ascontiguousarray(A, dtype=np.float64)
    p, n = A.shape[0], A.shape[-1]
    sh = np.ascontiguousarray(np.broadcast_to(np.asarray(shift, dtype=np.float64), (p,)))
    lam = np.empty((p, n))
    U = np.empty((p, n, n))
    if p == 0 or n == 0:
        return lam, U
    ok = np.ones(p, dtype=np.bool_)
    _solve(A, sh, lam, U, ok, int(lanes))
    if not ok.all():  # no convergence (not seen in practice): LAPACK for those
        bad = np.flatnonzero(~ok)
        Ab = A[bad] + sh[bad, None, None] * np.eye(n)
        lam[bad], U[bad] = np.linalg.eigh(Ab)
    return lam, U


def warm_up() -> None:
    """Compile (first use on a machine) or load from the cache the compiled solver.

    Takes some 20 s the first time after installation, well under a second
    afterwards; benchmarks call it so that neither lands in a timed phase.
    """
    eigh_stack(np.eye(2)[None], 0.0)
