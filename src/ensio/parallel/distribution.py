"""Contiguous block distribution of state-vector rows over ranks.

:func:`block_distribution` is the rule; :class:`RowDistribution` is the plan
built once from it for a whole communicator (every rank's start and count,
the displacements of a gather, the owner of any row), so no room computes the
rule again for each rank it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RowDistribution", "block_distribution"]


def block_distribution(n: int, size: int, rank: int) -> tuple[int, int]:
    """Rows ``[start, start + count)`` owned by ``rank`` of ``size``.

    The first ``n % size`` ranks own one row more, so no rank owns more than
    ``ceil(n / size)`` rows and the blocks are contiguous and in rank order.

    Returns
    -------
    (start, count) : tuple of int
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} of size {size}")
    base, extra = divmod(n, size)
    count = base + (1 if rank < extra else 0)
    start = rank * base + min(rank, extra)
    return start, count


@dataclass(frozen=True, eq=False)
class RowDistribution:
    """``n_rows`` rows over ``size`` ranks in contiguous blocks (:func:`block_distribution`).

    Build it with :meth:`of` from a communicator, or directly from a size
    (the online mode distributes over model ranks of a member, which is not
    the communicator at hand).

    Attributes
    ----------
    n_rows, size, rank : int
        Rows, ranks, and the rank this object describes (``start``, ``count``).
    offset : int
        Row of the whole state vector where row 0 of this distribution lies
        (non-zero for a :meth:`span`).
    starts, counts : numpy.ndarray, shape (size,), int64
        Every rank's first row (relative to ``offset``) and number of rows;
        ``starts`` doubles as the displacements of a ``Scatterv``/``Gatherv``.
    """

    n_rows: int
    size: int
    rank: int = 0
    offset: int = 0
    starts: np.ndarray = field(init=False, repr=False)
    counts: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.n_rows < 0:
            raise ValueError(f"n_rows = {self.n_rows} < 0")
        block_distribution(self.n_rows, self.size, self.rank)  # validates size and rank
        base, extra = divmod(self.n_rows, self.size)
        r = np.arange(self.size, dtype=np.int64)
        object.__setattr__(self, "counts", base + (r < extra).astype(np.int64))
        object.__setattr__(self, "starts", r * base + np.minimum(r, extra))

    @classmethod
    def of(cls, n_rows: int, comm: Any) -> RowDistribution:
        """The distribution over ``comm`` (anything with ``size`` and ``rank``)."""
        return cls(n_rows, comm.size, comm.rank)

    @property
    def start(self) -> int:
        """First row of :attr:`rank` (relative to :attr:`offset`)."""
        return int(self.starts[self.rank])

    @property
    def count(self) -> int:
        """Rows of :attr:`rank`."""
        return int(self.counts[self.rank])

    @property
    def stop(self) -> int:
        return self.start + self.count

    def bounds(self, rank: int) -> tuple[int, int]:
        """``(start, count)`` of any rank."""
        return int(self.starts[rank]), int(self.counts[rank])

    def owner(self, rows: np.ndarray | int) -> np.ndarray:
        """Rank owning each of ``rows`` (0 ≤ row < n_rows)."""
        return np.searchsorted(self.starts, rows, side="right") - 1


    def span(self, first: int, stop: int) -> RowDistribution:
        """The distribution restricted to ranks ``[first, stop)`` (e.g. one I/O group).

        A contiguous run of ranks of a block distribution is itself a block
        distribution of its rows (counts never increase and differ by at most
        one). The result's ``starts`` are relative to its first row (the
        displacements inside the group's buffer) and :attr:`offset` is that
        row; its :attr:`rank` is this rank's position in the group (0 outside).
        """
        if not 0 <= first < stop <= self.size:
            raise ValueError(f"ranks [{first}, {stop}) of size {self.size}")
        lo = int(self.starts[first])
        hi = int(self.starts[stop - 1] + self.counts[stop - 1])
        rank = self.rank - first if first <= self.rank < stop else 0
        return RowDistribution(hi - lo, stop - first, rank, offset=self.offset + lo)
