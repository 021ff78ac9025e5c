"""The seed of a test's random draws: ``ENSIO_TEST_SEED`` if set, else fresh; printed.

Why one rule: a test drawing fresh random cases each run explores more of them,
but a failure is only worth something if it can be replayed. Every random source
in tests/ takes its seed from :func:`draw_seed`, which prints it (pytest shows a
failed test's output), so ``ENSIO_TEST_SEED=<seed>`` reruns the same draws.
"""

from __future__ import annotations

import os
import secrets

#: Set to an integer to replay the random draws of a failed run.
SEED_ENV = "ENSIO_TEST_SEED"


def draw_seed(label: str) -> int:
    """``ENSIO_TEST_SEED`` if set, else a fresh 63-bit seed; printed with ``label``."""
    env = os.environ.get(SEED_ENV)
    seed = int(env) if env else secrets.randbits(63)
    print(f"{label}: {SEED_ENV}={seed}")
    return seed
