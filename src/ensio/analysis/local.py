"""Local analysis (LETKF, LESTKF, LEnKF): batched per tile, or point by point.

Every analysis point (a distinct location of state rows; rows sharing a
location share the transform) gets its own ensemble-space analysis using
the observations within the support radius, with R⁻¹ multiplied by the
taper (observation localization, Hunt et al. 2007). The **batched** kernel
(DESIGN.md, "Batched local analysis") forms, for a tile of points,

``S = W · Z``   — one dense GEMM,

with ``W`` (points × candidates) the taper divided by σ_o² and ``Z``
(candidates × columns) the packed outer products ``y_a y_b`` (a ≤ b) of the
observed anomalies, the innovation products ``y_a d`` (or, for the
stochastic filter, ``y_a (d + ε_j)`` for every member j) and three
diagnostic columns. Unpacking ``S`` gives ``C = Y R_loc⁻¹ Yᵀ`` and the
right-hand sides of every point; one batched symmetric eigendecomposition
then yields all transforms. For the square-root filters, ``Y`` is first
expressed in an orthonormal basis of its span when that is smaller than
the ensemble space (:mod:`~ensio.analysis.basis`; exact): the GEMM and the
eigenproblems shrink to its size and the transforms are applied as factors.
The **pointwise** kernel computes the same quantities with one small
product and one eigendecomposition per point and is kept as the reference.

Points without any observation inside the radius get ``C = 0``, ``b = 0``,
so their analysis is the prior with the configured multiplicative inflation
(``x̄ + X'/√ρ``); relaxation (RTPP/RTPS) then leaves them at that.

The functions work on an arbitrary subset of rows given their coordinates
and an observation set that contains at least every observation within the
radius of those rows, so the distributed version can call them per rank.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .basis import FactoredTransform, anomaly_basis, expand, prior_transform, sqrt_factors_in_basis
from .localization import Localization, as_coords, prepare
from .tiles import CandidateFinder, make_tiles, taper_weights, tile_weights
from .transforms import enkf_weights, estkf_projection, sqrt_weights, transform_from_weights

__all__ = ["ObsSpace", "LocalResult", "local_analysis", "Method", "Kernel"]

Method = Literal["etkf", "estkf", "enkf"]
Kernel = Literal["batched", "pointwise"]


@dataclass(frozen=True, eq=False)
class ObsSpace:
    """Observations as the analysis sees them (after H and quality control).

    Stored sorted by global id, so sums over observations run in the same
    order whichever subset a rank holds.

    Attributes
    ----------
    hx : ndarray, shape (k, m)
        Observed prior ensemble.
    values, errors : ndarray, shape (m,)
    coords : ndarray, shape (m, d)
        Locations in the localization geometry.
    ids : ndarray of int, shape (m,)
        Global observation numbers.
    perturbations : ndarray, shape (k, m), optional
        ε_j (scaled by σ_o) for the stochastic filters.
    """

    hx: np.ndarray
    values: np.ndarray
    errors: np.ndarray
    coords: np.ndarray
    ids: np.ndarray
    perturbations: np.ndarray | None = None
    mean: np.ndarray = field(init=False)
    Y: np.ndarray = field(init=False)
    d: np.ndarray = field(init=False)
    rinv: np.ndarray = field(init=False)
    var: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids, dtype=np.int64).ravel()
        for name in ("values", "errors"):
            if np.shape(getattr(self, name)) != ids.shape:
                raise ValueError(
                    f"ObsSpace.{name}: shape {np.shape(getattr(self, name))}, ids {ids.shape}"
                )
        if np.ndim(self.hx) != 2 or np.shape(self.hx)[1] != ids.size:
            raise ValueError(f"ObsSpace.hx: shape {np.shape(self.hx)}, expected (k, {ids.size})")
        order = np.argsort(ids, kind="stable")
        hx = np.asarray(self.hx, dtype=float)[:, order]
        put = object.__setattr__
        put(self, "ids", ids[order])
        put(self, "hx", hx)
        put(self, "values", np.asarray(self.values, dtype=float)[order])
        put(self, "errors", np.asarray(self.errors, dtype=float)[order])
        coords = np.asarray(self.coords, dtype=float)
        if coords.ndim == 1:
            coords = coords[:, None]
        if coords.shape[0] != ids.size:
            raise ValueError(f"{coords.shape[0]} observation coordinates for {ids.size} ids")
        put(self, "coords", coords[order])
        if self.perturbations is not None:
            put(self, "perturbations", np.asarray(self.perturbations, dtype=float)[:, order])
        mean = hx.mean(axis=0)
        put(self, "mean", mean)
        put(self, "Y", hx - mean)
        put(self, "d", self.values - mean)
        put(self, "rinv", 1.0 / self.errors**2)
        k = hx.shape[0]
        put(self, "var", (self.Y**2).sum(axis=0) / max(k - 1, 1))

    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def k(self) -> int:
        return int(self.hx.shape[0])


@dataclass(frozen=True, eq=False)
class LocalResult:
    """Analysis rows and per-row diagnostics.

    Attributes
    ----------
    ensemble : ndarray, shape (k, n)
    n_obs : ndarray of int, shape (n,)
        Observations with non-zero weight at the row's point.
    dRd, trace, weight_sum : ndarray, shape (n,)
        ``Σρd²/σ²``, ``Σρ var(HX)/σ²``, ``Σρ`` (adaptive inflation inputs).
    """

    ensemble: np.ndarray
    n_obs: np.ndarray
    dRd: np.ndarray
    trace: np.ndarray
    weight_sum: np.ndarray


def _taper(loc: Localization, pts, obs: ObsSpace, obs_pre, cand, rho: np.ndarray):
    """Localization weights ``(p, c)`` of candidates ``cand`` (None: all) for prepared ``pts``."""
    sel = slice(None) if cand is None else cand
    reg = (obs.var[sel], obs.errors[sel] ** 2) if loc.regulated else None
    return taper_weights(loc, pts, obs_pre[sel], rho, reg)


def _finish(method: Method, C, rhs, rho, k: int, T):
    """Member-space transforms ``(p, k, k)`` from ensemble-space sums."""
    if method == "enkf":
        return enkf_weights(C, rhs, rho, k)
    wbar, W = sqrt_weights(C, rhs, rho, k)
    return transform_from_weights(wbar, W, omega=T if method == "estkf" else None)


def _empty_transform(rho: np.ndarray, k: int) -> np.ndarray:
    return np.eye(k) / np.sqrt(rho)[:, None, None]


#: Z of all observations is computed once when it is at most this large;
#: otherwise it is built per tile from the candidates.
Z_CACHE_BYTES = 256 * 2**20

#: Relative residual up to which a tile's observed anomalies count as lying
#: in a smaller basis (:func:`~ensio.analysis.basis.anomaly_basis`);
#: 0 switches the reduced basis off.
BASIS_TOLERANCE = 1e-14


def _packed_index(q: int) -> np.ndarray:
    """Indices that unpack a row-major packed upper triangle into a full q × q matrix."""
    packed = np.zeros((q, q), dtype=np.int64)
    packed[np.triu_indices(q)] = np.arange(q * (q + 1) // 2)
    return (packed + np.triu(packed, 1).T).ravel()


class _Columns:
    """The Z matrix of the GEMM for a tile's candidate observations.

    **Reduced** form (ETKF/ESTKF), when the tile's observed anomalies span
    fewer than k−1 dimensions (:func:`~ensio.analysis.basis.anomaly_basis`):
    Z holds the products of their r coordinates in an orthonormal basis, the
    GEMM is ``r(r+1)/2`` instead of ``q(q+1)/2`` columns wide and each
    eigenproblem r × r. Otherwise Z (one row per observation) does not depend
    on the tile: it is computed once and gathered per tile when it fits in
    :data:`Z_CACHE_BYTES` (several times cheaper than forming the products
    again for every tile that sees the observation).
    """

    def __init__(self, obs: ObsSpace, method: Method, T: np.ndarray | None) -> None:
        self.method = method
        self.k = k = obs.k
        self.Yq = (T.T @ obs.Y) if method == "estkf" else obs.Y  # (q, m)
        q = self.Yq.shape[0]
        self.q = q
        self.T = T
        self.reduce = method != "enkf" and BASIS_TOLERANCE > 0
        if method == "enkf":
            if obs.perturbations is None:
                raise ValueError("the stochastic filter needs observation perturbations")
            self.D = obs.d[None, :] + obs.perturbations  # (k, m)
            self.nrhs = k * k
        else:
            self.nrhs = q
        self.obs = obs
        self.diag = np.stack([obs.d**2, obs.var, obs.errors**2])  # (3, m)
        self._index: dict[int, np.ndarray] = {}
        self._cache: np.ndarray | None = None
        self._lock = threading.Lock()
        self._cache_ok = len(obs) * (q * (q + 1) // 2 + self.nrhs + 3) * 8 <= Z_CACHE_BYTES

    def basis(self, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Basis ``Q`` (q × r) of the candidates' anomalies and their coordinates, if r < k−1.

        Only a span smaller than the k−1 dimensions of full-rank anomalies is
        used: at r = k−1 the eigenproblems shrink by one row only, which does
        not pay for the per-tile products (measured: no gain).
        """
        if not self.reduce:
            return None
        return anomaly_basis(self.Yq[:, cand], BASIS_TOLERANCE, max_rank=self.k - 2)

    def products(
        self, Wt: np.ndarray, cand: np.ndarray, basis: tuple[np.ndarray, np.ndarray] | None
    ) -> np.ndarray:
        """``S = W · Z`` for the candidates ``cand`` (in ``basis``): shape (p, ncols)."""
        if basis is not None:
            return Wt @ self._build(basis[1], cand).T
        if self._cache is None and self._cache_ok:
            with self._lock:  # built once, on first use (tile threads share it)
                if self._cache is None:
                    self._cache = np.ascontiguousarray(self._build(self.Yq, None).T)
        if self._cache is not None:
            return Wt @ self._cache[cand]
        return Wt @ self._build(self.Yq[:, cand], cand).T

    def _build(self, Yc: np.ndarray, cand: np.ndarray | None) -> np.ndarray:
        """Zᵀ for coordinates ``Yc`` (r, c) of candidates ``cand`` (None: all), C-contiguous.

        Stored transposed so that every block of products is written as
        contiguous rows; the GEMM takes it as ``W @ Zt.T`` without a copy.
        """
        r, c = Yc.shape
        npk = r * (r + 1) // 2
        nrhs = self.nrhs if r == self.q else r
        sel = slice(None) if cand is None else cand
        d = self.obs.d[sel]
        Zt = np.empty((npk + nrhs + 3, c))
        start = 0
        for a in range(r):  # row a of the upper triangle: y_a * y_b, b >= a
            np.multiply(Yc[a:], Yc[a], out=Zt[start : start + r - a])
            start += r - a
        rhs = Zt[npk : npk + nrhs]
        if self.method == "enkf":
            np.multiply(Yc[:, None, :], self.D[:, sel][None, :, :], out=rhs.reshape(r, -1, c))
        else:
            np.multiply(Yc, d, out=rhs)
        Zt[-3:] = self.diag[:, sel]
        return Zt

    def unpack(self, S: np.ndarray, r: int):
        """``(C, rhs, extra)`` of each point from S, for a basis of size ``r`` (``q``: none)."""
        p, npk = S.shape[0], r * (r + 1) // 2
        if r not in self._index:
            self._index[r] = _packed_index(r)
        C = np.take(S, self._index[r], axis=1).reshape(p, r, r)
        nrhs = self.nrhs if r == self.q else r
        rhs = S[:, npk : npk + nrhs]
        if self.method == "enkf":
            rhs = rhs.reshape(p, r, -1)
        return C, rhs, S[:, npk + nrhs :]

    def transforms(self, Q, C, rhs, rho: np.ndarray, k: int) -> np.ndarray | FactoredTransform:
        """Member-space transforms of the points from the unpacked sums.

        Matrices ``(p, k, k)`` without a basis; factors in the reduced form.
        """
        if Q is None:
            return _finish(self.method, C, rhs, rho, k, self.T)
        Qk = Q if self.T is None else self.T @ Q
        return sqrt_factors_in_basis(C, rhs, rho, k, Qk, centred=self.T is not None)


class _Clock:
    """Accumulates seconds per phase into ``sink`` (no-op when ``sink`` is None)."""

    def __init__(self, sink: dict[str, float] | None) -> None:
        self.sink = sink
        self.t = time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.sink is not None:
            now = time.perf_counter()
            self.sink[phase] = self.sink.get(phase, 0.0) + now - self.t
            self.t = now

    def count(self, name: str, value: float) -> None:
        if self.sink is not None:
            self.sink[name] = self.sink.get(name, 0.0) + value


def _batched(pts, obs, loc, method, rho, T, apply, tile_points, clock, threads):
    k = obs.k
    tiles = make_tiles(loc.geometry, pts, max_points=tile_points, max_extent=0.5 * loc.radius)
    finder = CandidateFinder(loc.geometry, obs.coords, loc.radius)
    pts_pre, obs_pre = prepare(loc.geometry, pts), prepare(loc.geometry, obs.coords)
    cols = _Columns(obs, method, T)
    diag = np.zeros((pts.shape[0], 4))
    clock.lap("select")

    def work(chunk: list[np.ndarray]) -> dict[str, float] | None:
        # tiles are independent: each writes only its own rows of diag/out
        sink: dict[str, float] | None = None if clock.sink is None else {}
        tclock = _Clock(sink)
        for tile in chunk:
            G: np.ndarray | FactoredTransform = prior_transform(rho[tile], k)
            cand = finder(pts[tile])
            tclock.lap("select")
            if cand.size:
                reg = (obs.var[cand], obs.errors[cand] ** 2) if loc.regulated else None
                Wt, n_obs, used = tile_weights(
                    loc, pts_pre[tile], obs_pre[cand], obs.rinv[cand], rho[tile], reg
                )
                has = n_obs > 0
                if not has.any():
                    tclock.lap("weights")
                else:
                    used = np.flatnonzero(used)
                    cand, Wt = cand[used], np.take(Wt if has.all() else Wt[has], used, axis=1)
                    diag[tile, 0] = n_obs
                    tclock.lap("weights")
                    basis = cols.basis(cand)
                    Q = None if basis is None else basis[0]
                    tclock.lap("basis")
                    S = cols.products(Wt, cand, basis)
                    C, rhs, extra = cols.unpack(S, cols.q if Q is None else Q.shape[1])
                    tclock.count("gemm_flops", 2.0 * S.shape[0] * cand.size * S.shape[1])
                    tclock.count("tiles_count", 1)
                    tclock.count("reduced_tiles_count", Q is not None)
                    tclock.count("basis_rank_count", 0 if Q is None else Q.shape[1])
                    diag[tile[has], 1:] = extra
                    tclock.lap("gemm")
                    Gh = cols.transforms(Q, C, rhs, rho[tile][has], k)
                    if isinstance(Gh, FactoredTransform):
                        G = Gh if has.all() else expand(Gh, has, rho[tile])
                    else:
                        G = _empty_transform(rho[tile], k)
                        G[has] = Gh
                    tclock.lap("transform")
            apply(tile, G)
            tclock.lap("update")
        return sink

    if threads <= 1 or len(tiles) < 2:
        sinks = [work(tiles)]
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            sinks = list(pool.map(work, [tiles[i::threads] for i in range(threads)]))
    for sink in sinks:
        for name, value in (sink or {}).items():
            clock.count(name, value)
    clock.t = time.perf_counter()
    return diag


def _pointwise(pts, obs, loc, method, rho, T, apply, clock):
    k = obs.k
    Yq = (T.T @ obs.Y) if method == "estkf" else obs.Y
    diag = np.zeros((pts.shape[0], 4))
    pts_pre, obs_pre = prepare(loc.geometry, pts), prepare(loc.geometry, obs.coords)
    for p in range(pts.shape[0]):
        one = np.array([p])
        G = _empty_transform(rho[one], k)
        if len(obs):
            taper = _taper(loc, pts_pre[one], obs, obs_pre, None, rho[one])[0]
            sel = np.nonzero(taper)[0]
            clock.lap("weights")
            if sel.size:
                w = taper[sel] * obs.rinv[sel]
                Yl = Yq[:, sel]
                Yw = Yl * w
                C = Yw @ Yl.T
                clock.count("gemm_flops", 2.0 * sel.size * Yl.shape[0] * (Yl.shape[0] + 1))
                if method == "enkf":
                    rhs = Yw @ (obs.d[sel][None, :] + obs.perturbations[:, sel]).T
                else:
                    rhs = Yw @ obs.d[sel]
                diag[p] = (sel.size, w @ obs.d[sel] ** 2, w @ obs.var[sel], taper[sel].sum())
                clock.lap("gemm")
                G = _finish(method, C[None], rhs[None], rho[one], k, T)
                clock.lap("transform")
        apply(one, G)
        clock.lap("update")
    return diag


def local_analysis(
    X: np.ndarray,
    row_coords: np.ndarray,
    obs: ObsSpace,
    loc: Localization,
    *,
    method: Method = "etkf",
    forget: float | np.ndarray = 1.0,
    kernel: Kernel = "batched",
    tile_points: int = 128,
    timings: dict[str, float] | None = None,
    threads: int = 1,
) -> LocalResult:
    """Local analysis of the rows ``X`` located at ``row_coords``.

    Parameters
    ----------
    X : ndarray, shape (k, n)
        Prior ensemble rows (member-major).
    row_coords : ndarray, shape (n, d) or (n,)
        Location of each row in ``loc.geometry``.
    obs : ObsSpace
        Must contain every observation within ``loc.radius`` of the rows.
    loc : Localization
    method : {"etkf", "estkf", "enkf"}
        Square root in ensemble space (LETKF), in the error subspace
        (LESTKF), or perturbed observations (LEnKF; ``obs.perturbations``).
    forget : float or ndarray, shape (n,)
        Forgetting factor ρ (per row; rows at one location must agree).
    kernel : {"batched", "pointwise"}
    tile_points : int
        Maximum points per tile of the batched kernel.
    timings : dict, optional
        Seconds per phase are added to it: ``select`` (tiles, candidate
        observations), ``weights`` (distances, taper), ``basis`` (the tile's
        anomaly basis, batched only), ``gemm`` (the products ``W·Z``; per
        point for ``pointwise``), ``transform`` (eigendecomposition
        and transforms), ``update`` (the rows); ``gemm_flops`` counts the
        floating-point operations of the products, ``tiles_count``,
        ``reduced_tiles_count`` and ``basis_rank_count`` the tiles with
        observations, those done in a reduced basis and the sum of its sizes.
        With several threads the phase times are summed over the threads.
    threads : int
        Threads working on separate tiles (batched kernel only). The result
        does not depend on it. Keep 1 when every core already runs an MPI
        rank; with spare cores, use them here and set the BLAS library to
        one thread (e.g. ``OPENBLAS_NUM_THREADS=1``).

    Returns
    -------
    LocalResult
    """
    X = np.asarray(X, dtype=float)
    k, n = X.shape
    if obs.k != k:
        raise ValueError(f"observed ensemble has {obs.k} members, state has {k}")
    coords = as_coords(row_coords, loc.geometry)
    if coords.shape[0] != n:
        raise ValueError(f"{coords.shape[0]} row coordinates for {n} rows")
    pts, first, inv = np.unique(coords, axis=0, return_index=True, return_inverse=True)
    inv = inv.ravel()
    rho_rows = np.broadcast_to(np.asarray(forget, dtype=float), (n,))
    rho = rho_rows[first]
    T = estkf_projection(k) if method == "estkf" else None

    mean = X.mean(axis=0)
    Xp = X - mean
    out = np.empty_like(X)
    order = np.argsort(inv, kind="stable")
    starts = np.searchsorted(inv[order], np.arange(pts.shape[0] + 1))

    def apply(points: np.ndarray, G: np.ndarray | FactoredTransform) -> None:
        counts = starts[points + 1] - starts[points]
        if np.all(counts == 1):
            rows = order[starts[points]]
        else:
            rows = np.concatenate([order[starts[p] : starts[p + 1]] for p in points])
        Xr = Xp[:, rows].T  # (rows, k)
        if isinstance(G, FactoredTransform):
            upd = (G if rows.size == points.size else G.repeat(counts)).apply(Xr)
        else:
            Grow = G if rows.size == points.size else np.repeat(G, counts, axis=0)
            upd = (Xr[:, None, :] @ Grow)[:, 0, :]
        out[:, rows] = mean[rows] + upd.T

    clock = _Clock(timings)
    if kernel == "batched":
        diag = _batched(pts, obs, loc, method, rho, T, apply, tile_points, clock, threads)
    elif kernel == "pointwise":
        diag = _pointwise(pts, obs, loc, method, rho, T, apply, clock)
    else:
        raise ValueError(f"unknown kernel {kernel!r}")
    d = diag[inv]
    return LocalResult(
        ensemble=out,
        n_obs=d[:, 0].astype(np.int64),
        dRd=d[:, 1],
        trace=d[:, 2],
        weight_sum=d[:, 3],
    )
