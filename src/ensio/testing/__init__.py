"""Test support that ships with ensio, for code outside it: the member-store contract.

``from ensio.testing import MemberStoreContract, pytest_generate_tests`` in a
test module, a subclass that sets ``store_class`` and ``kinds``, and a new
member-file format runs the tests every format of ensio passes
(:mod:`ensio.testing.store_contract`). Only test code imports this package: it
imports pytest, which ensio itself does not need, and nothing in ``src/ensio``
imports it (``tests/test_store_contract_package.py``).
"""

from __future__ import annotations

from . import store_contract
from .store_contract import *  # noqa: F403 (the contract's names, listed once there)

__all__ = list(store_contract.__all__)
