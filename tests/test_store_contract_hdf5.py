"""The member-store contract for plain HDF5 files (h5py-written): contiguous, default, gzip."""

from __future__ import annotations

from typing import ClassVar

from ensio.io.formats.hdf5 import HDF5Store
from ensio.io.formats.store import MemberStore
from ensio.testing import MemberStoreContract, pytest_generate_tests

__all__ = ["TestHDF5Store", "pytest_generate_tests"]


class TestHDF5Store(MemberStoreContract):
    store_class: ClassVar[type[MemberStore]] = HDF5Store
    kinds = ("h5-contiguous", "h5-default", "h5-zlib")
