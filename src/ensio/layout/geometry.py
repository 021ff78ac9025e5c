"""The coordinates of state variables seen through their views (halo, time level, grid file).

:func:`~ensio.layout.coords.build_geometry` knows grids whose indices are the
stored indices. Here it is given the *interior* of each variable instead
(:mod:`ensio.layout.view`): coordinates come from ``ensemble.grid`` (whose
dims must be the interior's, by name and length) or from the member, cut to
the interior; each variable's axes then carry the stored index of grid index 0
(``VariableAxes.start``). The member-consistency check keeps comparing what
every member repeats: the member's own coordinate variables as stored, its
time, and the time-level variable (``time_level.from``, exactly).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..config.schema import Coordinates
from ..errors import InputError
from .coords import CoordVar, StateGeometry, build_geometry
from .view import AxisRoles, GridSource, VariableView, interior_of

__all__ = ["LEVEL_ROLE", "check_roles", "view_geometry"]

#: The role of the time-level variable among the coordinates every member repeats.
LEVEL_ROLE = "time_level"

ReadVar = Callable[[str], np.ndarray]


def check_roles(roles: AxisRoles, views: Sequence[VariableView], source: str) -> None:
    """Every halo dim and the time-level dim is a dimension of some state variable.

    Raises
    ------
    InputError
        Naming the file and the key.
    """
    have = {d for v in views for d in v.dims}
    shown = ", ".join(sorted(have))
    for d in roles.halo:
        if d not in have:
            raise InputError(f"{source}: ensemble.halo.{d}: no state variable has a dimension "
                             f"{d} (they have {shown}; ensemble.dims names unnamed ones)")
    if roles.level_dim is not None and roles.level_dim not in have:
        raise InputError(f"{source}: ensemble.time_level.dim: no state variable has a dimension "
                         f"{roles.level_dim} (they have {shown})")


def view_geometry(
    views: Sequence[VariableView],
    names: Sequence[str],
    metas: Mapping[str, object],
    read_var: ReadVar,
    coordinates: Coordinates,
    source: str,
    roles: AxisRoles,
    grid: GridSource | None,
) -> StateGeometry:
    """The geometry of the variables' interiors (see the module docstring).

    Raises
    ------
    InputError
        A coordinate's length differs from the interior of the dimension it
        spans (naming the grid file and the member when from ``ensemble.grid``).
    """
    plain = all(v.whole and v.dims == v.file_dims for v in views)
    if grid is None and plain:  # nothing to translate: the geometry of the files as stored
        geo = build_geometry([(n, v.dims, v.shape) for n, v in zip(names, views, strict=True)],
                             metas, read_var, coordinates, source)
        return _with_level(geo, roles)
    if grid is not None:
        cmetas, cread, where = grid.metas, grid.read_var, f"{grid.path} (ensemble.grid)"
    else:
        rename: dict[str, str] = {}
        for v in views:
            rename.update(zip(v.file_dims, v.dims, strict=True))
        cmetas = {n: _Renamed(tuple(rename.get(d, d) for d in m.dims))  # type: ignore[attr-defined]
                  for n, m in metas.items()}

        def cread(name: str) -> np.ndarray:
            return interior_of(np.asarray(read_var(name)), cmetas[name].dims, views)

        where = source
    geo = build_geometry([(n, v.dims, v.interior) for n, v in zip(names, views, strict=True)],
                         cmetas, cread, coordinates, where)
    _check_lengths(geo, views, names, where, source if grid is not None else "")
    axes = tuple(dataclasses.replace(ax, start=v.start)
                 for ax, v in zip(geo.axes, views, strict=True))
    if grid is not None:
        # members repeat none of the grid file's coordinates: only their own time
        checked = []
        if coordinates.time in metas:
            m = metas[coordinates.time]
            checked.append(CoordVar("time", coordinates.time, tuple(m.dims),  # type: ignore[attr-defined]
                                    np.asarray(read_var(coordinates.time), np.float64)))
    else:  # members repeat their coordinate variables as stored
        checked = [CoordVar(c.role, c.name, tuple(metas[c.name].dims),  # type: ignore[attr-defined]
                            np.asarray(read_var(c.name), np.float64)) for c in geo.checked]
    geo = dataclasses.replace(geo, source=source, axes=axes, checked=tuple(checked))
    return _with_level(geo, roles)


@dataclasses.dataclass(frozen=True)
class _Renamed:
    """A member variable's metadata as the geometry sees it: the configured dim names."""

    dims: tuple[str, ...]


def _with_level(geo: StateGeometry, roles: AxisRoles) -> StateGeometry:
    """Add the time-level variable to what every member must repeat (exactly)."""
    if roles.level_var is None:
        return geo
    ref = CoordVar(LEVEL_ROLE, roles.level_var, (), np.asarray(roles.level_index, np.float64))
    return dataclasses.replace(geo, checked=(*geo.checked, ref))


def _check_lengths(geo: StateGeometry, views: Sequence[VariableView], names: Sequence[str],
                   where: str, member: str) -> None:
    """The grid's and the level coordinate's lengths are the interior's, variable by variable."""
    also = f" and {member}" if member else ""
    for name, v, ax in zip(names, views, geo.axes, strict=True):
        pairs = []
        if geo.grid is not None and ax.x is not None and ax.y is not None:
            ny, nx = geo.grid.shape
            pairs += [(ax.y, ny, geo.grid.ydim), (ax.x, nx, geo.grid.xdim)]
        if ax.level is not None and ax.vertical is not None:
            pairs.append((ax.vertical, ax.level.values.size, ax.level.name))
        for k, n, what in pairs:
            if geo.grid is not None and geo.grid.kind == "points" and k == ax.y:
                continue
            if n != v.interior[k]:
                raise InputError(
                    f"{where}{also}: '{what}' has {n} points, the interior of '{name}' "
                    f"{v.dims[k]}={v.interior[k]} (stored {v.shape[k]})"
                )
