"""The member-store contract for netCDF classic files: CDF-1, CDF-2 and CDF-5."""

from __future__ import annotations

from typing import ClassVar

from ensio.io.formats.classic import ClassicStore
from ensio.io.formats.store import MemberStore
from ensio.testing import MemberStoreContract, pytest_generate_tests

__all__ = ["TestClassicStore", "pytest_generate_tests"]


class TestClassicStore(MemberStoreContract):
    store_class: ClassVar[type[MemberStore]] = ClassicStore
    kinds = ("cdf1", "cdf2", "cdf5")
    always_big_endian = True  # the classic formats are big-endian by definition
