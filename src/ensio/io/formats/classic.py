"""netCDF classic member files: CDF-1, CDF-2 (64-bit offset) and CDF-5 (64-bit data).

The header is parsed here, from just its own bytes (read 4 KiB at a time as
the parse proceeds), instead of through the netCDF library: it is the whole
metadata of the file, it says where every fixed-size variable starts
(``begin``), and the ensemble I/O opens every member once per I/O task.

Grammar (big-endian throughout; ``NON_NEG`` is 32-bit in CDF-1/2 and 64-bit
in CDF-5; ``OFFSET`` is 32-bit in CDF-1 and 64-bit in CDF-2/5)::

    header    = 'C' 'D' 'F' VERSION numrecs dim_list gatt_list var_list
    numrecs   = NON_NEG | STREAMING (all bits set)
    dim_list  = ABSENT | NC_DIMENSION(0x0A) nelems [name dim_length ...]
    att_list  = ABSENT | NC_ATTRIBUTE(0x0C) nelems [name nc_type nelems values ...]
    var_list  = ABSENT | NC_VARIABLE(0x0B) nelems [var ...]
    var       = name nelems [dimid ...] vatt_list nc_type vsize begin
    name      = nelems namestring-padded-to-4
    ABSENT    = ZERO(32-bit) ZERO(NON_NEG)

Tags and ``nc_type`` are 32-bit in every version; attribute values are padded
to 4 bytes. A dimension of length 0 is the record (unlimited) dimension.
Fixed-size variables are contiguous at ``begin``; record variables are
interleaved, so they get no raw offset: written through the netCDF library, read
as byte ranges record by record (:meth:`ClassicStore.read_elements`; and
:func:`record_layout`, for the shared CDF-5 files of ``ioserver/``): record ``r`` of ``v`` starts at
``begin_v + r * recsize``, where ``recsize`` is the sum of the record
variables' sizes per record, each padded to 4 bytes, except that a lone
record variable is not padded (the classic format specification; netCDF-C
``NC_begins``).
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar, NamedTuple

import numpy as np

from ...errors import InputError
from ...layout.encoding import CONVENTION_ATTRIBUTES, Encoding
from .library import LibraryBackedStore
from .raw import raw_read_records
from .store import MetadataBytes, QuickLook, VarInfo

__all__ = [
    "CLASSIC_DTYPES",
    "NUMRECS_OFFSET",
    "ClassicStore",
    "RecordLayout",
    "RecordVar",
    "read_classic_header",
    "record_layout",
]

_MAGIC = b"CDF"
_VERSIONS = (1, 2, 5)
_NC_DIMENSION, _NC_VARIABLE, _NC_ATTRIBUTE = 0x0A, 0x0B, 0x0C
_CHUNK = 4096
#: Byte offset of ``numrecs`` (right after the 4-byte magic) in every version.
NUMRECS_OFFSET = 4

#: nc_type code → on-disk dtype (codes 7-11 exist in CDF-5 only).
CLASSIC_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("i1"),  # NC_BYTE
    2: np.dtype("S1"),  # NC_CHAR
    3: np.dtype(">i2"),  # NC_SHORT
    4: np.dtype(">i4"),  # NC_INT
    5: np.dtype(">f4"),  # NC_FLOAT
    6: np.dtype(">f8"),  # NC_DOUBLE
    7: np.dtype("u1"),  # NC_UBYTE
    8: np.dtype(">u2"),  # NC_USHORT
    9: np.dtype(">u4"),  # NC_UINT
    10: np.dtype(">i8"),  # NC_INT64
    11: np.dtype(">u8"),  # NC_UINT64
}


class _Corrupt(Exception):
    """Internal: the header does not follow the grammar (message = detail)."""


def _pad4(n: int) -> int:
    return (n + 3) & ~3


class _Header:
    """Cursor over the header bytes, reading more of the file only when needed."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.buf = b""
        self.pos = 0
        self.version = 1

    def _need(self, n: int) -> None:
        end = self.pos + n
        if end <= len(self.buf):
            return
        if end > self.size:
            raise _Corrupt(f"truncated header: needs byte {end}, file has {self.size}")
        want = min(self.size, max(end, len(self.buf) + _CHUNK))
        parts = [self.buf]
        have = len(self.buf)
        while have < want:
            got = os.pread(self.fd, want - have, have)
            if not got:
                raise _Corrupt(f"truncated header: file ends at byte {have}")
            parts.append(got)
            have += len(got)
        self.buf = b"".join(parts)

    def take(self, n: int) -> bytes:
        self._need(n)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def non_neg(self) -> int:
        return self.u64() if self.version == 5 else self.u32()

    def offset(self) -> int:
        return self.u32() if self.version == 1 else self.u64()

    def count(self, min_entry: int, what: str) -> int:
        """An element count, bounded by what the rest of the file could hold."""
        n = self.non_neg()
        if n * min_entry > self.size - self.pos:
            raise _Corrupt(f"{what} count {n} too large for the file")
        return n

    def name(self) -> str:
        n = self.count(1, "name length")
        raw = self.take(_pad4(n))[:n]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Corrupt(f"name {raw[:40]!r} is not UTF-8") from None

    def list_tag(self, tag: int, what: str, min_entry: int) -> int:
        """Number of entries of a dim/att/var list (0 if ABSENT)."""
        got = self.u32()
        n = self.count(min_entry, what)
        if got == 0 and n == 0:
            return 0
        if got != tag:
            raise _Corrupt(f"bad {what} list tag 0x{got:08x}")
        return n

    def nc_type(self) -> np.dtype:
        code = self.u32()
        dtype = CLASSIC_DTYPES.get(code)
        if dtype is None or (code > 6 and self.version != 5):
            raise _Corrupt(f"bad nc_type {code}")
        return dtype

    def attribute_values(self) -> tuple[tuple[int, int], ...]:
        """An att_list, skipped: the byte range of each value (padded)."""
        out = []
        word = 8 if self.version == 5 else 4
        for _ in range(self.list_tag(_NC_ATTRIBUTE, "attribute", 2 * word + 8)):
            self.name()
            dtype = self.nc_type()
            n = self.count(dtype.itemsize, "attribute value")
            out.append((self.pos, self.pos + _pad4(n * dtype.itemsize)))
            self.take(_pad4(n * dtype.itemsize))
        return tuple(out)

    def attributes(self) -> dict[str, tuple[np.dtype, bytes]]:
        """An att_list: name → (dtype, raw value bytes)."""
        atts: dict[str, tuple[np.dtype, bytes]] = {}
        word = 8 if self.version == 5 else 4
        for _ in range(self.list_tag(_NC_ATTRIBUTE, "attribute", 2 * word + 8)):
            name = self.name()
            dtype = self.nc_type()
            n = self.count(dtype.itemsize, "attribute value")
            nbytes = n * dtype.itemsize
            atts[name] = (dtype, self.take(_pad4(nbytes))[:nbytes])
        return atts


def _fill_value(atts: dict[str, tuple[np.dtype, bytes]]) -> object | None:
    if "_FillValue" not in atts:
        return None
    att_dtype, raw = atts["_FillValue"]
    values = np.frombuffer(raw, dtype=att_dtype)
    return values[0].item() if values.size == 1 else None


def _encoding(dtype: np.dtype, atts: dict[str, tuple[np.dtype, bytes]]) -> Encoding:
    """Packing and missing-data conventions from the variable's attributes."""
    found = {
        name: np.frombuffer(atts[name][1], dtype=atts[name][0])
        for name in CONVENTION_ATTRIBUTES
        if name in atts and atts[name][0].kind in "iuf"
    }
    if "_Unsigned" in atts:  # a char attribute
        found["_Unsigned"] = atts["_Unsigned"][1].rstrip(b"\0").decode(errors="replace")
    return Encoding.from_attributes(dtype, found)


class _Parsed(NamedTuple):
    version: int
    variables: dict[str, VarInfo]
    record: list[tuple[str, int, int]]  # record variables: name, begin, bytes per record
    numrecs: int
    header_end: int = 0
    #: Byte ranges of the values of the global attributes.
    global_values: tuple[tuple[int, int], ...] = ()


def read_classic_header(fd: int, path: Path) -> tuple[int, dict[str, VarInfo]]:
    """The version (1, 2 or 5) and the variables of the classic header of ``fd``.

    Variables in header order; record variables have ``raw_offset=None`` and
    the current number of records as first extent. ``InputError`` (naming the
    file) if it is not a classic file or its header is corrupt or truncated.
    """
    parsed = _parse_header(fd, path)
    return parsed.version, parsed.variables


def _parse_header(fd: int, path: Path) -> _Parsed:
    """The header of ``fd`` (see :func:`read_classic_header`), with the record variables."""
    size = os.fstat(fd).st_size
    h = _Header(fd, size)
    try:
        magic = h.take(4)
        if magic[:3] != _MAGIC or magic[3] not in _VERSIONS:
            raise _Corrupt(f"bad magic {magic!r}")
        h.version = magic[3]
        numrecs = h.non_neg()
        streaming = numrecs == (1 << (64 if h.version == 5 else 32)) - 1
        word = 8 if h.version == 5 else 4

        dims: list[tuple[str, int]] = []
        for _ in range(h.list_tag(_NC_DIMENSION, "dimension", 2 * word + 4)):
            dims.append((h.name(), h.non_neg()))
        global_values = h.attribute_values()  # global attributes: only where they are

        variables: dict[str, VarInfo] = {}
        record: list[tuple[str, int, int]] = []  # name, begin, bytes per record
        for _ in range(h.list_tag(_NC_VARIABLE, "variable", 4 * word + 12)):
            name = h.name()
            ndims = h.count(word, "dimension id")
            dimids = [h.non_neg() for _ in range(ndims)]
            atts = h.attributes()
            dtype = h.nc_type()
            h.non_neg()  # vsize: recomputed (it saturates for huge variables)
            begin = h.offset()
            if any(i >= len(dims) for i in dimids):
                raise _Corrupt(f"variable {name!r} uses an undefined dimension id")
            lengths = [dims[i][1] for i in dimids]
            is_record = bool(dimids) and lengths[0] == 0
            if 0 in lengths[1:]:
                raise _Corrupt(f"variable {name!r}: the record dimension must come first")
            if is_record:
                record.append((name, begin, math.prod(lengths[1:]) * dtype.itemsize))
            variables[name] = VarInfo(
                name=name,
                dims=tuple(dims[i][0] for i in dimids),
                shape=tuple(lengths),
                dtype=dtype,
                raw_offset=None if is_record else begin,
                fill_value=_fill_value(atts),
                encoding=_encoding(dtype, atts),
            )
        header_end = h.pos
    except _Corrupt as exc:
        raise InputError(f"{path}: corrupt netCDF classic header ({exc})") from None
    for info in variables.values():
        if info.raw_offset is not None and info.raw_offset < header_end:
            raise InputError(
                f"{path}: corrupt netCDF classic header (variable {info.name!r} "
                f"begins at {info.raw_offset}, inside the {header_end}-byte header)"
            )
    if not record:
        numrecs = 0
    else:
        if streaming:
            numrecs = _streaming_numrecs(record, size)
        for name, _, _ in record:
            info = variables[name]
            variables[name] = replace(info, shape=(numrecs, *info.shape[1:]))
    return _Parsed(h.version, variables, record, numrecs, header_end, global_values)


def _recsize(record: list[tuple[str, int, int]]) -> int:
    """Bytes of one record: padded sizes, except a lone (non-empty) record variable.

    netCDF-C (``NC_begins``) drops the padding when the padded sum equals the
    last record variable's padded size, i.e. when it is the only one with data.
    """
    padded = sum(_pad4(nbytes) for _, _, nbytes in record)
    if record and padded == _pad4(record[-1][2]):
        return record[-1][2]
    return padded


def _streaming_numrecs(record: list[tuple[str, int, int]], size: int) -> int:
    """Records present in a file whose header says STREAMING (count from the size)."""
    recsize = _recsize(record)
    first = min(begin for _, begin, _ in record)
    return max(0, size - first) // recsize if recsize else 0


class RecordVar(NamedTuple):
    """Where a record variable lives in a classic file.

    Attributes
    ----------
    begin : int
        File offset of its record 0.
    vsize : int
        Bytes of one of its records as the header counts them (padded to 4).
    dtype : numpy.dtype
        On-disk dtype (big-endian).
    shape : tuple of int
        Shape of one record (the dimensions after the record dimension).
    """

    begin: int
    vsize: int
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class RecordLayout:
    """The record section of a classic file: what a byte-range writer of records needs.

    Attributes
    ----------
    version : int
        1, 2 or 5.
    numrecs : int
        Records the header announces (counted from the size if STREAMING).
    recsize : int
        Bytes between record ``r`` and ``r + 1`` of any record variable.
    vars : dict of str to RecordVar
        The record variables, in header order.
    dims : dict of str to tuple of str
        Their dimension names after the record dimension.
    """

    version: int
    numrecs: int
    recsize: int
    vars: dict[str, RecordVar]
    dims: dict[str, tuple[str, ...]]

    @property
    def numrecs_offset(self) -> int:
        """File offset of the ``numrecs`` field of the header."""
        return NUMRECS_OFFSET

    @property
    def numrecs_dtype(self) -> np.dtype:
        """On-disk type of ``numrecs`` (``NON_NEG``: 64-bit in CDF-5, else 32-bit)."""
        return np.dtype(">u8" if self.version == 5 else ">u4")

    def record_info(self, name: str, record: int) -> VarInfo:
        """Record ``record`` of variable ``name`` as a contiguous ``VarInfo``.

        Its ``raw_offset`` is set, so ``io.raw.raw_write``/``raw_read`` move
        flat element ranges of that record (shape ``RecordVar.shape``).
        """
        var = self.vars[name]
        if record < 0:
            raise ValueError(f"record {record} < 0 for variable {name!r}")
        return VarInfo(
            name=name,
            dims=self.dims[name],
            shape=var.shape,
            dtype=var.dtype,
            raw_offset=var.begin + record * self.recsize,
        )

    def data_end(self, numrecs: int) -> int:
        """File size that holds ``numrecs`` complete records (0 without record variables)."""
        if not self.vars or numrecs == 0:
            return 0
        first = min(v.begin for v in self.vars.values())
        return first + numrecs * self.recsize


def record_layout(path: str | os.PathLike[str]) -> RecordLayout:
    """The record layout of the classic file at ``path`` (parsed from its header).

    Raises
    ------
    InputError
        Not a classic file, or a corrupt header (names the file).
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise InputError(f"{path}: cannot read netCDF classic file ({exc.strerror})") from None
    try:
        parsed = _parse_header(fd, path)
    finally:
        os.close(fd)
    rec_vars, dims = {}, {}
    for name, begin, nbytes in parsed.record:
        info = parsed.variables[name]
        rec_vars[name] = RecordVar(begin, _pad4(nbytes), info.dtype, info.shape[1:])
        dims[name] = info.dims[1:]
    return RecordLayout(parsed.version, parsed.numrecs, _recsize(parsed.record), rec_vars, dims)


class ClassicStore(LibraryBackedStore):
    """A netCDF classic member file (CDF-1, CDF-2 or CDF-5).

    Parameters
    ----------
    path : Path
    writable : bool
        Library-path writes allowed (record variables; the raw path never needs it).
    """

    format_name: ClassVar[str] = "classic"
    #: Fixed-size variables: one byte range at their ``begin``.
    raw_byte_ranges: ClassVar[bool] = True
    #: Record variables (interleaved by record): written through the netCDF library.
    library_writes: ClassVar[bool] = True

    def __init__(self, path: Path, writable: bool = False) -> None:
        super().__init__(path, writable)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise InputError(f"{self.path}: member file not found") from None
        except OSError as exc:
            raise InputError(f"{self.path}: cannot read member file ({exc.strerror})") from None
        try:
            parsed = _parse_header(fd, self.path)
        finally:
            os.close(fd)
        self.version, self._vars = parsed.version, parsed.variables
        self._records = {n: (begin, _recsize(parsed.record)) for n, begin, _ in parsed.record}

    def read_elements(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Record variables as byte ranges, unless writable (the library holds its writes)."""
        if name not in self._records or self.writable:
            return super().read_elements(name, lo, hi)
        begin, recsize = self._records[name]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return raw_read_records(fd, self._vars[name], begin, recsize, lo, hi, path=self.path)
        finally:
            os.close(fd)

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return len(head) >= 4 and head[:3] == _MAGIC and head[3] in _VERSIONS

    @classmethod
    def metadata_bytes(
        cls, fd: int, path: Path, infos: Mapping[str, VarInfo], compared: Collection[str] = ()
    ) -> MetadataBytes | None:
        """The header (it says where everything is); the global attribute values free."""
        parsed = _parse_header(fd, path)  # InputError if corrupt
        free = parsed.global_values
        return MetadataBytes(((0, parsed.header_end),), free=free, attributes=len(free))

    @classmethod
    def byte_pieces(cls, path: Path, infos: Mapping[str, VarInfo]) -> dict[str, list[VarInfo]]:
        """Fixed-size variables: one range; record variables: one per record (none: left out)."""
        out = super().byte_pieces(path, infos)
        record = [n for n in infos if n not in out and infos[n].shape[0]]
        if record:
            rl = record_layout(path)
            for n in record:
                out[n] = [rl.record_info(n, r) for r in range(infos[n].shape[0])]
        return out

    @classmethod
    def quick_look(
        cls, path: Path, dims: Mapping[str, tuple[str, ...]], read: Collection[str] = ()
    ) -> QuickLook | None:
        """The header parse (the full one) without the sniff; ``read`` is left to byte ranges."""
        store = cls(path)  # InputError, KeyError: the full check names them
        infos = {n: store._vars[n] for n in dims}
        values = {n: store.read_elements(n, 0, infos[n].size).reshape(infos[n].shape)
                  for n in read if n in store._records}  # record variables: no second parse
        return QuickLook(tuple((n, i.dims, i.shape, i.dtype.str) for n, i in infos.items()),
                         infos, values)  # fmt: skip
