import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import needs  # noqa: E402  (tests/ is on sys.path from the line above)
from seeds import SEED_ENV, draw_seed  # noqa: E402

_SHM_BEFORE = pytest.StashKey[set]()


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


def pytest_sessionstart(session: pytest.Session) -> None:
    from shm_support import segments

    session.config.stash[_SHM_BEFORE] = segments()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """MPICH segments left by test jobs killed on purpose (tests/shm_support.py); once,
    in the controlling process (not in each xdist worker)."""
    if hasattr(session.config, "workerinput") or _SHM_BEFORE not in session.config.stash:
        return
    from shm_support import remove_orphans

    removed = remove_orphans(session.config.stash[_SHM_BEFORE])
    if removed:
        print(f"\nremoved {removed} MPICH shared-memory segments left in /dev/shm by "
              "killed test jobs", file=sys.stderr)


def pytest_runtest_setup(item):
    """Needs of the test (``needs`` marks, the ``slurm`` mark) before its fixtures.

    Each skips without the tool, capability or cluster, and fails with the reason
    when CI=true (tests/needs.py).
    """
    needs.run_marks(item)
    if item.get_closest_marker("slurm") is not None:
        from pool_support import require_slurm

        require_slurm()


@pytest.hookimpl(optionalhook=True)  # pytest -p no:xdist has no such hook
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``/``loadgroup``: by file, SLURM files on one worker, longest
    first (tests/xdist_schedule.py says why)."""
    if config.getvalue("dist") not in ("loadfile", "loadgroup"):
        return None
    from xdist_schedule import make_scheduler

    return make_scheduler(config, log)
