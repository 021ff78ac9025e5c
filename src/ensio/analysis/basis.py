"""The reduced anomaly basis of the batched local analysis (ETKF/ESTKF).

Why: the batched kernel's cost after the GEMM is one symmetric q × q
eigendecomposition per grid point (q = k members, k−1 for the ESTKF), which
LAPACK does at a few GFLOP/s for q ≈ 40. Every point of a tile only sees
the tile's observed anomalies ``Y`` (q × c), so its matrices
``C = Y R_loc⁻¹ Yᵀ`` and right-hand sides ``Y R_loc⁻¹ d`` live in their
column span. When that span has r < q dimensions — always r ≤ k−1 for the
ETKF because anomalies sum to zero over the members, and r ≪ k for a
degenerate ensemble (members differing in a few modes) or a tile with fewer
observations than members — the whole analysis of the tile is done in an
orthonormal basis of it: an r(r+1)/2-wide GEMM, one r × r
eigendecomposition per point, and transforms kept as factors of size k × r
that are applied to the rows directly. This is exact (the basis is accepted
only when ``Y`` lies in it to rounding, :func:`anomaly_basis`), not a
low-rank approximation; the pointwise reference does not use it.

Pure functions on numpy arrays: no MPI, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .transforms import Eigh, eig_analysis

__all__ = [
    "FactoredTransform",
    "anomaly_basis",
    "expand",
    "prior_transform",
    "sqrt_factors_in_basis",
]


def anomaly_basis(
    Y: np.ndarray, tol: float = 1e-14, max_rank: int | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Orthonormal basis of the column span of ``Y`` when it is smaller than ``q``.

    The local matrices ``C = Y R_loc⁻¹ Yᵀ`` of every point of a tile and
    their right-hand sides ``Y R_loc⁻¹ d`` live in the span of the tile's
    observed anomalies ``Y`` (q × c). Anomalies sum to zero over the
    members, so that span has at most k−1 dimensions, and it has fewer when
    the ensemble is degenerate (members that differ by a few modes, or
    fewer observations than members). In an orthonormal basis ``Q`` (q × r)
    of it, every point's eigenproblem is r × r instead of q × q
    (:func:`sqrt_factors_in_basis`), which is exact, not an approximation:
    the basis is accepted only if ``‖Y − Q QᵀY‖_F ≤ tol ‖Y‖_F``, i.e. the part
    of ``Y`` outside it is at the level of the rounding errors ``Y`` already
    carries (``tol`` = 1e-14 is some 50 units of rounding). Leaving it out
    changes each ``C`` by at most about ``2 tol ‖Y‖₂² max R_loc⁻¹``, so the
    analysis changes by ``tol`` times the ratio of the largest observation
    precision to the prior precision ``(k−1)ρ`` of the point: far below the
    1e-10 to which the batched and pointwise kernels must agree.

    The basis comes from the eigenvectors of the Gram matrix ``Y Yᵀ`` with
    eigenvalues above ``1e-12`` of the largest (one q × q eigendecomposition
    per tile); the residual test then checks it directly, so a badly
    resolved spectrum can only make the function return ``None``.

    Parameters
    ----------
    Y : ndarray, shape (q, c)
    tol : float
        Largest accepted relative Frobenius norm of the residual.
    max_rank : int, optional
        Largest basis of use to the caller (default ``q − 1``).

    Returns
    -------
    (Q, QᵀY) : ndarray, shape (q, r), and ndarray, shape (r, c); or None
        ``None`` when no basis of at most ``max_rank`` dimensions passes the test.
    """
    q, c = Y.shape
    most = q - 1 if max_rank is None else min(max_rank, q - 1)
    if c > 4 * q and _surely_full(Y, most):
        return None
    gram = Y @ Y.T
    # the eigenvalues alone first: on locally full-rank ensembles (the usual
    # case) the answer is None, and the vectors would cost twice as much
    r = _rank(np.linalg.eigvalsh(gram))
    if r is not None and r <= most:
        lam, E = np.linalg.eigh(gram)
        r = _rank(lam)  # counted again on the eigenvalues that go with E
    if r is None:
        return np.empty((q, 0)), np.empty((0, c))
    if r > most:
        return None
    Q = np.ascontiguousarray(E[:, q - r :])
    coords = Q.T @ Y
    resid = Q @ coords
    np.subtract(Y, resid, out=resid)
    flat, yflat = resid.ravel(), Y.reshape(-1)
    if np.dot(flat, flat) > tol**2 * np.dot(yflat, yflat):
        return None
    return Q, coords


def _rank(lam: np.ndarray) -> int | None:
    """Eigenvalues (ascending) above ``1e-12`` of the largest; None if none is positive."""
    top = lam[-1] if lam.size else 0.0
    return int(np.count_nonzero(lam > 1e-12 * top)) if top > 0.0 else None


def _surely_full(Y: np.ndarray, most: int) -> bool:
    """Whether some ``2q`` columns of ``Y`` (q, c) already prove a span above ``most``.

    Why: on locally full-rank ensembles every tile asks, and the Gram
    matrix of all its candidates costs more than the answer needs. Adding
    columns adds a positive semidefinite matrix to the Gram matrix, so each
    of its eigenvalues can only grow (Weyl), while the largest stays below
    the trace ``‖Y‖²_F``. More than ``most`` eigenvalues of the subset above
    ``1e-12 ‖Y‖²_F`` therefore mean more than ``most`` of the whole above
    ``1e-12 λ_max``: the full test would return None too.
    """
    q = Y.shape[0]
    head = Y[:, :: max(1, Y.shape[1] // (2 * q))]  # spread over the candidates
    lam = np.linalg.eigvalsh(head @ head.T)
    flat = Y.reshape(-1)
    return int(np.count_nonzero(lam > 1e-12 * np.dot(flat, flat))) > most


@dataclass(frozen=True, eq=False)
class FactoredTransform:
    """Member-space transforms of p points kept as factors, not k × k matrices.

    ``G_i = s0_i P_i + M_i diag(D_i) M_iᵀ + w̄_i 1ᵀ`` with ``P_i = I − 11ᵀ/k``
    where ``centred_i`` (the ESTKF's ``T Tᵀ``) and ``I`` otherwise. Applying
    it to a row of anomalies costs O(k r) instead of the O(k³) of forming
    ``G_i`` (r is the size of the tile's anomaly basis).

    Attributes
    ----------
    s0 : ndarray, shape (p,)
    M : ndarray, shape (p, k, r)
    D : ndarray, shape (p, r)
    wbar : ndarray, shape (p, k)
    centred : ndarray of bool, shape (p,)
    """

    s0: np.ndarray
    M: np.ndarray
    D: np.ndarray
    wbar: np.ndarray
    centred: np.ndarray

    def dense(self) -> np.ndarray:
        """The transforms as matrices, shape (p, k, k)."""
        p, k, _ = self.M.shape
        G = np.empty((p, k, k))
        G[:] = np.eye(k)
        G[self.centred] -= 1.0 / k
        G *= self.s0[:, None, None]
        G += (self.M * self.D[:, None, :]) @ np.swapaxes(self.M, -1, -2)
        G += self.wbar[:, :, None]
        return G

    def apply(self, Xr: np.ndarray) -> np.ndarray:
        """``x'ᵀ G_i`` for one row of anomalies per point: ``Xr`` (p, k) → (p, k)."""
        t = (Xr[:, None, :] @ self.M)[:, 0, :]  # (p, r)
        t *= self.D
        out = (t[:, None, :] @ np.swapaxes(self.M, -1, -2))[:, 0, :]
        out += Xr * self.s0[:, None]
        shift = np.einsum("pk,pk->p", Xr, self.wbar)
        if self.centred.any():
            shift -= np.where(self.centred, self.s0 * Xr.mean(axis=1), 0.0)
        out += shift[:, None]
        return out

    def repeat(self, counts: np.ndarray) -> FactoredTransform:
        """Point i repeated ``counts[i]`` times (one entry per row)."""
        return FactoredTransform(
            *(
                np.repeat(a, counts, axis=0)
                for a in (self.s0, self.M, self.D, self.wbar, self.centred)
            )
        )


def sqrt_factors_in_basis(
    B: np.ndarray,
    br: np.ndarray,
    forget: np.ndarray | float,
    k: int,
    Qk: np.ndarray | None,
    centred: bool = False,
    eigh: Eigh | None = None,
) -> FactoredTransform:
    """ETKF/ESTKF transforms from ensemble-space sums in an orthonormal basis.

    With ``C = Q B Qᵀ``, ``b = Q b_r`` (Q orthonormal, q × r, see
    :func:`anomaly_basis`) and ``α = (k−1)ρ``, the matrix ``A = αI + C`` has
    eigenvectors ``Q V`` with eigenvalues ``α + λ_B`` (``B = V Λ_B Vᵀ``) and
    the eigenvalue α on the rest of the space, so exactly

    ``W = [(k−1)A⁻¹]^{1/2} = s₀ I + QV diag(s − s₀) VᵀQᵀ``,
    ``s = sqrt((k−1)/(α + λ_B))``, ``s₀ = 1/√ρ``, and ``w̄ = A⁻¹b = QV (α+Λ_B)⁻¹ Vᵀ b_r``:

    one r × r eigendecomposition per point instead of q × q. Mapped to
    member space as in :func:`transform_from_weights`: ETKF ``Qk = Q``;
    ESTKF ``Qk = T Q`` and ``centred`` (``T I Tᵀ = I − 11ᵀ/k``).

    With the whole space as the basis (``Q = I``: full-rank anomalies) this
    is the plain square-root transform kept as factors, ``W = U diag(s) Uᵀ``:
    applied to a row in O(k q) instead of forming the k × k matrix
    (``Qk = None`` for the ETKF, ``T`` for the ESTKF).

    Parameters
    ----------
    B : ndarray, shape (p, r, r)
        ``Qᵀ C Q`` per point.
    br : ndarray, shape (p, r)
        ``Qᵀ b`` per point.
    forget : float or ndarray, shape (p,)
    k : int
    Qk : ndarray, shape (k, r), or None
        The basis in member space; None: the identity (r = k).
    centred : bool
        ESTKF (see above).
    eigh : callable, optional
        Eigensolver for stacks (:func:`~ensio.analysis.transforms.eig_analysis`).

    Returns
    -------
    FactoredTransform
    """
    p, r = br.shape
    rho = np.broadcast_to(np.asarray(forget, dtype=float), (p,))
    s0 = 1.0 / np.sqrt(rho)
    flags = np.full(p, centred)
    if r == 0:
        return FactoredTransform(s0, np.zeros((p, k, 0)), np.zeros((p, 0)), np.zeros((p, k)), flags)
    lam, V = eig_analysis(B, rho, k, eigh)
    M = V if Qk is None else Qk @ V  # (p, k, r): eigenvectors of A in member space
    u = (np.swapaxes(V, -1, -2) @ br[..., None])[..., 0] / lam  # (p, r)
    wbar = (M @ u[..., None])[..., 0]  # (p, k)
    D = np.sqrt((k - 1) / lam) - s0[:, None]
    return FactoredTransform(s0, M, D, wbar, flags)


def expand(f: FactoredTransform, has: np.ndarray, rho: np.ndarray) -> FactoredTransform:
    """Factors of p points from those of the points ``has``; the others get ``I/√ρ``.

    Parameters
    ----------
    f : FactoredTransform
        For the ``has.sum()`` points with observations.
    has : ndarray of bool, shape (p,)
    rho : ndarray, shape (p,)
        Forgetting factor of every point (the prior of a point without
        observations is inflated to ``x̄ + X'/√ρ``).
    """
    p, (k, r) = has.size, f.M.shape[1:]
    M, D, wbar = np.zeros((p, k, r)), np.zeros((p, r)), np.zeros((p, k))
    M[has], D[has], wbar[has] = f.M, f.D, f.wbar
    centred = np.zeros(p, dtype=bool)
    centred[has] = f.centred
    return FactoredTransform(1.0 / np.sqrt(rho), M, D, wbar, centred)


def prior_transform(rho: np.ndarray, k: int) -> FactoredTransform:
    """``I/√ρ`` for points without observations, as factors."""
    p = rho.size
    return FactoredTransform(
        1.0 / np.sqrt(rho),
        np.zeros((p, k, 0)),
        np.zeros((p, 0)),
        np.zeros((p, k)),
        np.zeros(p, dtype=bool),
    )
