"""Open a member file with the backend its first bytes call for.

Formats are recognised by content, never by file name: ensemble members are
often called ``restart.0001`` or ``*.nc`` whatever their format, and a
netCDF-4 file renamed or produced by another tool must still take the fast
path. Each backend's :meth:`~ensio.io.formats.store.MemberStore.sniff` looks at the
first :data:`HEAD_BYTES` bytes (enough for an HDF5 signature after a user
block of up to 2 KiB); the backend that accepts them may then hand the file on
after a look at its content (:meth:`~ensio.io.formats.store.MemberStore.claimed_by`:
netCDF-4 and plain HDF5 share their first bytes, and netCDF-C's marks may sit
beyond them). :func:`backend_of` is the one decision, for opening and for the
quick check alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ...errors import InputError
from .classic import ClassicStore
from .hdf5 import HDF5Store
from .netcdf4 import NetCDF4Store
from .store import MemberStore, VarInfo

__all__ = ["BACKENDS", "HEAD_BYTES", "backend_of", "detect_backend", "open_member"]

#: Bytes read to recognise a format.
HEAD_BYTES = 4096

#: Backends by ``format_name``, tried in this order.
BACKENDS: dict[str, type[MemberStore]] = {
    NetCDF4Store.format_name: NetCDF4Store,
    ClassicStore.format_name: ClassicStore,
    HDF5Store.format_name: HDF5Store,
}


def detect_backend(head: bytes) -> type[MemberStore] | None:
    """The backend whose ``sniff`` accepts ``head``, or ``None``."""
    if len(head) < 4:
        return None
    for backend in BACKENDS.values():
        if backend.sniff(head):
            return backend
    return None


def backend_of(path: Path, head: bytes) -> type[MemberStore] | None:
    """The backend of the file ``path`` that starts with ``head``: sniffed, then claimed."""
    backend = detect_backend(head)
    return None if backend is None else backend.claimed_by(path)


def open_member(path: str | os.PathLike[str], writable: bool = False, *,
                known: Mapping[str, VarInfo] | None = None,
                backend: type[MemberStore] | None = None) -> MemberStore:
    """Open one member file for metadata and library-path I/O.

    Parameters
    ----------
    path : path-like
    writable : bool
        Allow library-path writes (``write_elements``).
    known : mapping, optional
        Variables (name → VarInfo) a scan of this very file, or of a byte copy of
        it, found: the backend may skip parsing its metadata again
        (:meth:`~ensio.io.formats.store.MemberStore.with_metadata`).
    backend : MemberStore class, optional
        The format that check found (with ``known`` only): not detected again
        (a plain HDF5 file is told from netCDF-4 by a walk over its datasets).

    Returns
    -------
    MemberStore
        A :class:`~ensio.io.formats.netcdf4.NetCDF4Store`,
        :class:`~ensio.io.formats.classic.ClassicStore` or
        :class:`~ensio.io.formats.hdf5.HDF5Store`; use it as a context manager.

    Raises
    ------
    InputError
        ``"<path>: member file not found"``, ``"<path>: not a netCDF file"``,
        or a corrupt-metadata message naming the file.
    """
    p = Path(path)
    if known is not None and backend is not None:
        return backend.with_metadata(p, writable, known)
    try:
        with open(p, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    except FileNotFoundError:
        raise InputError(f"{p}: member file not found") from None
    except IsADirectoryError:
        raise InputError(f"{p}: not a netCDF file (it is a directory)") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read member file ({exc.strerror or exc})") from None
    backend = backend_of(p, head)
    if backend is None:
        raise InputError(f"{p}: not a netCDF file")
    return backend(p, writable) if known is None else backend.with_metadata(p, writable, known)
