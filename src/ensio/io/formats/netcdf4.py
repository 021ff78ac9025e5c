"""netCDF-4/HDF5 member files.

Metadata comes from h5py (:mod:`ensio.io.formats.hdf5meta`, shared with plain
HDF5 files): netCDF-C's full metadata parse is paid only by stores that take
the library path. A file is netCDF-4 when it carries netCDF-C's marks
(``_NCProperties`` or dimension scales); others are plain HDF5
(:mod:`ensio.io.formats.hdf5`).

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

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import ClassVar

import h5py
import numpy as np

from ...layout.encoding import Encoding
from .hdf5headers import hdf5_header_keys
from .hdf5meta import (
    H5Dataset,
    conventions,
    hdf5_signature,
    netcdf4_marked,
    quantized,
    raw_offset,
    read_hdf5_metadata,
)
from .hdf5quick import hdf5_metadata_bytes, hdf5_root_header
from .library import LibraryBackedStore
from .store import HeaderKeys, MetadataBytes, MovableBytes, QuickLook, VarInfo

__all__ = ["NetCDF4Store", "quick_hdf5_variables"]


# --------------------------------------------------------------------------- quick check
#
# Many small members: the full scan (hdf5meta) walks every dataset of the file and
# all its attributes (~0.8 ms for a 4-variable file, more for real restarts),
# which for 2 MB members costs more than reading their data. A member written
# by the same program as an already fully checked one (the template) is
# accepted after opening only the datasets the ensemble uses and the
# dimension scales of their dimensions, and comparing with the template what
# the full scan's answer depends on: shape, extensibility, dtype, the set of
# attribute names (quantization, packing, CLASS/NAME), ``_Netcdf4Coordinates``
# and the scales' ``_Netcdf4Dimid``. Anything else falls back to the full scan.


def _signature(ds: H5Dataset) -> tuple[object, ...]:
    """What the full scan's description of ``ds`` (except offset and encoding) depends on."""
    coords = ds.ints(b"_Netcdf4Coordinates")
    dimid = ds.ints(b"_Netcdf4Dimid")
    return (ds.shape, ds.unlimited, ds.dtype.str, frozenset(ds.attrs),
            None if coords is None else tuple(coords), None if dimid is None else tuple(dimid),
            ds.is_scale, ds.is_pure_dim)  # fmt: skip


def _scale_path(dataset: Callable[[str], H5Dataset], group: str, dim: str) -> str:
    """The dataset of dimension ``dim`` seen from ``group``: there, else the nearest parent.

    netCDF's scoping: a variable uses a dimension of its own group or of an
    ancestor. Which one it is (its ``_Netcdf4Dimid``) is in the signature, so a
    member whose variable uses another is not accepted by the quick look.
    """
    parts = group.split("/") if group else []
    for k in range(len(parts), -1, -1):
        path = "/".join([*parts[:k], dim])
        try:
            dataset(path)
        except KeyError:
            continue
        return path
    raise KeyError(f"no dataset of dimension {dim!r} from group {group!r}")


def quick_hdf5_variables(
    path: Path, dims: dict[str, tuple[str, ...]], read: tuple[str, ...] = ()
) -> tuple[tuple[object, ...], dict[str, VarInfo], dict[str, np.ndarray]]:
    """Describe only the variables ``dims`` (path → dimension names) of ``path``.

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
        opened: dict[str, H5Dataset] = {}

        def dataset(name: str) -> H5Dataset:
            if name not in opened:
                opened[name] = H5Dataset(name, h5py.h5d.open(fid, name.encode()))
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
                raw_offset=None if quantized(ds) else raw_offset(ds.oid, ds.dtype),
                fill_value=None if fill is None or fill.size != 1 else fill[0].item(),
                encoding=Encoding.from_attributes(ds.dtype, conventions(ds)),
            )
        scales = {_scale_path(dataset, name.rpartition("/")[0], d)
                  for name, names in dims.items() for d in names}  # fmt: skip
        for scale in sorted(scales):
            sig.append((scale, _signature(dataset(scale))))
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
        """HDF5 with netCDF-C's marks in its first bytes (others: :meth:`HDF5Store.claimed_by`)."""
        return hdf5_signature(head) and netcdf4_marked(head)

    @classmethod
    def metadata_bytes(
        cls, fd: int, path: Path, infos: Mapping[str, VarInfo], compared: Collection[str] = ()
    ) -> MetadataBytes | None:
        """All but the data of contiguous datasets and stored chunks; root attribute values free.

        See :mod:`ensio.io.formats.hdf5quick`.
        """
        return hdf5_metadata_bytes(fd, path, infos, compared)

    @classmethod
    def movable_bytes(cls, fd: int, size: int) -> MovableBytes | None:
        """The root group's object header chunks (global attributes of another length move them).

        See :func:`ensio.io.formats.hdf5quick.hdf5_root_header`.
        """
        return hdf5_root_header(fd, size)

    @classmethod
    def header_keys(cls, fd: int, size: int, names: Collection[str]) -> HeaderKeys | None:
        """Every root dataset's object header but its place (members whose offsets moved).

        See :mod:`ensio.io.formats.hdf5headers`.
        """
        return hdf5_header_keys(fd, size, names)

    @classmethod
    def quick_look(
        cls, path: Path, dims: Mapping[str, tuple[str, ...]], read: Collection[str] = ()
    ) -> QuickLook | None:
        """:func:`quick_hdf5_variables`: variables in groups too (dimensions of a parent group
        found by netCDF's scoping, and checked by their ids in the signature)."""
        sig, infos, values = quick_hdf5_variables(path, dict(dims), tuple(read))
        return QuickLook(sig, infos, values)
