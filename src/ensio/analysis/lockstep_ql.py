"""The QL steps of the lockstep eigensolver (:mod:`~ensio.analysis.eigensolver`).

Why a module of their own: the eigenvalue pass (:func:`tql2`) and the
vector pass (:func:`ql_vectors`) are two long lockstep kernels that belong
together (the second is shifted by the eigenvalues of the first), and the
solver's module holds the tridiagonalization and the stack handling. Both
work on tridiagonal lanes ``(d, e)`` of shape (n, B), lane index innermost,
so every inner loop runs over the lanes and vectorizes; the conventions
(masks, identity rotations, ``ok`` flags) are those of the solver's module.

Compiled with numba (cached on disk); pure functions on numpy arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["LANES", "ql_vectors", "shift_subdiagonal", "tql2"]

#: Matrices solved in lockstep (measured on 40 × 40: 16 is 10 % slower, 64
#: no faster); a block of 40 × 40 matrices is 400 kB, two arrays fit in L2.
LANES = 32
_EPS = 2.0**-52
#: QL iterations per eigenvalue before giving up (LAPACK allows 30).
_MAX_ITER = 60
#: A perfect-shift sweep deflates when ``|e_l| ≤ _PERFECT_TOL · eps · ‖T‖`` (see
#: :func:`ql_vectors`). 64 saved second sweeps, but it moves A^{-1/2} by up to
#: 32 eps ‖A‖/λ_min relative: above 1e-10 once ‖A‖/λ_min passes ~1e4 (many
#: accurate observations do that), and a graded-spectrum test caught it. With
#: the other changes of this solver the speed difference measured ~1 %.
_PERFECT_TOL = 1.0


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


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def shift_subdiagonal(e):  # pragma: no cover - compiled
    """Lanes ``e`` (n, B) from ``e[1:]`` holding the subdiagonal to ``e[:n-1]`` (``e[n-1] = 0``).

    The QL passes index the subdiagonal from 0 (Numerical Recipes' and JAMA's
    ``tql2`` convention); the tridiagonalization leaves it from 1.
    """
    n, B = e.shape
    for i in range(1, n):
        for b in range(B):
            e[i - 1, b] = e[i, b]
    for b in range(B):
        e[n - 1, b] = 0.0


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def tql2(d, e, ok):  # pragma: no cover - compiled
    """Eigenvalues of the tridiagonal lanes ``(d, e)`` by implicit QL, in place (into ``d``).

    JAMA's ``tql2`` without the vectors, in lockstep: at eigenvalue ``l`` every lane that has not
    converged iterates; the sweep runs from the largest split point ``m`` of
    the lanes down to ``l``, with identity rotations where ``i ≥ m`` of a
    lane or for lanes that are done. ``ok[b]`` is cleared for a lane that
    did not converge in :data:`_MAX_ITER` iterations (the caller redoes it).
    Entries must be of order one or less (the caller scales by a power of 2)
    so that ``sqrt(p² + e²)`` neither overflows nor underflows. The values
    only serve as shifts for :func:`ql_vectors`, so an eigenvalue counts as
    converged when ``e_l² ≤ eps ‖T‖ |d_l − d_l+1|`` (dropping ``e_l`` moves it
    by about ``e_l² / gap``), besides the usual ``|e_l| ≤ eps ‖T‖``; a shift
    made imperfect by that costs a second vector sweep, not accuracy. Over 80
    lines for the reason given in :func:`~ensio.analysis.eigensolver._tred2`.
    """
    n, B = d.shape
    shift_subdiagonal(e)
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
def ql_vectors(Vt, d, e, mu, ok):  # pragma: no cover - compiled
    """Implicit QL with eigenvectors, shifted by the known eigenvalues ``mu``; in place.

    Why two passes: rotating the vectors is most of the cost (6n flops per
    rotation), and in lockstep every lane pays for the slowest lane's
    iterations (Wilkinson shifts: about 3.3 sweeps per eigenvalue for a
    block of 32 matrices). With the eigenvalues known (:func:`tql2`,
    cheap without vectors) the first sweep at ``l`` is shifted by the
    unused eigenvalue nearest to the Wilkinson shift ("perfect shift"): it
    deflates in one sweep, to rounding: ``|e_l|`` ends between 1 and some 50
    ``eps ‖T‖``; the deflation test after that sweep is
    ``|e_l| ≤`` :data:`_PERFECT_TOL` ``· eps ‖T‖``, and a lane above it gets a
    second, Wilkinson-shifted sweep. Dropping ``e_l`` perturbs T by that much:
    the root ``A^{-1/2}`` moves by at most ``½ |e_l| / λ_min`` relative, which
    is why the tolerance is the plain ``eps ‖T‖`` (see :data:`_PERFECT_TOL`).
    Numerical Recipes' ``tqli`` formulation, in which
    the shift enters only as ``d[m] − σ`` (JAMA's is tied to the Wilkinson
    shift). ``Vt[j, k, b]`` is row k of column j: the two columns a
    rotation mixes are contiguous, so the update vectorizes over the lanes.
    A lane that meets ``r = 0`` (an underflow the scaling makes all but
    impossible) or does not converge has ``ok`` cleared and is redone by
    the caller. Over 80 lines for the reason given in
    :func:`~ensio.analysis.eigensolver._tred2`.
    """
    n, B = d.shape
    shift_subdiagonal(e)
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
