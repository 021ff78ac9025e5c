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
shifted by those eigenvalues (:func:`_ql_vectors`), which halves the
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

__all__ = ["LANES", "eigh_stack", "warm_up"]

#: Matrices solved in lockstep (measured on 40 × 40: 16 is 10 % slower, 64
#: no faster); a block of 40 × 40 matrices is 400 kB, two arrays fit in L2.
LANES = 32
_EPS = 2.0**-52
#: QL iterations per eigenvalue before giving up (LAPACK allows 30).
_MAX_ITER = 60
#: A perfect-shift sweep deflates when ``|e_l| ≤ _PERFECT_TOL · eps · ‖T‖`` (see
#: :func:`_ql_vectors`): measured on the local analysis's 40 × 40 matrices, the
#: sweep leaves ``|e_l|`` between 1 and 50 eps ‖T‖ in a third of the cases, so
#: the plain ``eps ‖T‖`` test made nearly every block pay a second sweep.
_PERFECT_TOL = 64.0


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _tred2(V, d, e, h_of):  # pragma: no cover - compiled
    """Householder tridiagonalization of the lanes of ``V`` (n, n, B), in place.

    Over 80 lines: one classic algorithm kept whole, so that it can be read
    line by line against its reference; pieces would pass a dozen lane
    arrays around.

    On return ``V`` holds the orthogonal transformation, ``d`` the diagonal
    and ``e`` the subdiagonal (``e[0] = 0``) of every lane; JAMA's ``tred2``
    with its branches turned into lane selects.
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
    G = np.empty((n, B))
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


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _rotate(x, y, cv, sv):  # pragma: no cover - compiled
    """``(x, y) ← (c x − s y, s x + c y)`` per lane, for columns ``x``, ``y`` of shape (n, B)."""
    n, B = x.shape
    if B == LANES:  # a compile-time trip count: no remainder loop (measured 15 % faster)
        for k in range(n):
            for b in range(LANES):
                h = y[k, b]
                xv = x[k, b]
                y[k, b] = sv[b] * xv + cv[b] * h
                x[k, b] = cv[b] * xv - sv[b] * h
        return
    for k in range(n):
        for b in range(B):
            h = y[k, b]
            xv = x[k, b]
            y[k, b] = sv[b] * xv + cv[b] * h
            x[k, b] = cv[b] * xv - sv[b] * h


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _tql2(d, e, ok):  # pragma: no cover - compiled
    """Eigenvalues of the tridiagonal lanes ``(d, e)`` by implicit QL, in place (into ``d``).

    JAMA's ``tql2`` without the vectors, in lockstep: at eigenvalue ``l`` every lane that has not
    converged iterates; the sweep runs from the largest split point ``m`` of
    the lanes down to ``l``, with identity rotations where ``i ≥ m`` of a
    lane or for lanes that are done. ``ok[b]`` is cleared for a lane that
    did not converge in :data:`_MAX_ITER` iterations (the caller redoes it).
    Entries must be of order one or less (the caller scales by a power of 2)
    so that ``sqrt(p² + e²)`` neither overflows nor underflows. The values
    only serve as shifts for :func:`_ql_vectors`, so an eigenvalue counts as
    converged when ``e_l² ≤ eps ‖T‖ |d_l − d_l+1|`` (dropping ``e_l`` moves it
    by about ``e_l² / gap``), besides the usual ``|e_l| ≤ eps ‖T‖``; a shift
    made imperfect by that costs a second vector sweep, not accuracy. Over 80
    lines for the reason given in :func:`_tred2`.
    """
    n, B = d.shape
    for i in range(1, n):
        for b in range(B):
            e[i - 1, b] = e[i, b]
    for b in range(B):
        e[n - 1, b] = 0.0
    f = np.zeros(B)
    tst1 = np.zeros(B)
    m = np.zeros(B, dtype=np.int64)
    run = np.zeros(B, dtype=np.bool_)
    p = np.empty(B)
    c = np.empty(B)
    c2 = np.empty(B)
    c3 = np.empty(B)
    s = np.empty(B)
    s2 = np.empty(B)
    el1 = np.empty(B)
    dl1 = np.empty(B)
    hs = np.empty(B)
    for l in range(n):
        top = l
        for b in range(B):
            tst1[b] = max(tst1[b], abs(d[l, b]) + abs(e[l, b]))
            mb = l
            while mb < n - 1 and abs(e[mb, b]) > _EPS * tst1[b]:
                mb += 1
            m[b] = mb
            run[b] = mb > l
            top = max(top, mb)
        it = 0
        while top > l:
            it += 1
            for b in range(B):  # implicit shift
                hs[b] = 0.0
                if run[b]:
                    g = d[l, b]
                    pb = (d[l + 1, b] - g) / (2.0 * e[l, b])
                    r = np.sqrt(pb * pb + 1.0)
                    r = -r if pb < 0.0 else r
                    d[l, b] = e[l, b] / (pb + r)
                    d[l + 1, b] = e[l, b] * (pb + r)
                    dl1[b] = d[l + 1, b]
                    hs[b] = g - d[l, b]
                    f[b] += hs[b]
                    el1[b] = e[l + 1, b]
            for i in range(l + 2, n):  # the shift, row by row over the lanes (− 0 elsewhere)
                for b in range(B):
                    d[i, b] -= hs[b]
            for b in range(B):
                if run[b]:
                    p[b] = d[m[b], b]
                c[b] = 1.0
                c2[b] = 1.0
                c3[b] = 1.0
                s[b] = 0.0
                s2[b] = 0.0
            for i in range(top - 1, l - 1, -1):
                for b in range(B):  # branch-free: a select per lane, so it vectorizes
                    act = run[b] and i < m[b]
                    ei, di, cb, pb = e[i, b], d[i, b], c[b], p[b]
                    g = cb * ei
                    h = cb * pb
                    r = np.sqrt(pb * pb + ei * ei)
                    rs = r if act else 1.0
                    sn = ei / rs
                    cn = pb / rs
                    e[i + 1, b] = s[b] * r if act else e[i + 1, b]
                    d[i + 1, b] = h + sn * (cn * g + sn * di) if act else d[i + 1, b]
                    p[b] = cn * di - sn * g if act else pb
                    c3[b] = c2[b] if act else c3[b]
                    c2[b] = cb if act else c2[b]
                    s2[b] = s[b] if act else s2[b]
                    c[b] = cn if act else cb
                    s[b] = sn if act else s[b]
            top = l
            for b in range(B):
                if run[b]:
                    pb = -s[b] * s2[b] * c3[b] * el1[b] * e[l, b] / dl1[b]
                    e[l, b] = s[b] * pb
                    d[l, b] = c[b] * pb
                    # converged to eigenvalue accuracy: dropping e_l moves the
                    # eigenvalue by about e_l² / |d_l − d_l+1| (the vectors pass redoes
                    # the rare one whose shift this makes imperfect)
                    el2 = e[l, b] * e[l, b]
                    run[b] = abs(e[l, b]) > _EPS * tst1[b] and el2 > _EPS * tst1[b] * abs(
                        d[l, b] - d[l + 1, b]
                    )
                    if run[b] and it >= _MAX_ITER:
                        run[b] = False
                        ok[b] = False
                    if run[b]:
                        top = max(top, m[b])
        for b in range(B):
            d[l, b] = d[l, b] + f[b]
            e[l, b] = 0.0


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _nearest_unused(mu, used, x, best, dist, jbest):  # pragma: no cover - compiled
    """Per lane, the first unused ``mu[j]`` nearest to ``x`` (into ``best``, its j into ``jbest``).

    Row by row over the lanes, so that it vectorizes; a lane without an
    unused eigenvalue keeps ``best = x``, ``jbest = 0``.
    """
    n, B = mu.shape
    for b in range(B):
        best[b] = x[b]
        dist[b] = np.inf
        jbest[b] = 0
    for j in range(n):
        for b in range(B):
            dj = abs(mu[j, b] - x[b])
            closer = not used[j, b] and dj < dist[b]
            best[b] = mu[j, b] if closer else best[b]
            jbest[b] = j if closer else jbest[b]
            dist[b] = dj if closer else dist[b]


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _ql_vectors(Vt, d, e, mu, ok):  # pragma: no cover - compiled
    """Implicit QL with eigenvectors, shifted by the known eigenvalues ``mu``; in place.

    Why two passes: rotating the vectors is most of the cost (6n flops per
    rotation), and in lockstep every lane pays for the slowest lane's
    iterations (Wilkinson shifts: about 3.3 sweeps per eigenvalue for a
    block of 32 matrices). With the eigenvalues known (:func:`_tql2`,
    cheap without vectors) the first sweep at ``l`` is shifted by the
    unused eigenvalue nearest to the Wilkinson shift ("perfect shift"): it
    deflates in one sweep, to rounding: ``|e_l|`` ends between 1 and some 50
    ``eps ‖T‖``, so the deflation test after that sweep is
    ``|e_l| ≤`` :data:`_PERFECT_TOL` ``· eps ‖T‖`` (the plain ``eps ‖T‖`` made a
    third of them, and so nearly every block, pay a second sweep). Dropping
    ``e_l`` perturbs T by that much, the order of the sweep's own rounding:
    the root ``A^{-1/2}`` moves by at most ``½ |e_l| / λ_min`` relative, 1e-14
    times ``‖A‖/λ_min``. A lane above it (about 1 in 100) gets a second,
    Wilkinson-shifted sweep. Numerical Recipes' ``tqli`` formulation, in which
    the shift enters only as ``d[m] − σ`` (JAMA's is tied to the Wilkinson
    shift). ``Vt[j, k, b]`` is row k of column j: the two columns a
    rotation mixes are contiguous, so the update vectorizes over the lanes.
    A lane that meets ``r = 0`` (an underflow the scaling makes all but
    impossible) or does not converge has ``ok`` cleared and is redone by
    the caller. Over 80 lines for the reason given in :func:`_tred2`.
    """
    n, B = d.shape
    for i in range(1, n):
        for b in range(B):
            e[i - 1, b] = e[i, b]
    for b in range(B):
        e[n - 1, b] = 0.0
    tst1 = np.zeros(B)
    m = np.zeros(B, dtype=np.int64)
    run = np.zeros(B, dtype=np.bool_)
    used = np.zeros((n, B), dtype=np.bool_)
    g = np.empty(B)
    s = np.empty(B)
    c = np.empty(B)
    p = np.empty(B)
    cv = np.empty(B)
    sv = np.empty(B)
    shift = np.empty(B)
    best = np.empty(B)
    dist = np.empty(B)
    jbest = np.empty(B, dtype=np.int64)
    for l in range(n):
        it = 0
        while True:
            top = l
            for b in range(B):
                tst1[b] = max(tst1[b], abs(d[l, b]) + abs(e[l, b]))
                mb = l
                while mb < n - 1 and abs(e[mb, b]) > _EPS * tst1[b]:
                    mb += 1
                m[b] = mb
                run[b] = mb > l and ok[b]
                if run[b]:
                    top = max(top, mb)
            if top == l:
                break
            it += 1
            for b in range(B):  # Wilkinson's shift
                shift[b] = 0.0
                if run[b]:
                    gb = (d[l + 1, b] - d[l, b]) / (2.0 * e[l, b])
                    r = np.sqrt(gb * gb + 1.0)
                    shift[b] = d[l, b] - e[l, b] / (gb + (r if gb >= 0.0 else -r))
            if it == 1:  # the unused eigenvalue nearest to it (row by row over the lanes)
                _nearest_unused(mu, used, shift, best, dist, jbest)
                for b in range(B):
                    shift[b] = best[b]
            for b in range(B):
                if run[b]:
                    g[b] = d[m[b], b] - shift[b]
                s[b] = 1.0
                c[b] = 1.0
                p[b] = 0.0
            for i in range(top - 1, l - 1, -1):
                for b in range(B):  # branch-free: a select per lane, so it vectorizes
                    act = run[b] and i < m[b]
                    ei, gb, pb = e[i, b], g[b], p[b]
                    f = s[b] * ei
                    bb = c[b] * ei
                    r = np.sqrt(f * f + gb * gb)
                    rs = r if (act and r != 0.0) else 1.0
                    sn = f / rs
                    cn = gb / rs
                    gg = d[i + 1, b] - pb
                    rr = (d[i, b] - gg) * sn + 2.0 * cn * bb
                    pn = sn * rr
                    e[i + 1, b] = r if act else e[i + 1, b]
                    d[i + 1, b] = gg + pn if act else d[i + 1, b]
                    p[b] = pn if act else pb
                    g[b] = cn * rr - bb if act else gb
                    s[b] = sn if act else s[b]
                    c[b] = cn if act else c[b]
                    cv[b] = cn if act else 1.0
                    sv[b] = sn if act else 0.0
                    if act and r == 0.0:
                        ok[b] = False
                _rotate(Vt[i], Vt[i + 1], cv, sv)
            for b in range(B):
                if run[b]:
                    d[l, b] -= p[b]
                    e[l, b] = g[b]
                    e[m[b], b] = 0.0
                    if it == 1 and abs(g[b]) <= _PERFECT_TOL * _EPS * tst1[b]:
                        e[l, b] = 0.0  # deflated by the perfect shift, to rounding
                    if it >= _MAX_ITER:
                        ok[b] = False
        _nearest_unused(mu, used, d[l], best, dist, jbest)
        for b in range(B):  # the eigenvalue found at l is no longer a shift
            used[jbest[b], b] = True


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
        nb = min(lanes, P - b0)
        for b in range(lanes):
            okb[b] = True
            if b < nb:  # power-of-2 scale: exact, entries of order one
                big = 0.0
                for i in range(n):
                    for j in range(n):
                        x = abs(A[b0 + b, i, j] + (shift[b0 + b] if i == j else 0.0))
                        big = max(big, x)
                scale[b] = 1.0 if big == 0.0 or not np.isfinite(big) else 2.0 ** (
                    -np.ceil(np.log2(big))
                )
        for i in range(n):
            for j in range(n):
                for b in range(lanes):
                    if b < nb:
                        x = A[b0 + b, i, j] + (shift[b0 + b] if i == j else 0.0)
                        V[i, j, b] = x * scale[b]
                    else:  # padding lanes: the identity converges at once
                        V[i, j, b] = 1.0 if i == j else 0.0
        _tred2(V, d, e, h)
        for i in range(n):
            for j in range(n):
                for b in range(lanes):
                    Vt[j, i, b] = V[i, j, b]
        mu[:] = d
        e2[:] = e
        _tql2(mu, e2, okb)
        _ql_vectors(Vt, d, e, mu, okb)
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
