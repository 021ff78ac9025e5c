"""Weight interpolation, band by band: the coarse transforms and the blend into the rows.

:func:`~ensio.analysis.winterp.interpolated_local` hands the coarse nodes
(sorted by coarse row) and the rows' cells here. A coarse node's transform is
a k × k matrix, 207 MB for all nodes of a 360 × 180 grid at stride 2 with
N_e = 40, ten times the ensemble block, so they are never all held at once:
the nodes go through the kernel in **bands** of coarse rows whose dense
transforms fit :data:`BAND_BYTES` (one buffer, reused), the rows whose cells
lie in a band are blended as soon as the band is done, and the band's last
coarse row is kept for the next band. Numba loops, like the eigensolver.

Two routes from the nodes to the rows, chosen per call (:func:`vectors_route`)
by the most rows a node acts on (the rows of its four cells with a non-zero
weight: 9 per level at stride 2, 25 at stride 3) against the ensemble size:
for the square-root filters of the batched kernel, each node's transform
may be applied to those rows as vectors, as the exact analysis applies a
point's (:class:`_Vectors`, no eigenvectors and no k × k matrix); otherwise
the nodes' k × k matrices are formed and blended per row
(:class:`_Matrices`). Both are exact and agree to rounding.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numba import njit

from ..stopwatch import Stopwatch
from .basis import FactoredTransform
from .batched import tile_point_cap
from .deferred import VECTOR_MAX_ORDER, DeferredTransform
from .eigensolver import LANES
from .local import KERNELS, concatenated_ranges, transform_rows
from .localization import Localization
from .tiles import make_tiles

__all__ = ["BAND_BYTES", "VECTOR_SHARE", "banded_update", "vectors_route", "warm_up"]

#: Bytes of coarse transforms held at once (a band of coarse rows, see the
#: module docstring; at least two coarse rows). Why a bound: all nodes at once
#: were 207 MB at stride 2 on the 360 × 180 × 40 case (ten times the block),
#: and first touching an array that size cost more than the blend itself
#: (measured 0.5 s of a 0.98 s update phase on a loaded machine). Why 24 MiB
#: (measured there, N_mpi = 1, one run each): peak per rank 1.93× the issue's
#: budget (block + observations + one tile) at stride 2, 1.87× at 3 (16 MiB:
#: 1.8×; 32 MiB: 2.2×), and stride 2 in 3.38 s (16 MiB: 3.70 s, smaller tiles
#: slow the GEMM; 32 MiB: 3.22 s; all nodes at once: 3.51 s).
BAND_BYTES = 24 * 2**20


def _dense_into(
    Gbuf: np.ndarray, slots: np.ndarray, Gp: np.ndarray | FactoredTransform | DeferredTransform
) -> None:
    """Write the dense transforms of a tile into ``Gbuf[slots]``.

    Factored transforms are formed node by node straight into the buffer
    (:func:`_form_dense`): about 3× faster than
    :meth:`~ensio.analysis.basis.FactoredTransform.dense` and a gathered copy,
    whose tile-sized temporaries are fresh memory on every tile.
    """
    if isinstance(Gp, DeferredTransform):
        Gp = Gp.factored()
    if not isinstance(Gp, FactoredTransform):
        Gbuf[slots] = Gp
        return
    _form_dense(Gbuf, slots.astype(np.int64), Gp.M, Gp.D, Gp.s0, Gp.wbar, Gp.centred)


@njit(cache=True, nogil=True, fastmath=False)
def _form_dense(Gbuf, slots, M, D, s0, wbar, centred):  # pragma: no cover
    """``Gbuf[slots[i]] = (I − c_i 11ᵀ/k) s0_i + M_i diag(D_i) M_iᵀ + w̄_i 1ᵀ`` (numba).

    The product is one BLAS call per node (``np.dot`` on k × r scratch
    arrays); the rest is added in place in ``dense()``'s order.
    """
    p, k, r = M.shape
    MD = np.empty((k, r))
    Mt = np.empty((r, k))
    inv_k = 1.0 / k
    for i in range(p):
        G = Gbuf[slots[i]]
        if r == 0:
            G[:, :] = 0.0
        else:
            for a in range(k):
                for j in range(r):
                    MD[a, j] = M[i, a, j] * D[i, j]
                    Mt[j, a] = M[i, a, j]
            np.dot(MD, Mt, G)
        s = s0[i]
        for a in range(k):
            wa = wbar[i, a]
            for b in range(k):
                v = 1.0 if a == b else 0.0
                if centred[i]:
                    v -= inv_k
                G[a, b] = v * s + G[a, b] + wa


#: The vectors route (:func:`vectors_route`) is taken when ``VECTOR_SHARE`` times
#: the vectors a node needs (its rows and its mean weights) is at most the
#: order. Applying the square root to m vectors costs about ``a n³ + b m n²``,
#: the eigenvectors ``c n³``, so the crossing is a share of the order n.
#: Measured (one core, whole analysis with stride 2 = 10 vectors a node, or
#: stride 3 = 26; vectors / matrices): N_e = 20, stride 2: 0.99 / 0.90 s;
#: N_e = 40 (360 × 180): stride 2 2.33 / 2.58 s, stride 3 transform and
#: update 0.66 / 0.52 s; N_e = 100 (180 × 90): stride 2 2.98 / 3.85 s,
#: stride 3 1.44 / 1.76 s. The crossing lies between n/4 and n/2 vectors.
VECTOR_SHARE = 3


def vectors_route(most_rows: int, k: int) -> bool:
    """Whether nodes acting on at most ``most_rows`` rows each go as vectors (k members)."""
    return VECTOR_SHARE * (most_rows + 1) <= k <= VECTOR_MAX_ORDER


#: A band whose tiles fill this share of the eigensolver's lanes is taken;
#: otherwise the best of :data:`FILL_TRIES` band heights (largest first).
GOOD_FILL = 0.9
FILL_TRIES = 4

#: Tile extent of the coarse nodes, as a fraction of the support radius (the
#: kernel's ``tile_extent``). Why not the full grid's 0.5: the nodes are
#: ``stride`` grid points apart, so half a 5000 km radius held 45–61 nodes at
#: stride 3, which left the GEMM and the eigensolver's lanes under-filled;
#: a whole radius lets tiles reach their point cap (measured, 360 × 180,
#: N_e = 40, 256-point tiles, stride 3: 1.41 s at 0.8 of the radius, 1.31 s
#: at 1.0, 1.32 s at 1.3, where the cap binds first; with 0.5 and 0.7 of it
#: 1.69 and 1.41 s against 1.27 s: more tiles, each with its own candidates
#: and products, outweigh their fewer zero weights).
COARSE_TILE_EXTENT = 1.0


def _tile_fill(loc: Localization, pts: np.ndarray, tile_points: int) -> float:
    """Share of the eigensolver's lanes the kernel's tiles of ``pts`` fill.

    The tiles are made as :func:`~ensio.analysis.batched.batched_kernel`
    makes them (about 1 ms for a band); their matrices are solved in blocks of
    :data:`~ensio.analysis.eigensolver.LANES` (a partial block costs a full one).
    """
    tiles = make_tiles(loc.geometry, pts, max_points=tile_points,
                       max_extent=COARSE_TILE_EXTENT * loc.radius)  # fmt: skip
    sizes = np.array([t.size for t in tiles])
    return float(sizes.sum() / (LANES * np.ceil(sizes / LANES)).sum()) if sizes.size else 1.0


class _Bands:
    """Bands of consecutive coarse rows of the nodes, each band's transforms within a budget.

    ``nodes`` are sorted by coarse row (:meth:`WeightGrid.cells`), so a band
    is a contiguous range of nodes; consecutive bands share one coarse row
    (the last of one is the first of the next), which is kept, not recomputed.
    Why the band height is chosen by its tiles: bands cut by bytes alone gave
    tiles that filled 71 % of the eigensolver's lanes at stride 2 (all nodes
    at once: 100 %), and the transform phase grows with the blocks, not the
    matrices; chosen so, 90 % or more.
    """

    def __init__(self, node_row: np.ndarray, k: int, band_bytes: int) -> None:
        self.rows, self.start = np.unique(node_row, return_index=True)
        self.stop = np.append(self.start[1:], node_row.size)
        sizes = self.stop - self.start
        pairs = sizes[:-1] + sizes[1:] if sizes.size > 1 else sizes
        self.capacity = int(min(node_row.size, max(band_bytes // (8 * k * k), pairs.max())))

    def bands(self, fill) -> Iterator[tuple[int, int]]:
        """``(lo, hi)``: indices into ``rows`` of each band's first and last coarse row.

        ``fill(first, stop)`` rates the new nodes ``[first, stop)`` of a band.
        """
        lo, n = 0, self.rows.size
        while lo < n - 1:
            base = self.start[lo]
            first = base if lo == 0 else self.stop[lo]  # row lo is kept from the last band
            last = lo + 1
            while last + 1 < n and self.stop[last + 1] - base <= self.capacity:
                last += 1
            hi, best = last, -1.0
            if not (last == n - 1 and self.stop[last] - base <= self.capacity):
                for h in range(last, max(lo, last - FILL_TRIES), -1):
                    f = fill(first, self.stop[h])
                    if f > best:
                        hi, best = h, f
                    if f >= GOOD_FILL:
                        break
            yield lo, hi
            lo = hi


def _merge(sw: Stopwatch, band: Stopwatch) -> None:
    """Add a band's timings to ``sw``; ``*_bytes`` (the largest work array) keep the maximum."""
    for name, v in band.as_dict().items():
        if name.endswith("_bytes"):
            v = max(v - sw[name], 0.0)
        sw.add(name, v)


def banded_update(X, out, inv, nodes, node_row, corner, beta, cell, obs, loc, variant, rho,
                   kernel, tile_points, threads, sw, band_bytes) -> np.ndarray:  # fmt: skip
    """Band by band: the coarse transforms through the kernel, then the rows of the band's cells.

    Writes ``out``; returns the nodes' diagnostics ``(c, 4)``. Rows are
    visited cell by cell, then point by point (sorted by cell, hence by
    coarse row: each band's rows are one slice). The nodes' transforms reach
    the rows as k × k matrices blended per row (:class:`_Matrices`) or, with
    few rows per node, applied to those rows as vectors (:class:`_Vectors`).
    Rows whose four corners have no observation get ``x̄ + x'·(1/√ρ)``
    exactly, as in the exact analysis.
    """
    k = X.shape[0]
    bands = _Bands(node_row, k, BAND_BYTES if band_bytes is None else band_bytes)
    per_tile = min(tile_points, tile_point_cap(k))  # the kernel's tiles

    def fill(first: int, stop: int) -> float:
        with sw("select"):
            return _tile_fill(loc, nodes[first:stop], per_tile)

    diag_c = np.zeros((nodes.shape[0], 4))
    point_row = node_row[corner[:, 0]]  # a point's cell spans its row and the next
    empty = np.zeros(corner.shape[0], dtype=np.bool_)
    with sw("update"):
        rows = _Rows(X, inv, corner, beta, cell, point_row, 1.0 / np.sqrt(rho))
        deferred = kernel == "batched" and variant.reducible  # transforms come deferred
        pairs = _Pairs(rows, nodes.shape[0]) if deferred else None
        sink: _Matrices | _Vectors = (
            _Vectors(rows, pairs.group())
            if pairs is not None and vectors_route(pairs.most, k)
            else _Matrices(rows, bands.capacity)
        )
    kept = 0  # nodes of the last band's last coarse row, not recomputed
    for lo, hi in bands.bands(fill):
        base, first, stop = bands.start[lo], bands.start[lo] + kept, bands.stop[hi]
        band_sw = Stopwatch(sw.enabled)  # the kernel laps from its own start
        with sw("update"):
            a = rows.start(bands.rows[lo])  # the band's rows: cells in coarse rows lo … hi-1
            b = rows.stop(bands.rows[hi - 1])
            capture = sink.begin(a, rows.stop(bands.rows[hi]), base, first)
        diag_c[first:stop] = KERNELS[kernel](
            nodes[first:stop], obs, loc, variant, np.full(stop - first, rho),
            variant.projection(k), capture, band_sw, tile_points=tile_points, threads=threads,
            tile_extent=COARSE_TILE_EXTENT,
        )  # fmt: skip
        _merge(sw, band_sw)
        with sw("update"):
            pts_band = np.unique(rows.inv[rows.order[a:b]])
            empty[pts_band] = ~np.any(diag_c[corner[pts_band], 0] > 0, axis=1)
            sink.finish(a, b, empty, out, slice(bands.start[hi] - base, stop - base))
            kept = bands.stop[hi] - bands.start[hi]
    return diag_c


class _Rows:
    """The rows sorted by cell, then point, and what the blends need of them.

    ``order``: the rows in that order (a band's rows are one slice of it);
    ``row_of``: the coarse row of each one's cell.
    """

    def __init__(self, X, inv, corner, beta, cell, point_row, s0: float) -> None:
        self.X = X
        self.mean = X.mean(axis=0)  # the anomalies are formed row by row in the blends
        self.order = np.lexsort((inv, cell[inv])).astype(np.int64)
        self.row_of = point_row[inv][self.order]
        self.inv = np.asarray(inv, dtype=np.int64)
        self.corner = np.asarray(corner, dtype=np.int64)
        self.beta = np.ascontiguousarray(beta)
        self.s0 = s0

    def start(self, coarse_row: int) -> int:
        """First place in ``order`` of the rows of cells in ``coarse_row``."""
        return int(np.searchsorted(self.row_of, coarse_row, side="left"))

    def stop(self, coarse_row: int) -> int:
        """Place in ``order`` after the rows of cells in ``coarse_row``."""
        return int(np.searchsorted(self.row_of, coarse_row, side="right"))


class _Matrices:
    """The nodes' transforms as k × k matrices, blended into every row of their cells.

    A band's matrices fill ``Gbuf`` (the nodes from its first, ``base``);
    the last coarse row's are kept at its front for the next band. Rows go
    cell by cell, so the four corners of a cell stay in the cache while its
    rows use them.
    """

    def __init__(self, rows: _Rows, capacity: int) -> None:
        k = rows.X.shape[0]
        self.rows = rows
        self.Gbuf = np.empty((capacity, k, k))
        self.base = 0

    def begin(self, a: int, c: int, base: int, first: int):
        """The kernel's ``apply`` for a band's nodes from ``base`` (new ones from ``first``)."""
        self.base = base

        def capture(points: np.ndarray, Gp, off=first - base) -> None:
            _dense_into(self.Gbuf, points + off, Gp)

        return capture

    def finish(self, a: int, b: int, empty: np.ndarray, out: np.ndarray, last: slice) -> None:
        """Blend the rows ``order[a:b]`` (their corners are all in the buffer), then move
        the matrices ``last`` (the band's last coarse row) to the front."""
        r = self.rows
        _blend_rows(r.X, r.mean, r.order[a:b], r.inv, r.corner, self.base, r.beta, self.Gbuf,
                    empty, r.s0, out)  # fmt: skip
        self.Gbuf[: last.stop - last.start] = self.Gbuf[last].copy()


class _Vectors:
    """The nodes' transforms applied to their rows as vectors; each row's terms summed.

    Why: with few rows per node against the ensemble size (stride 2 at N_e =
    40: at most 9 rows, 10 vectors with the mean weights) a node's transform
    applied to those rows as vectors
    (:meth:`~ensio.analysis.deferred.DeferredTransform.apply_rows`, no
    eigenvectors) costs less than forming its k × k matrix and blending it
    into every row (:data:`VECTOR_SHARE`). The
    term ``β x'G_c`` of each (row, corner) pair is stored at that row and
    corner, and a row's terms are summed in the corners' order when its cell
    is done, so the sum does not depend on tiles, threads or bands.

    ``Pbuf`` holds the terms of the band's window (rows of cells in coarse
    rows lo … hi, from place ``a`` of ``order``); the cells of row hi have
    only half their corners when the band ends and are kept at its front.
    """

    def __init__(self, rows: _Rows, pairs: _Pairs) -> None:
        self.rows, self.pairs = rows, pairs
        self.Pbuf = np.empty((0, 4, rows.X.shape[0]))
        self.kept = 0

    def begin(self, a: int, c: int, base: int, first: int):
        """The kernel's ``apply`` for a band's window ``order[a:c]`` (new nodes from ``first``)."""
        r, k = self.rows, self.rows.X.shape[0]
        if self.Pbuf.shape[0] < c - a:
            grown = np.empty((c - a, 4, k))
            grown[: self.kept] = self.Pbuf[: self.kept]
            self.Pbuf = grown
        self.c = c
        win = r.order[a:c]  # the window's anomalies, gathered once (up to 4 pairs use each)
        anom = r.X[:, win].T - r.mean[win][:, None]
        Pbuf, pairs = self.Pbuf, self.pairs

        def capture(points: np.ndarray, Gp, off=first) -> None:
            pos, q, w, counts = pairs.of(points + off)
            pos -= a
            Pbuf[pos, q] = w[:, None] * transform_rows(Gp, anom[pos], counts, pairs.most)

        return capture

    def finish(self, a: int, b: int, empty: np.ndarray, out: np.ndarray, last: slice) -> None:
        """Sum the terms of the rows ``order[a:b]`` (all their corners are done), then move
        those of the cells in the band's last coarse row (``order[b:c]``) to the front.

        (``last``, that row's nodes, have all their terms stored already.)
        """
        r = self.rows
        _sum_pairs(r.X, r.mean, r.order[a:b], r.inv, r.beta, self.Pbuf, empty, r.s0, out)
        self.kept = self.c - b
        self.Pbuf[: self.kept] = self.Pbuf[b - a : self.c - a].copy()


class _Pairs:
    """The (row, corner) pairs of non-zero weight: the rows each node acts on.

    ``pos``: place of the pair's row in ``order``; ``q``: its corner;
    ``node``: its node; ``most``: the most pairs of a node; the pairs of node
    ``i`` are ``ptr[i]:ptr[i+1]`` once :meth:`group` has sorted them by node
    (only the vectors route needs that: the sort is most of the cost).
    """

    def __init__(self, rows: _Rows, n_nodes: int) -> None:
        self.rows = rows
        point = rows.inv[rows.order]
        self.pos, self.q = np.nonzero(rows.beta[point])
        self.node = rows.corner[point[self.pos], self.q]
        self.ptr = np.zeros(n_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.node, minlength=n_nodes), out=self.ptr[1:])
        self.most = int(np.diff(self.ptr).max()) if n_nodes else 0

    def group(self) -> _Pairs:
        """Sort the pairs by node (stably) and take their weights ``w``; returns ``self``."""
        by = np.argsort(self.node, kind="stable")
        self.pos, self.q, self.node = self.pos[by], self.q[by], self.node[by]
        point = self.rows.inv[self.rows.order[self.pos]]
        self.w = self.rows.beta[point, self.q]
        return self

    def of(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(pos, q, w, counts)`` of the pairs of ``nodes``, node by node (``pos`` a copy;
        after :meth:`group`)."""
        idx, counts = concatenated_ranges(self.ptr, nodes)
        return self.pos[idx], self.q[idx], self.w[idx], counts


@njit(cache=True, nogil=True, fastmath=False)
def _sum_pairs(X, mean, rows, point, beta, P, empty, s0, out):  # pragma: no cover
    """``out[:, r] = x̄_r + Σ_q P[t, q]`` over the corners of non-zero weight (numba).

    ``rows[t]`` is the row of ``P[t]``; rows whose four corners have no
    observation get ``x̄ + x' s0`` exactly.
    """
    k = X.shape[0]
    for t in range(rows.size):
        r = rows[t]
        p = point[r]
        if empty[p]:
            for b in range(k):
                out[b, r] = mean[r] + (X[b, r] - mean[r]) * s0
            continue
        for b in range(k):
            acc = 0.0
            for q in range(4):
                if beta[p, q] != 0.0:
                    acc += P[t, q, b]
            out[b, r] = mean[r] + acc


@njit(cache=True, nogil=True, fastmath=False)
def _blend_rows(X, mean, rows, point, corner, base, beta, Gc, empty, s0, out):  # pragma: no cover
    """``out[:, r] = x̄_r + Σ_c β_c x'_rᵀ G_c`` for the ``rows`` (numba; ``X``, ``out``: (k, n)).

    ``Gc[corner[p, q] - base]`` is corner q of point p; the anomalies
    ``x'_r = X[:, r] − x̄_r`` are formed here (no block-sized copy). ``rows``
    come grouped by point: a point with several rows (the levels of a 3-D
    state) gets its interpolated transform formed once (``4 k²``) and applied
    to each (``k²`` per row, against ``4 k²`` per row through the corners).
    """
    k = X.shape[0]
    x = np.empty(k)
    acc = np.empty(k)
    Gp = np.empty((k, k))
    t = 0
    while t < rows.size:
        p = point[rows[t]]
        u = t + 1
        while u < rows.size and point[rows[u]] == p:
            u += 1
        if not empty[p] and u - t > 1:
            Gp[:, :] = 0.0
            for q in range(4):
                w = beta[p, q]
                if w != 0.0:
                    G = Gc[corner[p, q] - base]
                    for a in range(k):
                        for b in range(k):
                            Gp[a, b] += w * G[a, b]
        for v in range(t, u):
            r = rows[v]
            for a in range(k):
                x[a] = X[a, r] - mean[r]
            if empty[p]:
                for b in range(k):
                    out[b, r] = mean[r] + x[b] * s0
                continue
            acc[:] = 0.0
            if u - t > 1:
                for a in range(k):
                    xa = x[a]
                    for b in range(k):
                        acc[b] += xa * Gp[a, b]
            else:
                for q in range(4):
                    w = beta[p, q]
                    if w == 0.0:
                        continue
                    G = Gc[corner[p, q] - base]
                    for a in range(k):
                        xa = x[a] * w
                        for b in range(k):
                            acc[b] += xa * G[a, b]
            for b in range(k):
                out[b, r] = mean[r] + acc[b]
        t = u


def warm_up() -> None:
    """Compile (first use) or load from the cache the numba loops of this module."""
    _blend_rows(np.zeros((2, 1)), np.zeros(1), np.zeros(1, np.int64), np.zeros(1, np.int64),
                np.zeros((1, 4), np.int64), 0, np.array([[1.0, 0, 0, 0]]), np.eye(2)[None],
                np.zeros(1, np.bool_), 1.0, np.zeros((2, 1)))  # fmt: skip
    _form_dense(np.zeros((1, 2, 2)), np.zeros(1, np.int64), np.ones((1, 2, 2)), np.ones((1, 2)),
                np.ones(1), np.zeros((1, 2)), np.zeros(1, np.bool_))  # fmt: skip
