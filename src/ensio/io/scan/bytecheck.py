"""The cheapest member check: the file's metadata bytes are the template's.

Why: for members of a few MB even a lean look through h5py (open the file,
the state and coordinate datasets, their dimension scales: ~0.3 ms) costs
more than reading the data. But a member written by the same program as a
fully checked member (the template) usually has *byte-identical metadata*:
the same superblock, object headers, data addresses and attributes; only the
data differ. If a member has the template's size and the same bytes there,
every parser reading it (HDF5, netCDF-C, ours) follows the same path through
the same bytes and finds the same variables at the same offsets: it is
accepted with the template's descriptions, after a few ``pread`` of some KB
and a ``memcmp``.

One exception, so that members that carry their number or a perturbation
amplitude as a *global* attribute (``ensio synth`` does, so do many
ensemble generators) still qualify: the values of the global attributes
may differ, as long as every other byte, including each attribute's name,
type and size, is the same. Global attributes are never used by the files
mode, and a value of fixed size changes no structure.

A second exception for global attributes of another *length* (a time stamp
in ``history``): they may make the format place some metadata elsewhere
(netCDF-4: the root group's object header chunks) while no variable moves.
A format that can say where that metadata is in each file answers
:meth:`~ensio.io.formats.store.MemberStore.movable_bytes`: those ranges, in
the template and in the member, are left out, and the key the format gives
(what of them is not a global attribute) must be equal. Every other
metadata byte is still compared, and a member's movable ranges may not
reach into the template's data ranges. It is asked only when the plain
comparison fails, and costs a parse of a few hundred bytes (~20 µs) instead
of opening the file through the library (~0.6 ms).

Which bytes are metadata, and where the global attribute values are, only
the format knows: its store answers through the optional hook
:meth:`~ensio.io.formats.store.MemberStore.metadata_bytes` (netCDF-4:
:mod:`ensio.io.formats.hdf5quick`; classic: the header). A format without
it gets no byte comparison. Anything else (a different size, any other
byte) is not an error: the caller then takes the next check
(:mod:`ensio.io.scan.quickcheck`, then the full one), whose messages name
the problem.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..formats.store import MemberStore, VarInfo

__all__ = ["ByteTemplate", "byte_template", "same_bytes"]


@dataclass(frozen=True)
class ByteTemplate:
    """The bytes a member must share with the template.

    Attributes
    ----------
    size : int
        File size (the HDF5 superblock records the end of file; classic
        record counts may come from it).
    ranges : tuple of (int, bytes)
        Offset and expected bytes of each compared range (the metadata minus
        the global attribute values).
    attributes : int
        Global attributes whose values may differ (0: every metadata byte
        must be equal).
    movable : type of MemberStore or None
        The format whose :meth:`~ensio.io.formats.store.MemberStore.movable_bytes`
        a member answers when ``ranges`` differ (None: nothing movable).
    key : object
        The template's movable key (what a member's must equal).
    loose : tuple of (int, bytes)
        ``ranges`` without the template's movable ranges: compared, outside
        the member's movable ranges, when ``ranges`` differ.
    data : tuple of (int, int)
        The template's data ranges, which a member's movable ranges may not
        overlap.
    """

    size: int
    ranges: tuple[tuple[int, bytes], ...]
    attributes: int = 0
    movable: type[MemberStore] | None = None
    key: object = None
    loose: tuple[tuple[int, bytes], ...] = ()
    data: tuple[tuple[int, int], ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(len(b) for _, b in self.ranges)


def same_bytes(path: Path, template: ByteTemplate, fd: int | None = None) -> bool:
    """Whether ``path`` has the template's size and bytes (False on any OS error).

    ``fd``: the file already open for reading (not closed here).
    """
    own = fd is None
    try:
        if fd is None:
            fd = os.open(path, os.O_RDONLY)
        if os.fstat(fd).st_size != template.size:
            return False
        if all(os.pread(fd, len(want), off) == want for off, want in template.ranges):
            return True
        if template.movable is None:
            return False
        moved = template.movable.movable_bytes(fd, template.size)
        if moved is None or moved.key != template.key or _overlap(moved.ranges, template.data):
            return False
        return _equal_outside(fd, template.loose, sorted(moved.ranges))
    except OSError:
        return False
    finally:
        if own and fd is not None:
            os.close(fd)


def byte_template(
    path: Path,
    store: type[MemberStore],
    infos: Mapping[str, VarInfo],
    compared: Collection[str] = (),
) -> ByteTemplate | None:
    """The byte template of a fully checked member, or None if its format has none.

    Parameters
    ----------
    path : Path
        The member.
    store : type of MemberStore
        Its format (whose :meth:`~ensio.io.formats.store.MemberStore.metadata_bytes`
        says where the metadata is).
    infos : mapping of str to VarInfo
        *All* its variables (the full check's), for their data ranges.
    compared : collection of str
        Variables whose data bytes are compared too (chunked coordinates
        whose values the template keeps).

    Raises
    ------
    OSError, InputError
        The file cannot be read, or its metadata is corrupt.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        meta = store.metadata_bytes(fd, path, infos, compared)
        if meta is None:
            return None
        size = os.fstat(fd).st_size
        keep = _subtract(meta.spans, sorted(meta.data + meta.free))
        ranges = tuple((lo, _pread(fd, lo, hi - lo)) for lo, hi in keep)
        moved = store.movable_bytes(fd, size)
        if moved is None or _overlap(moved.ranges, meta.data):
            return ByteTemplate(size, ranges, meta.attributes)
        holes = sorted(meta.data + meta.free + moved.ranges)
        loose = tuple((lo, _pread(fd, lo, hi - lo)) for lo, hi in _subtract(meta.spans, holes))
        return ByteTemplate(size, ranges, meta.attributes, store, moved.key, loose, meta.data)
    finally:
        os.close(fd)


def _equal_outside(
    fd: int, ranges: Sequence[tuple[int, bytes]], holes: Sequence[tuple[int, int]]
) -> bool:
    """Whether the file has the template's ``ranges`` except inside the (sorted) ``holes``."""
    for off, want in ranges:
        for lo, hi in _subtract(((off, off + len(want)),), holes):
            if os.pread(fd, hi - lo, lo) != want[lo - off : hi - off]:
                return False
    return True


def _overlap(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> bool:
    """Whether any range of ``a`` intersects one of ``b``."""
    return any(lo < h1 and h0 < hi for lo, hi in a for h0, h1 in b)


def _pread(fd: int, off: int, n: int) -> bytes:
    parts, done = [], 0
    while done < n:
        got = os.pread(fd, n - done, off + done)
        if not got:
            raise OSError(f"file ends at byte {off + done}")
        parts.append(got)
        done += len(got)
    return b"".join(parts)


def _subtract(
    spans: Sequence[tuple[int, int]], holes: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """``spans`` minus the (sorted) ``holes``, as sorted non-empty ranges."""
    out = []
    for lo, hi in spans:
        pos = lo
        for h0, h1 in holes:
            if h1 <= pos or h0 >= hi:
                continue
            if h0 > pos:
                out.append((pos, h0))
            pos = max(pos, h1)
        if pos < hi:
            out.append((pos, hi))
    return out
