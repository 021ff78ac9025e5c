"""This rank's rows of the ensemble matrix: what every path into the analysis produces.

It lives here, not in ``io/``, because the analysis, the online mode and the
Python API build and consume it without any file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .state import StateLayout

__all__ = ["EnsembleBlock"]


@dataclass
class EnsembleBlock:
    """This rank's rows of the ensemble matrix.

    Attributes
    ----------
    layout : StateLayout
    start, count : int
        Rows ``[start, start + count)`` of the state vector.
    data : numpy.ndarray, shape (N_e, count), float64
        Member-major: one member's segment is contiguous.
    """

    layout: StateLayout
    start: int
    count: int
    data: np.ndarray

    @property
    def n_members(self) -> int:
        return int(self.data.shape[0])

    @property
    def rows(self) -> np.ndarray:
        """State-vector rows of this block, shape (count,)."""
        return np.arange(self.start, self.start + self.count)
