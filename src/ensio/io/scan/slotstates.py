"""The members' states at the time slots of a 4-D analysis, read row by row for H.

The parallel observation operator (:mod:`ensio.analysis.stoo`) asks the rank
holding a (member, slot) pair for the state rows its observations read; this
is the reader it is given (the analysis room never opens a member file).
The state of member ``m`` at slot ``s`` is the file ``ensemble.slots`` with
``{member}`` = m and ``{slot}`` = s + 1 (1-based, slot 1 the earliest), or,
for a single slot without that key, the member file itself (the 4-D analysis
then equals the 3-D one).

Each slot file is checked against the state layout (variables, shapes,
dtypes, coordinates: :func:`~ensio.io.scan.members.check_member`) before a value
is used, and its own packing and missing-value attributes decode it, so a
history file written with another ``scale_factor`` reads right.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...config.schema import ConfigError, EnsembleSection
from ...layout.state import StateLayout
from ..formats.open import open_member
from .members import check_member

__all__ = ["SlotStates"]


class SlotStates:
    """``reader(j, s, rows)`` of :data:`ensio.analysis.stoo.SlotReader` over the slot files.

    Parameters
    ----------
    ensemble : EnsembleSection
        ``slots`` (the pattern), ``members`` and the member numbers.
    base : Path
        Directory relative patterns are resolved against.
    layout : StateLayout
        The state the rows refer to (from the member files).
    n_slots : int
        ``analysis.n_slots``.
    """

    def __init__(self, ensemble: EnsembleSection, base: Path, layout: StateLayout,
                 n_slots: int) -> None:
        if ensemble.slots is None and n_slots > 1:
            raise ConfigError(f"ensemble.slots: required for {n_slots} time slots")
        if ensemble.slots is None and ensemble.tiled:
            raise ConfigError(
                "ensemble.slots: required with tiled members ({tile}): the states at the "
                "slot are read from whole-domain files"
            )
        self.ensemble = ensemble
        self.base = Path(base)
        self.layout = layout
        self.n_slots = n_slots

    def path(self, j: int, s: int) -> Path:
        """File of member column ``j`` (0-based) at slot ``s`` (0-based)."""
        member = self.ensemble.numbers[j]
        if self.ensemble.slots is None:
            return self.ensemble.member_path(member, self.base)
        return self.ensemble.slot_path(member, s + 1, self.base)

    def __call__(self, j: int, s: int, rows: np.ndarray) -> np.ndarray:
        """Physical values (NaN where missing) of the sorted state ``rows``."""
        path = self.path(j, s)
        meta = check_member(path, self.layout)
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty(rows.size)
        with open_member(path) as store:
            for v in self.layout.variables:
                a, b = np.searchsorted(rows, [v.offset, v.offset + v.size])
                if a == b:
                    continue
                lo, hi = int(rows[a]), int(rows[b - 1]) + 1
                buf = np.empty(hi - lo)
                info = meta.infos[v.name]
                for seg in self.layout.segments(lo, hi):
                    raw = store.read_elements(v.name, seg.elem_lo, seg.elem_hi)
                    part = raw if seg.select is None else raw[seg.select]
                    info.encoding.decode(part, buf[seg.row_lo - lo: seg.row_hi - lo])
                out[a:b] = buf[rows[a:b] - lo]
        return out
