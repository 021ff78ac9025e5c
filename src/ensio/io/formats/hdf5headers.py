"""The netCDF-4 format's header keys: every root dataset's object header, wherever it lies.

Why: a model that writes its global attributes before its variables (netCDF-C
in define mode, ncgen, most Fortran models) gives each member a root-group
header of another length when a ``history`` or ``title`` differs in length;
every object after it, and every data offset, moves by as much. The byte
comparison (:mod:`ensio.io.scan.bytecheck`) then fails, and each member took
the HDF5 quick look (H5Fopen and per dataset a dozen attribute reads through
h5py, 0.6-0.9 ms). Here the same answer comes from a parse of a few hundred
bytes per dataset (:meth:`~ensio.io.formats.store.MemberStore.header_keys`).

For the root group (its link names, its messages but links and global
attributes) and for every dataset asked for (the variables a run reads, their
coordinates and their dimensions' scales), a **key** is built from its
object header: every message as (type, flags,
data), in a canonical order, without what only says *where* things are: the
continuation messages, the contiguous layout's address (returned as the raw
offset) and the object references of ``DIMENSION_LIST``/``REFERENCE_LIST``.
Two files whose keys are equal therefore hold the same datasets, named the
same, with the same shapes, types, fill values and attributes (values
included), so the full scan (:mod:`ensio.io.formats.hdf5meta`) describes
them alike but for their offsets. Its one answer that follows a reference,
a variable's dimensions from ``DIMENSION_LIST``, is excluded: a variable
asked for must take its dimensions from ``_Netcdf4Coordinates`` ids that
are each the ``_Netcdf4Dimid`` of one scale asked for, or be a
one-dimensional scale. Datasets not asked for are compared by name only,
as the HDF5 quick look does (it opens only the datasets it describes).

Anything this parse does not cover gives None and the caller takes the
next check: a superblock other than version 2/3, links in dense storage
(more than 8 in a netCDF-C group) or other than hard links, a link to a
group, a shared message, attributes in dense storage, chunked or external
storage, a header that is not version 2.
"""

from __future__ import annotations

import struct
from collections.abc import Collection

import numpy as np

from .hdf5quick import Chunk, header_chunks, superblock, windowed_reader
from .store import HeaderKeys

__all__ = ["hdf5_header_keys"]

_LINK_INFO, _LINK, _LAYOUT, _EXTERNAL = 0x02, 0x06, 0x08, 0x07
_DATASPACE, _ATTRIBUTE, _ATTRIBUTE_INFO = 0x01, 0x0C, 0x15
_NIL, _CONTINUATION = 0x00, 0x10
#: Message flag: the message is shared (stored elsewhere).
_SHARED = 0x02
#: Attributes whose data are object references (addresses): keyed without them.
_REFERENCES = (b"DIMENSION_LIST", b"REFERENCE_LIST")
_COORDINATES, _DIMID, _CLASS = b"_Netcdf4Coordinates", b"_Netcdf4Dimid", b"CLASS"
#: The first bytes read at once (netCDF-C writes all headers of a small file there).
_WINDOW = 65536


def hdf5_header_keys(fd: int, size: int, names: Collection[str]) -> HeaderKeys | None:
    """:meth:`~ensio.io.formats.store.MemberStore.header_keys` of a netCDF-4/HDF5 file.

    None where the parse does not apply, or the bytes are not what it expects.
    """
    try:
        return _header_keys(fd, size, names)
    except (IndexError, ValueError, struct.error):
        return None


def _header_keys(fd: int, size: int, names: Collection[str]) -> HeaderKeys | None:
    read = windowed_reader(fd, size, _WINDOW)
    sb = superblock(read, size)
    if sb is None:
        return None
    width, lengths, root = sb
    chunks = header_chunks(read, root, size, width, lengths)
    links = None if chunks is None else _links(chunks, width)
    if links is None:
        return None
    datasets = {}
    for name in names:
        at = links.get(name)
        parsed = None if at is None else header_chunks(read, at, size, width, lengths)
        found = None if parsed is None else _Dataset.parse(parsed, width, lengths)
        if found is None:
            return None
        datasets[name] = found
    scales = [d.ints(_DIMID) for d in datasets.values() if d.scale]
    dimids = [ids[0] for ids in scales if ids is not None and len(ids) == 1]
    if not all(d.own_dimensions(dimids) for d in datasets.values()):
        return None
    out = {n: (d.key, d.offset) for n, d in datasets.items()}
    return HeaderKeys(_root_key(chunks), tuple(sorted(links)), out)


def _root_key(chunks: list[Chunk]) -> tuple[object, ...]:
    """The root header's messages but links, attributes, continuations (and its prefix)."""
    skip = (_NIL, _CONTINUATION, _ATTRIBUTE, _LINK)
    kept = sorted((k, f, c.blob[lo:hi]) for c in chunks
                  for k, f, lo, hi in c.messages if k not in skip)  # fmt: skip
    return (_prefix(chunks[0]), tuple(kept))


def _prefix(chunk: Chunk) -> bytes:
    """Chunk 0's prefix (version, flags, times, attribute phase change) without its size."""
    return chunk.blob[: chunk.start - (1 << (chunk.blob[5] & 0x03))]


def _links(chunks: list[Chunk], width: int) -> dict[str, int] | None:
    """Name → object header address of the group's hard links (None: not all compact)."""
    undefined = (1 << (8 * width)) - 1
    out: dict[str, int] = {}
    for c in chunks:
        for kind, flags, lo, hi in c.messages:
            if flags & _SHARED:
                return None
            if kind == _LINK_INFO:
                pos = lo + 2 + (8 if c.blob[lo + 1] & 0x01 else 0)
                if int.from_bytes(c.blob[pos : pos + width], "little") != undefined:
                    return None  # dense link storage (a fractal heap)
            elif kind == _LINK:
                link = _link(c.blob[lo:hi], width)
                if link is None:
                    return None
                out[link[0]] = link[1]
    return out


def _link(data: bytes, width: int) -> tuple[str, int] | None:
    """(name, address) of a hard link message; None for any other link."""
    if len(data) < 3 or data[0] != 1:
        return None
    flags, pos = data[1], 2
    if flags & 0x08:
        if data[pos] != 0:
            return None  # soft or external
        pos += 1
    pos += (8 if flags & 0x04 else 0) + (1 if flags & 0x10 else 0)
    nsize = 1 << (flags & 0x03)
    n = int.from_bytes(data[pos : pos + nsize], "little")
    pos += nsize
    if pos + n + width > len(data):
        return None
    try:
        name = data[pos : pos + n].decode()
    except UnicodeDecodeError:
        return None
    return name, int.from_bytes(data[pos + n : pos + n + width], "little")


class _Dataset:
    """One dataset's key, raw offset and the few facts the dimension rule needs."""

    def __init__(self, key: tuple[object, ...], offset: int | None, rank: int,
                 attrs: dict[bytes, bytes]) -> None:  # fmt: skip
        self.key, self.offset, self.rank, self.attrs = key, offset, rank, attrs

    @property
    def scale(self) -> bool:
        label = self.attrs.get(_CLASS)
        return self.rank == 1 and label is not None and label.startswith(b"DIMENSION_SCALE")

    def ints(self, name: bytes) -> list[int] | None:
        """A 32-bit integer attribute (as netCDF-C writes its ids), or None."""
        raw = self.attrs.get(name)
        if raw is None or len(raw) % 4:
            return None
        return [int(v) for v in np.frombuffer(raw, dtype="<i4")]

    def own_dimensions(self, dimids: list[int]) -> bool:
        """Whether the full scan names its dimensions without following a reference."""
        if self.scale and _COORDINATES not in self.attrs:
            return _REFERENCES[0] not in self.attrs
        ids = self.ints(_COORDINATES)
        return (ids is not None and len(ids) == self.rank
                and all(dimids.count(i) == 1 for i in ids))  # fmt: skip

    @classmethod
    def parse(cls, chunks: list[Chunk], width: int, lengths: int) -> _Dataset | None:
        """The dataset of this object header; None where the parse does not apply.

        The key is each chunk's message bytes, in order, with the placement
        fields cut out (a member written by the same program has its
        messages at the same places of its chunks).
        """
        undefined = (1 << (8 * width)) - 1
        offset, rank, layout = None, -1, False
        attrs: dict[bytes, bytes] = {}
        key: list[bytes] = [_prefix(chunks[0])]
        for c in chunks:
            blob, cur = c.blob, c.start
            for kind, flags, lo, hi in c.messages:
                if flags & _SHARED or kind in (_EXTERNAL, _LINK_INFO):
                    return None  # shared, external storage, a group
                if kind == _ATTRIBUTE:
                    parsed = _attribute(blob, lo, hi)
                    if parsed is None:
                        return None
                    name, at = parsed
                    if name in _KEPT:
                        attrs[name] = blob[at:hi]
                        if name in _REFERENCES:  # object addresses: left out
                            key.append(blob[cur:at])
                            cur = hi
                elif kind == _CONTINUATION or kind == _NIL:  # where, and a gap's old bytes
                    key.append(blob[cur:lo])
                    cur = hi if kind == _NIL else lo + width
                elif kind == _LAYOUT:
                    if hi - lo < 2 or blob[lo] not in (3, 4) or blob[lo + 1] not in (0, 1):
                        return None  # chunked, virtual, an old version
                    layout = True
                    if blob[lo + 1] == 1:
                        at = int.from_bytes(blob[lo + 2 : lo + 2 + width], "little")
                        offset = None if at == undefined else at
                        key.append(blob[cur : lo + 2])
                        cur = lo + 2 + width
                elif kind == _DATASPACE:
                    rank = blob[lo + 1] if hi - lo > 1 else -1
                elif kind == _ATTRIBUTE_INFO:
                    pos = lo + 2 + (2 if blob[lo + 1] & 0x01 else 0)
                    if int.from_bytes(blob[pos : pos + width], "little") != undefined:
                        return None  # dense attribute storage
            key.append(blob[cur : c.end])
        if not layout or rank < 0:
            return None
        return cls(tuple(key), offset, rank, attrs)


#: The attributes whose values the dimension rule reads.
_KEPT = frozenset((*_REFERENCES, _COORDINATES, _DIMID, _CLASS))
_ATTRIBUTE_HEAD = struct.Struct("<BBHHH")


def _attribute(blob: bytes, lo: int, hi: int) -> tuple[bytes, int] | None:
    """(name, where its data start in ``blob``) of the attribute message at ``lo:hi``."""
    if hi - lo < 8:
        return None
    version, flags, nsize, tsize, ssize = _ATTRIBUTE_HEAD.unpack_from(blob, lo)
    if version == 1:
        pos = lo + 8
        start = pos + ((nsize + 7) & ~7) + ((tsize + 7) & ~7) + ((ssize + 7) & ~7)
    elif version in (2, 3):
        if flags & 0x03:
            return None  # a shared datatype or dataspace
        pos = lo + 8 + (version == 3)
        start = pos + nsize + tsize + ssize
    else:
        return None
    if start > hi or nsize < 1:
        return None
    return blob[pos : pos + nsize].rstrip(b"\0"), start
