"""Analysis products written beside the members: mean and spread files, member copies.

A product file has the structure a user expects of a model field: the
dimensions, coordinate variables (with their attributes) and global
attributes of the first member, and one variable per state variable with its
attributes, holding the field (masked points: ``_FillValue``).

The offline analysis (``ensio analyse``) and the filter side of the online
mode write their output through the same two collective functions,
:func:`write_member_copies` and :func:`write_products`, so that both modes
produce the same bytes; they differ only in where the structure of a file
comes from (``sources`` / ``template``) and in the ``history`` they leave.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import netCDF4
import numpy as np
from mpi4py import MPI

from ..config.analysis import OutputSection
from ..config.schema import ConfigError, Coordinates, IOSection
from ..durable import replacing
from ..layout.block import EnsembleBlock
from ..layout.state import StateLayout
from ..parallel.agree import all_call, root_call
from ..parallel.distribution import RowDistribution
from .ensemble import IOStats, open_ensemble

__all__ = ["copy_members", "partial_path", "product_paths", "write_field_file",
           "write_member_copies", "write_products"]

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
    with replacing(path) as tmp:
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
                attrs = {a: var.getncattr(a) for a in var.ncattrs() if a != "_FillValue"}
                out.setncatts(attrs)
                field = np.full(v.n_elements, _FILL)
                seg = rows[v.offset : v.offset + v.size]
                if v.active is None:
                    field[:] = seg
                else:
                    field[v.active] = seg
                out[...] = field.reshape(v.shape)


def copy_members(sources: Sequence[Path], targets: Sequence[Path], rank: int, size: int) -> None:
    """Copy member files (this rank's share: every ``size``-th from ``rank``)."""
    for m in range(rank, len(sources), size):
        targets[m].parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sources[m], targets[m])


def partial_path(target: Path) -> Path:
    """Where a member copy is written before it is renamed to ``target``."""
    return target.parent / f".{target.name}.ensio-partial"


def write_member_copies(
    io: IOSection,
    comm: MPI.Comm,
    block: EnsembleBlock,
    sources: Sequence[Path],
    targets: Sequence[Path],
) -> IOStats:
    """Collective: analysis member m = a copy of ``sources[m]`` with the state replaced.

    Every file is copied complete under a temporary name
    (:func:`partial_path`, beside its target), its state variables are
    written in place by the ensemble-I/O object, and only then is it renamed
    to its target, so an interrupted run never leaves a file that looks
    finished. The sources are not touched, so no journal is needed. Errors
    (a missing source, a full disk) are raised on every rank.

    Parameters
    ----------
    io : IOSection
        The run's ``io`` section; ``io.tasks`` is capped at the size of
        ``comm`` (the online filter has fewer ranks than the job).
    comm : MPI.Comm
        The ranks holding ``block``; member files are copied and renamed
        round-robin over them.
    block : EnsembleBlock
        This rank's rows of the analysis, ``data`` of shape (N_e, count);
        its layout is what every copy must match.
    sources : sequence of Path, length N_e
        The file each member is a copy of: its member file, or a template
        for members that have none (online).
    targets : sequence of Path, length N_e
        The analysis member files (``config.output_member_paths()``).

    Returns
    -------
    IOStats
        Of the write (``clipped``: values clipped when packing).
    """
    tasks = io.tasks
    out_io = dataclasses.replace(
        io, journal=False, tasks=None if tasks is None else min(tasks, comm.size)
    )
    temps = [partial_path(t) for t in targets]
    mine = range(comm.rank, len(targets), comm.size)
    all_call(comm, lambda: copy_members(sources, temps, comm.rank, comm.size))
    with open_ensemble(temps, block.layout, out_io, comm) as ens:
        stats = ens.write(block)
    all_call(comm, lambda: [os.replace(temps[m], targets[m]) for m in mine])
    return stats


def product_paths(output: OutputSection, base_dir: Path) -> dict[str, Path]:
    """The configured products (``"mean"``, ``"spread"``) and their resolved paths."""
    named = {"mean": output.mean, "spread": output.spread}
    return {
        k: (Path(v) if Path(v).is_absolute() else base_dir / v)
        for k, v in named.items()
        if v is not None
    }


def write_products(
    comm: MPI.Comm,
    layout: StateLayout,
    rows: np.ndarray,
    template: Path | None,
    program: str,
    targets: Mapping[str, Path],
    coordinates: Coordinates,
) -> None:
    """Collective: the analysis mean and spread files named in ``targets``, if any.

    The fields are gathered whole to rank 0, which writes them with
    :func:`write_field_file` (temporary name, then rename).

    Parameters
    ----------
    comm : MPI.Comm
        Rank r holds the rows ``RowDistribution.of(N_x, comm)`` gives it.
    layout : StateLayout
    rows : ndarray, shape (N_e, count)
        This rank's rows of the analysis ensemble, member-major.
    template : Path or None
        A member-shaped file the products take their structure from; ``None``
        is an error only if a product is configured.
    program : str
        Names the writer in the ``history`` attribute (``"ensio analyse"``).
    targets : mapping
        ``"mean"`` and/or ``"spread"`` → output file (:func:`product_paths`).
    coordinates : Coordinates
        Coordinate variables to carry over (``ensemble.coordinates``).
    """
    fields = []
    if "mean" in targets:
        fields.append((targets["mean"], rows.mean(axis=0), "analysis ensemble mean"))
    if "spread" in targets:
        ddof = 1 if rows.shape[0] > 1 else 0
        fields.append(
            (targets["spread"], rows.std(axis=0, ddof=ddof), "analysis ensemble spread (std)")
        )
    if fields and template is None:
        raise ConfigError(
            "output.mean/output.spread: no member file to take the structure from; "
            "give the Ensemble a template file"
        )
    dist = RowDistribution.of(layout.n_rows, comm)
    for path, field, what in fields:
        full = _gather_rows(comm, dist, field)
        root_call(
            comm,
            lambda path=path, full=full, what=what: write_field_file(
                path, template, layout, full, coordinates, f"{program}: {what}"
            ),
        )


def _gather_rows(comm: MPI.Comm, dist: RowDistribution, rows: np.ndarray) -> np.ndarray | None:
    """Collective: the block-distributed field ``rows`` (count,) whole on rank 0 (N_x,)."""
    full = np.empty(dist.n_rows) if comm.rank == 0 else None
    recv = [full, dist.counts, dist.starts, MPI.DOUBLE] if full is not None else None
    comm.Gatherv(np.ascontiguousarray(rows), recv)
    return full
