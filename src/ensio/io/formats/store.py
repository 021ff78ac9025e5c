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
:class:`ensio.testing.MemberStoreContract`. The quick check of many small
members (:mod:`ensio.io.scan.quickcheck`) asks a format through optional
hooks (:meth:`MemberStore.metadata_bytes`, :meth:`MemberStore.movable_bytes`,
:meth:`MemberStore.header_keys`, :meth:`MemberStore.byte_pieces`,
:meth:`MemberStore.quick_look`) whose defaults say "not supported", so no
code outside a format's module branches on its name.

Element ranges are in flat C order of the variable as stored
(``[lo, hi)`` of ``np.ravel(var)``).
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from ...layout.encoding import Encoding

__all__ = ["HeaderKeys", "MemberStore", "MetadataBytes", "MovableBytes", "QuickLook", "VarInfo"]


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


@dataclass(frozen=True)
class MetadataBytes:
    """Where a member file's metadata is (:meth:`MemberStore.metadata_bytes`).

    Attributes
    ----------
    spans : tuple of (int, int)
        Byte ranges ``[lo, hi)`` that hold metadata (and maybe data).
    data : tuple of (int, int)
        Ranges inside ``spans`` that are data: not compared.
    free : tuple of (int, int)
        Ranges inside ``spans`` that are metadata a member may have
        different from the template: the values of global attributes
        (never used by the ensemble I/O; a value of the same size changes
        no structure).
    attributes : int
        Global attributes located (whose values are ``free``).
    """

    spans: tuple[tuple[int, int], ...]
    data: tuple[tuple[int, int], ...] = ()
    free: tuple[tuple[int, int], ...] = ()
    attributes: int = 0


@dataclass(frozen=True)
class MovableBytes:
    """Metadata a member may hold elsewhere than the template (:meth:`MemberStore.movable_bytes`).

    Attributes
    ----------
    ranges : tuple of (int, int)
        Where it lies in this file: left out of the byte comparison, in the
        template and in the member alike.
    key : object
        What of it must equal the template's (compared with ``==``): all of
        it but global attributes and its own placement.
    """

    ranges: tuple[tuple[int, int], ...]
    key: object


@dataclass(frozen=True)
class HeaderKeys:
    """What :meth:`MemberStore.header_keys` found in one file.

    Attributes
    ----------
    key : object
        What of the file's structure is not a variable's (compared with ``==``).
    names : tuple of str
        Every variable of the file (compared).
    variables : dict of str to (object, int or None)
        Per variable asked for: the key of everything its description
        depends on but its place, and its raw offset in this file (None:
        none, or not allocated).
    """

    key: object
    names: tuple[str, ...]
    variables: dict[str, tuple[object, int | None]]


@dataclass(frozen=True)
class QuickLook:
    """What :meth:`MemberStore.quick_look` found in one member.

    Attributes
    ----------
    signature : tuple
        What the full parse's description of the looked-at variables depends
        on, except offsets and packing: two files with equal signatures get
        the same dimensions, shapes and dtypes from it.
    infos : dict of str to VarInfo
        The looked-at variables (offsets and packing of this file).
    values : dict of str to ndarray
        Those of the variables asked to be read that the look read, as
        stored, native byte order; the caller reads the others as byte
        ranges (:meth:`MemberStore.byte_pieces`).
    """

    signature: tuple[object, ...]
    infos: dict[str, VarInfo]
    values: dict[str, np.ndarray]


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
    def with_metadata(cls, path: Path, writable: bool,
                      known: Mapping[str, VarInfo]) -> MemberStore:
        """Open ``path`` knowing variables a check of this very file found (``known``).

        ``known`` (name → :class:`VarInfo`, usually only the state variables) comes
        from the scan of the same file or of a byte copy of it. The default ignores it
        and opens as usual; a backend whose metadata parse is costly (plain HDF5: a
        walk over every object header in Python, ~10 ms per Veros restart, which an
        analysis would otherwise repeat for every open of every member) takes it
        and parses only when asked for a variable it does not hold.
        """
        return cls(path, writable)

    @classmethod
    @abc.abstractmethod
    def sniff(cls, head: bytes) -> bool:
        """True if a file starting with ``head`` (≥ 8 bytes; up to 4 KiB) is this format."""

    @classmethod
    def claimed_by(cls, path: Path) -> type[MemberStore]:
        """The backend that opens ``path``, a file whose first bytes this format's sniff accepted.

        This one, by default. A format whose first bytes another shares (plain HDF5
        and netCDF-4) may hand the file on after a look at its content
        (:func:`ensio.io.formats.open.backend_of`); the handed-to backend must
        accept the file as it is.
        """
        return cls

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

    # ------------------------------------------------ optional hooks of the quick check
    #
    # The scan re-validates many members against one fully checked member (the
    # template, :mod:`ensio.io.scan.quickcheck`) through these class methods. They
    # are optional: each default says "not supported" and the member then takes
    # the full check (open the store, :meth:`variables`). What is format-specific
    # stays in the format's module; the scan never asks for a format by name.

    @classmethod
    def metadata_bytes(
        cls, fd: int, path: Path, infos: Mapping[str, VarInfo], compared: Collection[str] = ()
    ) -> MetadataBytes | None:
        """Where the metadata of this fully checked file is, for the byte comparison.

        A member with the template's size and the template's bytes in
        ``spans`` minus ``data`` and ``free`` must describe the same variables
        at the same offsets to every parser.

        Parameters
        ----------
        fd : int
            The file, open for reading (not closed here).
        path : Path
            The same file (messages; libraries that open by name).
        infos : mapping of str to VarInfo
            *All* its variables (the full check's).
        compared : collection of str
            Variables whose data must be compared as bytes too (chunked
            coordinates: the template keeps their values).

        Returns
        -------
        MetadataBytes or None
            None: no byte comparison for this format or this file (default).

        Raises
        ------
        OSError, InputError
            The file cannot be read or its metadata is corrupt.
        """
        return None

    @classmethod
    def movable_bytes(cls, fd: int, size: int) -> MovableBytes | None:
        """Metadata of this file that may lie elsewhere in a member, for the byte comparison.

        Called on the template and on every member: a member is accepted
        by bytes when its key equals the template's and every byte of
        :meth:`metadata_bytes`'s spans outside both files' ``ranges`` (and
        outside ``data`` and ``free``) is the template's. Meant for metadata
        that only global attributes of another length move (netCDF-4: the
        root group's object header chunks); it must be cheap, since every
        member pays it.

        Parameters
        ----------
        fd : int
            The file, open for reading (not closed here).
        size : int
            Its size in bytes.

        Returns
        -------
        MovableBytes or None
            None: nothing movable (default), or this file not parsed; the
            member then needs every byte equal.

        Raises
        ------
        OSError
            The file cannot be read.
        """
        return None

    @classmethod
    def header_keys(cls, fd: int, size: int, names: Collection[str]) -> HeaderKeys | None:
        """Keys of the variables ``names`` (and of the file around them), wherever they lie.

        For members whose metadata moved (a global attribute of another
        length written before the variables shifts every offset): a member
        whose keys equal the template's has the template's descriptions of
        these variables, with its own raw offsets. Must be cheap (every such
        member pays it) and must give None rather than a key that leaves out
        something the full check's description depends on.

        Parameters
        ----------
        fd : int
            The file, open for reading (not closed here).
        size : int
            Its size in bytes.
        names : collection of str
            The variables whose descriptions the caller needs (state
            variables, coordinates and their dimensions' variables).

        Returns
        -------
        HeaderKeys or None
            None: not supported (default), or this file not parsed.

        Raises
        ------
        OSError
            The file cannot be read.
        """
        return None

    @classmethod
    def byte_pieces(cls, path: Path, infos: Mapping[str, VarInfo]) -> dict[str, list[VarInfo]]:
        """How to read each of ``infos`` as byte ranges: one ``VarInfo`` per range.

        Their contiguous parts, joined in order, are the variable in flat C
        order. Variables that cannot be read so are left out. Default: the
        variables with a ``raw_offset``, one range each (classic record
        variables: one range per record).
        """
        return {n: [i] for n, i in infos.items() if i.raw_offset is not None}

    @classmethod
    def quick_look(
        cls, path: Path, dims: Mapping[str, tuple[str, ...]], read: Collection[str] = ()
    ) -> QuickLook | None:
        """Describe only the variables ``dims`` (name → dimension names) of ``path``.

        Cheaper than a full parse; used when the byte comparison fails (e.g.
        a global attribute of another length). The descriptions carry the
        dimension names given, valid only when the signature equals that of
        a file whose full parse gave them; the caller compares. Values of
        the variables ``read`` (coordinates) are returned where the look
        reads them anyway (chunked ones through the library); the caller
        reads the others as byte ranges.

        Returns
        -------
        QuickLook or None
            None: no quick look for this format or these variables (default).

        Raises
        ------
        InputError, KeyError, OSError, ValueError, TypeError, RuntimeError
            A missing variable, an unreadable or corrupt file: the caller then
            takes the full check, which names the problem.
        """
        return None

    def __enter__(self) -> MemberStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
