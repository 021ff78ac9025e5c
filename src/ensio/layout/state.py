"""The state layout: named model variables ⇄ rows of the flat state vector.

Every layer above the file formats speaks in state-vector rows; this module is
the one translation between rows and (variable, element) positions. Rows are
numbered variable by variable in config order; within a variable, in C order
of its dimensions as stored. A masked variable contributes only its active
elements (e.g. land points), so rows map to a sorted subset of its elements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..config.schema import Coordinates, VariableSpec
from ..errors import InputError
from .companions import Companion
from .coords import StateGeometry
from .encoding import Encoding
from .geometry import check_roles, view_geometry
from .view import AxisRoles, GridSource, VariableView, align_mask, interior_of, resolve_view

__all__ = ["Segment", "StateLayout", "VariableLayout", "VarMeta", "build_layout",
           "check_state_dtype"]


@dataclass(frozen=True)
class VarMeta:
    """What the layout needs to know of a variable in a member file."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    encoding: Encoding | None = None  # packing and missing-data conventions


@dataclass(frozen=True)
class Segment:
    """A contiguous run of state rows inside one variable.

    Attributes
    ----------
    var : int
        Index of the variable in ``StateLayout.variables``.
    row_lo, row_hi : int
        State-vector rows ``[row_lo, row_hi)``.
    elem_lo, elem_hi : int
        Flat element range of the variable that covers those rows.
    select : numpy.ndarray or None
        For masked variables, positions (relative to ``elem_lo``) of the
        rows' elements inside the covering range; ``None`` when every element
        of the range is a row.
    """

    var: int
    row_lo: int
    row_hi: int
    elem_lo: int
    elem_hi: int
    select: np.ndarray | None = None

    @property
    def n_rows(self) -> int:
        return self.row_hi - self.row_lo

    @property
    def n_elems(self) -> int:
        return self.elem_hi - self.elem_lo


@dataclass(frozen=True, eq=False)
class VariableLayout:
    """One state variable: its on-disk shape/dtype and its place in the state vector.

    Attributes
    ----------
    offset : int
        First state row of this variable.
    size : int
        Number of state rows (active elements).
    active : numpy.ndarray or None
        Sorted flat element indices that are rows (masked variables).
    encoding : Encoding or None
        Packing and missing-data conventions in the first member (each
        member's own are in its metadata: packed members may differ).
    companions : tuple of Companion
        Stored elements outside the rows that the write-back keeps
        consistent with them (:mod:`ensio.layout.companions`).
    """

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int
    size: int
    active: np.ndarray | None = None
    encoding: Encoding | None = None
    view: VariableView | None = None
    companions: tuple[Companion, ...] = ()

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def element_range(self, lo: int, hi: int) -> tuple[int, int, np.ndarray | None]:
        """Covering element range of local rows ``[lo, hi)`` (0-based within the variable)."""
        if self.active is None:
            return lo, hi, None
        idx = self.active[lo:hi]
        e0, e1 = int(idx[0]), int(idx[-1]) + 1
        return e0, e1, None if e1 - e0 == hi - lo else idx - e0

    def element_indices(self, lo: int, hi: int) -> np.ndarray:
        """Flat element index of each local row in ``[lo, hi)``."""
        if self.active is None:
            return np.arange(lo, hi, dtype=np.int64)
        return self.active[lo:hi]


@dataclass(frozen=True, eq=False)
class StateLayout:
    """The map between model variables and the state vector.

    Attributes
    ----------
    variables : tuple of VariableLayout
    n_rows : int
        Length N_x of the state vector.
    geometry : StateGeometry or None
        The coordinates of the variables (:mod:`ensio.layout.coords`): the
        lon/lat grid, each variable's vertical axis and level coordinate,
        the coordinate variables every member must repeat. ``None`` for a
        layout without files (the in-memory API).
    """

    variables: tuple[VariableLayout, ...]
    n_rows: int
    geometry: StateGeometry | None = None

    def variable(self, name: str) -> VariableLayout:
        for v in self.variables:
            if v.name == name:
                return v
        raise KeyError(name)

    def segments(self, lo: int, hi: int) -> list[Segment]:
        """Per-variable segments covering state rows ``[lo, hi)``, in row order."""
        out: list[Segment] = []
        for i, v in enumerate(self.variables):
            a, b = max(lo, v.offset), min(hi, v.offset + v.size)
            if a >= b:
                continue
            e0, e1, sel = v.element_range(a - v.offset, b - v.offset)
            out.append(Segment(i, a, b, e0, e1, sel))
        return out

    def coordinates(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Coordinates of state rows ``[lo, hi)``: each row's own grid point.

        ``lon``, ``lat`` (degrees) of the row's horizontal grid point (any
        grid: rectilinear, curvilinear, points) and, when a variable has a
        level coordinate, ``level`` (NaN for rows of variables without one).

        Raises
        ------
        InputError
            The files have no lon/lat, or a variable does not span their
            dimensions (the message names the key).
        """
        geo = self.geometry
        if geo is None:
            raise InputError("the state has no coordinates (a layout without member files)")
        grid = geo.horizontal()
        out = {"lon": np.empty(hi - lo), "lat": np.empty(hi - lo)}
        if any(a.level is not None for a in geo.axes):
            out["level"] = np.full(hi - lo, np.nan)
        for seg in self.segments(lo, hi):
            v = self.variables[seg.var]
            ax = geo.axes[seg.var]
            geo.horizontal(seg.var)
            flat = v.element_indices(seg.row_lo - v.offset, seg.row_hi - v.offset)
            pos = np.unravel_index(flat, v.shape)
            part = slice(seg.row_lo - lo, seg.row_hi - lo)
            j, i = pos[ax.y] - ax.offset(ax.y), pos[ax.x] - ax.offset(ax.x)  # type: ignore[index]
            out["lon"][part], out["lat"][part] = grid.lonlat(j, i)
            if ax.level is not None and ax.vertical is not None:
                out["level"][part] = ax.level.values[pos[ax.vertical] - ax.offset(ax.vertical)]
        return out


ReadVar = Callable[[str], np.ndarray]


def build_layout(
    specs: Sequence[VariableSpec],
    metas: Mapping[str, VarMeta],
    read_var: ReadVar,
    coordinates: Coordinates,
    source: str,
    roles: AxisRoles | None = None,
    grid: GridSource | None = None,
) -> StateLayout:
    """Build the layout from the first member's metadata.

    Parameters
    ----------
    specs : sequence of VariableSpec
        The configured state variables, in order.
    metas : mapping
        Metadata of every variable of the member file.
    read_var : callable
        Reads a whole (small) variable: masks and coordinates.
    coordinates : Coordinates
        Names of the coordinate variables.
    source : str
        File name for error messages.
    roles : AxisRoles, optional
        Dimension names, halo and time level (:mod:`ensio.layout.view`):
        the rows are the interior elements at the state's level.
    grid : GridSource, optional
        ``ensemble.grid``: coordinates and masks come from this file.
    """
    roles = roles if roles is not None else AxisRoles()
    views = []
    for spec in specs:
        meta = metas.get(spec.name)
        if meta is None:
            raise InputError(f"{source}: state variable '{spec.name}' not found "
                             "(ensemble.variables)")
        check_state_dtype(meta, source)
        if len(meta.shape) < 1:
            raise InputError(f"{source}: state variable '{spec.name}' is a scalar")
        views.append(resolve_view(spec.name, meta.dims, meta.shape, spec.dims, roles, source))
    check_roles(roles, views, source)  # before the masks: a misnamed dim is the first problem
    variables: list[VariableLayout] = []
    offset = 0
    for spec, view in zip(specs, views, strict=True):
        meta = metas[spec.name]
        active = None if view.whole else view.box_elements()
        if spec.mask is not None:
            keep = _mask(spec, view, metas, read_var, source, grid).ravel()
            active = np.flatnonzero(keep).astype(np.int64) if active is None else active[keep]
            if active.size == 0:
                raise InputError(f"{source}: mask '{spec.mask}' selects no point of "
                                 f"'{spec.name}'")
        size = int(np.prod(meta.shape, dtype=np.int64)) if active is None else int(active.size)
        variables.append(
            VariableLayout(
                name=spec.name,
                dims=view.dims,
                shape=meta.shape,
                dtype=np.dtype(meta.dtype).newbyteorder("="),
                offset=offset,
                size=size,
                active=active,
                encoding=meta.encoding,
                view=view,
            )
        )
        offset += size
    geometry = view_geometry(views, [v.name for v in variables], metas, read_var, coordinates,
                             source, roles, grid)
    return StateLayout(variables=tuple(variables), n_rows=offset, geometry=geometry)


def _mask(spec: VariableSpec, view: VariableView, metas: Mapping[str, VarMeta],
          read_var: ReadVar, source: str, grid: GridSource | None) -> np.ndarray:
    """The mask of ``spec`` on the variable's state box (bool, the box's shape)."""
    name = spec.mask or ""
    if grid is not None:
        gmeta = grid.metas.get(name)
        if gmeta is None:
            raise InputError(f"{grid.path}: mask variable '{name}' not found (ensemble.grid, "
                             f"ensemble.variables[].mask of '{spec.name}')")
        where = f"{grid.path} (ensemble.grid) and {source}"
        return align_mask(grid.read_var(name), tuple(gmeta.dims), view, where, spec.name, name)
    mmeta = metas.get(name)
    if mmeta is None:
        raise InputError(f"{source}: mask variable '{name}' not found")
    rename = dict(zip(view.file_dims, view.dims, strict=True))
    dims = tuple(rename.get(d, d) for d in mmeta.dims)
    values = interior_of(np.asarray(read_var(name)), dims, [view])
    return align_mask(values, dims, view, source, spec.name, name)


def check_state_dtype(meta: VarMeta, source: str) -> None:
    """A state variable is floating point, or an integer packed with scale_factor/add_offset."""
    kind = np.dtype(meta.dtype).kind
    if meta.encoding is not None and meta.encoding.unsigned:
        raise InputError(
            f"{source}: state variable '{meta.name}' holds unsigned data in a signed type "
            '(_Unsigned = "true"), which ensio does not analyse; store it as an unsigned '
            "netCDF-4 type or as float"
        )
    packed = meta.encoding is not None and meta.encoding.packed
    if kind == "f" or (kind in "iu" and packed):
        return
    what = "an unpacked integer" if kind in "iu" else "not numeric"
    raise InputError(
        f"{source}: state variable '{meta.name}' has dtype {np.dtype(meta.dtype).name}, "
        f"{what}; state variables must be float32/float64 or integers packed with "
        "scale_factor/add_offset"
    )
