"""The netCDF-library element path shared by every format (chunked, compressed, record variables).

The ensemble I/O speaks flat C-order element ranges; the netCDF library reads
and writes rectangular boxes. :func:`flat_boxes` translates one into the other
and :class:`NetCDFLibrary` drives netCDF4-python for one file, opened lazily
(its full metadata parse is paid only by stores that actually take this path);
:class:`LibraryBackedStore` is the part of a ``MemberStore`` that every netCDF
format shares (it lives here, not in store.py, so the contract imports nothing).
Why the netCDF library and not h5py: see :mod:`ensio.io.formats.netcdf4`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

import netCDF4
import numpy as np

from ...errors import InputError
from .store import MemberStore, VarInfo

__all__ = ["LibraryBackedStore", "NetCDFLibrary", "check_range", "flat_boxes", "one_line"]


def one_line(exc: BaseException) -> str:
    """An exception as one line of text (messages users see are one line)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def flat_boxes(shape: tuple[int, ...], lo: int, hi: int) -> Iterator[tuple[tuple[slice, ...], int]]:
    """Split the flat C-order range ``[lo, hi)`` into hyperslabs, in order.

    The netCDF library reads and writes rectangular boxes, the ensemble I/O
    speaks flat element ranges. A flat range of an ``n``-D array is a partial
    row at each level at the start, a block of full rows, and partial rows at
    the end: at most ``2n - 1`` boxes.

    Parameters
    ----------
    shape : tuple of int
    lo, hi : int
        ``0 <= lo <= hi <= prod(shape)``.

    Yields
    ------
    selection : tuple of slice
        One slice per dimension (empty tuple for a scalar).
    count : int
        Number of elements in the box; boxes are consecutive in flat order.
    """
    if lo >= hi:
        return
    if not shape:
        yield (), 1
        return
    if len(shape) == 1:
        yield (slice(lo, hi),), hi - lo
        return
    inner = shape[1:]
    row = math.prod(inner)
    i0, r0 = divmod(lo, row)
    i1, r1 = divmod(hi, row)
    if i0 == i1:
        for sel, count in flat_boxes(inner, r0, r1):
            yield (slice(i0, i0 + 1), *sel), count
        return
    if r0:
        for sel, count in flat_boxes(inner, r0, row):
            yield (slice(i0, i0 + 1), *sel), count
        i0 += 1
    if i1 > i0:
        yield (slice(i0, i1), *(slice(0, n) for n in inner)), (i1 - i0) * row
    if r1:
        for sel, count in flat_boxes(inner, 0, r1):
            yield (slice(i1, i1 + 1), *sel), count


def check_range(info: VarInfo, lo: int, hi: int) -> None:
    """Raise ``ValueError`` unless ``0 <= lo <= hi <= info.size``."""
    if not 0 <= lo <= hi <= info.size:
        raise ValueError(
            f"element range [{lo}, {hi}) outside variable {info.name!r} of size {info.size}"
        )


class NetCDFLibrary:
    """Element I/O through the netCDF library, for one file, opened on first use.

    Parameters
    ----------
    path : Path
    writable : bool
        Open ``r+`` (netCDF-4 files then hold an exclusive HDF5 file lock
        until :meth:`close`, so the caller keeps one writer per file).
    """

    def __init__(self, path: Path, writable: bool) -> None:
        self.path = path
        self.writable = writable
        self._ds: netCDF4.Dataset | None = None

    def _variable(self, name: str) -> netCDF4.Variable:
        if self._ds is None:
            try:
                ds = netCDF4.Dataset(self.path, "r+" if self.writable else "r")
            except OSError as exc:
                raise InputError(
                    f"{self.path}: the netCDF library cannot open the file ({one_line(exc)})"
                ) from None
            ds.set_auto_maskandscale(False)
            ds.set_auto_chartostring(False)
            self._ds = ds
        try:
            return self._ds[name]
        except (KeyError, IndexError):
            msg = f"{self.path}: the netCDF library finds no variable {name!r}"
            raise InputError(msg) from None

    def read(self, info: VarInfo, lo: int, hi: int) -> np.ndarray:
        """Flat elements ``[lo, hi)`` of ``info.name``, native byte order, as stored."""
        check_range(info, lo, hi)
        out = np.empty(hi - lo, dtype=info.dtype.newbyteorder("="))
        if hi == lo:
            return out
        var = self._variable(info.name)
        pos = 0
        for sel, count in flat_boxes(info.shape, lo, hi):
            out[pos : pos + count] = np.asarray(var[sel if sel else ...]).reshape(-1)
            pos += count
        return out

    def write(self, info: VarInfo, lo: int, values: np.ndarray) -> None:
        """Overwrite flat elements from ``lo`` with ``values`` (cast to the on-disk dtype).

        The cast is numpy's ``astype``, the same as the raw path's, so both
        paths store identical bytes for identical input.
        """
        if not self.writable:
            raise io.UnsupportedOperation(f"{self.path}: member store opened read-only")
        flat = np.asarray(values).reshape(-1)
        check_range(info, lo, lo + flat.size)
        if flat.size == 0:
            return
        data = flat.astype(info.dtype.newbyteorder("="), copy=False)
        var = self._variable(info.name)
        pos = 0
        for sel, count in flat_boxes(info.shape, lo, lo + flat.size):
            box = tuple(s.stop - s.start for s in sel)
            var[sel if sel else ...] = data[pos : pos + count].reshape(box)
            pos += count

    def close(self) -> None:
        """Close the dataset if it was opened (flushes writes)."""
        if self._ds is not None:
            ds, self._ds = self._ds, None
            ds.close()


class LibraryBackedStore(MemberStore):
    """Common part of the netCDF stores: a parsed variable table plus the library path.

    Subclasses parse their format's metadata into ``self._vars`` in
    ``__init__`` and implement :meth:`sniff`. Element I/O goes through
    :class:`NetCDFLibrary` (opened on first use).
    """

    raw_byte_ranges: ClassVar[bool] = True
    library_writes: ClassVar[bool] = True

    _vars: dict[str, VarInfo]

    def __init__(self, path: Path, writable: bool = False) -> None:
        super().__init__(path, writable)
        self._lib = NetCDFLibrary(self.path, writable)

    def variables(self) -> Mapping[str, VarInfo]:
        return MappingProxyType(self._vars)

    def _info(self, name: str) -> VarInfo:
        try:
            return self._vars[name]
        except KeyError:
            raise InputError(f"{self.path}: no variable {name!r}") from None

    def read_elements(self, name: str, lo: int, hi: int) -> np.ndarray:
        return self._lib.read(self._info(name), lo, hi)

    def write_elements(self, name: str, lo: int, values: np.ndarray) -> None:
        self._lib.write(self._info(name), lo, values)

    def close(self) -> None:
        self._lib.close()
