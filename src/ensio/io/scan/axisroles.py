"""What the layout needs from files besides the member's state: the time level, the grid file.

The layout room cannot open files; this module reads, for
:func:`~ensio.io.scan.members.layout_from_member`, the state's time level from
the first member (``ensemble.time_level.from``, a scalar integer such as
Veros's ``core/tau``) and opens ``ensemble.grid`` (any member-file format, in
practice the model's netCDF output with ``xt``, ``yt``, ``zt``, ``maskT``). The
other members' time levels are compared with the first's in the metadata pass,
as a coordinate every member repeats (:mod:`ensio.layout.geometry`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np

from ...config.schema import EnsembleSection
from ...errors import InputError
from ...layout.view import AxisRoles, GridSource
from ..formats.open import open_member
from ..formats.store import MemberStore, VarInfo

__all__ = ["axis_roles", "open_grid"]


def axis_roles(
    ensemble: EnsembleSection,
    infos: Mapping[str, VarInfo],
    read_var: Callable[[str], np.ndarray],
    source: str,
) -> AxisRoles:
    """The ``ensemble`` axis keys resolved for member ``source`` (its time level read).

    Raises
    ------
    InputError
        ``time_level.from`` names no variable of the file, or not a scalar
        integer; naming the file and the key.
    """
    tl = ensemble.time_level
    level_index = level_var = None
    if tl is not None:
        level_index, level_var = tl.index, tl.from_
        if level_var is not None:
            level_index = _level_value(level_var, infos, read_var, source)
    return AxisRoles(dims=ensemble.dims, halo=dict(ensemble.halo),
                     level_dim=None if tl is None else tl.dim, level_index=level_index,
                     level_var=level_var)


def _level_value(name: str, infos: Mapping[str, VarInfo],
                 read_var: Callable[[str], np.ndarray], source: str) -> int:
    info = infos.get(name)
    if info is None:
        raise InputError(f"{source}: ensemble.time_level.from: variable '{name}' not found")
    if info.size != 1 or info.dtype.kind not in "iu":
        raise InputError(
            f"{source}: ensemble.time_level.from: '{name}' is not a scalar integer (dtype "
            f"{info.dtype.name}, shape {info.shape})"
        )
    return int(np.asarray(read_var(name)).reshape(()))


@contextlib.contextmanager
def open_grid(
    ensemble: EnsembleSection, read_whole: Callable[[MemberStore, VarInfo], np.ndarray]
) -> Iterator[GridSource | None]:
    """``ensemble.grid`` opened for the layout builder (``None`` without one).

    Relative paths were resolved against the config's directory when it was
    loaded (:func:`ensio.config.load.config_from_dict`). ``read_whole`` reads
    a whole variable of an open store (the members' reader, handed in by
    :mod:`.members`, which imports this module).

    Raises
    ------
    InputError
        The file is missing or not a readable member-file format, naming it and the key.
    """
    if ensemble.grid is None:
        yield None
        return
    path = Path(ensemble.grid)
    if not path.is_file():
        raise InputError(f"{path}: grid file not found (ensemble.grid)")
    try:
        store = open_member(path)
    except InputError as exc:
        raise InputError(f"{exc} (ensemble.grid)") from None
    with store:
        infos = store.variables()

        def read_var(name: str) -> np.ndarray:
            return read_whole(store, infos[name])

        yield GridSource(str(path), infos, read_var)
