"""What an HDF5 file holds, as netCDF-C would show it: shared by the netCDF-4 and plain HDF5 stores.

Why a module of its own: a netCDF-4 file and a plain HDF5 file (what h5py
writes: Veros restarts) are read the same way, and a user must see the same
variable and dimension names in ensio's messages as in ``ncdump``. So the
scan follows netCDF-C's rules for both: variables in groups are named by
their path (``core/temp``); dimensions come from ``_Netcdf4Coordinates``,
else the attached dimension scales, else ``phony_dim_<N>`` invented per group
for each distinct length, numbered over the whole file with the subgroups'
variables first (netCDF-C's ``nc4_rec_match_dimscales``; checked against
``ncdump -h`` of a Veros restart and of nested groups). It also says which of
the two formats a file is (:func:`netcdf4_marked`, :func:`netcdf4_content`).

Metadata comes from h5py, not from the netCDF library: opening a file with
netCDF-C reads and indexes *all* of its metadata (every attribute, every
dimension scale of every group), while the ensemble I/O only needs, for each
variable, its dimensions, shape, dtype and — for contiguous, unfiltered,
allocated datasets — the byte offset returned by ``H5Dget_offset``. The h5py
handle is opened with ``locking=False`` (a concurrent library-path writer of
the same member must not make metadata reads fail) and closed before the
function returns, so no HDF5 handle stays open behind the raw path.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from ...errors import InputError
from ...layout.encoding import CONVENTION_ATTRIBUTES, Encoding
from .library import one_line
from .store import VarInfo

__all__ = [
    "HDF5_SIGNATURE",
    "NETCDF4_MARKERS",
    "H5Dataset",
    "conventions",
    "hdf5_signature",
    "netcdf4_content",
    "netcdf4_marked",
    "quantized",
    "raw_offset",
    "read_hdf5_metadata",
]

#: HDF5 superblock signature; it sits at 0 or, after a user block, at 512·2^k.
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_SIGNATURE_OFFSETS = (0, 512, 1024, 2048)
#: Attribute names (stored as plain bytes in object headers) that only netCDF-4
#: writers put into an HDF5 file: the provenance attribute of the root group
#: (netCDF-C >= 4.4.1, h5netcdf), the dimension bookkeeping of netCDF-C and the
#: dimension scales (netCDF's dimensions).
NETCDF4_MARKERS = (b"_NCProperties", b"_Netcdf4Dimid", b"_Netcdf4Coordinates",
                   b"DIMENSION_SCALE", b"DIMENSION_LIST", b"_nc3_strict")  # fmt: skip
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


class H5Dataset:
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
        self.datasets: list[H5Dataset] = []
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
                ds = H5Dataset(key, oid)
                node.datasets.append(ds)
                if ds.is_scale and len(ds.shape) == 1:
                    name = _dim_name(key)
                    node.dims.append((name, ds.shape[0], ds.unlimited[0]))
                    self.scales[oid] = name
                    dimid = ds.ints(b"_Netcdf4Dimid")
                    if dimid is not None and len(dimid) == 1:
                        self.dimids[dimid[0]] = name

    def _dims(self, ds: H5Dataset, node: _Group) -> tuple[str, ...]:
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

    def _phony(self, ds: H5Dataset, node: _Group) -> tuple[str, ...]:
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
                raw_offset=None if quantized(ds) else raw_offset(ds.oid, ds.dtype),
                fill_value=None if fill is None or fill.size != 1 else fill[0].item(),
                encoding=Encoding.from_attributes(ds.dtype, conventions(ds)),
            )
        for table in below:
            out.update(table)
        return out


_CONVENTIONS = tuple((a, a.encode()) for a in CONVENTION_ATTRIBUTES)


def conventions(ds: H5Dataset) -> dict[str, np.ndarray]:
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


def quantized(ds: H5Dataset) -> bool:
    return any(ds.attr(a) is not None for a in _QUANTIZE_ATTRS)


def raw_offset(oid: h5py.h5d.DatasetID, dtype: np.dtype) -> int | None:
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


# --------------------------------------------------------------------------- which format
#
# A netCDF-4 file and a plain HDF5 file start with the same signature. The
# netCDF-4 store (netCDF library path, netCDF quick checks) takes a file with
# netCDF-C's marks: ``_NCProperties`` or dimension scales; the plain HDF5 store
# (h5py library path) the others. The marks usually sit in the first bytes (the
# root group's object header follows the superblock), which the sniff sees; a
# long ``history`` or many global attributes push them further, so a file whose
# first bytes show none is then looked at by content (:func:`netcdf4_content`).


def hdf5_signature(head: bytes) -> bool:
    """An HDF5 superblock signature at 0 or after a user block of 512, 1024 or 2048 bytes."""
    return any(head[o : o + 8] == HDF5_SIGNATURE for o in _SIGNATURE_OFFSETS)


def netcdf4_marked(head: bytes) -> bool:
    """One of :data:`NETCDF4_MARKERS` is among the first bytes ``head`` of an HDF5 file."""
    return any(marker in head for marker in NETCDF4_MARKERS)


def netcdf4_content(path: Path) -> bool:
    """The HDF5 file has a root ``_NCProperties`` or any dimension scale (netCDF-4).

    One open, one attribute lookup, then (files without ``_NCProperties``) a walk
    over the datasets asking each for ``CLASS`` / ``DIMENSION_LIST``; about 2 ms for
    a Veros restart of 100 datasets. An unreadable file is "not netCDF-4": the plain
    store's scan then names the problem.
    """
    try:
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        fapl.set_file_locking(False, True)
        fid = h5py.h5f.open(str(path).encode(), h5py.h5f.ACC_RDONLY, fapl)
    except (OSError, ValueError):
        return False
    try:
        if h5py.h5a.exists(h5py.h5g.open(fid, b"/"), b"_NCProperties"):
            return True

        def scale(name: bytes, info: h5py.h5o.ObjInfo) -> int | None:
            if info.type != h5py.h5o.TYPE_DATASET:
                return None
            oid = h5py.h5o.open(fid, name)
            return 1 if h5py.h5a.exists(oid, b"DIMENSION_LIST") or (
                h5py.h5a.exists(oid, b"CLASS") and _read_label(oid, b"CLASS") == b"DIMENSION_SCALE"
            ) else None  # fmt: skip

        return bool(h5py.h5o.visit(fid, scale, info=True))
    except (KeyError, OSError, RuntimeError, TypeError, ValueError):
        return False
    finally:
        fid.close()
