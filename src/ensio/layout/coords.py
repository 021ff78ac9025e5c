"""Where each state row is: the coordinates of the state variables.

Built once from the first member (:func:`build_geometry`, called by
:func:`~ensio.layout.state.build_layout`) and carried by the
:class:`~ensio.layout.state.StateLayout`. It knows, per state variable, which
of its dimensions are the horizontal ``y``/``x`` of the lon/lat grid, which is
the vertical one (with its level coordinate, if any) and that the others have
length 1 (a ``time`` record dimension as CDO writes it). The horizontal grid
is either rectilinear (1-D ``lon(x)``, ``lat(y)``) or curvilinear (2-D
``lon(y, x)``, ``lat(y, x)``); its nearest point is found with a k-d tree on
unit vectors, built on first use and kept by the grid object.

The observation operator (:mod:`ensio.obs.stategrid`), the localization
(row coordinates) and the member-consistency check (coordinate variables
equal in every member) read from here; nothing here interpolates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..config.schema import Coordinates
from ..errors import InputError

__all__ = [
    "CoordVar",
    "HorizontalGrid",
    "StateGeometry",
    "VariableAxes",
    "build_geometry",
    "unit_vectors",
]

#: Role → the config key naming its variable (for messages).
KEYS = {role: f"ensemble.coordinates.{role}" for role in ("lon", "lat", "level", "time")}


def unit_vectors(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Unit vectors of points on the sphere, shape ``lon.shape + (3,)`` (degrees in)."""
    lo, la = np.radians(lon), np.radians(lat)
    c = np.cos(la)
    return np.stack([c * np.cos(lo), c * np.sin(lo), np.sin(la)], axis=-1)


@dataclass(frozen=True, eq=False)
class CoordVar:
    """A coordinate variable of the member files, as read from the first member.

    Attributes
    ----------
    role : str
        ``lon``, ``lat``, ``level`` or ``time``.
    name : str
        Variable name in the files.
    dims : tuple of str
    values : ndarray, float64, shape as stored
    """

    role: str
    name: str
    dims: tuple[str, ...]
    values: np.ndarray


@dataclass(frozen=True, eq=False)
class HorizontalGrid:
    """The lon/lat grid shared by the state variables.

    ``kind`` is ``rectilinear`` when ``lon`` and ``lat`` are 1-D over
    different dimensions (``x`` = lon's, ``y`` = lat's); ``curvilinear`` when
    both are 2-D over the same ``(y, x)``; ``points`` when both are 1-D over
    the same dimension (an unstructured mesh: rows are placed, but there is
    no cell to interpolate in, so lon/lat observations need an ``index``).
    """

    lon: CoordVar
    lat: CoordVar

    @property
    def kind(self) -> str:
        if self.lon.values.ndim == 2:
            return "curvilinear"
        return "points" if self.lon.dims == self.lat.dims else "rectilinear"

    @property
    def curvilinear(self) -> bool:
        return self.kind == "curvilinear"

    @property
    def ydim(self) -> str:
        return self.lon.dims[0] if self.curvilinear else self.lat.dims[0]

    @property
    def xdim(self) -> str:
        return self.lon.dims[-1]

    @property
    def shape(self) -> tuple[int, int]:
        if self.curvilinear:
            return self.lon.values.shape  # type: ignore[return-value]
        if self.kind == "points":
            return (1, self.lon.values.size)
        return (self.lat.values.size, self.lon.values.size)

    def lonlat(self, j: np.ndarray, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Lon/lat (degrees) of grid points ``(j, i)`` (y, x indices; ``points``: j = i)."""
        if self.curvilinear:
            return self.lon.values[j, i], self.lat.values[j, i]
        if self.kind == "points":
            return self.lon.values[i], self.lat.values[i]
        return self.lon.values[i], self.lat.values[j]

    def points(self) -> np.ndarray:
        """Unit vectors of all grid points, shape (ny, nx, 3) (computed once)."""
        return self._points

    @functools.cached_property
    def _points(self) -> np.ndarray:
        ny, nx = self.shape
        j, i = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
        return unit_vectors(*self.lonlat(j, i))

    @functools.cached_property
    def _tree(self):
        from scipy.spatial import cKDTree

        return cKDTree(self.points().reshape(-1, 3))

    def __getstate__(self) -> dict:
        # the k-d tree and unit vectors are rebuilt where used, not shipped to other ranks
        return {k: v for k, v in self.__dict__.items() if k not in ("_tree", "_points")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def nearest(self, lon: np.ndarray, lat: np.ndarray, k: int = 1):
        """The ``k`` nearest grid points (great circle) of each location.

        Returns
        -------
        j, i : ndarray of int, shape (m, k)
        """
        _, flat = self._tree.query(unit_vectors(lon, lat).reshape(-1, 3), k=k)
        flat = np.asarray(flat, dtype=np.int64).reshape(-1, k)
        j, i = np.divmod(flat, self.shape[1])
        return (i, i) if self.kind == "points" else (j, i)


@dataclass(frozen=True, eq=False)
class VariableAxes:
    """Which dimensions of one state variable are what (positions in its ``dims``).

    Attributes
    ----------
    y, x : int or None
        The horizontal dimensions (``None``: the variable does not span the grid).
    vertical : int or None
        The one other dimension of length > 1, or the configured level's.
    level : CoordVar or None
        The vertical coordinate (``ensemble.coordinates.level``, else the
        netCDF coordinate variable of the vertical dimension).
    extra : tuple of str
        Further dimensions of length > 1: observations cannot be placed on
        this variable by lon/lat (its rows are still placed horizontally).
    start : tuple of int
        Per stored dimension, the stored index of grid index 0 (a halo's
        width, the state's time level: :mod:`ensio.layout.view`); ``()``:
        all 0. Grid indices (coordinates, masks, observations) are interior
        indices; :meth:`elements` turns them into stored elements.
    """

    y: int | None
    x: int | None
    vertical: int | None = None
    level: CoordVar | None = None
    extra: tuple[str, ...] = ()
    start: tuple[int, ...] = ()

    def offset(self, k: int) -> int:
        """Stored index of grid index 0 along stored dimension ``k``."""
        return self.start[k] if self.start else 0

    def elements(self, idx: Sequence[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
        """Flat stored elements of the grid indices ``idx`` (one array per stored dim).

        Dimensions other than y/x/vertical take index 0, i.e. the state's
        time level (``start``); ``shape`` is the stored shape.
        """
        if self.start:
            idx = [np.asarray(i) + s for i, s in zip(idx, self.start, strict=True)]
        return np.ravel_multi_index(tuple(idx), shape)


@dataclass(frozen=True, eq=False)
class StateGeometry:
    """The coordinates of every state variable (see the module docstring).

    Attributes
    ----------
    source : str
        The file it was read from (messages).
    names : mapping
        Role → configured variable name.
    grid : HorizontalGrid or None
        ``None`` when the files have no lon/lat (``problem`` says why).
    axes : tuple of VariableAxes
        One per state variable, in layout order.
    checked : tuple of CoordVar
        Coordinate variables every member must repeat (lon, lat, levels, time).
    problem : str
        Why there is no grid (a one-line message naming the key), else ``""``.
    """

    source: str
    names: Mapping[str, str]
    grid: HorizontalGrid | None
    axes: tuple[VariableAxes, ...]
    checked: tuple[CoordVar, ...] = ()
    problem: str = ""
    var_names: tuple[str, ...] = field(default=())

    def horizontal(self, var: int | None = None) -> HorizontalGrid:
        """The lon/lat grid (of variable ``var``), or a one-line error naming the key."""
        if self.grid is None:
            raise InputError(self.problem)
        if var is not None and self.axes[var].x is None:
            raise InputError(
                f"{self.source}: state variable '{self.var_names[var]}' does not span the "
                f"dimensions ({self.grid.ydim}, {self.grid.xdim}) of the lon/lat coordinates "
                f"({KEYS['lon']}, {KEYS['lat']}): its rows cannot be placed"
            )
        return self.grid


ReadVar = Callable[[str], np.ndarray]


def build_geometry(
    variables: Sequence[tuple[str, tuple[str, ...], tuple[int, ...]]],
    metas: Mapping[str, object],
    read_var: ReadVar,
    coordinates: Coordinates,
    source: str,
) -> StateGeometry:
    """The coordinates of the state variables, from the first member.

    Parameters
    ----------
    variables : sequence of (name, dims, shape)
        The state variables, in layout order.
    metas : mapping
        Name → :class:`~ensio.layout.state.VarMeta` of every variable of the file.
    read_var : callable
        Reads a whole (small) variable.
    coordinates : Coordinates
        ``ensemble.coordinates``.
    source : str
        File name for messages.

    Raises
    ------
    InputError
        A configured ``level`` is missing or not 1-D, or lon/lat have
        dimensions that do not form a grid; the message names the key and the file.
    """
    names = {"lon": coordinates.lon, "lat": coordinates.lat, "time": coordinates.time}
    if coordinates.level is not None:
        names["level"] = coordinates.level

    def read(role: str, name: str) -> CoordVar:
        meta = metas[name]
        return CoordVar(role, name, tuple(meta.dims), np.asarray(read_var(name), np.float64))

    grid, problem = _grid(names, metas, read, source)
    level = None
    if coordinates.level is not None:
        if coordinates.level not in metas:
            raise InputError(
                f"{source}: coordinate variable '{coordinates.level}' not found ({KEYS['level']})"
            )
        level = read("level", coordinates.level)
        if level.values.ndim != 1:
            raise InputError(
                f"{source}: level coordinate '{level.name}' must be 1-D, has dims {level.dims} "
                f"({KEYS['level']})"
            )
    axes, levels = [], {}
    for name, dims, shape in variables:
        ax = _axes(name, dims, shape, grid, level, metas, read)
        axes.append(ax)
        if ax.level is not None:
            levels[ax.level.name] = ax.level
    checked = [] if grid is None else [grid.lon, grid.lat]
    checked += list(levels.values())
    if coordinates.time in metas:
        checked.append(read("time", coordinates.time))
    return StateGeometry(
        source=source,
        names=names,
        grid=grid,
        axes=tuple(axes),
        checked=tuple(checked),
        problem=problem,
        var_names=tuple(v[0] for v in variables),
    )


def _grid(names, metas, read, source) -> tuple[HorizontalGrid | None, str]:
    """The horizontal grid, or ``None`` and the message saying which key names nothing."""
    for role in ("lon", "lat"):
        if names[role] not in metas:
            return None, (
                f"{source}: coordinate variable '{names[role]}' not found ({KEYS[role]}); "
                "observations without an index and radius_km localization need it"
            )
    lon, lat = read("lon", names["lon"]), read("lat", names["lat"])
    nd = (lon.values.ndim, lat.values.ndim)
    if nd == (1, 1):
        return HorizontalGrid(lon, lat), ""
    if nd == (2, 2) and lon.dims == lat.dims:
        return HorizontalGrid(lon, lat), ""
    raise InputError(
        f"{source}: coordinates '{lon.name}' {lon.dims} and '{lat.name}' {lat.dims} form no "
        f"grid: give 1-D lon(x), lat(y), 2-D lon(y, x), lat(y, x) or lon(cell), lat(cell) "
        f"({KEYS['lon']}, {KEYS['lat']})"
    )


def _axes(name, dims, shape, grid, level, metas, read) -> VariableAxes:
    """The roles of the dimensions of one state variable."""
    pos = {d: k for k, d in enumerate(dims)}
    y = x = None
    if grid is not None and grid.ydim in pos and grid.xdim in pos:
        y, x = pos[grid.ydim], pos[grid.xdim]
    rest = [k for k in range(len(dims)) if k not in (y, x)]
    vertical = None
    if level is not None and level.dims[0] in pos:
        vertical = pos[level.dims[0]]
    else:
        long = [k for k in rest if shape[k] > 1]
        if len(long) == 1:
            vertical = long[0]
    lev = None
    if vertical is not None:
        d = dims[vertical]
        if level is not None and level.dims == (d,):
            lev = level
        elif d in metas and tuple(metas[d].dims) == (d,):
            lev = read("level", d)
    extra = tuple(dims[k] for k in rest if k != vertical and shape[k] > 1)
    return VariableAxes(y=y, x=x, vertical=vertical, level=lev, extra=extra)
