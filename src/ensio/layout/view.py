"""Which stored elements of a variable are state: the interior at the state's time level.

A model restart stores more than the state (issue 26): ghost cells on each side
of some axes (``ensemble.halo``) and several time levels of which one is the
state (``ensemble.time_level``), under dimension names the file may not give
(``ensemble.dims``). A :class:`VariableView` is that selection for one variable:
per stored axis, the first state index (``start``) and the number of state
indices (``interior``): the halo width and the axis length less both halos on a
halo axis, the state's level and 1 on the time-level axis, 0 and the length
elsewhere. The state rows of the variable are the elements of that box (and of
the mask), in C order of the stored array: :meth:`VariableView.box_elements`
feeds the layout's sorted ``active`` element list, so the read/write paths need
nothing new.

Coordinates and masks are given on the *interior* grid (a grid file, or a
member's variables cut to the interior by :func:`interior_of`): the geometry
(:mod:`ensio.layout.coords`) adds ``start`` back when it maps grid indices to
stored elements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError

__all__ = ["AxisRoles", "GridSource", "VariableView", "align_mask", "check_time_level",
           "interior_of", "resolve_view"]


@dataclass(frozen=True)
class AxisRoles:
    """The axis keys of ``ensemble`` as the layout needs them, resolved for one file.

    Attributes
    ----------
    dims : tuple of str or None
        ``ensemble.dims`` (a variable's own ``dims`` take precedence).
    halo : mapping
        ``ensemble.halo``: dim → ghost cells on each side.
    level_dim : str or None
        ``ensemble.time_level.dim``.
    level_index : int or None
        The state's level: ``time_level.index``, or the value of ``level_var``
        in the first member.
    level_var : str or None
        ``time_level.from``: the scalar every member must repeat.
    """

    dims: tuple[str, ...] | None = None
    halo: Mapping[str, int] = field(default_factory=dict)
    level_dim: str | None = None
    level_index: int | None = None
    level_var: str | None = None

    @property
    def level_key(self) -> str:
        """The config key (and variable) the level index comes from, for messages."""
        if self.level_var is not None:
            return f"ensemble.time_level.from: '{self.level_var}' = {self.level_index}"
        return f"ensemble.time_level.index: {self.level_index}"


@dataclass(frozen=True, eq=False)
class GridSource:
    """``ensemble.grid`` opened: where coordinates and masks come from instead of the member.

    Attributes
    ----------
    path : str
        The grid file (messages).
    metas : mapping
        Name → metadata (``dims``) of each of its variables; dims are matched
        by name to the state variables' interior dims.
    read_var : callable
        Name → the whole variable's values.
    """

    path: str
    metas: Mapping[str, object]
    read_var: Callable[[str], np.ndarray]


@dataclass(frozen=True, eq=False)
class VariableView:
    """The state box of one stored variable (see the module docstring).

    Attributes
    ----------
    dims : tuple of str
        Names of the stored axes (configured, else the file's).
    file_dims : tuple of str
        The names the file gives them (every member must have these).
    shape, start, interior : tuple of int
        Stored length, first state index and number of state indices per axis.
    level_axis : int or None
        Position of the time-level axis.
    """

    dims: tuple[str, ...]
    file_dims: tuple[str, ...]
    shape: tuple[int, ...]
    start: tuple[int, ...]
    interior: tuple[int, ...]
    level_axis: int | None = None

    @property
    def whole(self) -> bool:
        """Every stored element is in the box (no halo, no time level)."""
        return self.interior == self.shape

    @property
    def slices(self) -> tuple[slice, ...]:
        """The box as slices of the stored array."""
        return tuple(slice(s, s + n) for s, n in zip(self.start, self.interior, strict=True))

    @property
    def halo(self) -> tuple[int, ...]:
        """Ghost cells on each side of each axis (0 on the time-level axis)."""
        return tuple(0 if k == self.level_axis else s for k, s in enumerate(self.start))

    def box_elements(self) -> np.ndarray:
        """Sorted flat (C order) indices of the box's elements, int64, C order of the box."""
        ranges = [np.arange(s, s + n, dtype=np.int64)
                  for s, n in zip(self.start, self.interior, strict=True)]
        grids = np.meshgrid(*ranges, indexing="ij") if ranges else []
        return np.ravel_multi_index(tuple(grids), self.shape).astype(np.int64).ravel()


def resolve_view(
    name: str,
    file_dims: tuple[str, ...],
    shape: tuple[int, ...],
    own_dims: tuple[str, ...] | None,
    roles: AxisRoles,
    source: str,
) -> VariableView:
    """The state box of variable ``name`` (stored ``shape``) of file ``source``.

    Raises
    ------
    InputError
        The configured dims do not match the variable's rank, a halo leaves no
        interior, or the time level is outside its axis; naming file and key.
    """
    dims = own_dims if own_dims is not None else roles.dims
    if dims is None:
        dims = file_dims
    elif len(dims) != len(shape):
        key = "ensemble.variables[].dims" if own_dims is not None else "ensemble.dims"
        raise InputError(
            f"{source}: {key}: {list(dims)} names {len(dims)} axes, variable '{name}' has "
            f"{len(shape)} ({', '.join(file_dims) or 'a scalar'})"
        )
    start, interior = list(0 for _ in shape), list(shape)
    level_axis = None
    for k, (d, n) in enumerate(zip(dims, shape, strict=True)):
        h = roles.halo.get(d, 0)
        if h and 2 * h >= n:
            raise InputError(
                f"{source}: ensemble.halo.{d}: {h} ghost cells on each side of dimension "
                f"{d}={n} of '{name}' leave no interior (must be < {(n + 1) // 2})"
            )
        if h:
            start[k], interior[k] = h, n - 2 * h
        if d == roles.level_dim:
            lv = roles.level_index
            assert lv is not None
            if not 0 <= lv < n:
                raise InputError(
                    f"{source}: {roles.level_key} is outside 0..{n - 1} of dimension "
                    f"{d}={n} of '{name}'"
                )
            start[k], interior[k], level_axis = lv, 1, k
    return VariableView(tuple(dims), tuple(file_dims), tuple(shape), tuple(start),
                        tuple(interior), level_axis)


def interior_of(
    values: np.ndarray, dims: Sequence[str], views: Sequence[VariableView]
) -> np.ndarray:
    """A member's coordinate or mask variable (``dims``) cut to the state's interior.

    An axis whose length is the stored length of a state variable's axis of the
    same name loses that axis's halo (or keeps the state's level); any other
    length is left as it is (the caller checks it against the interior).
    """
    cut = []
    for d, n in zip(dims, values.shape, strict=True):
        s = slice(None)
        for v in views:
            if d in v.dims:
                k = v.dims.index(d)
                if n == v.shape[k] and v.interior[k] != n:
                    s = v.slices[k]
                    break
        cut.append(s)
    return values[tuple(cut)]


def align_mask(
    mask: np.ndarray,
    mask_dims: Sequence[str],
    view: VariableView,
    where: str,
    var: str,
    mask_name: str,
) -> np.ndarray:
    """Mask values (``mask_dims``, interior lengths) as a bool array of the box's shape.

    Its dims are matched by name to the variable's: any order, any subset
    (broadcast over the others); a dimension of length 1 the variable lacks
    (the record dimension of model output, ``Time``) is dropped.

    Raises
    ------
    InputError
        A mask dim the variable has not, or of another length than the
        variable's interior; naming ``where`` (the file(s)) and the mask.
    """
    mask = np.asarray(mask)
    drop = tuple(k for k, (d, n) in enumerate(zip(mask_dims, mask.shape, strict=True))
                 if n == 1 and d not in view.dims)
    if drop:
        mask = mask.reshape([n for k, n in enumerate(mask.shape) if k not in drop])
        mask_dims = [d for k, d in enumerate(mask_dims) if k not in drop]
    pos = []
    for d, n in zip(mask_dims, mask.shape, strict=True):
        if d not in view.dims:
            raise InputError(
                f"{where}: mask '{mask_name}' dimension {d} is not a dimension of '{var}' "
                f"{view.dims}"
            )
        k = view.dims.index(d)
        if n != view.interior[k]:
            raise InputError(
                f"{where}: mask '{mask_name}' has {d}={n}, the interior of '{var}' {d}="
                f"{view.interior[k]}"
            )
        pos.append(k)
    order = np.argsort(pos)
    m = np.transpose(np.asarray(mask) != 0, order) if pos else np.asarray(mask) != 0
    shape = [1] * len(view.dims)
    for k in pos:
        shape[k] = view.interior[k]
    return np.broadcast_to(m.reshape(shape), view.interior)


def check_time_level(path: object, first: str, name: str, got: np.ndarray | None,
                     ref: np.ndarray) -> None:
    """Member ``path`` is at the first member's time level (``time_level.from``).

    Raises
    ------
    InputError
        Naming both files, the key and both values.
    """
    if got is None:
        raise InputError(
            f"{path}: ensemble.time_level.from: variable '{name}' not found (the first member "
            f"{first} has it)"
        )
    got = np.asarray(got)
    if got.shape != () or got.dtype.kind not in "iu" or int(got) != int(ref):
        shown = got.tolist() if got.shape != () else got.item()
        raise InputError(
            f"{path}: ensemble.time_level.from: '{name}' is {shown}, the first member {first} "
            f"has {int(ref)} (every member must be at the same time level)"
        )
