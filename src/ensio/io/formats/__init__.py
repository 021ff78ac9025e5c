"""Member-file formats, the lowest room: it imports no other room of io.

``store`` is the ``MemberStore`` contract, one module per format (``netcdf4``,
with its HDF5 quick-check hooks in ``hdf5quick``; ``classic``; ``hdf5``, plain
HDF5 through h5py), ``hdf5meta`` the HDF5 metadata scan of both HDF5-based
formats (netCDF-C's names: group paths, phony dimensions), ``library`` the
netCDF-library element path, ``raw`` the byte-range path, ``open`` the opening
by content.

The names below are the room's surface for the rooms above it and for
``ioserver`` (whose shared CDF-5 files are written record by record as byte
ranges: it needs the record layout of a classic file, not the classic module's
parser). They load on first access (PEP 562), so importing one light module of
the room pulls no other in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazyexports import lazy_exports

if TYPE_CHECKING:
    from .classic import RecordLayout, record_layout
    from .open import BACKENDS, detect_backend, open_member
    from .raw import raw_read, raw_write
    from .store import MemberStore, MetadataBytes, QuickLook, VarInfo

__all__ = [
    "BACKENDS",
    "MemberStore",
    "MetadataBytes",
    "QuickLook",
    "RecordLayout",
    "VarInfo",
    "detect_backend",
    "open_member",
    "raw_read",
    "raw_write",
    "record_layout",
]

#: public name -> the module that defines it
_HOMES = {
    "BACKENDS": ".open",
    "detect_backend": ".open",
    "open_member": ".open",
    "MemberStore": ".store",
    "MetadataBytes": ".store",
    "QuickLook": ".store",
    "VarInfo": ".store",
    "raw_read": ".raw",
    "raw_write": ".raw",
    "RecordLayout": ".classic",
    "record_layout": ".classic",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
