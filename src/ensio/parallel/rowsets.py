"""Rows of the state vector owned by ranks in arbitrary sets, kept as runs.

:class:`~ensio.parallel.distribution.RowDistribution` gives every rank one
contiguous block. The group shuffle (``io.mode: shuffle``) gives a rank a
piece of a tile: one stretch of elements per latitude line and level, spread
over the whole state vector. :class:`RowSets` is the plan for such an
ownership: a partition of ``[0, n_rows)`` into runs, each run owned by one
rank. It answers the same questions as ``RowDistribution`` (who owns a row,
which rows are mine) plus where a row sits in its owner's data, which is no
longer ``row - start``. A contiguous block distribution is the special case
of one run per rank.

The plan is small (two ints per run, one run per latitude line and level of
each tile piece), built by every rank from the same geometry without
communication, and never lists one index per row of the whole state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["RowSets"]


@dataclass(frozen=True, eq=False)
class RowSets:
    """``n_rows`` rows over ``size`` ranks as runs ``[run_starts[i], run_starts[i+1])``.

    Attributes
    ----------
    n_rows, size, rank : int
        Rows, ranks, and the rank whose rows :attr:`rows` lists.
    run_starts : ndarray of int64, shape (n_runs,)
        Increasing, ``run_starts[0] == 0``; run i ends where run i+1 starts
        (the last at ``n_rows``).
    run_ranks : ndarray of int64, shape (n_runs,)
        Owner of each run.
    rows : ndarray of int64, shape (count,)
        This rank's rows, increasing: the order of its data's columns.
    """

    n_rows: int
    size: int
    rank: int
    run_starts: np.ndarray = field(repr=False)
    run_ranks: np.ndarray = field(repr=False)
    rows: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        starts = np.asarray(self.run_starts, dtype=np.int64)
        ranks = np.asarray(self.run_ranks, dtype=np.int64)
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} of size {self.size}")
        if starts.shape != ranks.shape or (self.n_rows > 0 and starts.size == 0):
            raise ValueError("run_starts and run_ranks must be non-empty and of one shape")
        if starts.size and (starts[0] != 0 or np.any(np.diff(starts) <= 0)
                            or starts[-1] >= self.n_rows):  # fmt: skip
            raise ValueError("run_starts must increase strictly from 0 below n_rows")
        if ranks.size and (ranks.min() < 0 or ranks.max() >= self.size):
            raise ValueError(f"run_ranks outside [0, {self.size})")
        object.__setattr__(self, "run_starts", starts)
        object.__setattr__(self, "run_ranks", ranks)
        stops = np.append(starts[1:], self.n_rows)
        mine = np.flatnonzero(ranks == self.rank)
        rows = [np.arange(starts[i], stops[i], dtype=np.int64) for i in mine]
        object.__setattr__(
            self, "rows", np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)
        )

    @classmethod
    def from_pieces(
        cls, n_rows: int, size: int, rank: int, starts: np.ndarray, lengths: np.ndarray,
        owners: np.ndarray,
    ) -> RowSets:  # fmt: skip
        """The plan from pieces (start, length, owner) in any order that cover each row once.

        Adjacent pieces of one owner are merged into one run.

        Raises
        ------
        ValueError
            The pieces overlap, leave a gap, or have a non-positive length.
        """
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        owners = np.asarray(owners, dtype=np.int64)
        if np.any(lengths <= 0):
            raise ValueError("every piece needs a positive length")
        order = np.argsort(starts, kind="stable")
        s, n, o = starts[order], lengths[order], owners[order]
        if s.size and (s[0] != 0 or np.any(s[1:] != s[:-1] + n[:-1]) or s[-1] + n[-1] != n_rows):
            raise ValueError(f"the pieces do not cover rows [0, {n_rows}) exactly once")
        keep = np.ones(s.size, dtype=bool)
        keep[1:] = o[1:] != o[:-1]
        return cls(n_rows, size, rank, s[keep], o[keep])

    @classmethod
    def blocks(cls, n_rows: int, starts: np.ndarray, rank: int) -> RowSets:
        """The contiguous block distribution with these rank ``starts`` (empty blocks allowed)."""
        starts = np.asarray(starts, dtype=np.int64)
        stops = np.append(starts[1:], n_rows)
        has = stops > starts
        return cls.from_pieces(n_rows, starts.size, rank, starts[has], (stops - starts)[has],
                               np.flatnonzero(has))  # fmt: skip

    @property
    def count(self) -> int:
        """Rows of :attr:`rank`."""
        return int(self.rows.size)

    def owner(self, rows: np.ndarray | int) -> np.ndarray:
        """Rank owning each of ``rows`` (0 ≤ row < n_rows)."""
        return self.run_ranks[np.searchsorted(self.run_starts, rows, side="right") - 1]

    def local(self, rows: np.ndarray) -> np.ndarray:
        """Column of each of ``rows`` (rows of :attr:`rank`) in this rank's data.

        Raises
        ------
        ValueError
            A row this rank does not own.
        """
        rows = np.asarray(rows, dtype=np.int64)
        pos = np.searchsorted(self.rows, rows)
        if rows.size and (np.any(pos >= self.rows.size) or np.any(self.rows[pos] != rows)):
            raise ValueError(f"rank {self.rank} is asked for rows it does not own")
        return pos

    def counts(self) -> np.ndarray:
        """Rows per rank, shape (size,)."""
        lengths = np.diff(np.append(self.run_starts, self.n_rows))
        return np.bincount(self.run_ranks, weights=lengths, minlength=self.size).astype(np.int64)
