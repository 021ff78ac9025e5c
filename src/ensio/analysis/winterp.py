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
without vertical localization, so each level is interpolated alike
(``analysis.localization.vertical`` is refused with a stride > 1).

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
nodes go through the kernel in bands of coarse rows and each band's rows
are blended as soon as it is done (:mod:`~ensio.analysis.winterp_bands`).
The result does not depend on the band size (to rounding, as for tiles).
When a node acts on few rows against the ensemble size (stride 2, one row
per point, from 30 members on) the matrices are not formed at all: each
node's transform is applied to the rows around it as vectors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config.analysis import AnalysisSection, KernelName
from ..config.errors import ConfigError
from ..layout.state import StateLayout
from ..obs import RegularGrid
from ..obs.cells import lon_periodic
from ..stopwatch import Stopwatch
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
    bounds the coarse transforms held at once (default
    :data:`~ensio.analysis.winterp_bands.BAND_BYTES`).
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
    from .winterp_bands import banded_update  # numba: loaded when an analysis blends (issue 24)

    diag_c = banded_update(X, out, inv, nodes, node_row, corner, beta, cell, obs, loc,
                           variant, rho, kernel, tile_points, threads, sw, band_bytes)  # fmt: skip
    diag = np.einsum("pc,pcj->pj", beta, diag_c[corner])
    diag[:, 0] = np.rint(diag[:, 0])
    return AnalysisResult.from_diagnostics(out, diag[inv])


def warm_up() -> None:
    """Compile (first use) or load from the cache the blend's numba loops (benchmarks call it)."""
    from .winterp_bands import warm_up as warm_up_bands

    warm_up_bands()
