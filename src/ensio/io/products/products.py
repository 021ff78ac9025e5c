"""Analysis products written beside the members: mean and spread files, member copies.

A product file is a CF field like the members: the coordinates of the
first member (time, level, bounds, grid mapping, auxiliary 2-D lon/lat), its
global attributes with a timestamped ``history`` line, and one variable per
state variable in the member's physical dtype and fill convention, described
as an ensemble statistic (``cell_methods``; a spread has its own
``long_name`` and no ``standard_name``). The CF rules live in :mod:`.cf`.

The offline analysis (``ensio analyse``) and the filter side of the online
mode write their output through the same two collective functions,
:func:`write_member_copies` and :func:`write_products`, so that both modes
produce the same bytes; they differ only in where the structure of a file
comes from (``sources`` / ``template``) and in the ``history`` they leave.

``stage`` (the offline run's transaction's
:meth:`~ensio.io.txn.transaction.Transaction.stage`)
maps a target to the name it is written under until the run commits; without
it (the online mode) each file is renamed into place as soon as it is complete.
Operating-system errors become one-line :class:`~ensio.errors.FileOpError`
messages naming the target and the operation.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import netCDF4
import numpy as np
from mpi4py import MPI

from ... import __version__
from ...config.analysis import OutputSection
from ...config.schema import ConfigError, Coordinates, IOSection
from ...durable import replacing
from ...errors import FileOpError, os_error_reason
from ...layout.block import EnsembleBlock
from ...layout.state import StateLayout, VariableLayout
from ...parallel.agree import all_call, root_call
from ...parallel.distribution import RowDistribution
from ..modes.copies import copy_members
from ..modes.ensemble import IOStats, open_ensemble
from ..scan.members import MemberMeta
from ..tiles.tileproducts import TileProducts, tile_paths
from ..txn.staging import PartialFiles
from ..txn.transaction import Staging
from . import cf

__all__ = ["history", "product_paths", "statistics", "write_field_file",
           "write_member_copies", "write_products"]

Statistic = cf.Statistic


def write_field_file(
    path: Path,
    template: Path,
    layout: StateLayout,
    rows: np.ndarray,
    coordinates: Coordinates,
    history: str,
    *,
    statistic: Statistic | None = None,
    ddof: int = 1,
) -> None:
    """Write a state-shaped field (e.g. the analysis mean) as netCDF-4, a CF field like the members.

    The file holds, from ``template``: the global attributes (``history``
    gets a timestamped line first; ``Conventions`` is ``CF-1.8`` if the
    member has none), every variable the state variables and the configured
    coordinates refer to (dimension coordinates such as ``time`` and the
    level, bounds, grid mappings, auxiliary 2-D lon/lat, formula terms, cell
    measures: :func:`ensio.io.products.cf.referenced_variables`) copied byte for
    byte, the dimensions they use (the record dimension stays unlimited), and
    one variable per state variable in the member's physical dtype and fill
    convention (:func:`ensio.io.products.cf.field_encoding`; packed members are
    written unpacked). Points outside a variable's mask, points missing in
    ``template`` and non-finite values of ``rows`` hold the fill value.

    Parameters
    ----------
    path : Path
        Output file (parent directories are created); written to a temporary
        name and renamed, so a reader never sees a partial file.
    template : Path
        A member file: dimensions, coordinates and attributes come from it.
    layout : StateLayout
    rows : ndarray, shape (N_x,)
        The field in state-vector order, physical units.
    coordinates : Coordinates
        Coordinate variables to carry over (with what they refer to).
    history : str
        The ``history`` line (after its timestamp), e.g.
        ``"ensio analyse (ensio 0.1.0): analysis ensemble mean"``.
    statistic : Statistic, optional
        What the field is over the ensemble (:data:`ensio.io.products.cf.MEAN`,
        :data:`ensio.io.products.cf.SPREAD`): sets ``cell_methods`` and, for a spread,
        the ``long_name`` (with ``ddof``) instead of the ``standard_name``.
    ddof : int
        Delta degrees of freedom of a spread, named in its ``long_name``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        with netCDF4.Dataset(template) as src, netCDF4.Dataset(tmp, "w", format="NETCDF4") as dst:
            src.set_auto_maskandscale(False)
            src.set_auto_chartostring(False)
            dst.set_auto_maskandscale(False)
            dst.set_auto_chartostring(False)
            attrs = {a: src.getncattr(a) for a in src.ncattrs()}
            line = cf.history_line(history)
            attrs["history"] = cf.prepend_history(str(attrs.get("history", "")), line)
            attrs.setdefault("Conventions", "CF-1.8")
            dst.setncatts(attrs)
            state = [v.name for v in layout.variables]
            coord_names = [n for n in (coordinates.lon, coordinates.lat, coordinates.level) if n]
            carried = cf.referenced_variables(src.variables, [*state, *coord_names])
            carried = [n for n in src.variables if n in carried or n in coord_names]
            _copy_dimensions(src, dst, [*state, *carried])
            for name in carried:
                _copy_variable(src[name], dst)
            for v in layout.variables:
                _write_state_variable(src[v.name], dst, v, rows[v.offset : v.offset + v.size],
                                      statistic, ddof)


def _copy_dimensions(src: netCDF4.Dataset, dst: netCDF4.Dataset, names: Sequence[str]) -> None:
    """The dimensions variables ``names`` use, each in its group (``core/temp``'s in ``core``).

    In the template's order of dimensions within a group, as before groups
    were read (the root group's order is what a reader sees first).
    """
    needed: dict[str, set[str]] = {}
    for n in names:
        for dim in src[n].get_dims():
            needed.setdefault(dim.group().path, set()).add(dim.name)
    for path, dims in needed.items():
        g = src if path == "/" else src[path]
        out = dst if path == "/" else dst.createGroup(path)
        for name, dim in g.dimensions.items():
            if name in dims:
                out.createDimension(name, None if dim.isunlimited() else len(dim))


def _copy_variable(var: netCDF4.Variable, dst: netCDF4.Dataset) -> None:
    """Copy a variable of the template as stored (dtype, fill value, attributes, bytes)."""
    attrs = {a: var.getncattr(a) for a in var.ncattrs()}
    fill = attrs.pop("_FillValue", None)
    out = dst.createVariable(var.name, var.datatype, var.dimensions, fill_value=fill)
    out.setncatts(attrs)
    if var.size:
        out[...] = var[...]


def _write_state_variable(
    var: netCDF4.Variable,
    dst: netCDF4.Dataset,
    v: VariableLayout,
    seg: np.ndarray,
    statistic: Statistic | None,
    ddof: int,
) -> None:
    """One state variable of a product: the member's structure, ``seg`` as values."""
    attrs = {a: var.getncattr(a) for a in var.ncattrs()}
    enc = cf.field_encoding(var.dtype, attrs)
    fill = enc.dtype.type(enc.fill) if enc.fill_attribute else None
    # the template's dimension names: ``v.dims`` may be ``ensemble.dims`` renaming them
    out = dst.createVariable(v.name, enc.dtype, var.dimensions, fill_value=fill)
    out.setncatts(cf.product_attributes(attrs, v.name, enc, statistic, ddof))
    field = np.full(v.n_elements, np.nan)
    if v.active is None:
        field[:] = seg
    else:
        field[v.active] = seg
    missing = ~np.isfinite(field) | cf.missing_mask(np.asarray(var[...]).ravel(), attrs)
    values = field.astype(enc.dtype)
    values[missing] = enc.fill
    out[...] = values.reshape(v.shape)


def write_member_copies(
    io: IOSection,
    comm: MPI.Comm,
    block: EnsembleBlock,
    sources: Sequence[Path],
    targets: Sequence[Path],
    stage: Staging | None = None,
    *,
    copies_of: Sequence[MemberMeta] | None = None,
) -> IOStats:
    """Collective: analysis member m = a copy of ``sources[m]`` with the state replaced.

    Every file is copied complete under the name ``stage`` gives it (without
    ``stage``: its own :class:`~ensio.io.txn.staging.PartialFiles`, beside its
    target), its state variables are written in place by the ensemble-I/O
    object, and only then is it renamed to its target, so an interrupted run
    never leaves a file that looks finished. The sources are not touched, so
    no journal is needed. Errors (a missing source, a full disk) are raised
    on every rank.

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
    stage : callable, optional
        Write copy m to ``stage(targets[m])`` and leave it there (the run's
        commit renames it); default: a temporary name renamed at once.
    copies_of : sequence of MemberMeta, optional
        The checked metadata of ``sources`` (the read's scan, current): the
        byte copies are not opened again to be checked.

    Returns
    -------
    IOStats
        Of the write (``clipped``: values clipped when packing).
    """
    tasks = io.tasks
    out_io = dataclasses.replace(
        io, journal=False, tasks=None if tasks is None else min(tasks, comm.size)
    )
    # without the run's transaction each copy is its own (this rank's share renames)
    own = PartialFiles(targets[m] for m in range(comm.rank, len(targets), comm.size))
    temps = [(own.stage if stage is None else stage)(t) for t in targets]
    all_call(comm, lambda: copy_members(sources, temps, comm.rank, comm.size))
    # the copies are private until renamed: written into directly, not copied again
    with open_ensemble(temps, block.layout, out_io, comm, private=True,
                       copies_of=copies_of) as ens:
        stats = ens.write(block)
    if stage is None:
        all_call(comm, own.commit)
    return stats


def product_paths(output: OutputSection, base_dir: Path) -> dict[str, Path]:
    """The configured products (``"mean"``, ``"spread"``) and their resolved paths."""
    named = {"mean": output.mean, "spread": output.spread}
    return {
        k: (Path(v) if Path(v).is_absolute() else base_dir / v)
        for k, v in named.items()
        if v is not None
    }


def statistics(
    rows: np.ndarray, keys: Collection[str]
) -> tuple[int, list[tuple[str, Statistic, Callable[[], np.ndarray]]]]:
    """The products among ``keys`` (``"mean"``, ``"spread"``) of ``rows`` (N_e, count).

    Returns the spread's ddof and, in that order, ``(key, statistic, compute)``
    for each product asked: one expression per row, so any partition of the
    rows (the ranks of ``files`` or ``shuffle`` mode) gives the same values.
    """
    ddof = 1 if rows.shape[0] > 1 else 0
    every = [("mean", cf.MEAN, lambda: rows.mean(axis=0)),
             ("spread", cf.SPREAD, lambda: rows.std(axis=0, ddof=ddof))]  # fmt: skip
    return ddof, [f for f in every if f[0] in keys]


def history(program: str, statistic: Statistic) -> str:
    """The ``history`` line of a product (after its timestamp)."""
    return f"{program} (ensio {__version__}): analysis ensemble {statistic.name}"


def write_products(
    comm: MPI.Comm,
    layout: StateLayout,
    rows: np.ndarray,
    template: Path | None,
    program: str,
    targets: Mapping[str, Path],
    coordinates: Coordinates,
    stage: Staging | None = None,
    *,
    inactive: np.ndarray | None = None,
    tiles: TileProducts | None = None,
) -> None:
    """Collective: the analysis mean and spread files named in ``targets``, if any.

    The fields are gathered whole to rank 0, which writes them with
    :func:`write_field_file` (temporary name, then rename); with ``tiles``
    (a tiled ensemble) as one file per tile (:mod:`ensio.io.tiles.tileproducts`).

    Parameters
    ----------
    comm : MPI.Comm
        Rank r holds the rows ``RowDistribution.of(N_x, comm)`` gives it.
    layout : StateLayout
    rows : ndarray, shape (N_e, count)
        This rank's rows of the analysis ensemble, member-major, physical units.
    template : Path or None
        A member-shaped file the products take their structure from; ``None``
        is an error only if a product is configured.
    program : str
        Names the writer in the ``history`` attribute (``"ensio analyse"``).
    targets : mapping
        ``"mean"`` and/or ``"spread"`` → output file (:func:`product_paths`).
    coordinates : Coordinates
        Coordinate variables to carry over (``ensemble.coordinates``).
    stage : callable, optional
        Write product ``p`` to ``stage(p)`` (renamed by the run's commit).
    inactive : ndarray of bool, shape (count,), optional
        This rank's rows that were not analysed (missing in some member):
        they hold the fill value in the products.
    tiles : TileProducts, optional
        The members are tiled: each target is a pattern with ``{tile}`` and
        tile t takes its structure from ``tiles.templates[t]``.
    """
    ddof, stats = statistics(rows, targets)
    fields = [(targets[k], statistic, compute) for k, statistic, compute in stats]
    if fields and template is None:
        raise ConfigError(
            "output.mean/output.spread: no member file to take the structure from; "
            "give the Ensemble a template file"
        )
    dist = RowDistribution.of(layout.n_rows, comm)
    for path, statistic, compute in fields:
        field = compute()
        if inactive is not None:
            field = np.where(inactive, np.nan, field)
        full = _gather_rows(comm, dist, field)
        what = history(program, statistic)
        if tiles is None:
            pieces = [(path, template, layout, lambda full=full: full)]
        else:
            pieces = [
                (p, tmpl, tiles.layout(layout, box),
                 lambda full=full, box=box: tiles.cut(layout, full, box))
                for p, tmpl, box in zip(tile_paths(path, tiles.geometry.count), tiles.templates,
                                        tiles.geometry.boxes, strict=True)
            ]  # fmt: skip

        def write_all(pieces=pieces, what=what, statistic=statistic) -> None:
            for target, tmpl, lay, values in pieces:
                _write_product(
                    target, target if stage is None else stage(target),
                    lambda out, tmpl=tmpl, lay=lay, values=values: write_field_file(
                        out, tmpl, lay, values(), coordinates, what, statistic=statistic,
                        ddof=ddof,
                    ),
                )

        root_call(comm, write_all)


def _write_product(target: Path, out: Path, write: Callable[[Path], None]) -> None:
    """``write(out)``; its failure as one line naming ``target`` (netCDF errors too)."""
    try:
        write(out)
    except (OSError, RuntimeError) as exc:
        # HDF5 reports a full disk as "HDF error" or even EACCES on its own file
        reason = os_error_reason(exc) if isinstance(exc, OSError) else str(exc)
        try:
            st = os.statvfs(out.parent)
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = None
        if free is not None and free < (1 << 20) and "space" not in reason.lower():
            reason = (f"No space left on device ({free // 1024} kB free; "
                      f"the netCDF library said: {reason})")
        raise FileOpError(f"cannot write {target}: {reason}") from exc


def _gather_rows(comm: MPI.Comm, dist: RowDistribution, rows: np.ndarray) -> np.ndarray | None:
    """Collective: the block-distributed field ``rows`` (count,) whole on rank 0 (N_x,)."""
    full = np.empty(dist.n_rows) if comm.rank == 0 else None
    recv = [full, dist.counts, dist.starts, MPI.DOUBLE] if full is not None else None
    comm.Gatherv(np.ascontiguousarray(rows), recv)
    return full
