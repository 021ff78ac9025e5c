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

Members whose global attributes differ in *length* (a time stamp in
``history``, a title per member) defeat that comparison: HDF5 then gives the
root group's object header other chunks (a longer message no longer fits, a
chunk is moved to a free gap, its continuation message points elsewhere), so
bytes move although no variable does. :func:`hdf5_root_header` is the hook
for them (:meth:`~ensio.io.formats.store.MemberStore.movable_bytes`): the
root group's header chunks, wherever each file has them, are left out of the
byte comparison, and what of them is not a global attribute (the chunk-0
prefix; the link, link-info, group-info and attribute-info messages: the
root's variables and where their headers are) must be equal as a key. Every
other byte (the superblock, every variable's header, the chunk indexes,
dense attribute storage) is still compared, so the variables are the
template's at the template's offsets.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import NamedTuple

import h5py

from .store import MetadataBytes, MovableBytes, VarInfo

__all__ = [
    "MAX_CHUNKS",
    "Chunk",
    "Reader",
    "chunk_ranges",
    "hdf5_metadata_bytes",
    "hdf5_root_header",
    "header_chunks",
    "superblock",
]

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_UNDEFINED = 0xFFFFFFFFFFFFFFFF
_NIL_MESSAGE = 0x00
_ATTRIBUTE_MESSAGE = 0x0C
_CONTINUATION_MESSAGE = 0x10
#: Messages that are not part of the root header's key (:func:`hdf5_root_header`).
_UNKEYED = (_NIL_MESSAGE, _ATTRIBUTE_MESSAGE, _CONTINUATION_MESSAGE)
#: First read of an object header chunk (a longer one is read again, whole).
_FIRST_READ = 1024
#: :func:`hdf5_root_header` reads the file's first bytes at once (netCDF-C puts the
#: root group's header chunks there); chunks beyond take a read each.
_WINDOW = 32768
#: A version-2 header message: type, size of its data, flags (then maybe a creation order).
_MESSAGE_HEAD = struct.Struct("<BHB")
#: At most this many chunks in the root group's object header (beyond: not parsed).
_MAX_HEADER_CHUNKS = 64

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


def windowed_reader(fd: int, size: int, window: int) -> Callable[[int, int], bytes]:
    """``read(offset, n)`` of ``fd``: the first ``window`` bytes read once, the rest by pread.

    A header parse reads many small pieces, nearly all near the start of the
    file; one read of the window answers them without a system call each.
    """
    head = os.pread(fd, min(size, window), 0)

    def read(off: int, n: int) -> bytes:
        return head[off : off + n] if off + n <= len(head) else os.pread(fd, n, off)

    return read


def hdf5_root_header(fd: int, size: int) -> MovableBytes | None:
    """:meth:`~ensio.io.formats.store.MemberStore.movable_bytes` of a netCDF-4/HDF5 file.

    The byte ranges of the root group's object header chunks, and their key:
    the chunk-0 prefix and every message that is not nil, a (global)
    attribute or a continuation, as (type, flags, data), in a canonical
    order. None where :func:`_root_chunks` does not parse the file.
    """
    read = windowed_reader(fd, size, _WINDOW)
    chunks = _root_chunks(read, size)
    if chunks is None:
        return None
    ranges, keyed = [], []
    for at, blob, _start, end, messages in chunks:
        ranges.append((at, at + end + 4))
        keyed += [(kind, flags, blob[lo:hi])
                  for kind, flags, lo, hi in messages if kind not in _UNKEYED]  # fmt: skip
    first = chunks[0]
    key = (first[1][: first[2]], tuple(sorted(keyed)))
    return MovableBytes(tuple(sorted(ranges)), key)


class Chunk(NamedTuple):
    """One chunk of a version-2 object header.

    ``at``: where it lies in the file (its signature; the chunk ends with
    the checksum after ``end``); ``blob``: its bytes from ``at``;
    ``start``/``end``: its messages' part of ``blob``; ``messages``: (type,
    flags, data start, data end) in ``blob``.
    """

    at: int
    blob: bytes
    start: int
    end: int
    messages: list[tuple[int, int, int, int]]


def _root_attributes(read: Reader, size: int, counted: list[int]) -> list[tuple[int, int]] | None:
    """Attribute message data and chunk checksums of the root group's object header.

    ``counted[0]`` is set to the number of attribute messages. None where
    :func:`_root_chunks` does not parse the file.
    """
    chunks = _root_chunks(read, size)
    if chunks is None:
        return None
    allowed = []
    counted[0] = 0
    for c in chunks:
        for kind, _flags, lo, hi in c.messages:
            if kind == _ATTRIBUTE_MESSAGE:
                allowed.append((c.at + lo, c.at + hi))
                counted[0] += 1
        allowed.append((c.at + c.end, c.at + c.end + 4))  # the checksum of the chunk
    return sorted(allowed)


def _root_chunks(read: Reader, size: int) -> list[Chunk] | None:
    """The chunks of the root group's object header, chunk 0 first.

    None unless the superblock (at 0: no user block) is version 2/3 with base
    address 0 and the root object header is a version-2 ``OHDR`` whose chunks
    lie in the file (:func:`superblock`, :func:`header_chunks`).
    """
    sb = superblock(read, size)
    return None if sb is None else header_chunks(read, sb[2], size, sb[0], sb[1])


def superblock(read: Reader, size: int) -> tuple[int, int, int] | None:
    """(size of offsets, size of lengths, root object header address) of a version-2/3 superblock.

    None for anything else: a user block, superblock version 0/1, a base
    address other than 0.
    """
    sb = read(0, 48)
    if len(sb) < 48 or sb[:8] != _HDF5_SIGNATURE or sb[8] not in (2, 3):
        return None
    width, lengths = sb[9], sb[10]
    if width not in (4, 8) or lengths not in (4, 8):
        return None
    code = "I" if width == 4 else "Q"
    base, _ext, _eof, root = struct.unpack_from("<" + code * 4, sb, 12)
    if base != 0 or root in (0, _UNDEFINED, 0xFFFFFFFF) or root + 16 > size:
        return None
    return width, lengths, root


def header_chunks(read: Reader, at: int, size: int, width: int, lengths: int) -> list[Chunk] | None:
    """The chunks of the version-2 object header at ``at``, chunk 0 first (None: not one).

    Chunk 0 follows the ``OHDR`` prefix; continuation messages (type 0x10:
    address, length) point to ``OCHK`` chunks, parsed the same way.
    """
    if at + 16 > size:
        return None
    blob = read(at, min(size - at, _FIRST_READ))
    if blob[:4] != b"OHDR" or len(blob) < 8 or blob[4] != 2:
        return None
    flags = blob[5]
    pos = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    nsize = 1 << (flags & 0x03)
    length = int.from_bytes(blob[pos : pos + nsize], "little")
    pos += nsize
    if at + pos + length + 4 > size:
        return None
    if pos + length + 4 > len(blob):
        blob = read(at, pos + length + 4)
    head = 6 if flags & 0x04 else 4
    pending = [(at, blob, pos, pos + length)]
    out: list[Chunk] = []
    unpack = _MESSAGE_HEAD.unpack_from
    while pending:  # one pass over each chunk's messages: it runs for every member
        where, data, pos, end = pending.pop(0)
        if end + 4 > len(data) or len(out) >= _MAX_HEADER_CHUNKS:
            return None
        start, found = pos, []
        while pos + head <= end:  # a tail shorter than a message header is a gap
            kind, n, mflags = unpack(data, pos)
            pos += head
            if pos + n > end:
                return None
            found.append((kind, mflags, pos, pos + n))
            if kind == _CONTINUATION_MESSAGE:
                to = int.from_bytes(data[pos : pos + width], "little")
                more = int.from_bytes(data[pos + width : pos + width + lengths], "little")
                if to + more > size or more < 8:
                    return None
                block = read(to, more)
                if block[:4] != b"OCHK":
                    return None
                pending.append((to, block, 4, more - 4))
            pos += n
        out.append(Chunk(where, data, start, end, found))
    return out
