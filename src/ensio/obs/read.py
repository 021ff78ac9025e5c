"""Reading observation files (DESIGN.md "Conventions")."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError
from .batch import ObsBatch

__all__ = ["read_obs_netcdf"]

_REQUIRED = ("lon", "lat", "value", "error")


def read_obs_netcdf(path: str | Path, id_offset: int = 0) -> ObsBatch:
    """Read an observation file into an :class:`ObsBatch`.

    The file has a dimension ``obs`` and variables ``lon``, ``lat`` (degrees),
    ``value``, ``error`` (standard deviation) and optionally ``index``
    (0-based state row, H = identity). Missing/fill values become NaN (values,
    errors: rejected later by quality control) or -1 (index: bilinear H).

    Parameters
    ----------
    path : path-like
    id_offset : int
        Global number of the first observation (the total size of the
        observation files before this one), see :attr:`ObsBatch.ids`.

    Raises
    ------
    InputError
        The file cannot be opened, or a variable is missing or has the wrong
        dimension; the message names the file and the variable.
    """
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
        data: dict[str, np.ndarray] = {}
        for name in (*_REQUIRED, "index"):
            if name not in ds.variables:
                if name == "index":
                    continue
                raise InputError(f"{path}: variable '{name}' missing in observation file")
            var = ds.variables[name]
            if var.dimensions != ("obs",):
                raise InputError(
                    f"{path}: variable '{name}' must have dimension (obs), has {var.dimensions}"
                )
            var.set_auto_mask(True)
            raw = var[:]
            if name == "index":
                data[name] = np.ma.filled(np.ma.asarray(raw).astype(np.int64), -1)
            else:
                data[name] = np.ma.filled(np.ma.asarray(raw, dtype=float), np.nan)
    return ObsBatch(
        values=data["value"],
        errors=data["error"],
        lon=data["lon"],
        lat=data["lat"],
        index=data.get("index"),
        ids=np.arange(id_offset, id_offset + n, dtype=np.int64),
    )
