"""Cheap re-validation of member files against one fully checked member (many small files).

Why: for members of a few MB the metadata pass, not the data, dominated a
read. A full check (:func:`ensio.io.scan.members.check_member`) parses all of a
file's metadata; a netCDF-4 file costs ~0.9 ms that way (5 ms when its
coordinates were read through the netCDF library), as much as reading 8 MB
from the page cache. But the members of an ensemble are written by one
program and share their structure. So one member is checked fully and kept
as the **template**; every member (the template's file too, once it has
changed) is then checked by the first of these that applies:

1. **bytes** (:mod:`ensio.io.scan.bytecheck`): the member's metadata bytes are the
   template's, except global attribute values. It then has the template's
   variables at the template's offsets (netCDF-4 and classic; ~10 µs);
2. **a lean HDF5 look** (netCDF-4: :func:`ensio.io.formats.netcdf4.quick_hdf5_variables`):
   only the datasets the ensemble uses and their dimension scales are
   opened, and what the full check's answer depends on is compared with the
   template; offsets and packing are the member's own (~0.3 ms);
3. the **full check**, whose messages name any problem (missing variable,
   wrong dims or dtype, corrupt file).

In 1 and 2 the coordinate values are still compared with the layout's
(:func:`ensio.io.scan.consistency.check_coordinates`, same messages), read as
byte ranges, through HDF5 (chunked) or, for chunked netCDF-4 coordinates in
case 1, taken from the template (their bytes were compared).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

import h5py
import numpy as np

from ...errors import InputError
from ...layout.state import StateLayout
from ..formats.classic import record_layout
from ..formats.netcdf4 import NetCDF4Store, chunk_ranges, quick_hdf5_variables
from ..formats.open import HEAD_BYTES, detect_backend
from ..formats.raw import raw_read
from ..formats.store import VarInfo
from .bytecheck import ByteTemplate, byte_template, same_bytes
from .consistency import check_coordinates

__all__ = ["Template", "make_template", "quick_check"]

#: What h5py raises for files the quick look cannot handle (then: the full check).
_H5_ERRORS = (KeyError, OSError, ValueError, TypeError, RuntimeError)


@dataclass(frozen=True)
class Template:
    """The structure of one fully checked member, for :func:`quick_check`.

    Attributes
    ----------
    source : Path
        The member it was taken from (messages, tests).
    infos : dict of str to VarInfo
        Its state variables, then the coordinate variables the consistency
        check compares (what a member of identical bytes has).
    bytes : ByteTemplate or None
        The byte comparison (:mod:`ensio.io.scan.bytecheck`), if it applies.
    signature : tuple or None
        netCDF-4: :func:`~ensio.io.formats.netcdf4.quick_hdf5_variables`' signature
        of the source, if that look applies.
    pieces : dict of str to list of VarInfo
        Coordinate variables read as byte ranges: the variable, or (classic
        record variables) one range per record, at the source's offsets.
    fixed : dict of str to ndarray
        netCDF-4 coordinates that are chunked: their values in the source.
        Their bytes are part of the compared bytes, so a member that passes
        the byte comparison has them too.
    library_writes : bool
        The capability of the source's format (a template exists only for
        formats with raw byte ranges).
    """

    source: Path
    infos: dict[str, VarInfo]
    bytes: ByteTemplate | None
    signature: tuple[object, ...] | None
    pieces: dict[str, list[VarInfo]]
    fixed: dict[str, np.ndarray]
    library_writes: bool = True

    @property
    def dims(self) -> dict[str, tuple[str, ...]]:
        return {n: i.dims for n, i in self.infos.items()}


def _names(layout: StateLayout) -> list[str]:
    """State variables, then the coordinate variables the consistency check compares."""
    names = [v.name for v in layout.variables]
    if layout.geometry is not None:
        names += [c.name for c in layout.geometry.checked if c.name not in names]
    return names


def _same(a: VarInfo, b: VarInfo) -> bool:
    """Field by field, NaN fill values equal (``repr`` of each field)."""
    return all(repr(getattr(a, f.name)) == repr(getattr(b, f.name)) for f in fields(VarInfo))


def make_template(
    path: Path,
    layout: StateLayout,
    infos: dict[str, VarInfo],
    format_name: str,
    library_writes: bool = True,
) -> Template | None:
    """The template of member ``path``, fully checked with descriptions ``infos``; or None.

    ``infos`` holds *all* variables of the file (the full check's). None when
    no quick look applies. The HDF5 look is kept only where it gives exactly
    the full check's descriptions for this structure (a variable in a
    subgroup, a dimension without a scale dataset: not).
    """
    names = _names(layout)
    if any(n not in infos for n in names):
        return None
    used = {n: infos[n] for n in names}
    coords = [n for n in names if n not in {v.name for v in layout.variables}]
    chunks: list[tuple[int, int]] | None = []
    if format_name == NetCDF4Store.format_name:  # chunked data, except the coordinates'
        chunks = chunk_ranges(path, [n for n, i in infos.items()
                                     if i.raw_offset is None and n not in coords])  # fmt: skip
    try:
        raw = None if chunks is None else byte_template(path, infos.values(), format_name, chunks)
        pieces = _pieces(path, {n: used[n] for n in coords}, format_name)
    except (OSError, InputError):
        return None
    sig, fixed = None, {}
    if format_name == NetCDF4Store.format_name and not any("/" in n for n in names):
        chunked = tuple(n for n in coords if n not in pieces)
        try:
            sig, quick, fixed = quick_hdf5_variables(path, {n: used[n].dims for n in names},
                                                     chunked)  # fmt: skip
        except _H5_ERRORS:
            return None
        if not all(_same(quick[n], used[n]) for n in names):
            return None
        if raw is not None and not _attribute_count_agrees(path, raw):
            try:  # the parse missed attributes: compare every metadata byte
                raw = byte_template(path, infos.values(), format_name, chunks or (), exact=True)
            except (OSError, InputError):
                raw = None
    if pieces is None or any(n not in pieces and n not in fixed for n in coords):
        return None
    if raw is None and sig is None:
        return None
    return Template(path, used, raw, sig, pieces, fixed, library_writes)


def _pieces(
    path: Path, coords: dict[str, VarInfo], format_name: str
) -> dict[str, list[VarInfo]] | None:
    """How to read each coordinate as byte ranges (classic record variables: per record)."""
    out = {n: [i] for n, i in coords.items() if i.raw_offset is not None}
    record = [n for n in coords if n not in out]
    if record and format_name == "classic":
        rl = record_layout(path)
        for n in record:
            if coords[n].shape[0]:  # no records: nothing to read, no quick check
                out[n] = [rl.record_info(n, r) for r in range(coords[n].shape[0])]
    return out


def _attribute_count_agrees(path: Path, raw: ByteTemplate) -> bool:
    """The byte parse found every global attribute of the root group (cross-check with HDF5)."""
    try:
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        fapl.set_file_locking(False, True)
        fid = h5py.h5f.open(str(path).encode(), h5py.h5f.ACC_RDONLY, fapl)
        try:
            root = h5py.h5g.open(fid, b"/")
            return bool(h5py.h5a.get_num_attrs(root) == raw.attributes)
        finally:
            fid.close()
    except _H5_ERRORS:
        return False


def quick_check(
    path: Path, layout: StateLayout, template: Template
) -> tuple[dict[str, VarInfo], np.ndarray | None] | None:
    """Check member ``path`` against the template; None means "take the full check".

    Returns
    -------
    (infos, time) or None
        The state variables' descriptions (offsets and packing of this file)
        and the member's time coordinate, as the full check returns them.

    Raises
    ------
    InputError
        Only for coordinate values that differ from the layout's (the same
        message as the full check's).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _quick(fd, path, layout, template)
    finally:
        os.close(fd)


def _quick(
    fd: int, path: Path, layout: StateLayout, template: Template
) -> tuple[dict[str, VarInfo], np.ndarray | None] | None:
    """:func:`quick_check` on the open file ``fd``."""
    state = {v.name for v in layout.variables}
    if template.bytes is not None and same_bytes(path, template.bytes, fd):
        infos, pieces, values = template.infos, template.pieces, dict(template.fixed)
    elif template.signature is not None and _is_netcdf4(path):
        coords = [n for n in template.infos if n not in state]
        try:
            sig, infos, values = quick_hdf5_variables(path, template.dims, tuple(coords))
        except _H5_ERRORS:
            return None
        if sig != template.signature:
            return None
        pieces = {}
    else:
        return None
    read = _read_pieces(fd, path, pieces, infos)
    if read is None:
        return None
    values.update(read)
    times = check_coordinates(path, layout, values.get)
    return {n: infos[n] for n in infos if n in state}, times


def _read_pieces(
    fd: int, path: Path, pieces: dict[str, list[VarInfo]], infos: dict[str, VarInfo]
) -> dict[str, np.ndarray] | None:
    """Each variable's byte ranges, joined, shaped as ``infos`` (native byte order).

    None if the file is too short (the full check then names the problem).
    """
    out = {}
    try:
        for name, parts in pieces.items():
            flat = np.concatenate([raw_read(fd, i, 0, i.size, path=path) for i in parts])
            native = flat.astype(flat.dtype.newbyteorder("="), copy=False)
            out[name] = native.reshape(infos[name].shape)
    except InputError:
        return None
    return out


def _is_netcdf4(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError:
        return False
    return detect_backend(head) is NetCDF4Store
