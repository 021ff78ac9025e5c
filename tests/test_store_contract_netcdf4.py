"""The member-store contract for netCDF-4/HDF5 files: contiguous, default and chunked + zlib."""

from __future__ import annotations

from typing import ClassVar

from ensio.io.formats.netcdf4 import NetCDF4Store
from ensio.io.formats.store import MemberStore
from ensio.testing import MemberStoreContract, pytest_generate_tests

__all__ = ["TestNetCDF4Store", "pytest_generate_tests"]


class TestNetCDF4Store(MemberStoreContract):
    store_class: ClassVar[type[MemberStore]] = NetCDF4Store
    kinds = ("nc4-contiguous", "nc4-default", "nc4-zlib")
