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
from collections.abc import Sequence
from pathlib import Path

import netCDF4
import numpy as np
from mpi4py import MPI

from ..config.schema import Config, ConfigError, Coordinates
from ..durable import replacing
from ..layout.state import StateLayout
from ..parallel.agree import all_call, root_call
from ..parallel.distribution import block_distribution
from .ensemble import EnsembleBlock, write_ensemble

__all__ = ["copy_members", "write_field_file", "write_member_copies", "write_products"]

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


def write_member_copies(
    config: Config,
    comm: MPI.Comm,
    block: EnsembleBlock,
    sources: Sequence[Path],
    targets: str,
) -> None:
    """Collective: analysis member m = a copy of ``sources[m]`` with the state replaced.

    Every file is copied complete under a temporary name
    (``.<name>.ensio-partial`` beside its target), its state variables are
    written in place by :func:`~ensio.io.ensemble.write_ensemble`, and only
    then is it renamed to its target, so an interrupted run never leaves a
    file that looks finished. The sources are not touched, so no journal is
    needed. Errors (a missing source, a full disk) are raised on every rank.

    Parameters
    ----------
    config : Config
        ``ensemble`` (the layout, N_e) and ``io`` of the run; ``io.tasks`` is
        capped at the size of ``comm`` (the online filter has fewer ranks
        than the job).
    comm : MPI.Comm
        The ranks holding ``block``; member files are copied and renamed
        round-robin over them.
    block : EnsembleBlock
        This rank's rows of the analysis, ``data`` of shape (N_e, count).
    sources : sequence of Path, length N_e
        The file each member is a copy of: its member file, or a template
        for members that have none (online).
    targets : str
        Member path pattern with ``{member}`` (1-based), relative to
        ``config.base_dir`` (normally ``output.members``). A pattern and not
        a list, because the writer addresses member files by pattern.
    """
    pattern = Path(targets)
    partial = str(pattern.parent / f".{pattern.name}.ensio-partial")
    tasks = config.io.tasks
    out_cfg = dataclasses.replace(
        config,
        ensemble=dataclasses.replace(config.ensemble, members=partial),
        io=dataclasses.replace(
            config.io, journal=False, tasks=None if tasks is None else min(tasks, comm.size)
        ),
    )
    temps = out_cfg.member_paths()
    finals = [config.resolve(targets.format(member=m)) for m in config.ensemble.numbers]
    mine = range(comm.rank, len(finals), comm.size)
    all_call(comm, lambda: copy_members(sources, temps, comm.rank, comm.size))
    write_ensemble(out_cfg, comm, block)
    all_call(comm, lambda: [os.replace(temps[m], finals[m]) for m in mine])


def write_products(
    config: Config,
    comm: MPI.Comm,
    layout: StateLayout,
    rows: np.ndarray,
    template: Path | None,
    program: str,
) -> None:
    """Collective: ``output.mean`` / ``output.spread`` of the analysis, if configured.

    The fields are gathered whole to rank 0, which writes them with
    :func:`write_field_file` (temporary name, then rename).

    Parameters
    ----------
    config : Config
        ``output`` (which products, where) and ``ensemble.coordinates``.
    comm : MPI.Comm
        Rank r holds the rows ``block_distribution(N_x, comm.size, r)``.
    layout : StateLayout
    rows : ndarray, shape (N_e, count)
        This rank's rows of the analysis ensemble, member-major.
    template : Path or None
        A member-shaped file the products take their structure from; ``None``
        is an error only if a product is configured.
    program : str
        Names the writer in the ``history`` attribute (``"ensio analyse"``).
    """
    out = config.output
    fields = []
    if out.mean is not None:
        fields.append((out.mean, rows.mean(axis=0), "analysis ensemble mean"))
    if out.spread is not None:
        ddof = 1 if rows.shape[0] > 1 else 0
        fields.append((out.spread, rows.std(axis=0, ddof=ddof), "analysis ensemble spread (std)"))
    if fields and template is None:
        raise ConfigError(
            "output.mean/output.spread: no member file to take the structure from; "
            "give the Ensemble a template file"
        )
    for name, field, what in fields:
        full = _gather_rows(comm, layout.n_rows, field)
        root_call(
            comm,
            lambda name=name, full=full, what=what: write_field_file(
                config.resolve(name),
                template,
                layout,
                full,
                config.ensemble.coordinates,
                f"{program}: {what}",
            ),
        )


def _gather_rows(comm: MPI.Comm, n_rows: int, rows: np.ndarray) -> np.ndarray | None:
    """Collective: the block-distributed field ``rows`` (count,) whole on rank 0 (N_x,)."""
    counts = np.array([block_distribution(n_rows, comm.size, r)[1] for r in range(comm.size)])
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    full = np.empty(n_rows) if comm.rank == 0 else None
    comm.Gatherv(
        np.ascontiguousarray(rows), [full, counts, displs, MPI.DOUBLE] if full is not None else None
    )
    return full
