"""``precision: 2``: CF packing of a variable in 16-bit integers (XIOS's ``prec="2"``).

CF packing stores ``packed = round((value - add_offset) / scale_factor)`` as
``short`` and readers unpack ``packed * scale_factor + add_offset``
(netCDF-C users, xarray, CDO and NCO all do). CF allows one ``scale_factor``
and ``add_offset`` per variable, so they cannot follow the data record by
record: they come from the config, once:

* ``scale_factor`` (and ``add_offset``, default 0) as given — XIOS's field
  attributes of the same names;
* or ``valid_min``/``valid_max``: the 65535 codes -32767..32767 span the range,
  ``scale_factor = (valid_max - valid_min) / 65534``, ``add_offset`` its midpoint
  (so the quantum is the range / 65534 and the unpacking error at most half of it).

``-32768`` is the ``_FillValue`` (missing values, and values outside the
packable range, which would otherwise wrap around silently).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import FieldDef

__all__ = ["Packing", "packing_of", "PACKED_FILL"]

#: The ``_FillValue`` of packed variables (the one code outside the data range).
PACKED_FILL = -32768
_TOP = 32767


@dataclass(frozen=True)
class Packing:
    """One variable's ``scale_factor`` and ``add_offset`` (float64, as CF asks of the
    unpacked type)."""

    scale_factor: float
    add_offset: float

    @property
    def fill(self) -> int:
        return PACKED_FILL

    @property
    def attrs(self) -> dict[str, Any]:
        return {"scale_factor": np.float64(self.scale_factor),
                "add_offset": np.float64(self.add_offset)}

    def pack(self, data: np.ndarray) -> np.ndarray:
        """float64 values (NaN = missing) → int16 codes; outside the range → fill."""
        q = np.round((np.asarray(data, dtype=np.float64) - self.add_offset) / self.scale_factor)
        bad = ~np.isfinite(q) | (np.abs(q) > _TOP)
        return np.where(bad, PACKED_FILL, np.where(bad, 0, q)).astype(np.int16)


def packing_of(fd: FieldDef) -> Packing:
    """The packing of a ``precision: 2`` field (checked when the config was loaded)."""
    if fd.scale_factor is not None:
        return Packing(float(fd.scale_factor), float(fd.add_offset or 0.0))
    lo, hi = float(fd.valid_min), float(fd.valid_max)
    return Packing((hi - lo) / (2 * _TOP), 0.5 * (lo + hi))
