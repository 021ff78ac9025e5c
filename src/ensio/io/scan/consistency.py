"""Members must describe the same grid, and be different files.

Checked in the metadata pass (:class:`~ensio.io.scan.members.MemberScan`), on
every rank, before any byte is written:

* every coordinate variable the layout uses (lon, lat, the level
  coordinates, time: :attr:`~ensio.layout.coords.StateGeometry.checked`)
  is present in every member with the first member's shape and values:
  lon/lat/level within ``|a - b| <= REL_TOL * max(1, |a|)`` (a = the first
  member's value), time exactly. A member with inverted latitudes or shifted
  longitudes would otherwise be analysed against the wrong grid points;
* no two member paths are the same file (a symlink or hard link: the same
  device and inode), which would be read twice and written twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...layout.geometry import LEVEL_ROLE
from ...layout.state import StateLayout
from ...layout.view import check_time_level

__all__ = ["REL_TOL", "check_coordinates", "check_distinct"]

#: Relative tolerance of coordinate values across members (lon, lat, level).
REL_TOL = 1e-6


def check_coordinates(
    path: Path, layout: StateLayout, read: Callable[[str], np.ndarray | None]
) -> np.ndarray | None:
    """Compare the coordinate variables of member ``path`` with the first member's.

    The grid (lon, lat, level) is compared with the layout's, which was built
    from a member (in the online mode: once, from the initial file). Time is
    not: the layout outlives a cycle and the model time moves on. Its values
    are returned, and :func:`check_times` compares them across the members of
    one scan.

    Parameters
    ----------
    path : Path
        The member (messages).
    layout : StateLayout
        Built from the first member; its geometry holds the reference values.
    read : callable
        Name → the member's values of that variable (``None`` if absent).

    Returns
    -------
    ndarray or None
        The member's time coordinate (``None`` if the layout has none).

    Raises
    ------
    InputError
        Naming the member, the coordinate variable and the first element that differs.
    """
    geo = layout.geometry
    if geo is None:
        return None
    time = None
    for c in geo.checked:
        got = read(c.name)
        if c.role == LEVEL_ROLE:  # ensemble.time_level.from: an integer, exactly
            check_time_level(path, geo.source, c.name, got, c.values)
            continue
        if got is None:
            raise InputError(
                f"{path}: coordinate variable '{c.name}' not found (the first member "
                f"{geo.source} has it)"
            )
        got = np.asarray(got, dtype=np.float64)
        if got.shape != c.values.shape:
            raise InputError(
                f"{path}: coordinate '{c.name}' has shape {got.shape}, the first member "
                f"{geo.source} {c.values.shape}"
            )
        ref = c.values
        if c.role == "time":
            time = got
            continue
        if np.array_equal(got, ref):  # the usual case, one comparison (NaN: the rule below)
            continue
        with np.errstate(invalid="ignore"):
            same = np.abs(got - ref) <= REL_TOL * np.maximum(1.0, np.abs(ref))
        same |= np.isnan(got) & np.isnan(ref)
        rule = f"tolerance |a - b| <= {REL_TOL:g} * max(1, |a|)"
        if not np.all(same):
            at = np.unravel_index(int(np.argmin(same)), same.shape) if same.ndim else ()
            raise InputError(
                f"{path}: coordinate '{c.name}' differs from the first member {geo.source} "
                f"at {tuple(int(a) for a in at)}: {float(got[at]):.9g} vs "
                f"{float(ref[at]):.9g} ({rule})"
            )
    return time


def check_distinct(paths: Sequence[Path], identity: dict[int, tuple[int, int]]) -> None:
    """No two members are the same file.

    Parameters
    ----------
    paths : sequence of Path
        The member files, in matrix order.
    identity : dict
        Member position → ``(st_dev, st_ino)``.

    Raises
    ------
    InputError
        Naming both paths of the first pair (in member order) that are one file.
    """
    seen: dict[tuple[int, int], int] = {}
    for m in sorted(identity):
        first = seen.setdefault(identity[m], m)
        if first != m:
            raise InputError(
                f"{paths[first]} and {paths[m]}: the same file (a link; device and inode "
                f"{identity[m][0]}:{identity[m][1]}); every member must be its own file"
            )


def check_times(
    paths: Sequence[Path], times: Sequence[np.ndarray | None], name: str = "time"
) -> None:
    """Every member's time coordinate ``name`` equals the first member's (exactly; NaN = NaN).

    Raises
    ------
    InputError
        Naming the first member that differs, the first member and both values.
    """
    if not times or times[0] is None:
        return
    ref = np.asarray(times[0], dtype=np.float64)
    for path, got in zip(paths[1:], times[1:], strict=True):
        got = np.asarray(got, dtype=np.float64)
        if got.shape != ref.shape:
            raise InputError(f"{path}: coordinate '{name}' has shape {got.shape}, the first "
                             f"member {paths[0]} {ref.shape}")
        same = (got == ref) | (np.isnan(got) & np.isnan(ref))
        if not np.all(same):
            at = np.unravel_index(int(np.argmin(same)), same.shape) if same.ndim else ()
            raise InputError(
                f"{path}: coordinate '{name}' differs from the first member {paths[0]} at "
                f"{tuple(int(a) for a in at)}: {float(got[at]):.9g} vs {float(ref[at]):.9g} "
                "(time must be equal)"
            )
