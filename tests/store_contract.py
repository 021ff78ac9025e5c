"""The member-store contract lives in the package, :mod:`ensio.testing.store_contract`.

It ships with ensio so that a format written outside ensio runs the same tests;
this module keeps the name the test modules of ``tests/`` import it by.
"""

from __future__ import annotations

from ensio.testing import (
    CASES,
    DIMS,
    NRECS,
    MemberStoreContract,
    make_member,
    nc_attrs,
    nc_vars,
    pytest_generate_tests,
    random_ranges,
)

__all__ = [
    "CASES",
    "DIMS",
    "NRECS",
    "MemberStoreContract",
    "make_member",
    "nc_attrs",
    "nc_vars",
    "pytest_generate_tests",
    "random_ranges",
]
