"""The batched local-analysis kernel: one GEMM per tile of analysis points.

For a tile of points (DESIGN.md, "Batched local analysis") the kernel forms

``S = W · Z``   — one dense GEMM,

with ``W`` (points × candidates) the taper divided by σ_o² and ``Z``
(candidates × columns) the packed outer products ``y_a y_b`` (a ≤ b) of the
observed anomalies, the right-hand-side products ``y_a D_s`` (the
variant's :meth:`~ensio.analysis.variants.Variant.innovations`: ``d`` for
the square-root filters, ``d + ε_j`` for every member j for the stochastic
one) and three diagnostic columns. Unpacking ``S`` gives ``C = Y R_loc⁻¹ Yᵀ``
and the right-hand sides of every point; one batched symmetric
eigendecomposition (the lockstep solver of :mod:`~ensio.analysis.eigensolver`)
then yields all transforms. For a
:attr:`~ensio.analysis.variants.Variant.reducible` (square-root) variant
the tile's sums wait for its rows
(:class:`~ensio.analysis.deferred.DeferredTransform`: applied to few rows as
vectors, else formed as factors once), and ``Y`` is first expressed in an
orthonormal basis of its span when that is smaller than the ensemble space
(:mod:`~ensio.analysis.basis`; exact): the GEMM and the eigenproblems shrink
to its size. Other variants get k × k
matrices from their finishing step.

Many candidates, large ensembles: the packed products grow as ``k²/2``
columns per candidate, so when a tile's packed Zᵀ would exceed
:data:`TILE_WORK_BYTES` it is built and multiplied in chunks of candidates
(observations at many levels of a column; N_e ≈ 100); when not even
:data:`MIN_CHUNK` candidates fit (k ≳ 180) the tile forms each point's ``C``
from its own observations instead (:meth:`Columns.direct`, the pointwise
reference's sums in one BLAS call of order k per point). Tiles hold at
most :func:`tile_point_cap` points so their k × k stacks stay within the
same budget, and eigenproblems above :data:`LOCKSTEP_MAX_ORDER` go to LAPACK.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import threadpool_limits

from ..stopwatch import Stopwatch
from .basis import FactoredTransform, anomaly_basis, prior_transform
from .deferred import DeferredTransform
from .localization import Localization, prepare
from .obsspace import ObsSpace
from .tiles import CandidateFinder, make_tiles, tile_weights
from .variants import Variant

__all__ = [
    "BASIS_TOLERANCE",
    "LOCKSTEP_MAX_ORDER",
    "MIN_CHUNK",
    "TILE_EXTENT",
    "TILE_WORK_BYTES",
    "Columns",
    "batched_kernel",
    "tile_point_cap",
]

#: A tile's largest extent, as a fraction of the support radius: small against
#: the radius, so a tile's candidates are not many more than one point's
#: (:func:`~ensio.analysis.tiles.make_tiles`). On the full grid the 128 points
#: of a tile span less than that anyway; callers with sparser points (the
#: coarse nodes of weight interpolation) pass a larger one.
TILE_EXTENT = 0.5

#: Largest per-tile work array of the products (the packed Zᵀ of the tile's
#: candidates, or the tile's q × q matrices): above it a tile forms its
#: matrices point by point (:meth:`Columns.direct`) and holds fewer points
#: (:func:`tile_point_cap`), so memory does not grow as k² × candidates.
TILE_WORK_BYTES = 32 * 2**20

#: Fewest candidates per chunk of the packed products
#: (:meth:`Columns.products`): a tile whose budget holds fewer (k above
#: about 180 for the square-root filters, 150 for the stochastic EnKF, whose
#: right-hand sides are k wide) forms its matrices point by point
#: (:meth:`Columns.direct`), where short chunks would leave the GEMM's inner
#: dimension too small to pay for the ``k²/2``-wide products it builds.
MIN_CHUNK = 256

#: Largest eigenproblem order solved by the lockstep solver; larger ones go to
#: LAPACK, as in the pointwise reference (measured, one core: lockstep ahead by
#: ~10 % at q = 64, even at 80–100 alone and up to 2× behind there when the cores
#: are shared, LAPACK well ahead from 128 on and several times faster at 256,
#: where a block of 32 matrices no longer fits in the cache).
LOCKSTEP_MAX_ORDER = 64

#: Relative residual up to which a tile's observed anomalies count as lying
#: in a smaller basis (:func:`~ensio.analysis.basis.anomaly_basis`);
#: 0 switches the reduced basis off.
BASIS_TOLERANCE = 1e-14

#: Applies the transforms ``G`` of the given points to their rows.
Apply = Callable[[np.ndarray, "np.ndarray | FactoredTransform | DeferredTransform"], None]


def empty_transform(rho: np.ndarray, k: int) -> np.ndarray:
    """Transforms ``(p, k, k)`` of points without observations: the inflated prior."""
    return np.eye(k) / np.sqrt(rho)[:, None, None]


def _packed_index(q: int) -> np.ndarray:
    """Indices that unpack a row-major packed upper triangle into a full q × q matrix."""
    packed = np.zeros((q, q), dtype=np.int64)
    packed[np.triu_indices(q)] = np.arange(q * (q + 1) // 2)
    return (packed + np.triu(packed, 1).T).ravel()


class Columns:
    """The Z matrix of the GEMM for a tile's candidate observations.

    **Reduced** form (reducible variants), when the tile's observed anomalies
    span fewer than k−1 dimensions (:func:`~ensio.analysis.basis.anomaly_basis`):
    Z holds the products of their r coordinates in an orthonormal basis, the
    GEMM is ``r(r+1)/2`` instead of ``q(q+1)/2`` columns wide and each
    eigenproblem r × r. Otherwise Z of the tile's candidates is built per
    tile. (A cache of Z for all observations, gathered per tile, was dropped:
    it lives through the whole analysis beside the block and broke the memory
    budget of issue 14 at N_mpi = 2, peak 4.2× the budget, for a few per cent
    of the GEMM phase.)
    """

    def __init__(self, obs: ObsSpace, variant: Variant, T: np.ndarray | None) -> None:
        self.variant = variant
        self.k = obs.k
        self.Yq = np.ascontiguousarray(obs.Y if T is None else T.T @ obs.Y)  # (q, m)
        self.q = self.Yq.shape[0]
        self.T = T
        self.reduce = variant.reducible and BASIS_TOLERANCE > 0
        self.D = np.ascontiguousarray(variant.innovations(obs))  # (s, m)
        self.s = self.D.shape[0]
        self.obs = obs
        self.diag = np.stack([obs.d**2, obs.var, obs.errors**2])  # (3, m)
        self._index: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self.work_max = 0  # largest tile's work arrays, bytes (tile_work_bytes)

    def packed_bytes(self, n_cand: int, r: int | None = None) -> int:
        """Bytes of the packed Zᵀ a tile of ``n_cand`` candidates builds."""
        q = self.q if r is None else r
        return 8 * n_cand * (q * (q + 1) // 2 + q * self.s + 3)

    def direct(
        self, Wt: np.ndarray, cand: np.ndarray, basis: tuple[np.ndarray, np.ndarray] | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(C, rhs, extra)`` point by point, from each point's non-zero weights only.

        Why: the packed product costs ``p · c · q(q+1)/2`` with a ``c × q(q+1)/2``
        work array; point by point it is ``Σ_i n_i q²`` (``n_i`` ≤ c the
        observations of point i) in BLAS calls of order q, which is as
        efficient once q is large, and needs no work array beyond the
        results. Same sums as the pointwise reference.
        """
        Yc = self.candidates(cand) if basis is None else basis[1]
        Dc, diag = self.D[:, cand], self.diag[:, cand]
        p, r = Wt.shape[0], Yc.shape[0]
        C, rhs, extra = np.empty((p, r, r)), np.empty((p, r, self.s)), np.empty((p, 3))
        for i in range(p):
            nz = np.flatnonzero(Wt[i])
            w = Wt[i, nz]
            Yl = Yc[:, nz]
            Yw = Yl * w
            np.matmul(Yw, Yl.T, out=C[i])
            np.matmul(Yw, Dc[:, nz].T, out=rhs[i])
            np.matmul(diag[:, nz], w, out=extra[i])
        return C, rhs, extra

    def candidates(self, cand: np.ndarray) -> np.ndarray:
        """The anomalies ``(q, c)`` of the candidates ``cand``, C-ordered.

        Why ``take``: ``Yq[:, cand]`` comes out Fortran-ordered, and
        :meth:`_build`'s products of its rows then run over strided memory
        (measured: 4× slower, a quarter of the GEMM phase).
        """
        return np.take(self.Yq, cand, axis=1)

    def note_work(self, nbytes: int) -> None:
        """Record one tile's work arrays; the largest is the kernel's ``tile_work_bytes``."""
        with self._lock:
            self.work_max = max(self.work_max, int(nbytes))

    def basis(self, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Basis ``Q`` (q × r) of the candidates' anomalies and their coordinates, if r < k−1.

        Only a span smaller than the k−1 dimensions of full-rank anomalies is
        used: at r = k−1 the eigenproblems shrink by one row only, which does
        not pay for the per-tile products (measured: no gain).
        """
        if not self.reduce:
            return None
        return anomaly_basis(self.candidates(cand), BASIS_TOLERANCE, max_rank=self.k - 2)

    def chunk_size(self, r: int | None = None) -> int:
        """Most candidates whose packed Zᵀ fits :data:`TILE_WORK_BYTES`."""
        return TILE_WORK_BYTES // self.packed_bytes(1, r)

    def products(
        self, Wt: np.ndarray, cand: np.ndarray, basis: tuple[np.ndarray, np.ndarray] | None,
        chunk: int,
    ) -> np.ndarray:
        """``S = W · Z`` for the candidates ``cand`` (in ``basis``): shape (p, ncols).

        Z is built and multiplied ``chunk`` candidates at a time, so a tile
        with many candidates (observations at many levels of a column) keeps
        the GEMM within :data:`TILE_WORK_BYTES` instead of falling back to
        per-point products.
        """
        def product(part: slice) -> np.ndarray:
            Yc = basis[1][:, part] if basis is not None else self.candidates(cand[part])
            return Wt[:, part] @ self._build(Yc, cand[part]).T

        S = product(slice(0, chunk))
        for a in range(chunk, cand.size, chunk):
            S += product(slice(a, a + chunk))
        return S

    def _build(self, Yc: np.ndarray, cand: np.ndarray | None) -> np.ndarray:
        """Zᵀ for coordinates ``Yc`` (r, c) of candidates ``cand`` (None: all), C-contiguous.

        Stored transposed so that every block of products is written as
        contiguous rows; the GEMM takes it as ``W @ Zt.T`` without a copy.
        """
        r, c = Yc.shape
        npk = r * (r + 1) // 2
        sel = slice(None) if cand is None else cand
        Zt = np.empty((npk + r * self.s + 3, c))
        start = 0
        for a in range(r):  # row a of the upper triangle: y_a * y_b, b >= a
            np.multiply(Yc[a:], Yc[a], out=Zt[start : start + r - a])
            start += r - a
        rhs = Zt[npk : npk + r * self.s].reshape(r, self.s, c)
        np.multiply(Yc[:, None, :], self.D[:, sel][None, :, :], out=rhs)
        Zt[-3:] = self.diag[:, sel]
        return Zt

    def unpack(self, S: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(C, rhs, extra)`` of each point from S, for a basis of size ``r`` (``q``: none).

        Shapes (p, r, r), (p, r, s) and (p, 3).
        """
        p, npk = S.shape[0], r * (r + 1) // 2
        if r not in self._index:
            self._index[r] = _packed_index(r)
        C = np.take(S, self._index[r], axis=1).reshape(p, r, r)
        nrhs = r * self.s
        rhs = S[:, npk : npk + nrhs].reshape(p, r, self.s)
        return C, rhs, S[:, npk + nrhs :]

    def transforms(self, Q, C, rhs, rho, has, sw: Stopwatch) -> np.ndarray | DeferredTransform:
        """Member-space transforms of the points ``has`` from the unpacked sums.

        ``rho`` and ``has`` cover all the tile's points. Square-root variants:
        the sums in the basis ``Qk`` (the reduced basis ``Q`` or, None, the
        whole space), kept until the rows come
        (:class:`~ensio.analysis.deferred.DeferredTransform`), so no k × k
        matrix is formed. Others: matrices ``(p_h, k, k)`` of the points
        ``has`` from the variant's finishing step. Eigendecompositions up to
        :data:`LOCKSTEP_MAX_ORDER` are the lockstep solver's
        (:mod:`~ensio.analysis.eigensolver`, several times faster than LAPACK
        on stacks of small matrices; imported here so that only a local
        analysis loads numba).
        """
        from .eigensolver import eigh_stack

        eigh = eigh_stack if C.shape[-1] <= LOCKSTEP_MAX_ORDER else None
        if not self.variant.reducible:
            return self.variant.transforms(C, rhs, rho[has], self.k, self.T, eigh=eigh)
        Qk = self.T if Q is None else (Q if self.T is None else self.T @ Q)
        return DeferredTransform(C, rhs[..., 0], rho, has, self.k, Qk, self.T is not None, eigh, sw)


def _tile(cols: Columns, cand, loc, pts_pre, obs_pre, tile, rho, diag, sw: Stopwatch, levels=None):
    """Transforms of one tile's points from its candidate observations ``cand``.

    Writes the tile's rows of ``diag``; ``pts_pre``, ``rho`` and the first of
    ``levels`` (points' and all observations' levels, vertical localization
    only) are the tile's.
    """
    obs, k = cols.obs, cols.k
    G: np.ndarray | FactoredTransform = prior_transform(rho, k)
    sw.lap("select")
    if not cand.size:
        return G
    reg = (obs.var[cand], obs.errors[cand] ** 2) if loc.regulated else None
    lev = None if levels is None else (levels[0], levels[1][cand])
    Wt, n_obs, used = tile_weights(loc, pts_pre, obs_pre[cand], obs.rinv[cand], rho, reg, lev)
    has = n_obs > 0
    if not has.any():
        sw.lap("weights")
        return G
    used = np.flatnonzero(used)
    cand, Wt = cand[used], np.take(Wt if has.all() else Wt[has], used, axis=1)
    diag[tile, 0] = n_obs
    sw.lap("weights")
    basis = cols.basis(cand)
    Q = None if basis is None else basis[0]
    sw.lap("basis")
    r = cols.q if Q is None else Q.shape[1]
    chunk = cols.chunk_size(r)
    if chunk >= min(cand.size, MIN_CHUNK):
        S = cols.products(Wt, cand, basis, chunk)
        C, rhs, extra = cols.unpack(S, r)
        sw.add("gemm_flops", 2.0 * S.shape[0] * cand.size * S.shape[1])
        chunked = chunk < cand.size
        sw.add("chunked_tiles_count", chunked)
        packed = cols.packed_bytes(min(chunk, cand.size), r)
        packed += S.nbytes * (1 + chunked)  # and a chunk's product
    else:
        packed = 0
        C, rhs, extra = cols.direct(Wt, cand, basis)
        sw.add("gemm_flops", 2.0 * np.count_nonzero(Wt) * r * (r + cols.s))
        sw.add("direct_tiles_count", 1)
    # live at once: weights, products, matrices, right-hand sides, and in the
    # transforms about three (p, r, max(r, k)) stacks (shifted copy, vectors, factors)
    p = C.shape[0]
    cols.note_work(Wt.nbytes + packed + C.nbytes + rhs.nbytes + 3 * 8 * p * r * max(r, k))
    sw.add("tiles_count", 1)
    sw.add("reduced_tiles_count", Q is not None)
    sw.add("basis_rank_count", 0 if Q is None else Q.shape[1])
    diag[tile[has], 1:] = extra
    sw.lap("gemm")
    Gh = cols.transforms(Q, C, rhs, rho, has, sw)
    if isinstance(Gh, DeferredTransform):
        return Gh  # its work is timed as the transform phase when the rows come
    G = empty_transform(rho, k)
    G[has] = Gh
    sw.lap("transform")
    return G


def tile_point_cap(k: int) -> int:
    """Most points per tile for k members: their k × k stacks fit :data:`TILE_WORK_BYTES`.

    A tile's matrices, shifted copies, eigenvectors and factors are each
    ``p k²`` numbers (about four live at once), so at k = 256 a 128-point tile
    would hold several 64 MiB arrays; capping p keeps one tile's work arrays
    within the budget at any ensemble size (at least 16 points, the tiles'
    own lower bound; no cap below k ≈ 90 at 128 points per tile).
    """
    return max(16, TILE_WORK_BYTES // (4 * 8 * k * k))


def batched_kernel(
    pts: np.ndarray,
    obs: ObsSpace,
    loc: Localization,
    variant: Variant,
    rho: np.ndarray,
    T: np.ndarray | None,
    apply: Apply,
    sw: Stopwatch,
    *,
    tile_points: int,
    threads: int,
    tile_extent: float = TILE_EXTENT,
) -> np.ndarray:
    """Transforms of all points ``pts`` (p, d), tile by tile, handed to ``apply``.

    With ``loc.vertical`` the last column of ``pts`` and of ``obs.coords``
    is the level (:meth:`~ensio.analysis.localization.Localization.split`).
    ``tile_extent``: a tile's largest extent as a fraction of the support radius.

    Returns
    -------
    ndarray, shape (p, 4)
        Per point: observations used, ``Σρd²/σ²``, ``Σρ var/σ²``, ``Σρ``.
    """
    tile_points = min(tile_points, tile_point_cap(obs.k))
    # vertical localization: tiles and candidates are horizontal (the vertical
    # taper only lowers weights), the levels enter the weights
    pts, pt_lev = loc.split(pts)
    obs_xy, obs_lev = loc.split(obs.coords)
    tiles = make_tiles(loc.geometry, pts, max_points=tile_points,
                       max_extent=tile_extent * loc.radius)  # fmt: skip
    pts_pre, obs_pre = prepare(loc.geometry, pts), prepare(loc.geometry, obs_xy)
    finder = CandidateFinder(loc.geometry, obs_xy, loc.radius)
    cols = Columns(obs, variant, T)
    diag = np.zeros((pts.shape[0], 4))
    sw.lap("select")

    def work(chunk: list[np.ndarray]) -> Stopwatch:
        # tiles are independent: each writes only its own rows of diag/out;
        # each thread laps its own stopwatch, merged below
        tsw = Stopwatch(sw.enabled)
        for tile in chunk:
            cand = finder(pts[tile])
            lev = None if pt_lev is None else (pt_lev[tile], obs_lev)
            G = _tile(cols, cand, loc, pts_pre[tile], obs_pre, tile, rho[tile], diag, tsw, lev)
            apply(tile, G)
            tsw.lap("update")
        return tsw

    if threads <= 1 or len(tiles) < 2:
        clocks = [work(tiles)]
    else:
        # one BLAS thread per worker: the workers already fill the cores (the
        # eigensolver is numba code that releases the GIL, as numpy/BLAS do)
        with (
            threadpool_limits(limits=1, user_api="blas"),
            ThreadPoolExecutor(max_workers=threads) as pool,
        ):
            # one task per tile, taken by whichever worker is free: tiles differ
            # in cost (observation density), so a static split would leave one idle
            clocks = list(pool.map(work, [[tile] for tile in tiles]))
    for clock in clocks:
        sw.merge(clock)
    sw.add("tile_work_bytes", cols.work_max)
    return diag
