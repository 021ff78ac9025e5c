"""H on any state: the observed variable, its level, its grid, its mask.

An observation without an ``index`` names a state variable (``variable``,
default the first) and, on a 3-D variable, a ``level`` (a value of the
variable's level coordinate: linear interpolation between the two nearest
levels, ascending or descending; outside their range: not inside) or a
``level_index``. Horizontally it is interpolated bilinearly in the cell
around it (:mod:`ensio.obs.cells`: rectilinear or curvilinear). Dimensions
of length 1 (a ``time`` record dimension) take index 0. So an observation
reads up to 4 corners × 2 levels = 8 state rows; on a masked variable every
corner of non-zero weight must be a state row, else the observation is not
inside (rejected and counted as ``outside`` by quality control). A corner of
weight exactly 0 (an observation on a grid point or edge) reads nothing.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..layout.coords import KEYS
from ..layout.index import element_rows
from ..layout.state import StateLayout
from .batch import ObsBatch
from .cells import Cells, curvilinear_cells, rectilinear_cells
from .operators import ObsOperator

__all__ = ["StateGrid", "vertical_weights"]


def vertical_weights(levels: np.ndarray, value: np.ndarray):
    """Linear interpolation in a 1-D level coordinate (ascending or descending).

    Returns
    -------
    k0, k1 : ndarray of int, shape (m,)
    w1 : ndarray, shape (m,)
        Weight of ``k1`` (``1 - w1`` of ``k0``); ``k1 == k0`` and ``w1 == 0``
        at a level.
    inside : ndarray of bool, shape (m,)
    """
    value = np.asarray(value, dtype=float)
    order = np.argsort(levels)
    gl = levels[order]
    inside = np.isfinite(value) & (value >= gl[0]) & (value <= gl[-1])
    x = np.where(inside, value, gl[0])
    if gl.size == 1:
        z = np.zeros(value.size, np.int64)
        return z + order[0], z + order[0], np.zeros(value.size), inside
    j = np.clip(np.searchsorted(gl, x, side="right") - 1, 0, gl.size - 2)
    w1 = (x - gl[j]) / (gl[j + 1] - gl[j])
    at = w1 == 0.0
    k1 = np.where(at, order[j], order[j + 1])
    return order[j], k1, np.where(at, 0.0, w1), inside


class StateGrid:
    """The observation operator of observations without an index, on a state layout.

    Built from the layout (cheap: the k-d tree of a curvilinear grid is
    built on first use and kept by the layout's grid). Implements
    :class:`~ensio.obs.operators.Locator`.
    """

    def __init__(self, layout: StateLayout) -> None:
        if layout.geometry is None:
            raise ValueError("StateGrid: the layout has no coordinates")
        self.layout = layout
        self.geometry = layout.geometry

    def locate(self, obs: ObsBatch, n_state: int) -> tuple[ObsOperator, np.ndarray]:
        """Rows ``(m, 8)``, weights and inside-flags of every observation of ``obs``.

        Raises
        ------
        InputError
            No lon/lat coordinates, or a variable the observations cannot be
            placed on (no grid dimensions, a further dimension of length > 1,
            a 3-D variable without level, a level without level coordinate).
        """
        m = len(obs)
        rows = np.zeros((m, 8), dtype=np.int64)
        w = np.zeros((m, 8))
        inside = np.zeros(m, dtype=bool)
        var = np.zeros(m, np.int64) if obs.variable is None else np.maximum(obs.variable, 0)
        if np.any(var >= len(self.layout.variables)):
            raise ValueError("ObsBatch.variable: not a state variable of the layout")
        for k in np.unique(var):
            sel = np.flatnonzero(var == k)
            r, ww, ins = self._variable(int(k), obs.subset(sel))
            rows[sel], w[sel], inside[sel] = r, ww, ins
        inside &= rows.max(axis=1) < n_state
        w[~inside] = 0.0
        return ObsOperator(rows, w), inside

    def _variable(self, k: int, obs: ObsBatch):
        """:meth:`locate` for the observations of state variable ``k``."""
        v = self.layout.variables[k]
        geo = self.geometry
        grid = geo.horizontal(k)
        ax = geo.axes[k]
        if ax.extra:
            raise InputError(
                f"{geo.source}: observations of '{v.name}': it has dimension(s) "
                f"{', '.join(ax.extra)} of length > 1 besides lon/lat/level; "
                "observations need an index"
            )
        cells = self._cells(grid, obs)
        k0, k1, w1, vin = self._levels(k, obs)
        m = len(obs)
        idx = [np.zeros((m, 4), np.int64) for _ in v.shape]
        j = np.where(cells.inside[:, None], cells.j, 0)
        i = np.where(cells.inside[:, None], cells.i, 0)
        idx[ax.y], idx[ax.x] = j, i  # type: ignore[index]
        rows, w = [], []
        for kk, wk in ((k0, 1.0 - w1), (k1, w1)):
            if ax.vertical is not None:
                idx[ax.vertical] = np.broadcast_to(np.where(vin, kk, 0)[:, None], (m, 4))
            elems = ax.elements(idx, v.shape)  # grid (interior) indices -> stored elements
            rows.append(element_rows(v, elems))
            w.append(cells.w * wk[:, None])
        R = np.concatenate(rows, axis=1)
        W = np.concatenate(w, axis=1)
        # a masked corner (no state row) rejects the observation only if it weighs
        # something: one exactly on an ocean point next to land reads no land
        inside = cells.inside & vin & np.all((R >= 0) | (W == 0.0), axis=1)
        R = np.where(inside[:, None] & (R >= 0), R, 0)
        return R, np.where(inside[:, None], W, 0.0), inside

    def _cells(self, grid, obs: ObsBatch) -> Cells:
        if grid.kind == "points":
            raise InputError(
                f"{self.geometry.source}: '{grid.lon.name}' and '{grid.lat.name}' are "
                "unstructured points (no cells to interpolate in): observations need an "
                "index (see `ensio index`)"
            )
        if grid.curvilinear:
            return curvilinear_cells(grid, obs.lon, obs.lat)
        return rectilinear_cells(grid.lon.values, grid.lat.values, obs.lon, obs.lat)

    def _levels(self, k: int, obs: ObsBatch):
        """Levels and weights of variable ``k`` (level 0 of a variable without vertical)."""
        v = self.layout.variables[k]
        ax = self.geometry.axes[k]
        m = len(obs)
        zero = np.zeros(m, np.int64)
        if ax.vertical is None:
            return zero, zero, np.zeros(m), np.ones(m, bool)
        nz = v.shape[ax.vertical]
        li = np.full(m, -1, np.int64) if obs.level_index is None else obs.level_index
        lv = np.full(m, np.nan) if obs.level is None else obs.level
        by_index = li >= 0
        by_value = ~by_index & np.isfinite(lv)
        if nz > 1 and obs.level is None and obs.level_index is None:
            raise InputError(
                f"{self.geometry.source}: state variable '{v.name}' is 3-D "
                f"({v.dims[ax.vertical]}={nz}): observations need level or level_index"
            )
        k0 = np.where(by_index, li, 0)
        inside = np.where(by_index, li < nz, nz == 1)
        w1 = np.zeros(m)
        if by_value.any():
            if ax.level is None:
                raise InputError(
                    f"{self.geometry.source}: observations of '{v.name}' give a level, but its "
                    f"vertical dimension '{v.dims[ax.vertical]}' has no coordinate variable "
                    f"({KEYS['level']})"
                )
            a, b, t, ins = vertical_weights(ax.level.values, lv[by_value])
            k0[by_value] = a
            k1 = k0.copy()
            k1[by_value] = b
            w1[by_value] = t
            inside[by_value] = ins
        else:
            k1 = k0
        k0 = np.where(inside, k0, 0)
        k1 = np.where(inside, k1, 0)
        return k0, k1, w1, inside
