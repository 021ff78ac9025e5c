"""State-vector rows of places: what an observation's ``index`` is.

An observation file may give each observation an ``index``, the 0-based
state-vector row it observes (H = identity there). Rows are numbered
variable by variable in config order, within a variable in C order of its
dimensions as stored, masked-out points skipped (DESIGN.md "Conventions").
:func:`state_index` computes it for lon/lat (and level) positions, the
``ensio index`` command prints it.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .state import StateLayout, VariableLayout

__all__ = ["element_rows", "state_index"]


def element_rows(v: VariableLayout, elems: np.ndarray) -> np.ndarray:
    """State row of each flat element of variable ``v``; -1 where masked out."""
    elems = np.asarray(elems, dtype=np.int64)
    if v.active is None:
        return v.offset + elems
    pos = np.searchsorted(v.active, elems)
    hit = pos < v.active.size
    hit[hit] = v.active[pos[hit]] == elems[hit]
    return np.where(hit, v.offset + pos, -1)


def state_index(
    layout: StateLayout,
    lon: np.ndarray | float,
    lat: np.ndarray | float,
    variable: str | None = None,
    level: float | None = None,
    level_index: int | None = None,
) -> np.ndarray:
    """The state row of the grid point nearest to each location.

    Parameters
    ----------
    layout : StateLayout
        From the member files (:func:`ensio.io.scan.members.layout_from_member`).
    lon, lat : array_like
        Degrees (any longitude convention); broadcast together.
    variable : str, optional
        State variable (default: the first).
    level, level_index : optional
        On a 3-D variable: the nearest level to a value of its level
        coordinate, or a 0-based level (one of them is required there).

    Returns
    -------
    ndarray of int, the shape of the broadcast ``lon``/``lat``
        Rows (great-circle nearest grid point); -1 where that point is
        masked out of the state.

    Raises
    ------
    InputError
        Unknown variable, no lon/lat coordinates, a 3-D variable without a
        level (or a level but no level coordinate), a level index out of range.
    """
    geo = layout.geometry
    if geo is None:
        raise InputError("state_index: the layout has no coordinates (no member files)")
    names = [v.name for v in layout.variables]
    name = variable if variable is not None else names[0]
    if name not in names:
        raise InputError(
            f"'{name}' is not a state variable (ensemble.variables: {', '.join(names)})"
        )
    k = names.index(name)
    v = layout.variables[k]
    grid = geo.horizontal(k)
    ax = geo.axes[k]
    if ax.extra:
        raise InputError(
            f"{geo.source}: '{v.name}' has dimension(s) {', '.join(ax.extra)} of length > 1 "
            "besides lon/lat/level: no single row per place"
        )
    lon_b, lat_b = np.broadcast_arrays(np.asarray(lon, float), np.asarray(lat, float))
    j, i = grid.nearest(lon_b.ravel(), lat_b.ravel())
    idx = [np.zeros(j.shape[0], np.int64) for _ in v.shape]
    idx[ax.y], idx[ax.x] = j[:, 0], i[:, 0]  # type: ignore[index]
    if ax.vertical is not None:
        idx[ax.vertical][:] = _level(geo.source, v, ax, level, level_index)
    rows = element_rows(v, ax.elements(idx, v.shape))
    return rows.reshape(lon_b.shape)


def _level(source: str, v: VariableLayout, ax, level, level_index) -> int:
    nz = v.shape[ax.vertical]
    dim = v.dims[ax.vertical]
    if level_index is not None:
        if not 0 <= level_index < nz:
            raise InputError(f"level_index {level_index} is outside 0..{nz - 1} of '{v.name}'")
        return int(level_index)
    if level is not None:
        if ax.level is None:
            raise InputError(
                f"{source}: '{v.name}': its vertical dimension '{dim}' has no coordinate "
                "variable (ensemble.coordinates.level)"
            )
        return int(np.argmin(np.abs(ax.level.values - level)))
    if nz > 1:
        raise InputError(f"'{v.name}' is 3-D ({dim}={nz}): give a level or a level index")
    return 0
