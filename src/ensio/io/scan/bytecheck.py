"""The cheapest member check: the file's metadata bytes are the template's.

Why: for members of a few MB even a lean look through h5py (open the file,
the state and coordinate datasets, their dimension scales: ~0.3 ms) costs
more than reading the data. But a member written by the same program as a
fully checked member (the template) usually has *byte-identical metadata*:
the same superblock, object headers, data addresses and attributes; only the
data differ. The metadata bytes are everything outside the raw data ranges of
the template's contiguous variables. If a member has the template's size and
the same bytes there, every parser reading it (HDF5, netCDF-C, ours) follows
the same path through the same bytes and finds the same variables at the
same offsets: it is accepted with the template's descriptions, after a few
``pread`` of some KB and a ``memcmp``.

One exception, so that members that carry their number or a perturbation
amplitude as a *global* attribute (``ensio synth`` does, so do many
ensemble generators) still qualify: the values of the global attributes
may differ, as long as every other byte, including each attribute's name,
type and size, is the same. Global attributes are never used by the files
mode, and a value of fixed size changes no structure. They are located by a
small parse, checked against the template's own parse:

* netCDF-4: superblock version 2 or 3 (what netCDF-C writes), root group
  object header version 2: the data of its attribute messages and the
  checksum of each of its chunks (which covers them);
* classic: the values of the header's global attribute list.

Where the parse does not apply (a user block, superblock version 0/1,
global attributes in dense storage) every metadata byte must be equal.
Anything else (a different size, any other byte) is not an error: the
caller then takes the next check (:mod:`ensio.io.scan.quickcheck`, then the full
one), whose messages name the problem.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..formats.classic import classic_metadata
from ..formats.store import VarInfo

__all__ = ["ByteTemplate", "byte_template", "same_bytes"]

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_UNDEFINED = 0xFFFFFFFFFFFFFFFF
_ATTRIBUTE_MESSAGE = 0x0C
_CONTINUATION_MESSAGE = 0x10


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
    """

    size: int
    ranges: tuple[tuple[int, bytes], ...]
    attributes: int = 0  #: global attributes located (netCDF-4; checked against HDF5)

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
        return all(os.pread(fd, len(want), off) == want for off, want in template.ranges)
    except OSError:
        return False
    finally:
        if own and fd is not None:
            os.close(fd)


def byte_template(
    path: Path,
    infos: Iterable[VarInfo],
    format_name: str,
    chunks: Sequence[tuple[int, int]] = (),
    exact: bool = False,
) -> ByteTemplate | None:
    """The byte template of a fully checked member, or None if it does not apply.

    Parameters
    ----------
    path : Path
        The member.
    infos : iterable of VarInfo
        *All* its variables (the full check's), for their raw data ranges.
    chunks : sequence of (int, int)
        netCDF-4: further data ranges not compared, the chunks of chunked
        variables (:func:`~ensio.io.formats.netcdf4.chunk_ranges`); their addresses
        and sizes are in the chunk index, which is compared.
    exact : bool
        netCDF-4: global attribute values must be equal too (no parse of the
        root group; what is left when the parse does not apply, e.g. dense
        attribute storage).
    format_name : str
        ``"netcdf4"`` or ``"classic"`` (others: None).

    Raises
    ------
    OSError, InputError
        The file cannot be read, or its classic header is corrupt.
    """
    fd = os.open(path, os.O_RDONLY)
    counted = [0]  # global attributes found (netCDF-4)
    try:
        size = os.fstat(fd).st_size
        if format_name == "netcdf4":
            # metadata: everything but the raw data of contiguous variables
            data = sorted([(i.raw_offset, i.raw_offset + i.nbytes) for i in infos
                           if i.raw_offset is not None and i.nbytes] + list(chunks))  # fmt: skip
            spans = _subtract([(0, size)], data)
            allowed = [] if exact else _hdf5_allowed(lambda off, n: os.pread(fd, n, off), size,
                                                     counted)  # fmt: skip
            if allowed is None:  # not parsed: every metadata byte must be equal
                allowed = []
        elif format_name == "classic":
            # metadata: the header (it says where everything is)
            meta = classic_metadata(fd, path)
            spans, allowed = [(0, meta.header_end)], list(meta.global_values)
        else:
            return None
        if allowed is None:
            return None
        keep = _subtract(spans, sorted(allowed))
        ranges = tuple((lo, _pread(fd, lo, hi - lo)) for lo, hi in keep)
        return ByteTemplate(size, ranges, counted[0])
    finally:
        os.close(fd)


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


# --------------------------------------------------------------------------- netCDF-4


#: ``read(offset, n)``: up to ``n`` bytes of the file at ``offset``.
Reader = Callable[[int, int], bytes]


def _hdf5_allowed(read: Reader, size: int, counted: list[int]) -> list[tuple[int, int]] | None:
    """Attribute message data and chunk-0 checksum of the root group's object header.

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
