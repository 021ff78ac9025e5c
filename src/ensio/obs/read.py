"""Reading observation files (DESIGN.md "Conventions")."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError
from .batch import ObsBatch

__all__ = ["obs_count", "read_obs_file", "read_obs_netcdf"]

#: Observation files larger than this are not read whole by every rank of a
#: local analysis: each rank reads the locations, then the values and errors
#: of only the observations it needs (within the support radius of its rows,
#: or owned by it). Smaller files are read once by rank 0 and broadcast.
PARTIAL_READ_BYTES = 64 * 2**20


def obs_count(path: str | Path) -> int:
    """Number of observations in a file (length of its ``obs`` dimension)."""
    import netCDF4

    path = Path(path)
    try:
        with netCDF4.Dataset(path, "r") as ds:
            if "obs" not in ds.dimensions:
                raise InputError(f"{path}: no dimension 'obs' in observation file")
            return len(ds.dimensions["obs"])
    except OSError as exc:
        raise InputError(f"{path}: cannot open observation file ({exc})") from None


#: Observations per hyperslab when reading a selection (bounds the memory of a read).
SELECT_WINDOW = 1 << 20


def _read_selected(var, select: np.ndarray) -> np.ma.MaskedArray:
    """``var[select]`` for sorted positions, as hyperslabs of at most ``SELECT_WINDOW``.

    netCDF4's own fancy indexing issues about one request per position (a
    sorted selection of 10^5 of 10^5 observations took minutes); a window
    from the first selected position reads all the selected positions it
    covers in one request and picks them in memory.
    """
    if select.size == 0:
        return var[:0]
    if np.any(np.diff(select) < 0):
        order = np.argsort(select, kind="stable")
        out = _read_selected(var, select[order])
        back = np.empty_like(order)
        back[order] = np.arange(order.size)
        return out[back]
    parts, i = [], 0
    while i < select.size:
        a = int(select[i])
        j = int(np.searchsorted(select, a + SELECT_WINDOW, side="left"))
        block = var[a : int(select[j - 1]) + 1]
        parts.append(np.ma.asarray(block)[select[i:j] - a])
        i = j
    return np.ma.concatenate(parts) if len(parts) > 1 else parts[0]


_REQUIRED = ("lon", "lat", "value", "error")
_OPTIONAL = ("index", "level", "level_index", "time")


def read_obs_netcdf(
    path: str | Path,
    id_offset: int = 0,
    select: np.ndarray | None = None,
    values: bool = True,
    part: tuple[int, int] | None = None,
) -> ObsBatch:
    """Read an observation file into an :class:`ObsBatch`.

    The file has a dimension ``obs`` and variables ``lon``, ``lat`` (degrees),
    ``value``, ``error`` (standard deviation) and optionally ``index``
    (0-based state row, H = identity), ``level`` (a value of the observed
    variable's level coordinate), ``level_index`` (0-based level) and
    ``time`` (the observation time, in the unit and reference of
    ``analysis.window``, for a 4-D analysis; its ``units`` attribute is not
    interpreted).
    Missing/fill values become NaN (values, errors, levels: such
    observations are rejected later) or -1 (index: interpolation H;
    level_index: none).

    Parameters
    ----------
    path : path-like
    id_offset : int
        Global number of the first observation (the total size of the
        observation files before this one), see :attr:`ObsBatch.ids`.
    select : ndarray of int, optional
        Sorted positions of the observations to read (all if omitted).
    values : bool
        ``False`` reads only the locations (``lon``, ``lat``, ``index``, levels);
        values and errors are then NaN: enough to decide which to read.
    part : (start, stop), optional
        Read only the contiguous slice ``[start, stop)`` of the observations
        (one hyperslab per variable; the regional distribution's parallel
        read, where no rank reads the whole list). Not with ``select``.

    Raises
    ------
    InputError
        The file cannot be opened, or a variable is missing or has the wrong
        dimension; the message names the file and the variable.
    """
    return read_obs_file(path, id_offset, select, values, part)[0]


def read_obs_file(
    path: str | Path,
    id_offset: int = 0,
    select: np.ndarray | None = None,
    values: bool = True,
    part: tuple[int, int] | None = None,
) -> tuple[ObsBatch, str | None]:
    """:func:`read_obs_netcdf` and the file's global attribute ``variable`` (or ``None``)."""
    import netCDF4

    path = Path(path)
    try:
        ds = netCDF4.Dataset(path, "r")
    except OSError as exc:
        raise InputError(f"{path}: cannot open observation file ({exc})") from None
    with ds:
        if "obs" not in ds.dimensions:
            raise InputError(f"{path}: no dimension 'obs' in observation file")
        n = len(ds.dimensions["obs"])
        if part is not None:
            if select is not None:
                raise ValueError("read_obs_file: give select or part, not both")
            lo, hi = int(part[0]), int(part[1])
            if not 0 <= lo <= hi <= n:
                raise ValueError(f"{path}: slice [{lo}, {hi}) outside the {n} observations")
            select_slice = slice(lo, hi)
        attr = ds.getncattr("variable") if "variable" in ds.ncattrs() else None
        if attr is not None and not isinstance(attr, str):
            raise InputError(f"{path}: global attribute 'variable' must be a string")
        data: dict[str, np.ndarray] = {}
        for name in (*_REQUIRED, *_OPTIONAL):
            if name not in ds.variables:
                if name in _OPTIONAL:
                    continue
                raise InputError(f"{path}: variable '{name}' missing in observation file")
            var = ds.variables[name]
            if var.dimensions != ("obs",):
                raise InputError(
                    f"{path}: variable '{name}' must have dimension (obs), has {var.dimensions}"
                )
            if not values and name in ("value", "error"):
                continue
            var.set_auto_mask(True)
            if part is not None:
                raw = var[select_slice]
            else:
                raw = var[:] if select is None else _read_selected(var, np.asarray(select))
            if name in ("index", "level_index"):
                data[name] = np.ma.filled(np.ma.asarray(raw).astype(np.int64), -1)
            else:
                data[name] = np.ma.filled(np.ma.asarray(raw, dtype=float), np.nan)
    if part is not None:
        pos = np.arange(part[0], part[1], dtype=np.int64)
    else:
        pos = np.arange(n, dtype=np.int64) if select is None else np.asarray(select, np.int64)
    nan = np.full(pos.size, np.nan)
    batch = ObsBatch(
        values=data.get("value", nan),
        errors=data.get("error", nan),
        lon=data["lon"],
        lat=data["lat"],
        index=data.get("index"),
        ids=id_offset + pos,
        level=data.get("level"),
        level_index=data.get("level_index"),
        time=data.get("time"),
    )
    return batch, attr
