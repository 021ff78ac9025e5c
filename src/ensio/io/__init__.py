"""Ensemble I/O, a package of rooms that import one way, lowest first.

``formats`` (one ``MemberStore`` per file format) < ``scan`` (member metadata
and consistency) < ``txn`` (locks, journals, run record: crash safety) <
``tiles`` (tile geometry and tile files) < ``node`` (node-local copies and
backup) < ``modes`` (the ensemble-I/O object of each ``io.mode``) <
``products`` (copies, mean, spread, CF metadata). ``tests/test_import_rules.py``
keeps that order.

This module is the public surface. The heavy objects are loaded on first
access (PEP 562), so importing any ``ensio.io.<room>.<module>`` (the worker,
``ensio --version``) does not pull numpy, netCDF4 or mpi4py in through here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazyexports import lazy_exports

if TYPE_CHECKING:
    from .formats.open import open_member
    from .formats.store import MemberStore, VarInfo
    from .modes.ensemble import EnsembleIO, open_ensemble
    from .modes.stats import IOStats
    from .txn.commit import RunTransaction
    from .txn.transaction import Transaction

__all__ = [
    "EnsembleIO",
    "IOStats",
    "MemberStore",
    "RunTransaction",
    "Transaction",
    "VarInfo",
    "open_ensemble",
    "open_member",
]

#: public name -> the module that defines it
_HOMES = {
    "open_member": ".formats.open",
    "MemberStore": ".formats.store",
    "VarInfo": ".formats.store",
    "open_ensemble": ".modes.ensemble",
    "EnsembleIO": ".modes.ensemble",
    "IOStats": ".modes.stats",
    "RunTransaction": ".txn.commit",
    "Transaction": ".txn.transaction",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
