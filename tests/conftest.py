import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import needs  # noqa: E402  (tests/ is on sys.path from the line above)
from seeds import SEED_ENV, draw_seed  # noqa: E402


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A seeded random generator; the seed is printed and shown with a failure.

    A fresh seed every run (so repeated runs explore different cases) unless
    ``ENSIO_TEST_SEED`` is set, which replays a reported failure exactly.
    """
    seed = draw_seed(request.node.nodeid)
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


def pytest_configure(config: pytest.Config) -> None:
    needs.register(config)


def pytest_runtest_setup(item):
    """Needs of the test (``needs`` marks, the ``slurm`` mark) before its fixtures.

    Each skips without the tool, capability or cluster, and fails with the reason
    when CI=true (tests/needs.py).
    """
    needs.run_marks(item)
    if item.get_closest_marker("slurm") is not None:
        from pool_support import require_slurm

        require_slurm()


def pytest_xdist_make_scheduler(config, log):
    """Schedule by file, with every SLURM file in one group (``make test-serial``).

    The tests of one file run on one worker, so a module-scoped fixture (a
    baseline run, CDO-built members) is built once instead of once per worker;
    the SLURM files (tests/test_slurm_*.py) share one group, so their jobs run
    one file after another on the one-node cluster (waiting on its timers)
    while the other worker runs CPU-bound files. pytest-xdist's own
    ``--dist loadgroup`` marks do not reach its scheduler under pytest 9 (it
    renames ``item._nodeid``, which pytest 9 no longer reads), hence this
    scheduler; it applies to ``--dist loadfile`` and ``--dist loadgroup``.
    """
    if config.getvalue("dist") not in ("loadfile", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileOrSlurm(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "slurm" if Path(path).name.startswith("test_slurm_") else path

    return FileOrSlurm(config, log)
