"""Observation operators: grid-point index (identity) and interpolation on a grid.

An operator is stored as a small sparse matrix in row form: for each
observation, the state rows it reads and their weights (``(m, 4)`` for
bilinear, ``(m, 1)`` for an index). Applying it to the ensemble is one gather
and a weighted sum, and a rank can tell from ``rows`` which state rows it
needs from others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .batch import ObsBatch
from .cells import lon_periodic, rectilinear_cells

__all__ = ["Locator", "RegularGrid", "ObsOperator", "bilinear_operator", "build_operator"]


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
        return lon_periodic(self.lon)

    def coords(self) -> np.ndarray:
        """(lon, lat) of every grid point in state order, shape (nlat*nlon, 2)."""
        lon2, lat2 = np.meshgrid(self.lon, self.lat)
        return np.stack([lon2.ravel(), lat2.ravel()], axis=1)

    def locate(self, obs: ObsBatch, n_state: int) -> tuple[ObsOperator, np.ndarray]:
        """Bilinear H of every observation (variable and level are not used)."""
        op, inside = bilinear_operator(self, obs.lon, obs.lat)
        inside = inside & (op.rows.max(axis=1) < n_state)
        return ObsOperator(op.rows, np.where(inside[:, None], op.weights, 0.0)), inside


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
    c = rectilinear_cells(grid.lon, grid.lat, lon, lat)
    rows = grid.offset + c.j * grid.lon.size + c.i
    rows = np.where(c.inside[:, None], rows, grid.offset)
    return ObsOperator(rows.astype(np.int64), c.w), c.inside


class Locator(Protocol):
    """What :func:`build_operator` needs of a grid: H of observations without an index."""

    def locate(self, obs: ObsBatch, n_state: int) -> tuple[ObsOperator, np.ndarray]:
        """Rows, weights and inside-flags of every observation of ``obs``."""
        ...


def build_operator(obs: ObsBatch, n_state: int, grid: Locator | None = None):
    """H for a batch: identity at ``obs.index``, else interpolation by ``grid``.

    Parameters
    ----------
    obs : ObsBatch
    n_state : int
        Length of the state vector (index range check).
    grid : RegularGrid or StateGrid, optional
        Needed when some observation has no (non-negative) index: a
        :class:`RegularGrid` (bilinear on one variable, the in-memory API) or
        a :class:`~ensio.obs.stategrid.StateGrid` (any state: variable, level,
        curvilinear, masks).

    Returns
    -------
    op : ObsOperator
        Rows ``(m, p)``, p = 4, or 8 when some observation interpolates
        between two levels (identity rows padded with weight 0).
    inside : ndarray of bool, shape (m,)
        False for observations outside the grid / state (to be rejected and counted).
    """
    m = len(obs)
    has_index = np.zeros(m, dtype=bool) if obs.index is None else obs.index >= 0
    need = ~has_index
    located = None
    if need.any():
        if grid is None:
            raise ValueError("observations without an index need a lon/lat grid for H")
        located = grid.locate(obs.subset(need), n_state)
    p = 4 if located is None else max(4, located[0].rows.shape[1])
    rows = np.zeros((m, p), dtype=np.int64)
    w = np.zeros((m, p))
    inside = np.zeros(m, dtype=bool)
    if has_index.any():
        idx = obs.index[has_index]  # type: ignore[index]
        ok = idx < n_state
        rows[has_index, 0] = np.where(ok, idx, 0)
        w[has_index, 0] = np.where(ok, 1.0, 0.0)
        inside[has_index] = ok
    if located is not None:
        op, ins = located
        width = op.rows.shape[1]
        rows[need, :width] = op.rows
        w[need, :width] = op.weights
        inside[need] = ins
    return ObsOperator(rows, w), inside
