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
   variables at the template's offsets (~10 µs);
2. **header keys** (:meth:`~ensio.io.formats.store.MemberStore.header_keys`;
   netCDF-4: :mod:`ensio.io.formats.hdf5headers`, ~40 µs): for members whose
   metadata moved (a global attribute of another length written before the
   variables shifts every offset), each variable's header, wherever it lies,
   must equal the template's but for its place; offsets are the member's own;
3. **a quick look** (:meth:`~ensio.io.formats.store.MemberStore.quick_look`;
   netCDF-4: only the datasets the ensemble uses and their dimension scales
   are opened through HDF5, ~0.3-0.6 ms; classic: the header alone, no sniff,
   for a header that moved, e.g. a global attribute of another length): what the full
   check's answer depends on is compared with the template; offsets and
   packing are the member's own;
4. the **full check**, whose messages name any problem (missing variable,
   wrong dims or dtype, corrupt file).

In 1 to 3 the coordinate values are still compared with the layout's
(:func:`ensio.io.scan.consistency.check_coordinates`, same messages), read as
byte ranges (:meth:`~ensio.io.formats.store.MemberStore.byte_pieces`), by the
quick look, or, for coordinates without byte ranges in case 1, taken from
the template (their bytes were compared). Coordinates stored as the
template's very bytes (a ``pread`` and a compare each) are the template's
values, which its own check compared with the same layout: they give the
template's time coordinate without being decoded again (~20 µs a member).

Which of 1 to 3 a format offers is its store's business (optional hooks of
:class:`~ensio.io.formats.store.MemberStore`); this module never asks which
format a file is, only whether it is the template's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...layout.state import StateLayout
from ..formats.open import BACKENDS, HEAD_BYTES, backend_of
from ..formats.raw import raw_read
from ..formats.store import HeaderKeys, MemberStore, VarInfo
from .bytecheck import ByteTemplate, byte_template, same_bytes
from .consistency import check_coordinates

__all__ = ["Template", "make_template", "quick_check"]

#: What a quick look raises for files it cannot handle (then: the full check).
_LOOK_ERRORS = (InputError, KeyError, OSError, ValueError, TypeError, RuntimeError)


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
        The signature of the source's quick look
        (:meth:`~ensio.io.formats.store.MemberStore.quick_look`), if that applies.
    pieces : dict of str to list of VarInfo
        Coordinate variables read as byte ranges: the variable, or (classic
        record variables) one range per record, at the source's offsets.
    fixed : dict of str to ndarray
        Coordinates without byte ranges (chunked netCDF-4): their values in
        the source. Their bytes are part of the compared bytes, so a member
        that passes the byte comparison has them too.
    library_writes : bool
        The capability of the source's format (a template exists only for
        formats with raw byte ranges).
    store : type of MemberStore or None
        The source's format: a member of another format takes the full check.
    headers : HeaderKeys or None
        The source's header keys
        (:meth:`~ensio.io.formats.store.MemberStore.header_keys`), if they
        give its raw offsets.
    coordinates : tuple or None
        ``(checked, bytes, time)``: what of the layout the coordinate check
        compares with (:func:`_checked`), the coordinates' stored bytes per
        piece of ``pieces``, and the time coordinate the source's check gave
        (None: no shortcut).
    """

    source: Path
    infos: dict[str, VarInfo]
    bytes: ByteTemplate | None
    signature: tuple[object, ...] | None
    pieces: dict[str, list[VarInfo]]
    fixed: dict[str, np.ndarray]
    library_writes: bool = True
    store: type[MemberStore] | None = None
    headers: HeaderKeys | None = None
    coordinates: tuple[object, dict[str, tuple[bytes, ...]], np.ndarray | None] | None = None

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

    ``infos`` holds *all* variables of the file (the full check's);
    ``format_name`` is its store's (a key of
    :data:`~ensio.io.formats.open.BACKENDS`). None when no quick check
    applies. The quick look is kept only where it gives exactly the full
    check's descriptions for this structure.
    """
    store = BACKENDS.get(format_name)
    names = _names(layout)
    if store is None or any(n not in infos for n in names):
        return None
    used = {n: infos[n] for n in names}
    coords = [n for n in names if n not in {v.name for v in layout.variables}]
    try:
        raw = byte_template(path, store, infos, coords)
        pieces = store.byte_pieces(path, {n: used[n] for n in coords})
    except (OSError, InputError):
        return None
    try:
        look = store.quick_look(path, {n: used[n].dims for n in names},
                                tuple(n for n in coords if n not in pieces))  # fmt: skip
    except _LOOK_ERRORS:
        return None
    sig, fixed = None, {}
    if look is not None:
        if not all(_same(look.infos[n], used[n]) for n in names):
            return None
        sig, fixed = look.signature, look.values
    if any(n not in pieces and n not in fixed for n in coords):
        return None
    headers = _headers(path, store, used)
    if raw is None and sig is None and headers is None:
        return None
    stored = _stored_coordinates(path, layout, used, pieces, fixed)
    return Template(path, used, raw, sig, pieces, fixed, library_writes, store, headers, stored)


def _stored_coordinates(
    path: Path,
    layout: StateLayout,
    infos: dict[str, VarInfo],
    pieces: dict[str, list[VarInfo]],
    fixed: dict[str, np.ndarray],
) -> tuple[object, dict[str, tuple[bytes, ...]], np.ndarray | None] | None:
    """:attr:`Template.coordinates` of the template ``path`` (None if its check fails)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            stored = {n: tuple(os.pread(fd, i.nbytes, i.raw_offset) for i in parts)
                      for n, parts in pieces.items()}  # fmt: skip
            values = _read_pieces(fd, path, pieces, infos)
        finally:
            os.close(fd)
    except OSError:
        return None
    if values is None or any(len(b) != i.nbytes for n, parts in pieces.items()
                             for b, i in zip(stored[n], parts, strict=True)):  # fmt: skip
        return None
    values.update(fixed)
    try:
        time = check_coordinates(path, layout, values.get)
    except InputError:
        return None
    return _checked(layout), stored, time


def _checked(layout: StateLayout) -> tuple[object, ...]:
    """What :func:`~ensio.io.scan.consistency.check_coordinates` compares a member with.

    By value, not identity: a template crosses ranks pickled (the scan's
    rank 0 makes it), its layout then is another object.
    """
    geo = layout.geometry
    if geo is None:
        return ()
    return tuple((c.role, c.name, np.asarray(c.values).dtype.str, np.shape(c.values),
                  np.asarray(c.values).tobytes()) for c in geo.checked)  # fmt: skip


def _headers(path: Path, store: type[MemberStore], used: dict[str, VarInfo]) -> HeaderKeys | None:
    """The template's header keys (its variables and their dimensions'), if they agree with it."""
    wanted = sorted(set(used) | {d for i in used.values() for d in i.dims})
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            keys = store.header_keys(fd, os.fstat(fd).st_size, wanted)
        finally:
            os.close(fd)
    except OSError:
        return None
    if keys is None or any(n not in keys.variables for n in wanted):
        return None
    if any(i.raw_offset not in (None, keys.variables[n][1]) for n, i in used.items()):
        return None
    return keys


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
    looked = False  # coordinate values read by the quick look (not the template's)
    if template.bytes is not None and same_bytes(path, template.bytes, fd):
        infos, pieces, values = template.infos, template.pieces, dict(template.fixed)
    elif template.headers is not None and (moved := _by_headers(fd, path, template)):
        infos, pieces, values = *moved, {}
    elif template.signature is not None and _format(fd, path) is template.store:
        coords = [n for n in template.infos if n not in state]
        try:
            look = template.store.quick_look(path, template.dims, tuple(coords))
        except _LOOK_ERRORS:
            return None
        if look is None or look.signature != template.signature:
            return None
        infos, values = look.infos, dict(look.values)
        looked = bool(values)
        rest = {n: infos[n] for n in coords if n not in values}
        try:
            pieces = template.store.byte_pieces(path, rest) if rest else {}
        except (OSError, InputError):
            return None
        if any(n not in pieces for n in rest):
            return None
    else:
        return None
    if not looked and _stored_as_template(fd, layout, pieces, template):
        time = template.coordinates[2] if template.coordinates else None
        return {n: infos[n] for n in infos if n in state}, None if time is None else time.copy()
    read = _read_pieces(fd, path, pieces, infos)
    if read is None:
        return None
    values.update(read)
    times = check_coordinates(path, layout, values.get)
    return {n: infos[n] for n in infos if n in state}, times


def _stored_as_template(
    fd: int, layout: StateLayout, pieces: dict[str, list[VarInfo]], template: Template
) -> bool:
    """Whether the coordinates in ``pieces`` hold the template's bytes, checked with ``layout``."""
    if template.coordinates is None:
        return False
    checked, stored, _ = template.coordinates
    if pieces.keys() != stored.keys():
        return False
    try:
        same = all(len(parts) == len(stored[n])
                   and all(os.pread(fd, len(want), i.raw_offset) == want
                           for i, want in zip(parts, stored[n], strict=True))
                   for n, parts in pieces.items())  # fmt: skip
    except OSError:
        return False
    return same and _checked(layout) == checked


def _by_headers(
    fd: int, path: Path, template: Template
) -> tuple[dict[str, VarInfo], dict[str, list[VarInfo]]] | None:
    """Descriptions and coordinate pieces from the member's header keys; None if they differ.

    Equal keys: the template's descriptions, with the member's raw offsets.
    """
    want = template.headers
    assert want is not None and template.store is not None
    try:
        keys = template.store.header_keys(fd, os.fstat(fd).st_size, tuple(want.variables))
    except OSError:
        return None
    if keys is None or keys.key != want.key or keys.names != want.names:
        return None
    if any(keys.variables.get(n, (None,))[0] != key for n, (key, _) in want.variables.items()):
        return None
    infos = {n: i if i.raw_offset is None else replace(i, raw_offset=keys.variables[n][1])
             for n, i in template.infos.items()}  # fmt: skip
    coords = {n: infos[n] for n in template.pieces}
    try:
        pieces = template.store.byte_pieces(path, coords) if coords else {}
    except (OSError, InputError):
        return None
    if len(pieces) != len(coords) or template.fixed:
        return None
    return infos, pieces


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


def _format(fd: int, path: Path) -> type[MemberStore] | None:
    """The format of the open file ``path`` (as :func:`open_member` decides), or None."""
    try:
        head = os.pread(fd, HEAD_BYTES, 0)
    except OSError:
        return None
    return backend_of(path, head)
