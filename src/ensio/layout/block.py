"""This rank's rows of the ensemble matrix: what every path into the analysis produces.

It lives here, not in ``io/``, because the analysis, the online mode and the
Python API build and consume it without any file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .state import StateLayout

__all__ = ["EnsembleBlock", "all_finite"]


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
    inactive : numpy.ndarray of bool, shape (count,), optional
        Rows where some member holds a missing value (``_FillValue``,
        ``missing_value``, outside the valid range, NaN): the analysis leaves
        them as they are and the writer keeps every member's bytes there.
        ``None``: no row is known to be inactive (a row with a non-finite
        value in any member is inactive all the same, see
        :meth:`inactive_rows`).
    """

    layout: StateLayout
    start: int
    count: int
    data: np.ndarray
    inactive: np.ndarray | None = None

    @property
    def n_members(self) -> int:
        return int(self.data.shape[0])

    @property
    def rows(self) -> np.ndarray:
        """State-vector rows of this block, shape (count,)."""
        return np.arange(self.start, self.start + self.count)

    def inactive_rows(self) -> np.ndarray:
        """Rows the analysis must not update, shape (count,): ``inactive`` or non-finite.

        A local OR over the members of each row (all members of a row are on
        this rank): no communication.
        """
        if all_finite(self.data):  # the usual case: no block-sized temporary
            flags = np.zeros(self.data.shape[1], dtype=bool)
        else:
            flags = ~np.isfinite(self.data).all(axis=0)
        if self.inactive is not None:
            flags |= np.asarray(self.inactive, dtype=bool)
        return flags

    def to_write(self) -> np.ndarray:
        """A float64 copy of ``data`` (N_e, count) with NaN in :meth:`inactive_rows`.

        What the tile writers take: a non-finite value keeps the prior bytes,
        so the rows the analysis must not update are not written.
        """
        data = np.array(self.data, dtype=np.float64)
        keep = self.inactive_rows()
        if keep.any():
            data[:, keep] = np.nan
        return data

    def count_by_variable(self, flags: np.ndarray) -> np.ndarray:
        """How many of this block's rows with ``flags`` fall in each variable, shape (n_vars,)."""
        out = np.zeros(len(self.layout.variables), dtype=np.int64)
        where = np.flatnonzero(flags) + self.start
        for i, v in enumerate(self.layout.variables):
            out[i] = np.count_nonzero((where >= v.offset) & (where < v.offset + v.size))
        return out


def all_finite(a: np.ndarray) -> bool:
    """True only if every value of ``a`` is finite: one pass, no temporary array.

    A NaN or an infinity makes the sum non-finite; a finite sum can only be
    wrong towards "not all finite" (overflow), which sends the caller down
    its careful path, never the other way.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.add.reduce(a, axis=None)))
