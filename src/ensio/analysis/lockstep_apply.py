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
from .lockstep_ql import _EPS, _MAX_ITER, LANES, _rotate, shift_subdiagonal

__all__ = ["ROTATION_ROOM", "sqrt_apply_stack"]

#: Room for recorded QL rotations per block, in units of order²: about 1.2 n²
#: are needed (measured, orders 10–255, Wishart and graded spectra); a block
#: that needs more is redone by LAPACK.
ROTATION_ROOM = 2


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
def _ql_apply(W, d, e, ok, rec_i, rec_c, rec_s, nrec):  # pragma: no cover - compiled
    """Implicit QL (Wilkinson shifts) of the lanes ``(d, e)``, rotating the vectors ``W``.

    On return ``d`` holds the eigenvalues, ``W`` (n, m, B) is ``Zᵀ W`` and
    every rotation is recorded for :func:`_unrotate` (``rec_i[t]`` the pair
    it mixed, ``rec_c``/``rec_s`` its cosine and sine per lane, ``nrec[0]``
    their count). Why not the eigensolver's QL
    (:mod:`~ensio.analysis.lockstep_ql`): there every lane waits at each
    eigenvalue for the slowest lane of the block (about 3.7 sweeps per
    eigenvalue at 32 lanes where one lane needs 1.7); here each lane moves
    on to its next eigenvalue as soon as its current one has converged, so
    a block takes about as many sweeps as its slowest lane needs in all. A
    sweep runs from the highest split point of the lanes down to the lowest
    current eigenvalue, with identity rotations outside a lane's own range.
    ``e`` is the subdiagonal in ``e[1:]`` (``e[0]`` ignored). A lane that
    meets ``r = 0``, does not converge or runs out of room has ``ok``
    cleared (the caller redoes it). Numerical Recipes' ``tqli``
    formulation, as in :func:`~ensio.analysis.lockstep_ql.ql_vectors`.
    """
    n, B = d.shape
    shift_subdiagonal(e)
    tst1 = np.zeros(B)
    lo = np.zeros(B, dtype=np.int64)  # the eigenvalue each lane works on
    m = np.zeros(B, dtype=np.int64)
    it = np.zeros(B, dtype=np.int64)
    run = np.zeros(B, dtype=np.bool_)
    g = np.empty(B)
    s = np.empty(B)
    c = np.empty(B)
    p = np.empty(B)
    cv = np.empty(B)
    sv = np.empty(B)
    shift = np.empty(B)
    cap = rec_i.size
    nrec[0] = 0
    for b in range(B):
        tst1[b] = abs(d[0, b]) + abs(e[0, b])
    while True:
        top, bottom = 0, n
        for b in range(B):  # each lane: skip converged eigenvalues, find its split point
            run[b] = False
            if not ok[b]:
                continue
            while lo[b] < n:
                l = lo[b]
                mb = l
                while mb < n - 1 and abs(e[mb, b]) > _EPS * tst1[b]:
                    mb += 1
                if mb > l:
                    break
                lo[b] = l + 1
                it[b] = 0
                if l + 1 < n:
                    tst1[b] = max(tst1[b], abs(d[l + 1, b]) + abs(e[l + 1, b]))
            if lo[b] < n:
                m[b] = mb
                run[b] = True
                it[b] += 1
                if it[b] > _MAX_ITER:
                    ok[b] = False
                    run[b] = False
                    continue
                top = max(top, mb)
                bottom = min(bottom, lo[b])
        if top == 0:
            break
        for b in range(B):  # Wilkinson's shift at each lane's own eigenvalue
            g[b] = 0.0
            s[b] = 1.0
            c[b] = 1.0
            p[b] = 0.0
            if run[b]:
                l = lo[b]
                gb = (d[l + 1, b] - d[l, b]) / (2.0 * e[l, b])
                r = np.sqrt(gb * gb + 1.0)
                shift[b] = d[l, b] - e[l, b] / (gb + (r if gb >= 0.0 else -r))
                g[b] = d[m[b], b] - shift[b]
        for i in range(top - 1, bottom - 1, -1):
            for b in range(B):  # branch-free: a select per lane, so it vectorizes
                act = run[b] and i < m[b] and i >= lo[b]
                ei, gb, pb = e[i, b], g[b], p[b]
                f = s[b] * ei
                bb = c[b] * ei
                r = np.sqrt(f * f + gb * gb)
                rinv = 1.0 / (r if (act and r != 0.0) else 1.0)
                sn = f * rinv
                cn = gb * rinv
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
            _rotate(W[i], W[i + 1], cv, sv)
            t = nrec[0]
            if t < cap:
                rec_i[t] = i
                for b in range(B):
                    rec_c[t, b] = cv[b]
                    rec_s[t, b] = sv[b]
                nrec[0] = t + 1
            else:
                for b in range(B):
                    ok[b] = False
        for b in range(B):
            if run[b]:
                l = lo[b]
                d[l, b] -= p[b]
                e[l, b] = g[b]
                e[m[b], b] = 0.0


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _unrotate(W, rec_i, rec_c, rec_s, count):  # pragma: no cover - compiled
    """``W ← Z W`` per lane: the recorded rotations, last first, each transposed.

    A rotation transposed is the same rotation with its sine negated.
    """
    B = W.shape[2]
    minus_s = np.empty(B)
    for t in range(count - 1, -1, -1):
        for b in range(B):
            minus_s[b] = -rec_s[t, b]
        i = rec_i[t]
        _rotate(W[i], W[i + 1], rec_c[t], minus_s)


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def _solve_apply(A, shift, X, kk, s0, n_inv, lam, Y, ok, lanes, cap):  # pragma: no cover - compiled
    """All blocks of ``lanes`` matrices: load, reduce, ``Qᵀ``, QL, ``f(Λ)``, Z, Q, store.

    ``cap``: room for this many recorded rotations per block.
    """
    P, n, m = A.shape[0], A.shape[1], X.shape[2]
    V = np.empty((n, n, lanes))
    W = np.empty((n, m, lanes))
    d = np.empty((n, lanes))
    e = np.empty((n, lanes))
    mu = np.empty((n, lanes))
    scale = np.empty(lanes)
    okb = np.empty(lanes, dtype=np.bool_)
    rec_i = np.empty(cap, dtype=np.int64)
    rec_c = np.empty((cap, lanes))
    rec_s = np.empty((cap, lanes))
    nrec = np.zeros(1, dtype=np.int64)
    for b0 in range(0, P, lanes):
        nb = load_block(A, shift, b0, V, scale, okb)
        _reduce(V, d, e)
        for i in range(n):  # the tridiagonal matrix: diagonal of V, subdiagonal e[1:]
            for b in range(lanes):
                mu[i, b] = V[i, i, b]
        for i in range(n):
            for j in range(m):
                for b in range(lanes):
                    W[i, j, b] = X[b0 + b, i, j] if b < nb else 0.0
        _reflect(V, d, W, True)
        _ql_apply(W, mu, e, okb, rec_i, rec_c, rec_s, nrec)
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
        Matrices per lockstep block (tuning only; halved when that leaves
        fewer padding lanes in the last block). The result does not depend
        on it: lanes never mix.

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
    if lanes == LANES and n > 64:
        lanes = LANES // 2  # a block of large matrices must still fit the L2 cache
    if (-p) % lanes >= lanes // 2 and lanes >= 16:
        lanes //= 2  # small tiles: half-width blocks waste fewer padding lanes
    ok = np.ones(p, dtype=np.bool_)
    cap = ROTATION_ROOM * n * n + 16 * n
    _solve_apply(A, sh, X, float(kk), s0, int(n_inv), lam, Y, ok, int(lanes), int(cap))
    if not ok.all():  # no convergence or too many rotations (not seen in practice): LAPACK
        bad = np.flatnonzero(~ok)
        lb, U = np.linalg.eigh(A[bad] + sh[bad, None, None] * np.eye(n))
        f = np.sqrt(kk / lb) - s0[bad, None]
        f = np.broadcast_to(f[:, :, None], (bad.size, n, m)).copy()
        f[:, :, :n_inv] = (1.0 / lb)[:, :, None]
        Y[bad] = U @ (f * (np.swapaxes(U, -1, -2) @ X[bad]))
        lam[bad] = lb
    return lam, Y
