"""A rank's rows of the ensemble matrix when they are not one contiguous block.

The group shuffle (``io.mode: shuffle``) gives each rank a piece of one tile:
rows spread over the state vector. :class:`RowSetBlock` is an
:class:`~ensio.layout.block.EnsembleBlock` whose columns are the rows of a
:class:`~ensio.parallel.rowsets.RowSets` plan (``plan.rows``, increasing).
The analysis asks a block for its plan
(:func:`ensio.analysis.distributed.row_plan`) and its row coordinates
(:func:`ensio.analysis.placement.block_row_coordinates`) instead of reading
``start`` and ``count``, so both kinds of block go through the same pipeline.

``start`` is the first row of the set and ``count`` its size, only so that
code that logs a block still works; the rows are :attr:`rows`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..parallel.rowsets import RowSets
from .block import EnsembleBlock
from .state import StateLayout

__all__ = ["RowSetBlock"]


@dataclass
class RowSetBlock(EnsembleBlock):
    """This rank's rows ``plan.rows`` of the ensemble matrix (``data``: (N_e, count))."""

    plan: RowSets | None = None

    @classmethod
    def of(
        cls, layout: StateLayout, plan: RowSets, data: np.ndarray,
        inactive: np.ndarray | None = None,
    ) -> RowSetBlock:  # fmt: skip
        """The block of ``plan``'s rank holding ``data`` (columns in ``plan.rows`` order)."""
        if data.shape[1] != plan.count:
            raise ValueError(f"data has {data.shape[1]} columns for {plan.count} rows")
        first = int(plan.rows[0]) if plan.count else 0
        return cls(layout, first, plan.count, data, inactive, plan)

    def like(self, data: np.ndarray) -> RowSetBlock:
        """The same rows (and inactive flags) holding other ``data`` (e.g. the analysis)."""
        assert self.plan is not None
        return RowSetBlock.of(self.layout, self.plan, data, self.inactive)

    @property
    def rows(self) -> np.ndarray:
        """State-vector rows of this block, shape (count,), increasing."""
        assert self.plan is not None
        return self.plan.rows

    def count_by_variable(self, flags: np.ndarray) -> np.ndarray:
        """How many of this block's rows with ``flags`` fall in each variable."""
        out = np.zeros(len(self.layout.variables), dtype=np.int64)
        where = self.rows[np.asarray(flags, dtype=bool)]
        for i, v in enumerate(self.layout.variables):
            out[i] = np.count_nonzero((where >= v.offset) & (where < v.offset + v.size))
        return out
