"""Analysis products written beside the members: mean and spread files, member copies.

A product file has the structure a user expects of a model field: the
dimensions, coordinate variables (with their attributes) and global
attributes of the first member, and one variable per state variable with its
attributes, holding the field (masked points: ``_FillValue``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import netCDF4
import numpy as np

from ..config.schema import Coordinates
from ..layout.state import StateLayout

__all__ = ["copy_members", "write_field_file"]

_FILL = netCDF4.default_fillvals["f8"]


def write_field_file(
    path: Path,
    template: Path,
    layout: StateLayout,
    rows: np.ndarray,
    coordinates: Coordinates,
    history: str,
) -> None:
    """Write a state-shaped field (e.g. the analysis mean) as netCDF-4.

    Parameters
    ----------
    path : Path
        Output file (parent directories are created); written to a temporary
        name and renamed, so a reader never sees a partial file.
    template : Path
        A member file: dimensions, coordinates and attributes come from it.
    layout : StateLayout
    rows : ndarray, shape (N_x,)
        The field in state-vector order.
    coordinates : Coordinates
        Coordinate variables to carry over.
    history : str
        Appended to the ``history`` global attribute.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.ensio-tmp")
    coord_names = [n for n in (coordinates.lon, coordinates.lat, coordinates.level) if n]
    with netCDF4.Dataset(template) as src, netCDF4.Dataset(tmp, "w", format="NETCDF4") as dst:
        src.set_auto_maskandscale(False)
        attrs = {a: src.getncattr(a) for a in src.ncattrs()}
        old = str(attrs.get("history", ""))
        attrs["history"] = (old + "\n" if old else "") + history
        dst.setncatts(attrs)
        needed = {d for v in layout.variables for d in v.dims}
        needed |= {d for n in coord_names if n in src.variables for d in src[n].dimensions}
        for name, dim in src.dimensions.items():
            if name in needed:
                dst.createDimension(name, None if dim.isunlimited() else len(dim))
        for name in coord_names:
            if name in src.variables:
                var = src[name]
                out = dst.createVariable(name, var.dtype, var.dimensions)
                out.setncatts({a: var.getncattr(a) for a in var.ncattrs()})
                out[...] = var[...]
        for v in layout.variables:
            var = src[v.name]
            out = dst.createVariable(v.name, "f8", v.dims, fill_value=_FILL)
            out.setncatts({a: var.getncattr(a) for a in var.ncattrs() if a not in ("_FillValue",)})
            field = np.full(v.n_elements, _FILL)
            seg = rows[v.offset : v.offset + v.size]
            if v.active is None:
                field[:] = seg
            else:
                field[v.active] = seg
            out[...] = field.reshape(v.shape)
    os.replace(tmp, path)


def copy_members(sources: Sequence[Path], targets: Sequence[Path], rank: int, size: int) -> None:
    """Copy member files (this rank's share: every ``size``-th from ``rank``)."""
    for m in range(rank, len(sources), size):
        targets[m].parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sources[m], targets[m])
