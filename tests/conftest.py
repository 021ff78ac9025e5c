import os
import secrets
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

#: Set to an integer to replay the random draws of a failed run.
SEED_ENV = "ENSIO_TEST_SEED"


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A seeded random generator; the seed is printed and shown with a failure.

    A fresh seed every run (so repeated runs explore different cases) unless
    ``ENSIO_TEST_SEED`` is set, which replays a reported failure exactly.
    """
    env = os.environ.get(SEED_ENV)
    seed = int(env) if env else secrets.randbits(63)
    print(f"{request.node.nodeid}: {SEED_ENV}={seed}")
    request.node.user_properties.append((SEED_ENV, seed))
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Name the seed of the ``rng`` fixture in the report of a failed test."""
    outcome = yield
    report = outcome.get_result()
    seeds = [v for k, v in item.user_properties if k == SEED_ENV]
    if report.failed and seeds:
        report.sections.append(("random seed", f"rerun with {SEED_ENV}={seeds[0]}"))


def pytest_runtest_setup(item):
    # SLURM tests skip without a cluster, and fail with the reason when CI=true.
    if item.get_closest_marker("slurm") is not None:
        from pool_support import require_slurm

        require_slurm()
