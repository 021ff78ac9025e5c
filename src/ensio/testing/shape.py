"""The dimensions of the contract's test members, one home for both member makers.

:mod:`ensio.testing.store_contract` (netCDF) and :mod:`ensio.testing.h5member`
(plain HDF5 by h5py) write the same variables; both take their sizes from here,
so neither imports the other at module level (no import cycle).
"""

from __future__ import annotations

__all__ = ["DIMS", "NRECS"]

#: Dimension name → length (None: the unlimited record dimension).
DIMS: dict[str, int | None] = {"time": None, "lev": 3, "lat": 5, "lon": 7, "nv": 2}
#: Records written along ``time``.
NRECS = 4
