"""Weight interpolation (Yang et al. 2009): transforms on a coarse grid, bilinear in between.

With ``analysis.weight_interpolation.stride: k > 1`` a local filter on a
rectilinear lon/lat grid computes the ensemble-space transform
``G = w̄ 1ᵀ + W`` (the perturbed-observation transform for the EnKF, the
error-subspace one mapped to member space for the ESTKF) only at the
**coarse nodes**: every k-th longitude and every k-th latitude of the
grid, plus the last latitude (and the last longitude when longitude is not
periodic), so every grid point lies in a coarse cell. Every analysis point
then gets ``G = Σ_c β_c G_c`` over the four corners of its cell, with the
bilinear weights ``β`` of its (lon, lat) in the cell — in longitude across
the dateline when the grid is periodic (the cell between the last coarse
column and the first wraps), and up to the pole rows when the grid has
them — and is updated as ``x̄ + X'G``. A point on a coarse node takes that
node's transform exactly (weights 1, 0, 0, 0); a point whose four corners
have no observation keeps the inflated prior ``I/√ρ`` exactly. Rows of a
3-D variable share the transform of their column, as in the exact analysis
(there is no vertical localization), so each level is interpolated alike.

**Ranks.** A rank computes the coarse nodes its points need, wherever they
are (inside its rows or not): their transforms need only the observations
within the support radius of the node, so the observations a rank selects
(:func:`selection_radius`) reach ``margin_km`` further, the largest
distance between a grid point and a corner of its coarse cell. The result
then does not depend on the ranks (to rounding: tiles of nodes differ).

The coarse columns start at the smallest longitude of the grid (as the
coordinate is stored) and the coarse rows at the southernmost latitude. A
regional grid whose longitudes wrap inside it (e.g. 170 … 180, −180 … −170)
is not supported (its sorted longitudes are not in order along the grid).

**Memory.** A coarse node's transform is a k × k matrix (``8 N_e²`` bytes:
207 MB at N_e = 40 for the 16 290 nodes of a 360 × 180 grid at stride 2,
ten times the ensemble block), so they are never all held at once: the
nodes go through the kernel in **bands** of coarse rows whose transforms fit
:data:`BAND_BYTES`, the rows whose cells lie in the band are blended into
the analysis by a compiled loop (:func:`_blend_rows`, numba like the
eigensolver), and only the band's last coarse row is kept for the next band.
The result does not depend on the band size (to rounding, as for tiles).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from ..config.analysis import AnalysisSection, KernelName
from ..config.errors import ConfigError
from ..layout.state import StateLayout
from ..obs import RegularGrid
from ..obs.cells import lon_periodic
from ..stopwatch import Stopwatch
from .basis import FactoredTransform
from .local import KERNELS
from .localization import EARTH_RADIUS_KM, Localization, as_coords
from .obsspace import ObsSpace
from .result import AnalysisResult
from .variants import Variant

__all__ = [
    "KEY",
    "WeightGrid",
    "interpolated_local",
    "warm_up",
    "selection_radius",
    "weight_grid",
]

KEY = "analysis.weight_interpolation.stride"

#: Bytes of coarse transforms held at once (a band of coarse rows, see the
#: module docstring; at least two coarse rows). Why a bound: all nodes at once
#: were 207 MB at stride 2 on the 360 × 180 × 40 case (ten times the block),
#: and first touching an array that size cost more than the blend itself
#: (measured 0.5 s of a 0.98 s update phase on a loaded machine). Why 16 MiB:
#: beside the posterior block and one tile's work arrays it keeps the peak
#: within the issue's 2 × (block + observations + one tile) (measured 1.8×;
#: 2.2× with 32 MiB), and the bands' smaller tiles did not cost GEMM work
#: (40.1 against 42.9 GFLOP in one band at stride 2, 19.7 against 19.2 at 3).
BAND_BYTES = 16 * 2**20


def _coarse_indices(n: int, stride: int, closed: bool) -> np.ndarray:
    """Every ``stride``-th index of ``n``, plus ``n - 1`` when ``closed`` (non-periodic)."""
    idx = np.arange(0, n, stride)
    if closed and idx[-1] != n - 1:
        idx = np.append(idx, n - 1)
    return idx


def _axis_cells(nodes: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Left node (clipped to ``[0, n-2]``) and fraction in ``[0, 1]`` on ascending ``nodes``."""
    i = np.clip(np.searchsorted(nodes, x, side="right") - 1, 0, nodes.size - 2)
    f = np.clip((x - nodes[i]) / (nodes[i + 1] - nodes[i]), 0.0, 1.0)
    return i, f


@dataclass(frozen=True, eq=False)
class WeightGrid:
    """The lon/lat grid and its coarse nodes for a stride.

    Parameters
    ----------
    lon, lat : ndarray, 1-D
        The grid's coordinates in degrees (any order; sorted here).
    stride : int
    """

    lon: np.ndarray
    lat: np.ndarray
    stride: int
    periodic: bool = field(init=False)
    clon: np.ndarray = field(init=False)  # coarse longitudes (grid values), ascending
    clat: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        lon = np.unique(np.asarray(self.lon, dtype=float))
        lat = np.unique(np.asarray(self.lat, dtype=float))
        if lon.size < 2 or lat.size < 2:
            raise ConfigError(f"{KEY}: needs a lon/lat grid of at least 2 × 2 points")
        periodic = lon.size > 2 and lon_periodic(lon)
        if periodic:  # ascending from the first longitude eastwards, in (lon0 - 360, lon0 + 360)
            lon = lon[np.argsort(np.mod(lon - lon[0], 360.0), kind="stable")]
        object.__setattr__(self, "lon", lon)
        object.__setattr__(self, "lat", lat)
        object.__setattr__(self, "periodic", periodic)
        object.__setattr__(
            self, "clon", lon[_coarse_indices(lon.size, self.stride, not periodic)]
        )
        object.__setattr__(self, "clat", lat[_coarse_indices(lat.size, self.stride, True)])

    def _lon_cells(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Left and right coarse column and fraction of each longitude ``x``."""
        if not self.periodic:
            i, f = _axis_cells(self.clon, x)
            return i, i + 1, f
        rel = np.mod(self.clon - self.clon[0], 360.0)
        edges = np.append(rel, 360.0)  # the last cell wraps to the first column
        r = np.mod(x - self.clon[0], 360.0)
        i = np.clip(np.searchsorted(edges, r, side="right") - 1, 0, rel.size - 1)
        f = np.clip((r - edges[i]) / (edges[i + 1] - edges[i]), 0.0, 1.0)
        return i, (i + 1) % rel.size, f

    def cells(self, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The coarse nodes the points need and each point's corners and weights.

        Parameters
        ----------
        pts : ndarray, shape (p, 2)
            lon, lat in degrees.

        Returns
        -------
        nodes : ndarray, shape (c, 2)
            lon, lat of the needed coarse nodes (grid values, so a node that
            is also a row has exactly the row's coordinates).
        corner : ndarray of int, shape (p, 4)
            Index into ``nodes`` of the corners (i, j), (i+1, j), (i, j+1), (i+1, j+1).
        beta : ndarray, shape (p, 4)
            Bilinear weights (sum 1; exactly (1, 0, 0, 0) on a node).
        cell : ndarray of int, shape (p,)
            The coarse cell of each point (points of one cell share the corners).
        """
        i0, i1, fx = self._lon_cells(pts[:, 0])
        j0, fy = _axis_cells(self.clat, pts[:, 1])
        j1 = j0 + 1
        nlon = self.clon.size
        ids = np.stack([j0 * nlon + i0, j0 * nlon + i1, j1 * nlon + i0, j1 * nlon + i1], axis=1)
        beta = np.stack(
            [(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy], axis=1
        )
        # the sorted distinct node ids and each corner's place among them, by a
        # mark-and-count over the coarse grid (np.unique sorts 4 ids per point)
        used = np.zeros(self.clat.size * nlon, dtype=np.bool_)
        used[ids] = True
        uniq = np.flatnonzero(used)
        corner = (np.cumsum(used) - 1)[ids]
        nodes = np.stack([self.clon[uniq % nlon], self.clat[uniq // nlon]], axis=1)
        return nodes, corner, beta, ids[:, 0]

    def node_rows(self, nodes: np.ndarray) -> np.ndarray:
        """Coarse row (index into ``clat``) of each node of :meth:`cells` (exact: grid values)."""
        return np.searchsorted(self.clat, nodes[:, 1])

    def margin_km(self) -> float:
        """Upper bound of the distance from a grid point to the corners of its coarse cell.

        Along the meridian at most the largest coarse latitude step, then
        along the parallel at most the largest coarse longitude step (an arc
        of a parallel is no shorter than the great circle): their sum.
        """
        dlat = float(np.max(np.diff(self.clat)))
        if self.periodic:
            rel = np.append(np.mod(self.clon - self.clon[0], 360.0), 360.0)
            dlon = float(np.max(np.diff(rel)))
        else:
            dlon = float(np.max(np.diff(self.clon)))
        return EARTH_RADIUS_KM * np.radians(dlat + min(dlon, 180.0)) * (1.0 + 1e-9)


def weight_grid(
    cfg: AnalysisSection,
    layout: StateLayout | None,
    grid: object = None,
    coords: np.ndarray | None = None,
) -> WeightGrid | None:
    """The :class:`WeightGrid` of ``analysis.weight_interpolation`` (None: exact analysis).

    The grid is the layout's rectilinear lon/lat grid (member files), else
    ``grid`` (a :class:`~ensio.obs.RegularGrid` of the in-memory API), else
    the distinct longitudes and latitudes of ``coords`` (the in-memory API's
    coordinates of every row).
    """
    stride = cfg.weight_interpolation.stride
    if stride == 1 or cfg.localization is None:
        return None
    geo = None if layout is None else layout.geometry
    if geo is not None and geo.grid is not None:
        if geo.grid.kind != "rectilinear":
            raise ConfigError(
                f"{KEY}: needs a rectilinear lon/lat grid; {geo.source} has a {geo.grid.kind} one"
            )
        return WeightGrid(geo.grid.lon.values, geo.grid.lat.values, stride)
    if isinstance(grid, RegularGrid):
        return WeightGrid(grid.lon, grid.lat, stride)
    if coords is not None:
        c = np.asarray(coords, dtype=float)
        if c.ndim == 2 and c.shape[1] == 2:
            return WeightGrid(c[:, 0], c[:, 1], stride)
    raise ConfigError(f"{KEY}: needs the lon/lat grid of the state (member files or grid=)")


def selection_radius(support_radius: float, wgrid: WeightGrid | None) -> float:
    """Radius around a rank's rows within which it keeps observations (see the module doc)."""
    return support_radius if wgrid is None else support_radius + wgrid.margin_km()


def _unique_points(coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(coords, axis=0, return_inverse=True)`` for (n, 2) float coordinates.

    Each (lon, lat) pair read as one complex number (the same bytes), whose
    sort is lexicographic as the rows' is: the same points in the same order,
    about 20 times faster than the row-wise unique (150 ms for 64 800 rows).
    """
    pairs = np.ascontiguousarray(coords, dtype=np.float64).view(np.complex128).ravel()
    uniq, inv = np.unique(pairs, return_inverse=True)
    return uniq.view(np.float64).reshape(-1, 2), inv.ravel()


def _dense_into(Gbuf: np.ndarray, slots: np.ndarray, Gp: np.ndarray | FactoredTransform) -> None:
    """Write the dense transforms of a tile into ``Gbuf[slots]``.

    Factored transforms are formed node by node straight into the buffer
    (:func:`_form_dense`): about 3× faster than
    :meth:`~ensio.analysis.basis.FactoredTransform.dense` and a gathered copy,
    whose tile-sized temporaries are fresh memory on every tile.
    """
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


class _Bands:
    """Bands of consecutive coarse rows of the nodes, each band's transforms within a budget.

    ``nodes`` are sorted by coarse row (:meth:`WeightGrid.cells`), so a band
    is a contiguous range of nodes; consecutive bands share one coarse row
    (the last of one is the first of the next), which is kept, not recomputed.
    """

    def __init__(self, node_row: np.ndarray, k: int, band_bytes: int) -> None:
        self.rows, self.start = np.unique(node_row, return_index=True)
        self.stop = np.append(self.start[1:], node_row.size)
        sizes = self.stop - self.start
        pairs = sizes[:-1] + sizes[1:] if sizes.size > 1 else sizes
        self.capacity = int(min(node_row.size, max(band_bytes // (8 * k * k), pairs.max())))

    def __iter__(self):
        """``(lo, hi)``: indices into ``rows`` of the band's first and last coarse row."""
        lo, n = 0, self.rows.size
        while lo < n - 1:
            base = self.start[lo]
            hi = lo + 1
            while hi + 1 < n and self.stop[hi + 1] - base <= self.capacity:
                hi += 1
            yield lo, hi
            lo = hi


def _merge(sw: Stopwatch, band: Stopwatch) -> None:
    """Add a band's timings to ``sw``; ``*_bytes`` (the largest work array) keep the maximum."""
    for name, v in band.as_dict().items():
        if name.endswith("_bytes"):
            v = max(v - sw[name], 0.0)
        sw.add(name, v)


def interpolated_local(
    X: np.ndarray,
    row_coords: np.ndarray,
    obs: ObsSpace,
    loc: Localization,
    variant: Variant,
    forget: float | np.ndarray,
    kernel: KernelName,
    tile_points: int,
    threads: int,
    sw: Stopwatch,
    wgrid: WeightGrid,
    band_bytes: int | None = None,
) -> AnalysisResult:
    """:func:`~ensio.analysis.local.run_local` with transforms interpolated from ``wgrid``.

    ``obs`` must hold every observation within the support radius of the
    coarse nodes of the rows' cells (:func:`selection_radius`). The
    diagnostics of a point (observations used, adaptive-inflation sums) are
    interpolated like the transforms (the count rounded). ``forget`` must be
    one value (adaptive inflation is refused by the config). ``band_bytes``
    bounds the coarse transforms held at once (default :data:`BAND_BYTES`).
    """
    X = np.asarray(X, dtype=float)
    k, n = X.shape
    if obs.k != k:
        raise ValueError(f"observed ensemble has {obs.k} members, state has {k}")
    coords = as_coords(row_coords, loc.geometry)
    if coords.shape != (n, 2):
        raise ValueError(f"{KEY}: needs lon/lat of every row, got shape {coords.shape}")
    rho_all = np.broadcast_to(np.asarray(forget, dtype=float), (n,))
    rho = float(rho_all[0]) if n else 1.0
    if not np.all(rho_all == rho):
        raise ValueError(f"{KEY}: needs one forgetting factor for all rows")
    out = X.copy()
    if n == 0:
        z = np.zeros(0)
        return AnalysisResult(ensemble=out, n_obs=np.zeros(0, np.int64), dRd=z, trace=z,
                              weight_sum=z)  # fmt: skip
    with sw("select"):
        pts, inv = _unique_points(coords)
        nodes, corner, beta, cell = wgrid.cells(pts)
        node_row = wgrid.node_rows(nodes)
    diag_c = _banded_update(X, out, inv, nodes, node_row, corner, beta, cell, obs, loc,
                            variant, rho, kernel, tile_points, threads, sw, band_bytes)  # fmt: skip
    diag = np.einsum("pc,pcj->pj", beta, diag_c[corner])
    diag[:, 0] = np.rint(diag[:, 0])
    return AnalysisResult.from_diagnostics(out, diag[inv])


def _banded_update(X, out, inv, nodes, node_row, corner, beta, cell, obs, loc, variant, rho,
                   kernel, tile_points, threads, sw, band_bytes) -> np.ndarray:  # fmt: skip
    """Band by band: the coarse transforms through the kernel, then the rows of the band's cells.

    Writes ``out``; returns the nodes' diagnostics ``(c, 4)``. Rows are
    visited cell by cell, then point by point (sorted by cell, hence by
    coarse row: each band's rows are one slice), so the four corner
    transforms of a cell stay in the cache while its rows use them. Rows
    whose four corners have no observation get ``x̄ + x'·(1/√ρ)`` exactly,
    as in the exact analysis.
    """
    k = X.shape[0]
    bands = _Bands(node_row, k, BAND_BYTES if band_bytes is None else band_bytes)
    Gbuf = np.empty((bands.capacity, k, k))
    diag_c = np.zeros((nodes.shape[0], 4))
    point_row = node_row[corner[:, 0]]  # a point's cell spans its row and the next
    empty = np.zeros(corner.shape[0], dtype=np.bool_)
    with sw("update"):
        mean = X.mean(axis=0)  # the anomalies are formed row by row in the blend
        order = np.lexsort((inv, cell[inv])).astype(np.int64)  # by cell, then point
        row_of = point_row[inv][order]
        inv64, corner64 = np.asarray(inv, dtype=np.int64), np.asarray(corner, dtype=np.int64)
        beta = np.ascontiguousarray(beta)
    kept = 0  # nodes at the front of Gbuf carried over from the previous band
    for lo, hi in bands:
        base, first, stop = bands.start[lo], bands.start[lo] + kept, bands.stop[hi]
        band_sw = Stopwatch(sw.enabled)  # the kernel laps from its own start

        def capture(points: np.ndarray, Gp, off=first - base) -> None:
            _dense_into(Gbuf, points + off, Gp)

        diag_c[first:stop] = KERNELS[kernel](
            nodes[first:stop], obs, loc, variant, np.full(stop - first, rho),
            variant.projection(k), capture, band_sw, tile_points=tile_points, threads=threads,
        )  # fmt: skip
        _merge(sw, band_sw)
        with sw("update"):
            a = int(np.searchsorted(row_of, bands.rows[lo], side="left"))
            b = int(np.searchsorted(row_of, bands.rows[hi - 1], side="right"))
            pts_band = np.unique(inv64[order[a:b]])
            empty[pts_band] = ~np.any(diag_c[corner[pts_band], 0] > 0, axis=1)
            _blend_rows(X, mean, order[a:b], inv64, corner64, base, beta, Gbuf, empty,
                        1.0 / np.sqrt(rho), out)  # fmt: skip
            kept = bands.stop[hi] - bands.start[hi]
            Gbuf[:kept] = Gbuf[bands.start[hi] - base : stop - base].copy()
    return diag_c


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
    """Compile (first use) or load from the cache :func:`_blend_rows` (benchmarks call it)."""
    _blend_rows(np.zeros((2, 1)), np.zeros(1), np.zeros(1, np.int64), np.zeros(1, np.int64),
                np.zeros((1, 4), np.int64), 0, np.array([[1.0, 0, 0, 0]]), np.eye(2)[None],
                np.zeros(1, np.bool_), 1.0, np.zeros((2, 1)))  # fmt: skip
    _form_dense(np.zeros((1, 2, 2)), np.zeros(1, np.int64), np.ones((1, 2, 2)), np.ones((1, 2)),
                np.ones(1), np.zeros((1, 2)), np.zeros(1, np.bool_))  # fmt: skip
