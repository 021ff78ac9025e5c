"""Square-root transforms deferred until the rows they apply to are known.

Why: a point's transform ``G = s0 P + M diag(D) Mᵀ + w̄ 1ᵀ``
(:class:`~ensio.analysis.basis.FactoredTransform`) needs the eigenvectors of
the point's ensemble-space matrix ``A``, O(n³) per point. A point with few
state rows (one level of one variable; a 3-D point under vertical
localization) only needs ``G`` applied to those rows, and
``xᵀG = s0 xᵀP + (f(A) t)ᵀ Qkᵀ + (t · A⁻¹b) 1ᵀ`` with ``t = Qkᵀ x`` needs
``f(A) = [(k−1)A⁻¹]^{1/2} − s0`` and ``A⁻¹`` applied to a few vectors only:
O(n²) per vector without eigenvectors
(:func:`~ensio.analysis.lockstep_apply.sqrt_apply_stack`). Points with more
rows than :data:`VECTOR_MAX_ROWS` get the factored transform as before, so
the choice is per point and depends only on its own rows. Both are exact;
they agree to rounding.

Pure functions on numpy arrays: no MPI, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..stopwatch import Stopwatch
from .basis import FactoredTransform, expand, sqrt_factors_in_basis
from .transforms import Eigh

__all__ = ["VECTOR_MAX_ORDER", "VECTOR_MAX_ROWS", "DeferredTransform"]

#: Largest order whose transforms are applied to few rows as vectors (N_e ≤
#: 129). Measured, one core: 270 µs per matrix at order 99 against 850 µs for
#: LAPACK with eigenvectors, 3.4 ms against 5.2 ms at 255; the recorded rotations
#: grow as order² × lanes, so larger ones keep the eigenvectors.
VECTOR_MAX_ORDER = 128

#: Most rows a point may have for its transform to be applied as vectors
#: (:mod:`~ensio.analysis.lockstep_apply`); above it the eigenvectors are
#: formed. Measured on 40 × 40 matrices (one core, µs per point, vectors
#: against eigenvectors): 46/66 at 8 rows, 65/81 at 16, 85/92 at 24, 104/107
#: at 32. The vectors cost O(n²) each and the eigenvectors O(n³), so the
#: crossing moves with the order (about half as many rows at N_e = 20); 16 is
#: below it from N_e = 20 on. (It was 8 while every tile copied its sums
#: before applying them, about 20 µs per point of fresh memory.)
VECTOR_MAX_ROWS = 16


@dataclass(frozen=True, eq=False)
class DeferredTransform:
    """Square-root transforms of p points from their sums, applied when the rows come.

    ``B`` (p_h, r, r) and ``br`` (p_h, r) are the sums of the points
    ``has`` (those with observations), in the basis ``Qk`` (k × r; None:
    the members themselves); ``rho`` (p,) the forgetting factors of all p
    points, ``centred`` the ESTKF's projection. ``sw``: the time spent here
    is the ``transform`` phase.
    """

    B: np.ndarray
    br: np.ndarray
    rho: np.ndarray
    has: np.ndarray
    k: int
    Qk: np.ndarray | None
    centred: bool
    eigh: Eigh | None
    sw: Stopwatch

    def factored(self) -> FactoredTransform:
        """The transforms as factors (eigenvectors formed), for callers that need ``G`` itself."""
        self.sw.lap("update")
        f = sqrt_factors_in_basis(
            self.B, self.br, self.rho[self.has], self.k, self.Qk, centred=self.centred,
            eigh=self.eigh,
        )  # fmt: skip
        if not self.has.all():
            f = expand(f, self.has, self.rho)
        self.sw.lap("transform")
        return f

    def apply_rows(
        self, Xr: np.ndarray, counts: np.ndarray, vector_rows: int = VECTOR_MAX_ROWS
    ) -> np.ndarray:
        """``x'ᵀ G_i`` for the rows of every point: ``Xr`` (rows, k) → (rows, k).

        ``Xr`` holds the rows point by point, ``counts[i]`` of point i (0: none,
        nothing is computed for that point). Points with at most ``vector_rows``
        rows take the vectors (weight interpolation's coarse nodes set their own
        bound, :func:`~ensio.analysis.winterp_bands.vectors_route`).
        """
        self.sw.lap("update")
        p = self.rho.size
        s0 = 1.0 / np.sqrt(self.rho)
        point = np.repeat(np.arange(p), counts)
        out = Xr * s0[point, None]
        if self.centred:  # the ESTKF's s0 (I − 11ᵀ/k) at points with observations
            on = self.has[point]
            out[on] -= (s0[point[on]] * Xr[on].mean(axis=1))[:, None]
        hp = np.flatnonzero(self.has)  # point of each row of B
        slot = np.full(p, -1)
        slot[hp] = np.arange(hp.size)
        few = (counts[hp] <= vector_rows) & (self.B.shape[-1] <= VECTOR_MAX_ORDER)
        some = counts[hp] > 0
        t = Xr if self.Qk is None else Xr @ self.Qk  # (rows, r)
        for sel, vectors in ((few & some, True), (~few & some, False)):
            if not sel.any():
                continue
            pts = hp[sel]
            mine: slice | np.ndarray
            if pts.size == p:  # every point (the usual case): all rows, no search or copy
                mine, i = slice(None), point
            else:
                mine = np.flatnonzero(np.isin(point, pts))  # rows of these points, in order
                i = slot[point[mine]]
            part = self._by_vectors if vectors else self._by_factors
            out[mine] += part(pts, i, t[mine], counts, s0)
        self.sw.lap("transform")
        return out

    def _sums(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``B`` and ``br`` of the points in ``slots`` (ascending): no copy when that is all.

        Why: a gathered copy of a tile's ``B`` is fresh memory on every tile, and
        its page faults cost more than the gather (measured: 1–2 ms a tile of 256).
        """
        if slots.size == self.B.shape[0]:
            return self.B, self.br
        return self.B[slots], self.br[slots]

    def _by_vectors(self, pts, i, t, counts, s0) -> np.ndarray:
        """Rows' parts beyond ``s0 x'`` through ``f(A)`` applied to vectors."""
        from .lockstep_apply import sqrt_apply_stack

        lam_s = (self.k - 1) * self.rho[pts]
        if np.all(counts[pts] == 1):  # one row per point
            B, br = self._sums(i)
            X = np.stack([br, t], axis=2)
            _, Y = sqrt_apply_stack(B, lam_s, X, self.k - 1.0, s0[pts], 1)
            ft, z0 = Y[:, :, 1], Y[:, :, 0]
        else:
            first, which, col = _row_slots(counts[pts])
            B, br = self._sums(i[first])
            X = np.zeros((pts.size, t.shape[1], 1 + int(col.max())))
            X[:, :, 0] = br
            X[which, :, col] = t
            _, Y = sqrt_apply_stack(B, lam_s, X, self.k - 1.0, s0[pts], 1)
            ft, z0 = Y[which, :, col], Y[which, :, 0]  # (rows, r): f(A) t, A⁻¹b
        part = ft if self.Qk is None else ft @ self.Qk.T
        part += np.einsum("ij,ij->i", t, z0)[:, None]
        return part

    def _by_factors(self, pts, i, t, counts, s0) -> np.ndarray:
        """Rows' parts beyond ``s0 x'`` through the eigenvectors, point by point.

        The rows of a point are stacked (padded with zeros) and multiplied by
        its eigenvectors once, so no per-row copy of an r × r matrix is made.
        """
        first, which, col = _row_slots(counts[pts])
        B, br = self._sums(i[first])
        f = sqrt_factors_in_basis(B, br, self.rho[pts], self.k, None, eigh=self.eigh)
        # in the basis: M = V, wbar = V Λ⁻¹ Vᵀ br
        T3 = np.zeros((pts.size, int(col.max()), t.shape[1]))
        T3[which, col - 1] = t
        tv = (T3 @ f.M) * f.D[:, None, :]
        ft = (tv @ np.swapaxes(f.M, 1, 2))[which, col - 1]
        part = ft if self.Qk is None else ft @ self.Qk.T
        part += np.einsum("ij,ij->i", t, f.wbar[which])[:, None]
        return part


def _row_slots(rows_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For points with ``rows_of`` rows each, stored point by point: each point's first
    row, each row's point and each row's 1-based place within its point."""
    first = np.concatenate([[0], np.cumsum(rows_of)[:-1]])
    which = np.repeat(np.arange(rows_of.size), rows_of)
    return first, which, 1 + np.arange(which.size) - first[which]
