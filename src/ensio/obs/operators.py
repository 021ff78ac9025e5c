"""Observation operators: grid-point index (identity) and bilinear lon/lat.

An operator is stored as a small sparse matrix in row form: for each
observation, the state rows it reads and their weights (``(m, 4)`` for
bilinear, ``(m, 1)`` for an index). Applying it to the ensemble is one gather
and a weighted sum, and a rank can tell from ``rows`` which state rows it
needs from others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .batch import ObsBatch

__all__ = ["RegularGrid", "ObsOperator", "bilinear_operator", "build_operator"]


@dataclass(frozen=True, eq=False)
class RegularGrid:
    """A lon/lat grid of one state variable stored lat-major (C order of (lat, lon)).

    Attributes
    ----------
    lon : ndarray, shape (nlon,)
        Monotonic longitudes in degrees; when they are equally spaced and
        cover the full circle the grid is periodic in longitude.
    lat : ndarray, shape (nlat,)
        Monotonic latitudes in degrees (ascending or descending).
    offset : int
        State-vector row of grid point (lat[0], lon[0]).
    """

    lon: np.ndarray
    lat: np.ndarray
    offset: int = 0

    def __post_init__(self) -> None:
        lon = np.asarray(self.lon, dtype=float)
        lat = np.asarray(self.lat, dtype=float)
        if lon.ndim != 1 or lat.ndim != 1 or lon.size < 2 or lat.size < 2:
            raise ValueError("RegularGrid: lon and lat must be 1-D with at least 2 points")
        object.__setattr__(self, "lon", lon)
        object.__setattr__(self, "lat", lat)

    @property
    def size(self) -> int:
        return self.lon.size * self.lat.size

    @property
    def periodic(self) -> bool:
        """True when the longitudes are equally spaced around the whole circle."""
        rel = np.mod(self.lon - self.lon[0], 360.0)
        step = rel[1]
        return bool(
            step > 0
            and np.allclose(np.diff(rel), step)
            and abs(step * self.lon.size - 360.0) < 1e-6
        )

    def coords(self) -> np.ndarray:
        """(lon, lat) of every grid point in state order, shape (nlat*nlon, 2)."""
        lon2, lat2 = np.meshgrid(self.lon, self.lat)
        return np.stack([lon2.ravel(), lat2.ravel()], axis=1)


@dataclass(frozen=True, eq=False)
class ObsOperator:
    """Sparse linear observation operator in row form.

    Attributes
    ----------
    rows : ndarray of int, shape (m, p)
        State rows each observation reads.
    weights : ndarray, shape (m, p)
    """

    rows: np.ndarray
    weights: np.ndarray

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def apply(self, X: np.ndarray) -> np.ndarray:
        """``HX`` for an ensemble ``X`` of shape (k, n) → (k, m)."""
        return np.einsum("kmp,mp->km", X[:, self.rows], self.weights)

    def subset(self, selection: np.ndarray) -> ObsOperator:
        return ObsOperator(self.rows[selection], self.weights[selection])


def _axis_lon(grid: RegularGrid, lon: np.ndarray):
    """Left index, right index, fraction and inside-flag along longitude."""
    n = grid.lon.size
    finite = np.isfinite(lon)
    lon = np.where(finite, lon, grid.lon[0])
    if grid.periodic:
        step = np.mod(grid.lon[1] - grid.lon[0], 360.0)
        rel = np.mod(lon - grid.lon[0], 360.0) / step
        i0 = np.minimum(np.floor(rel).astype(np.int64), n - 1)
        t = rel - i0
        return i0, (i0 + 1) % n, t, finite
    order = np.argsort(grid.lon)
    gl = grid.lon[order]
    # bring each observation into [gl[0], gl[0] + 360)
    x = gl[0] + np.mod(lon - gl[0], 360.0)
    inside = finite & (x <= gl[-1])
    j = np.clip(np.searchsorted(gl, x, side="right") - 1, 0, n - 2)
    t = (x - gl[j]) / (gl[j + 1] - gl[j])
    return order[j], order[j + 1], t, inside


def bilinear_operator(grid: RegularGrid, lon: np.ndarray, lat: np.ndarray):
    """Bilinear interpolation weights on ``grid`` for observation locations.

    Longitude is periodic when the grid is (see :attr:`RegularGrid.periodic`);
    otherwise, and always in latitude, locations outside the grid's range are
    flagged (no extrapolation, e.g. beyond the last latitude next to a pole).

    Parameters
    ----------
    grid : RegularGrid
    lon, lat : ndarray, shape (m,)

    Returns
    -------
    op : ObsOperator
        Rows ``(m, 4)``; entries of rejected observations point at row
        ``grid.offset`` with weight 0.
    inside : ndarray of bool, shape (m,)
    """
    lon = np.asarray(lon, dtype=float)
    lat = np.asarray(lat, dtype=float)
    i0, i1, tx, inside = _axis_lon(grid, lon)
    order = np.argsort(grid.lat)
    gl = grid.lat[order]
    inside = inside & np.isfinite(lat) & (lat >= gl[0]) & (lat <= gl[-1])
    lat = np.where(np.isfinite(lat), lat, gl[0])
    j = np.clip(np.searchsorted(gl, lat, side="right") - 1, 0, gl.size - 2)
    ty = (lat - gl[j]) / (gl[j + 1] - gl[j])
    j0, j1 = order[j], order[j + 1]
    nlon = grid.lon.size
    rows = grid.offset + np.stack(
        [j0 * nlon + i0, j0 * nlon + i1, j1 * nlon + i0, j1 * nlon + i1], 1
    )
    w = np.stack([(1 - tx) * (1 - ty), tx * (1 - ty), (1 - tx) * ty, tx * ty], axis=1)
    rows = np.where(inside[:, None], rows, grid.offset)
    w = np.where(inside[:, None], w, 0.0)
    return ObsOperator(rows.astype(np.int64), w), inside


def build_operator(obs: ObsBatch, n_state: int, grid: RegularGrid | None = None):
    """H for a batch: identity at ``obs.index``, else bilinear on ``grid``.

    Parameters
    ----------
    obs : ObsBatch
    n_state : int
        Length of the state vector (index range check).
    grid : RegularGrid, optional
        Needed when some observation has no (non-negative) index.

    Returns
    -------
    op : ObsOperator
        Rows ``(m, 4)`` (identity rows padded with weight 0).
    inside : ndarray of bool, shape (m,)
        False for observations outside the grid / state (to be rejected and counted).
    """
    m = len(obs)
    rows = np.zeros((m, 4), dtype=np.int64)
    w = np.zeros((m, 4))
    inside = np.zeros(m, dtype=bool)
    has_index = np.zeros(m, dtype=bool) if obs.index is None else obs.index >= 0
    if has_index.any():
        idx = obs.index[has_index]  # type: ignore[index]
        ok = idx < n_state
        r = np.where(ok, idx, 0)
        rows[has_index, 0] = r
        w[has_index, 0] = np.where(ok, 1.0, 0.0)
        inside[has_index] = ok
    need = ~has_index
    if need.any():
        if grid is None:
            raise ValueError("observations without an index need a lon/lat grid for H")
        op, ins = bilinear_operator(grid, obs.lon[need], obs.lat[need])
        ins &= op.rows.max(axis=1) < n_state
        rows[need] = op.rows
        w[need] = np.where(ins[:, None], op.weights, 0.0)
        inside[need] = ins
    return ObsOperator(rows, w), inside
