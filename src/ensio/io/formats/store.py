"""The member-file abstraction: one ``MemberStore`` subclass per file format.

A store answers two questions for the parallel ensemble I/O
(:mod:`ensio.io.modes.ensemble`):

* *Where are the bytes?* :meth:`MemberStore.variables` describes each variable;
  ``VarInfo.raw_offset`` is the absolute file offset of element 0 when the
  variable is stored contiguously and uncompressed (netCDF-4/HDF5 contiguous
  dataset offset, netCDF classic ``begin`` of a fixed-size variable). Such
  variables are then read and written as plain byte ranges with ``os.pread`` /
  ``os.pwrite`` by many tasks at once, without the netCDF library: this is what
  makes the fast path fast and what guarantees that nothing but the state bytes
  is ever touched.
* *How else can I get at them?* :meth:`read_elements` / :meth:`write_elements`
  go through the netCDF library for chunked, compressed or record variables.
  Library writes are done by one writer per file (the caller guarantees it).

What a format can do is declared once, as class attributes
(:attr:`MemberStore.raw_byte_ranges`, :attr:`MemberStore.library_writes`);
the ensemble I/O consults them, never the format's name. A new format is one
module with a ``MemberStore`` subclass, an entry in
:data:`ensio.io.formats.open.BACKENDS`, and a subclass of the contract test
``tests/store_contract.py``.

Element ranges are in flat C order of the variable as stored
(``[lo, hi)`` of ``np.ravel(var)``).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from ...layout.encoding import Encoding

__all__ = ["MemberStore", "VarInfo"]


@dataclass(frozen=True)
class VarInfo:
    """Description of one variable of a member file.

    Attributes
    ----------
    name : str
    dims : tuple of str
        Dimension names, in storage order.
    shape : tuple of int
    dtype : numpy.dtype
        On-disk dtype with its byte order (e.g. ``>f4`` for classic netCDF).
    raw_offset : int or None
        File offset of element 0 if the variable is one contiguous,
        uncompressed, allocated byte range; ``None`` means library path only.
    fill_value : object or None
        ``_FillValue`` attribute, if any (informational).
    encoding : Encoding
        Packing (``scale_factor``/``add_offset``) and missing-data conventions
        (``_FillValue``, ``missing_value``, ``valid_*``) of the variable in
        this file; by default those of its dtype without attributes.
    """

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    raw_offset: int | None
    fill_value: object | None = None
    encoding: Encoding = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.encoding is None:
            object.__setattr__(self, "encoding", Encoding.from_attributes(self.dtype, {}))

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


class MemberStore(abc.ABC):
    """One member file, opened for metadata and (library path) element I/O.

    Subclasses implement one file format each. Opening must be cheap (it
    happens once per member per I/O task): parse metadata only.

    Parameters
    ----------
    path : Path
        The file.
    writable : bool
        Open for library-path writes (``r+``); the raw path never needs it.
    """

    #: Short name used in messages and benchmarks, e.g. ``"netcdf4"``.
    format_name: ClassVar[str]
    #: Whether :meth:`variables` may report a ``raw_offset``: the format stores
    #: (some) variables as one plain byte range that many tasks may ``pread`` /
    #: ``pwrite`` at once, without the library. ``False``: every variable takes
    #: the library path, whatever ``raw_offset`` says.
    raw_byte_ranges: ClassVar[bool] = False
    #: Whether :meth:`write_elements` works (opened ``writable``): variables
    #: without a raw byte range can then be written through the library by one
    #: writer per file. ``False``: such variables are read-only, and writing an
    #: ensemble that holds one is an error before any byte is written.
    library_writes: ClassVar[bool] = False

    def __init__(self, path: Path, writable: bool = False) -> None:
        self.path = Path(path)
        self.writable = writable

    @classmethod
    @abc.abstractmethod
    def sniff(cls, head: bytes) -> bool:
        """True if a file starting with ``head`` (≥ 8 bytes; up to 4 KiB) is this format."""

    @abc.abstractmethod
    def variables(self) -> Mapping[str, VarInfo]:
        """All variables of the file, by name."""

    @abc.abstractmethod
    def read_elements(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Library path: flat elements ``[lo, hi)`` of ``name``, native byte order.

        Returns a 1-D array of the variable's dtype (native byte order).
        Fill values are returned as stored (no masking, no scale/offset).
        """

    @abc.abstractmethod
    def write_elements(self, name: str, lo: int, values: np.ndarray) -> None:
        """Library path: overwrite flat elements ``[lo, lo + len(values))`` of ``name``.

        ``values`` is converted to the on-disk dtype. Only allowed when opened
        ``writable``; the caller guarantees a single writer per file.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the file (flushes library-path writes)."""

    def __enter__(self) -> MemberStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
