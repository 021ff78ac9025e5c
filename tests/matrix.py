"""How much of a kill matrix or random-draw loop a run covers: ``ENSIO_TEST_FULL``.

Why: the kill tests SIGKILL real processes at drawn fault points, and their full
draw counts were most of the suite's time. A default run still covers every
fault label and every rank count of each matrix (no case is skipped: each runs
fewer draws; the one exception, test_transfer_cycle's daemon killed mid-cycle, says
which test covers its guarantee by default); ``ENSIO_TEST_FULL=1`` (``make
test-full``) runs the full counts.
"""

from __future__ import annotations

import os

FULL_ENV = "ENSIO_TEST_FULL"


def full() -> bool:
    """Whether the full matrices were asked for (any value but empty or ``0``)."""
    return os.environ.get(FULL_ENV, "") not in ("", "0")


def draws(default: int, full_count: int) -> int:
    """The number of random draws (trials) of one case in this run."""
    assert 1 <= default <= full_count
    return full_count if full() else default
