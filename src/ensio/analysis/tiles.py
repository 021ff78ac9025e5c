"""Tiles of nearby analysis points and their candidate observations.

A tile is a compact group of points. Its candidate observations are those
within ``tile radius + support radius`` of the tile's centre point: by the
triangle inequality of the (great-circle, periodic or Euclidean) distance
this is a superset of the observations within the support radius of any
point of the tile, so nothing is missed, and the exact per-point weights
decide the rest. Working with true distances (no boxes in degrees) makes
tiles that straddle the dateline or contain a pole correct without special
cases.

Tiles are built by recursive bisection in an embedding of the points in
Euclidean space where the straight-line (chord) distance is a monotone
function of the true distance: unit vectors × Earth radius for lon/lat, a
circle of circumference ``period`` for periodic domains, the coordinates
themselves otherwise. Candidate queries use a k-d tree in the same
embedding.
"""

from __future__ import annotations

import numpy as np

from .localization import (
    EARTH_RADIUS_KM,
    Geometry,
    Localization,
    distances,
    prepared_distances,
    regulate,
    unit_vectors,
)

__all__ = [
    "embed",
    "chord_radius",
    "make_tiles",
    "CandidateFinder",
    "taper_weights",
    "tile_weights",
]

#: Pairs per block of :func:`tile_weights`: the dozens of element-wise passes
#: of the distances and the taper then run on arrays that stay in the L2
#: cache (about twice as fast as passes over a whole tile).
TAPER_BLOCK = 16384


def embed(geometry: Geometry, coords: np.ndarray) -> np.ndarray:
    """Embed ``(n, d)`` coordinates in Euclidean space (chord ≤ true distance).

    Returns
    -------
    ndarray, shape (n, e)
    """
    if geometry.kind == "lonlat":
        return unit_vectors(coords) * EARTH_RADIUS_KM
    if geometry.kind == "periodic":
        p = float(geometry.period)  # type: ignore[arg-type]
        ang = 2.0 * np.pi * coords[:, 0] / p
        return np.stack([np.cos(ang), np.sin(ang)], axis=1) * (p / (2.0 * np.pi))
    return np.asarray(coords, dtype=float)


def chord_radius(geometry: Geometry, dist: float) -> float:
    """Embedding distance equivalent to the true distance ``dist`` (with a margin).

    Returns ``inf`` when every point is within ``dist``.
    """
    if not np.isfinite(dist):
        return np.inf
    if geometry.kind == "lonlat":
        half = 0.5 * dist / EARTH_RADIUS_KM
        if half >= 0.5 * np.pi:
            return np.inf
        r = 2.0 * EARTH_RADIUS_KM * np.sin(half)
    elif geometry.kind == "periodic":
        p = float(geometry.period)  # type: ignore[arg-type]
        if dist >= 0.5 * p:
            return np.inf
        rho = p / (2.0 * np.pi)
        r = 2.0 * rho * np.sin(dist / (2.0 * rho))
    else:
        r = dist
    # relative and absolute margins absorb rounding of the embedding
    return r * (1.0 + 1e-9) + 1e-9 * (1.0 + r)


def make_tiles(
    geometry: Geometry,
    coords: np.ndarray,
    max_points: int = 128,
    max_extent: float = np.inf,
    min_points: int = 16,
) -> list[np.ndarray]:
    """Split points into compact tiles by recursive median bisection.

    A node is split along the embedding axis of largest extent while it has
    more than ``max_points`` points, or while its extent exceeds
    ``max_extent`` and it has more than ``min_points`` points. The second rule
    keeps tiles small compared with the support radius, so the candidate set
    of a tile is not much larger than that of one of its points.

    Parameters
    ----------
    geometry : Geometry
    coords : ndarray, shape (n, d)
    max_points, min_points : int
    max_extent : float
        In distance units (km for lon/lat).

    Returns
    -------
    list of ndarray of int
        Point indices per tile; every point is in exactly one tile.
    """
    n = coords.shape[0]
    if n == 0:
        return []
    e = embed(geometry, coords)
    tiles: list[np.ndarray] = []
    stack = [np.arange(n)]
    while stack:
        idx = stack.pop()
        sub = e[idx]
        ext = sub.max(axis=0) - sub.min(axis=0)
        axis = int(np.argmax(ext))
        big = idx.size > max_points or (ext[axis] > max_extent and idx.size > min_points)
        if not big or ext[axis] == 0.0:
            tiles.append(np.sort(idx))
            continue
        half = idx.size // 2
        part = np.argpartition(sub[:, axis], half)
        stack.append(idx[part[half:]])
        stack.append(idx[part[:half]])
    return tiles


class CandidateFinder:
    """Observations possibly within ``radius`` of some point of a tile.

    Parameters
    ----------
    geometry : Geometry
    obs_coords : ndarray, shape (m, d)
    radius : float
        Support radius.
    """

    def __init__(self, geometry: Geometry, obs_coords: np.ndarray, radius: float) -> None:
        self.geometry = geometry
        self.obs_coords = obs_coords
        self.radius = radius
        self.m = obs_coords.shape[0]
        # scipy.spatial costs ~0.2-0.9 s to import: only where a tree is built (issue 24)
        from scipy.spatial import cKDTree

        self._tree = cKDTree(embed(geometry, obs_coords)) if self.m else None

    def __call__(self, point_coords: np.ndarray) -> np.ndarray:
        """Sorted indices of candidate observations for a tile of points ``(p, d)``."""
        if self.m == 0 or point_coords.shape[0] == 0:
            return np.empty(0, dtype=np.int64)
        if not np.isfinite(self.radius):
            return np.arange(self.m)
        e = embed(self.geometry, point_coords)
        centre = int(np.argmin(((e - e.mean(axis=0)) ** 2).sum(axis=1)))
        tile_radius = float(
            distances(self.geometry, point_coords[centre : centre + 1], point_coords).max()
        )
        r = chord_radius(self.geometry, tile_radius + self.radius)
        if not np.isfinite(r):
            return np.arange(self.m)
        found = self._tree.query_ball_point(e[centre], r)  # type: ignore[union-attr]
        return np.sort(np.asarray(found, dtype=np.int64))


def taper_weights(
    loc: Localization,
    pts: np.ndarray,
    obs_pre: np.ndarray,
    rho: np.ndarray,
    regulated: tuple[np.ndarray, np.ndarray] | None = None,
    levels: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Localization weights ``(p, c)`` of points ``pts`` against observations ``obs_pre``.

    Parameters
    ----------
    loc : Localization
    pts, obs_pre : ndarray
        Horizontal coordinates passed through
        :func:`~ensio.analysis.localization.prepare`.
    rho : ndarray, shape (p,)
        Forgetting factor of each point (regulated localization only).
    regulated : (ndarray, ndarray), optional
        Observed ensemble variance and σ_o² of the observations, for
        ``loc.regulated``.
    levels : (ndarray, ndarray), optional
        Levels of the points (p,) and of the observations (c,), for
        ``loc.vertical``: the vertical taper multiplies the horizontal one
        (before regulation, which sees the product).
    """
    taper = loc.weights(prepared_distances(loc.geometry, pts, obs_pre))
    if levels is not None and loc.vertical is not None:
        taper *= loc.vertical.weights(*levels)
    return _regulated(taper, rho, regulated)


def _regulated(
    taper: np.ndarray, rho: np.ndarray, regulated: tuple[np.ndarray, np.ndarray] | None
) -> np.ndarray:
    """The regulated weights of ``taper`` (p, c) (:func:`taper_weights`), or ``taper``."""
    if regulated is None:
        return taper
    var, err2 = regulated
    inside = taper > 0
    cnt = inside.sum(axis=1)
    state_var = (inside @ var) / np.maximum(cnt, 1) / rho
    return regulate(taper, err2, state_var)


def _fused(loc: Localization, regulated) -> bool:
    """Whether the compiled lon/lat Gaspari–Cohn weights apply (bit for bit the numpy ones)."""
    return regulated is None and loc.taper == "gaspari-cohn" and loc.geometry.kind == "lonlat"


def _horizontal(loc: Localization, pts: np.ndarray, obs_pre: np.ndarray, fused: bool):
    """The horizontal taper ``(p, c)`` alone (no R⁻¹), compiled when ``fused``."""
    if not fused:
        return loc.weights(prepared_distances(loc.geometry, pts, obs_pre))
    from .taperfused import lonlat_gc_weights  # numba: loaded only by the analyses using it

    c = obs_pre.shape[0]
    out = np.empty((pts.shape[0], c))
    # R⁻¹ = 1: the compiled loop's ``w * 1.0`` is the taper itself
    lonlat_gc_weights(pts, obs_pre, np.ones(c), loc.radius, out,
                      np.empty(pts.shape[0], np.int64), np.zeros(c, bool))  # fmt: skip
    return out


def _vertical_tile(loc, pts, obs_pre, rinv, rho, regulated, levels):
    """:func:`tile_weights` with vertical localization.

    Why apart: a tile's points are (column, level) pairs and the levels of
    one column share its horizontal taper, so it is computed once per
    distinct column and gathered, then multiplied by the vertical weights
    (the operations, in the order, of :func:`taper_weights`: equal to the
    pointwise kernel's weights bit for bit).
    """
    cols, inv = np.unique(pts, axis=0, return_inverse=True)
    taper = _horizontal(loc, cols, obs_pre, _fused(loc, regulated))[inv.ravel()]
    taper *= loc.vertical.weights(*levels)
    taper = _regulated(taper, rho, regulated)
    return taper * rinv, np.count_nonzero(taper, axis=1), taper.any(axis=0)


def tile_weights(
    loc: Localization,
    pts: np.ndarray,
    obs_pre: np.ndarray,
    rinv: np.ndarray,
    rho: np.ndarray,
    regulated: tuple[np.ndarray, np.ndarray] | None = None,
    levels: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tile's GEMM weights ``taper · R⁻¹`` with per-point counts and used candidates.

    Computed in blocks of :data:`TAPER_BLOCK` pairs; every value is
    element-wise (per row for the regulated weights), so the blocking
    changes nothing. ``levels``: see :func:`taper_weights`.

    Returns
    -------
    W : ndarray, shape (p, c)
    n_obs : ndarray of int, shape (p,)
        Observations with non-zero weight at each point.
    used : ndarray of bool, shape (c,)
        Candidates with a non-zero weight at some point.
    """
    if levels is not None and loc.vertical is not None:
        return _vertical_tile(loc, pts, obs_pre, rinv, rho, regulated, levels)
    p, c = pts.shape[0], obs_pre.shape[0]
    out = np.empty((p, c))
    n_obs = np.empty(p, dtype=np.int64)
    used = np.zeros(c, dtype=bool)
    if _fused(loc, regulated):
        from .taperfused import lonlat_gc_weights  # numba: loaded only by the analyses using it

        lonlat_gc_weights(pts, obs_pre, rinv, loc.radius, out, n_obs, used)  # bit for bit
        return out, n_obs, used
    step = max(1, TAPER_BLOCK // max(c, 1))
    for i in range(0, p, step):
        w = taper_weights(loc, pts[i : i + step], obs_pre, rho[i : i + step], regulated)
        n_obs[i : i + step] = np.count_nonzero(w, axis=1)
        used |= w.any(axis=0)
        np.multiply(w, rinv, out=out[i : i + step])
    return out, n_obs, used
