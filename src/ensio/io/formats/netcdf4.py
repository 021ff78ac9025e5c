"""netCDF-4/HDF5 member files.

Metadata comes from h5py, not from the netCDF library: opening a file with
netCDF-C reads and indexes *all* of its metadata (every attribute, every
dimension scale of every group), while the ensemble I/O only needs, for each
variable, its dimensions, shape, dtype and — for contiguous, unfiltered,
allocated datasets — the byte offset returned by ``H5Dget_offset``. The h5py
handle is opened with ``locking=False`` (a concurrent library-path writer of
the same member must not make metadata reads fail) and closed before the
constructor returns, so no HDF5 handle stays open behind the raw path.

The library path (:class:`~ensio.io.formats.library.NetCDFLibrary`) uses the netCDF library
(netCDF4-python), opened lazily on first use, with auto mask/scale and
char-to-string conversion off. h5py would also do, and writing identical
values through either library was measured to leave netCDF-4 files
byte-identical (contiguous, chunked, chunked + zlib/shuffle). The netCDF
library is used because

* it applies the netCDF semantics of a variable when writing: netCDF
  quantization (``_QuantizeBitGroomNumberOfSignificantDigits`` etc.) is
  re-applied to values written through it (checked: writing e through a file
  opened ``r+`` stores 2.7177…), which h5py would bypass, and its compression
  plugins (zstd, bzip2, blosc) come with it;
* the same code then serves the record variables of classic files
  (:mod:`ensio.io.formats.classic`), so there is one library path to get right;
* its cost (netCDF-C's full metadata parse) is paid only by stores that
  actually take the library path.

Caveat for callers: rewriting a *compressed* variable with different values
changes the compressed chunk sizes, so HDF5 relocates chunks (usually to the
end of the file), rewrites the chunk index and the superblock, and never
reuses the old space. Such writes are not confined to the variable's bytes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import ClassVar

import h5py
import numpy as np

from ...errors import InputError
from ...layout.encoding import CONVENTION_ATTRIBUTES, Encoding
from .hdf5quick import hdf5_metadata_bytes
from .library import LibraryBackedStore, one_line
from .store import MetadataBytes, QuickLook, VarInfo

__all__ = ["HDF5_SIGNATURE", "NetCDF4Store", "quick_hdf5_variables", "read_hdf5_metadata"]

#: HDF5 superblock signature; it sits at 0 or, after a user block, at 512·2^k.
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_SIGNATURE_OFFSETS = (0, 512, 1024, 2048)
#: ``NAME`` of a dimension scale that is a netCDF dimension but not a variable.
_PURE_DIMENSION = b"This is a netCDF dimension but not a netCDF variable"
#: netCDF-C stores a non-coordinate variable named like a dimension under this prefix.
_NON_COORD_PREFIX = "_nc4_non_coord_"


# --------------------------------------------------------------------------- HDF5 metadata
#
# The scan uses h5py's low-level API: opening objects and reading attributes
# through the high-level wrappers costs ~0.1-0.2 ms each, which made a
# 200-variable file slower to scan than netCDF-C's own open. Dimensions come
# from ``_Netcdf4Coordinates`` (dimension ids) mapped through the scales'
# ``_Netcdf4Dimid``, which is what netCDF-C itself consults first; the
# ``DIMENSION_LIST`` references are followed only when that is missing (files
# from other HDF5 writers), by object identity, never by ``H5Rget_name``
# (which searches the file for a path, ~0.5 ms per reference).


def _dim_name(h5name: str) -> str:
    """netCDF name of a dimension-scale dataset or variable (from its HDF5 link name)."""
    return h5name.rsplit("/", 1)[-1].removeprefix(_NON_COORD_PREFIX)


def _read_attr(oid: h5py.h5o.ObjectID, name: bytes) -> np.ndarray | None:
    """A fixed-size attribute as a flat array, or ``None`` (variable-length, unreadable)."""
    try:
        attr = h5py.h5a.open(oid, name)
        if attr.dtype.kind == "O":
            return None
        buf = np.empty(attr.shape, dtype=attr.dtype)
        attr.read(buf)
    except (KeyError, OSError, TypeError, ValueError):
        return None
    return buf.reshape(-1)


def _read_ints(oid: h5py.h5o.ObjectID, name: bytes) -> list[int] | None:
    """An integer attribute (dimension ids), read as int64 without asking for its dtype."""
    try:
        attr = h5py.h5a.open(oid, name)
        buf = np.empty(attr.get_space().get_simple_extent_npoints(), dtype=np.int64)
        attr.read(buf, mtype=h5py.h5t.NATIVE_INT64)
    except (KeyError, OSError, TypeError, ValueError):
        return None
    return buf.tolist()


def _read_label(oid: h5py.h5o.ObjectID, name: bytes) -> bytes:
    """A scalar fixed-length string attribute (``CLASS``, ``NAME``); ``b""`` if not one."""
    try:
        attr = h5py.h5a.open(oid, name)
        ftype = attr.get_type()
        if not isinstance(ftype, h5py.h5t.TypeStringID) or ftype.is_variable_str():
            return b""
        buf = np.empty(attr.get_space().get_simple_extent_npoints(), dtype=f"S{ftype.get_size()}")
        attr.read(buf, mtype=ftype)
    except (KeyError, OSError, TypeError, ValueError):
        return b""
    return bytes(buf[0]) if buf.size else b""


class _Dataset:
    """What the scan needs of one HDF5 dataset (one low-level open, one attribute listing)."""

    def __init__(self, key: str, oid: h5py.h5d.DatasetID) -> None:
        self.key = key
        self.oid = oid
        names: list[bytes] = []
        h5py.h5a.iterate(oid, names.append)
        self.attrs = set(names)
        space = oid.get_space()
        self.shape = tuple(int(n) for n in space.get_simple_extent_dims())
        self.unlimited = tuple(m == h5py.h5s.UNLIMITED for m in space.get_simple_extent_dims(True))
        self.dtype = oid.dtype
        self.is_scale = b"CLASS" in self.attrs and _read_label(oid, b"CLASS") == b"DIMENSION_SCALE"
        self.is_pure_dim = (
            self.is_scale
            and b"NAME" in self.attrs
            and _read_label(oid, b"NAME").startswith(_PURE_DIMENSION)
        )

    def attr(self, name: bytes) -> np.ndarray | None:
        return _read_attr(self.oid, name) if name in self.attrs else None

    def ints(self, name: bytes) -> list[int] | None:
        return _read_ints(self.oid, name) if name in self.attrs else None


class _Group:
    """One HDF5 group during the metadata scan."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix  # "" for root, "sub/" for a subgroup
        self.datasets: list[_Dataset] = []
        self.children: list[_Group] = []
        #: (name, length, unlimited) of the group's dimensions, for phony matching.
        self.dims: list[tuple[str, int, bool]] = []


class _Scan:
    """Two passes over the file: collect datasets and dimensions, then resolve variables."""

    def __init__(self, f: h5py.File) -> None:
        self.f = f
        self.dimids: dict[int, str] = {}
        self.scales: dict[h5py.h5o.ObjectID, str] = {}
        self.root = _Group("")
        self._collect(f.id, self.root)
        self.next_dimid = len(self.dimids)

    def _collect(self, gid: h5py.h5g.GroupID, node: _Group) -> None:
        for raw in gid:
            key = raw.decode()
            oid = h5py.h5o.open(gid, raw)
            if isinstance(oid, h5py.h5g.GroupID):
                child = _Group(f"{node.prefix}{key}/")
                node.children.append(child)
                self._collect(oid, child)
            elif isinstance(oid, h5py.h5d.DatasetID):
                ds = _Dataset(key, oid)
                node.datasets.append(ds)
                if ds.is_scale and len(ds.shape) == 1:
                    name = _dim_name(key)
                    node.dims.append((name, ds.shape[0], ds.unlimited[0]))
                    self.scales[oid] = name
                    dimid = ds.ints(b"_Netcdf4Dimid")
                    if dimid is not None and len(dimid) == 1:
                        self.dimids[dimid[0]] = name

    def _dims(self, ds: _Dataset, node: _Group) -> tuple[str, ...]:
        ndim = len(ds.shape)
        if ndim == 0:
            return ()
        ids = ds.ints(b"_Netcdf4Coordinates")
        if ids is not None:
            if len(ids) == ndim and all(i in self.dimids for i in ids):
                return tuple(self.dimids[i] for i in ids)
        if b"DIMENSION_LIST" in ds.attrs:
            dimlist = h5py.Dataset(ds.oid).attrs["DIMENSION_LIST"]
            if len(dimlist) == ndim and all(len(refs) for refs in dimlist):
                found = [self.scales.get(h5py.h5r.dereference(r[0], self.f.id)) for r in dimlist]
                if all(name is not None for name in found):
                    return tuple(str(name) for name in found)
        if ndim == 1 and ds.is_scale:
            return (_dim_name(ds.key),)
        return self._phony(ds, node)

    def _phony(self, ds: _Dataset, node: _Group) -> tuple[str, ...]:
        """Reuse a group dimension of the same length, else invent ``phony_dim_<id>`` (netCDF-C)."""
        names: list[str] = []
        for length, unlimited in zip(ds.shape, ds.unlimited, strict=True):
            match = next(
                (
                    n
                    for n, ln, unl in node.dims
                    if (ln, unl) == (length, unlimited) and n not in names
                ),
                None,
            )
            if match is None:
                match = f"phony_dim_{self.next_dimid}"
                self.next_dimid += 1
                node.dims.append((match, length, unlimited))
            names.append(match)
        return tuple(names)

    def resolve(self, node: _Group) -> dict[str, VarInfo]:
        """Variables of ``node`` then its subgroups (subgroups resolved first, as netCDF-C)."""
        below = [self.resolve(child) for child in node.children]
        out: dict[str, VarInfo] = {}
        for ds in node.datasets:
            if ds.is_pure_dim:
                continue
            fill = ds.attr(b"_FillValue")
            name = node.prefix + _dim_name(ds.key)
            out[name] = VarInfo(
                name=name,
                dims=self._dims(ds, node),
                shape=ds.shape,
                dtype=ds.dtype,
                raw_offset=None if _quantized(ds) else _raw_offset(ds.oid, ds.dtype),
                fill_value=None if fill is None or fill.size != 1 else fill[0].item(),
                encoding=Encoding.from_attributes(ds.dtype, _conventions(ds)),
            )
        for table in below:
            out.update(table)
        return out


_CONVENTIONS = tuple((a, a.encode()) for a in CONVENTION_ATTRIBUTES)


def _conventions(ds: _Dataset) -> dict[str, np.ndarray]:
    """The packing and missing-data attributes of a dataset (only those present)."""
    out = {}
    for name, key in _CONVENTIONS:
        if key in ds.attrs:
            value = ds.attr(key)
            if value is not None:
                out[name] = value
    return out


#: netCDF-4 quantization attributes: the library quantizes on every write, so
#: such a variable must be written through the library even if contiguous.
_QUANTIZE_ATTRS = (
    b"_QuantizeBitGroomNumberOfSignificantDigits",
    b"_QuantizeGranularBitRoundNumberOfSignificantDigits",
    b"_QuantizeBitRoundNumberOfSignificantBits",
)


def _quantized(ds: _Dataset) -> bool:
    return any(ds.attr(a) is not None for a in _QUANTIZE_ATTRS)


def _raw_offset(oid: h5py.h5d.DatasetID, dtype: np.dtype) -> int | None:
    """``H5Dget_offset`` if the dataset is one contiguous, unfiltered, allocated range."""
    if dtype.kind == "O":  # variable-length data: the range holds heap pointers
        return None
    dcpl = oid.get_create_plist()
    if (
        dcpl.get_layout() != h5py.h5d.CONTIGUOUS
        or dcpl.get_nfilters() != 0
        or dcpl.get_external_count() != 0
    ):
        return None
    offset = oid.get_offset()  # includes any user block; None if not allocated
    return None if offset is None else int(offset)


def read_hdf5_metadata(path: Path) -> dict[str, VarInfo]:
    """All netCDF variables of a netCDF-4/HDF5 file (subgroup variables as ``"grp/var"``).

    Raises
    ------
    InputError
        Missing, unreadable or corrupt file (one line, naming the file).
    """
    try:
        f = h5py.File(path, "r", locking=False)
    except FileNotFoundError:
        raise InputError(f"{path}: member file not found") from None
    except OSError as exc:
        raise InputError(f"{path}: not a readable netCDF-4/HDF5 file ({one_line(exc)})") from None
    try:
        scan = _Scan(f)
        return scan.resolve(scan.root)
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise InputError(f"{path}: corrupt netCDF-4/HDF5 metadata ({one_line(exc)})") from None
    finally:
        f.close()


# --------------------------------------------------------------------------- quick check
#
# Many small members: the full scan above walks every dataset of the file and
# all its attributes (~0.8 ms for a 4-variable file, more for real restarts),
# which for 2 MB members costs more than reading their data. A member written
# by the same program as an already fully checked one (the template) is
# accepted after opening only the datasets the ensemble uses and the
# dimension scales of their dimensions, and comparing with the template what
# the full scan's answer depends on: shape, extensibility, dtype, the set of
# attribute names (quantization, packing, CLASS/NAME), ``_Netcdf4Coordinates``
# and the scales' ``_Netcdf4Dimid``. Anything else falls back to the full scan.


def _signature(ds: _Dataset) -> tuple[object, ...]:
    """What the full scan's description of ``ds`` (except offset and encoding) depends on."""
    coords = ds.ints(b"_Netcdf4Coordinates")
    dimid = ds.ints(b"_Netcdf4Dimid")
    return (ds.shape, ds.unlimited, ds.dtype.str, frozenset(ds.attrs),
            None if coords is None else tuple(coords), None if dimid is None else tuple(dimid),
            ds.is_scale, ds.is_pure_dim)  # fmt: skip


def quick_hdf5_variables(
    path: Path, dims: dict[str, tuple[str, ...]], read: tuple[str, ...] = ()
) -> tuple[tuple[object, ...], dict[str, VarInfo], dict[str, np.ndarray]]:
    """Describe only the root-group variables ``dims`` (name → dimension names) of ``path``.

    Returns the file's signature (equal for two files means the full scan
    gives both the same dimensions, shapes and dtypes for these variables),
    their descriptions, with the dimension names given (valid only when the
    signature equals that of a file whose full scan gave them), and the
    values of the variables ``read`` (through HDF5: chunked or compressed
    coordinates), as stored, native byte order.

    Raises
    ------
    KeyError, OSError, ValueError, TypeError, RuntimeError
        Whatever h5py raises for a missing dataset or an unreadable file: the
        caller then takes the full scan, which reports the problem by name.
    """
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_file_locking(False, True)
    fid = h5py.h5f.open(str(path).encode(), h5py.h5f.ACC_RDONLY, fapl)
    try:
        opened: dict[str, _Dataset] = {}

        def dataset(name: str) -> _Dataset:
            if name not in opened:
                opened[name] = _Dataset(name, h5py.h5d.open(fid, name.encode()))
            return opened[name]

        sig: list[object] = []
        infos: dict[str, VarInfo] = {}
        for name, names in dims.items():
            ds = dataset(name)
            sig.append((name, _signature(ds)))
            fill = ds.attr(b"_FillValue")
            infos[name] = VarInfo(
                name=name,
                dims=names,
                shape=ds.shape,
                dtype=ds.dtype,
                raw_offset=None if _quantized(ds) else _raw_offset(ds.oid, ds.dtype),
                fill_value=None if fill is None or fill.size != 1 else fill[0].item(),
                encoding=Encoding.from_attributes(ds.dtype, _conventions(ds)),
            )
        for dim in sorted({d for names in dims.values() for d in names}):
            sig.append((dim, _signature(dataset(dim))))
        values = {}
        for name in read:
            ds = dataset(name)
            values[name] = np.empty(ds.shape, dtype=ds.dtype.newbyteorder("="))
            ds.oid.read(h5py.h5s.ALL, h5py.h5s.ALL, values[name])
        return tuple(sig), infos, values
    finally:
        opened.clear()
        fid.close()


class NetCDF4Store(LibraryBackedStore):
    """A netCDF-4 (HDF5-based) member file.

    Parameters
    ----------
    path : Path
    writable : bool
        Library-path writes allowed (the raw path never needs it).
    """

    format_name: ClassVar[str] = "netcdf4"
    #: Contiguous, unfiltered, allocated datasets: ``H5Dget_offset``.
    raw_byte_ranges: ClassVar[bool] = True
    #: Chunked/compressed datasets: written through the netCDF library.
    library_writes: ClassVar[bool] = True

    def __init__(self, path: Path, writable: bool = False) -> None:
        super().__init__(path, writable)
        self._vars = read_hdf5_metadata(self.path)

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return any(head[o : o + 8] == HDF5_SIGNATURE for o in _SIGNATURE_OFFSETS)

    @classmethod
    def metadata_bytes(
        cls, fd: int, path: Path, infos: Mapping[str, VarInfo], compared: Collection[str] = ()
    ) -> MetadataBytes | None:
        """All but the data of contiguous datasets and stored chunks; root attribute values free.

        See :mod:`ensio.io.formats.hdf5quick`.
        """
        return hdf5_metadata_bytes(fd, path, infos, compared)

    @classmethod
    def quick_look(
        cls, path: Path, dims: Mapping[str, tuple[str, ...]], read: Collection[str] = ()
    ) -> QuickLook | None:
        """:func:`quick_hdf5_variables`; root-group variables only (None otherwise).

        A variable in a subgroup may use dimensions of its parents, which only
        the full scan resolves.
        """
        if any("/" in n for n in dims):
            return None
        sig, infos, values = quick_hdf5_variables(path, dict(dims), tuple(read))
        return QuickLook(sig, infos, values)
