"""The member-store contract for netCDF classic files: CDF-1, CDF-2 and CDF-5."""

from __future__ import annotations

import os
from typing import ClassVar

import numpy as np
import pytest

from ensio.errors import InputError
from ensio.io.formats.classic import ClassicStore
from ensio.io.formats.library import NetCDFLibrary
from ensio.io.formats.open import open_member
from ensio.io.formats.store import MemberStore
from ensio.testing import (
    NRECS,
    MemberStoreContract,
    make_member,
    nc_vars,
    pytest_generate_tests,
    random_ranges,
)

__all__ = ["TestClassicStore", "pytest_generate_tests"]


class TestClassicStore(MemberStoreContract):
    store_class: ClassVar[type[MemberStore]] = ClassicStore
    kinds = ("cdf1", "cdf2", "cdf5")
    always_big_endian = True  # the classic formats are big-endian by definition


def test_record_variables_are_read_without_the_netcdf_library(tmp_path, rng, monkeypatch):
    """Reading a record variable (the full check reads the time coordinate) parses no metadata.

    Same values as the library's (the reference), for random element ranges
    across record boundaries; a cut file is named. A writable store still reads
    through the library, which holds its own unflushed writes.
    """
    kind = str(rng.choice(TestClassicStore.kinds))
    path = make_member(tmp_path / f"{kind}.nc", kind, rng)
    want = nc_vars(path)["rec"].reshape(-1)

    def no_library(*args: object) -> None:
        raise AssertionError("the netCDF library was opened")

    with monkeypatch.context() as mp:
        mp.setattr(NetCDFLibrary, "_variable", no_library)
        with open_member(path) as store:
            info = store.variables()["rec"]
            assert info.raw_offset is None and info.shape[0] == NRECS
            for lo, hi in random_ranges(rng, info.size):
                got = store.read_elements("rec", lo, hi)
                assert got.dtype.isnative and got.shape == (hi - lo,)
                np.testing.assert_array_equal(got, want[lo:hi])
            with pytest.raises(ValueError, match="outside"):
                store.read_elements("rec", 0, info.size + 1)
        with open_member(path, writable=True) as store, pytest.raises(AssertionError):
            store.read_elements("rec", 0, 1)
    os.truncate(path, path.stat().st_size - 8)  # the last record loses its end
    with open_member(path) as store, pytest.raises(InputError, match="truncated") as err:
        store.read_elements("rec", 0, store.variables()["rec"].size)
    assert str(path) in str(err.value)
