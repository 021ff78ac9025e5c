"""Local analysis (LETKF, LESTKF, LEnKF): batched per tile, or point by point.

This module is the entry point and the row bookkeeping (points ⇄ rows,
applying transforms); the kernels are :mod:`~ensio.analysis.batched` and
:mod:`~ensio.analysis.pointwise`, the per-variant step
:mod:`~ensio.analysis.variants`.

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

import numpy as np

from ..config.analysis import KernelName as Kernel
from ..stopwatch import Stopwatch
from .basis import FactoredTransform
from .batched import batched_kernel
from .deferred import VECTOR_MAX_ROWS, DeferredTransform
from .localization import Localization
from .obsspace import ObsSpace
from .pointwise import pointwise_kernel
from .result import AnalysisResult
from .variants import VARIANTS, Variant

__all__ = [
    "KERNELS",
    "Kernel",
    "ObsSpace",
    "concatenated_ranges",
    "local_analysis",
    "run_local",
    "transform_rows",
]

#: The local kernels by ``analysis.kernel`` value.
KERNELS = {"batched": batched_kernel, "pointwise": pointwise_kernel}


def local_analysis(
    X: np.ndarray,
    row_coords: np.ndarray,
    obs: ObsSpace,
    loc: Localization,
    *,
    method: str | Variant = "etkf",
    forget: float | np.ndarray = 1.0,
    kernel: Kernel = "batched",
    tile_points: int = 256,
    timings: dict[str, float] | None = None,
    threads: int = 1,
) -> AnalysisResult:
    """Local analysis of the rows ``X`` located at ``row_coords``.

    Parameters
    ----------
    X : ndarray, shape (k, n)
        Prior ensemble rows (member-major).
    row_coords : ndarray, shape (n, d) or (n,)
        Location of each row in ``loc.geometry``; with ``loc.vertical`` one
        more column, the level (non-finite: none). Rows at one location and
        level share a transform.
    obs : ObsSpace
        Must contain every observation within ``loc.radius`` of the rows.
    loc : Localization
    method : str or Variant
        Square root in ensemble space (LETKF), in the error subspace
        (LESTKF), or perturbed observations (LEnKF; ``obs.perturbations``):
        a name of :data:`~ensio.analysis.variants.VARIANTS` or the variant.
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
        observations, those done in a reduced basis and the sum of its sizes,
        ``chunked_tiles_count`` and ``direct_tiles_count`` those whose products
        were summed over chunks of candidates or formed point by point.
        With several threads the phase times are summed over the threads.
    threads : int
        Threads working on separate tiles (batched kernel only). The result
        does not depend on it. Keep 1 when every core already runs an MPI
        rank; with spare cores, use them here and set the BLAS library to
        one thread (e.g. ``OPENBLAS_NUM_THREADS=1``).

    Returns
    -------
    AnalysisResult
        ``ensemble``, ``n_obs`` and the adaptive-inflation sums ``dRd``,
        ``trace``, ``weight_sum``.
    """
    variant = VARIANTS[method] if isinstance(method, str) else method
    sw = Stopwatch(enabled=timings is not None)
    res = run_local(X, row_coords, obs, loc, variant, forget, kernel, tile_points, threads, sw)
    if timings is not None:
        for name, value in sw.as_dict().items():
            timings[name] = timings.get(name, 0.0) + value
    return res


def run_local(
    X: np.ndarray,
    row_coords: np.ndarray,
    obs: ObsSpace,
    loc: Localization,
    variant: Variant,
    forget: float | np.ndarray,
    kernel: Kernel,
    tile_points: int,
    threads: int,
    sw: Stopwatch,
) -> AnalysisResult:
    """:func:`local_analysis` with a variant object and a :class:`Stopwatch` (filters use it)."""
    X = np.asarray(X, dtype=float)
    k, n = X.shape
    if obs.k != k:
        raise ValueError(f"observed ensemble has {obs.k} members, state has {k}")
    coords = loc.coords(row_coords)
    if coords.shape[0] != n:
        raise ValueError(f"{coords.shape[0]} row coordinates for {n} rows")
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}")
    pts, first, inv = np.unique(coords, axis=0, return_index=True, return_inverse=True)
    inv = inv.ravel()
    rho = np.broadcast_to(np.asarray(forget, dtype=float), (n,))[first]
    out = np.empty_like(X)
    apply = _applier(X, inv, pts.shape[0], out)
    diag = KERNELS[kernel](
        pts,
        obs,
        loc,
        variant,
        rho,
        variant.projection(k),
        apply,
        sw,
        tile_points=tile_points,
        threads=threads,
    )
    d = diag[inv]
    # A row no observation reaches, without inflation, keeps its prior bit for
    # bit: x̄ + (x − x̄) differs from x in the last bit, and an analysis that
    # changes nothing must leave the member files byte-identical.
    keep = (d[:, 0] == 0) & (rho[inv] == 1.0)
    if keep.any():
        out[:, keep] = X[:, keep]
    return AnalysisResult.from_diagnostics(out, d)


def _applier(X: np.ndarray, inv: np.ndarray, n_points: int, out: np.ndarray):
    """``apply(points, G)``: write ``x̄ + X'G`` of the rows at ``points`` into ``out``.

    Rows sharing a location (``inv``: the point of each row) share the transform.
    The anomalies are formed per call, for the rows at hand only: a whole
    anomaly copy of the block would be one more block of peak memory.
    """
    mean = X.mean(axis=0)
    order = np.argsort(inv, kind="stable")
    starts = np.searchsorted(inv[order], np.arange(n_points + 1))

    def apply(points: np.ndarray, G: np.ndarray | FactoredTransform) -> None:
        idx, counts = concatenated_ranges(starts, points)
        rows = order[idx]
        Xr = X[:, rows].T - mean[rows][:, None]  # (rows, k): the same values as X − x̄
        out[:, rows] = mean[rows] + transform_rows(G, Xr, counts).T

    return apply


def concatenated_ranges(ptr: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(idx, counts)``: the ranges ``ptr[i]:ptr[i+1]`` of the ``ids``, one after the other.

    Why one vectorized pass: both the exact analysis (the rows of each point of
    a tile) and weight interpolation (the rows each node acts on) gather a
    tile's ranges from a CSR-style ``ptr``, a Python loop per point otherwise.
    """
    start = ptr[ids]
    counts = ptr[ids + 1] - start
    ends = np.cumsum(counts)
    total = int(ends[-1]) if ends.size else 0
    return np.repeat(start - (ends - counts), counts) + np.arange(total), counts


def transform_rows(
    G: np.ndarray | FactoredTransform | DeferredTransform,
    Xr: np.ndarray,
    counts: np.ndarray,
    vector_rows: int = VECTOR_MAX_ROWS,
) -> np.ndarray:
    """``x'ᵀ G_i`` for the rows of every point: ``Xr`` (rows, k), ``counts[i]`` rows of point i.

    The rows come point by point, in the order of ``G``'s points; whatever form
    the kernel handed the transforms in (deferred, factors or matrices).
    ``vector_rows``: see :meth:`~ensio.analysis.deferred.DeferredTransform.apply_rows`.
    """
    if isinstance(G, DeferredTransform):
        return G.apply_rows(Xr, counts, vector_rows)
    one = Xr.shape[0] == counts.size and bool(np.all(counts == 1))
    if isinstance(G, FactoredTransform):
        return (G if one else G.repeat(counts)).apply(Xr)
    Grow = G if one else np.repeat(G, counts, axis=0)
    return (Xr[:, None, :] @ Grow)[:, 0, :]
