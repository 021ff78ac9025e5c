"""Contiguous block distribution of state-vector rows over ranks."""

from __future__ import annotations

__all__ = ["block_distribution"]


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
