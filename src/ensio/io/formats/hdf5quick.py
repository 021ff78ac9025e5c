"""The netCDF-4 format's quick-check hooks: where an HDF5 file's metadata bytes are.

Why a module of its own: the byte comparison of the quick check
(:mod:`ensio.io.scan.bytecheck`) must know which bytes of a fully checked
member are metadata and which of them may differ between members (global
attribute values). That knowledge is HDF5's, so it lives with the netCDF-4
format, behind :meth:`~ensio.io.formats.store.MemberStore.metadata_bytes`,
and the scan never asks which format a file is.

The metadata of a netCDF-4 file is everything but the raw data of its
contiguous datasets and the stored chunks of its chunked ones (their
addresses and sizes are in the chunk index, which is metadata). The values of
the root group's attributes may differ, as long as every other byte,
including each attribute's name, type and size, is the same. They are located
by a small parse of the superblock (version 2 or 3, what netCDF-C writes) and
of the root group's version-2 object header: the data of its attribute
messages and the checksum of each of its chunks (which covers them). Where the
parse does not apply (a user block, superblock version 0/1, attributes in
dense storage: the parse then finds fewer attributes than HDF5 counts) every
metadata byte must be equal.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import h5py

from .store import MetadataBytes, VarInfo

__all__ = ["MAX_CHUNKS", "chunk_ranges", "hdf5_metadata_bytes"]

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_UNDEFINED = 0xFFFFFFFFFFFFFFFF
_ATTRIBUTE_MESSAGE = 0x0C
_CONTINUATION_MESSAGE = 0x10

#: At most this many chunks are located for the byte comparison (beyond: it is not used).
MAX_CHUNKS = 100_000

#: What h5py raises for a file it cannot read.
_H5_ERRORS = (KeyError, OSError, ValueError, TypeError, RuntimeError)


def _open(path: Path) -> h5py.h5f.FileID:
    """The file, read-only, without HDF5 file locking (a library-path writer may hold it)."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_file_locking(False, True)
    return h5py.h5f.open(str(path).encode(), h5py.h5f.ACC_RDONLY, fapl)


def hdf5_metadata_bytes(
    fd: int, path: Path, infos: Mapping[str, VarInfo], compared: Collection[str] = ()
) -> MetadataBytes | None:
    """:meth:`~ensio.io.formats.store.MemberStore.metadata_bytes` of a netCDF-4 file.

    None if the chunks of its chunked variables cannot be located (too many).
    """
    chunked = [n for n, i in infos.items() if i.raw_offset is None and n not in compared]
    chunks = chunk_ranges(path, chunked)
    if chunks is None:
        return None
    size = os.fstat(fd).st_size
    data = [(i.raw_offset, i.raw_offset + i.nbytes) for i in infos.values()
            if i.raw_offset is not None and i.nbytes]  # fmt: skip
    counted = [0]
    free = _root_attributes(lambda off, n: os.pread(fd, n, off), size, counted)
    if free is None or counted[0] != _attribute_count(path):
        free, counted[0] = [], 0  # not parsed, or the parse missed some: all bytes equal
    return MetadataBytes(((0, size),), tuple(sorted(data + chunks)), tuple(free), counted[0])


def _attribute_count(path: Path) -> int | None:
    """Attributes of the root group as HDF5 counts them (None: unreadable)."""
    try:
        fid = _open(path)
        try:
            return int(h5py.h5a.get_num_attrs(h5py.h5g.open(fid, b"/")))
        finally:
            fid.close()
    except _H5_ERRORS:
        return None


def chunk_ranges(path: Path, names: Collection[str]) -> list[tuple[int, int]] | None:
    """The byte ranges ``(offset, end)`` of every stored chunk of the chunked datasets ``names``.

    None if there are more than :data:`MAX_CHUNKS` or HDF5 cannot say.
    """
    out: list[tuple[int, int]] = []
    try:
        fid = _open(path)
    except (OSError, ValueError):
        return None
    try:
        for name in names:
            oid = h5py.h5d.open(fid, name.encode())
            if oid.get_create_plist().get_layout() != h5py.h5d.CHUNKED:
                continue
            n = oid.get_num_chunks()
            if len(out) + n > MAX_CHUNKS:
                return None
            for i in range(n):
                info = oid.get_chunk_info(i)
                if info.byte_offset is not None and info.size:
                    out.append((int(info.byte_offset), int(info.byte_offset + info.size)))
    except _H5_ERRORS:
        return None
    finally:
        fid.close()
    return out


#: ``read(offset, n)``: up to ``n`` bytes of the file at ``offset``.
Reader = Callable[[int, int], bytes]


def _root_attributes(read: Reader, size: int, counted: list[int]) -> list[tuple[int, int]] | None:
    """Attribute message data and chunk checksums of the root group's object header.

    None unless the superblock (at 0: no user block) is version 2/3 with base
    address 0 and the root object header is a version-2 ``OHDR``.
    """
    sb = read(0, 48)
    if sb[:8] != _HDF5_SIGNATURE or len(sb) < 48 or sb[8] not in (2, 3):
        return None
    width = sb[9]
    if width not in (4, 8):
        return None
    code = "I" if width == 4 else "Q"
    base, _ext, _eof, root = struct.unpack_from("<" + code * 4, sb, 12)
    if base != 0 or root in (0, _UNDEFINED, 0xFFFFFFFF) or root + 16 > size:
        return None
    lengths = sb[10]
    if lengths not in (4, 8):
        return None
    return _ohdr_attributes(read, root, size, width, lengths, counted)


def _ohdr_attributes(
    read: Reader, at: int, size: int, offsets: int, lengths: int, counted: list[int]
) -> list[tuple[int, int]] | None:
    """The allowed ranges of a version-2 object header: every chunk's attributes and checksum.

    Chunk 0 follows the ``OHDR`` prefix; continuation messages (type 0x10:
    address, length) point to ``OCHK`` chunks, parsed the same way.
    ``counted[0]`` is set to the number of attribute messages.
    """
    blob = read(at, min(size - at, 1 << 16))
    if blob[:4] != b"OHDR" or len(blob) < 8 or blob[4] != 2:
        return None
    flags = blob[5]
    pos = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    nsize = 1 << (flags & 0x03)
    length = int.from_bytes(blob[pos : pos + nsize], "little")
    pos += nsize
    allowed: list[tuple[int, int]] = []
    counted[0] = 0
    chunks = [(at, blob, pos, pos + length)]
    while chunks:
        base, data, start, end = chunks.pop()
        found = _chunk_messages(data, start, end, 6 if flags & 0x04 else 4)
        if found is None:
            return None
        for kind, lo, hi in found:
            if kind == _ATTRIBUTE_MESSAGE:
                allowed.append((base + lo, base + hi))
                counted[0] += 1
            elif kind == _CONTINUATION_MESSAGE:
                where = int.from_bytes(data[lo : lo + offsets], "little")
                n = int.from_bytes(data[lo + offsets : lo + offsets + lengths], "little")
                if where + n > size or n < 8:
                    return None
                more = read(where, n)
                if more[:4] != b"OCHK":
                    return None
                chunks.append((where, more, 4, n - 4))
        allowed.append((base + end, base + end + 4))  # the checksum of the chunk
    return sorted(allowed)


def _chunk_messages(
    blob: bytes, pos: int, end: int, head: int
) -> list[tuple[int, int, int]] | None:
    """(type, data start, data end) of the messages of one chunk; None if they overrun it.

    ``head``: bytes of a message header (type, size, flags [, creation order]);
    a tail shorter than one is a gap.
    """
    if end + 4 > len(blob):
        return None
    out = []
    while pos + head <= end:
        kind = blob[pos]
        length = int.from_bytes(blob[pos + 1 : pos + 3], "little")
        pos += head
        if pos + length > end:
            return None
        out.append((kind, pos, pos + length))
        pos += length
    return out
