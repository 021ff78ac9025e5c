"""How ``make test-serial`` spreads the test files over pytest-xdist workers.

Why a scheduler of our own (tests/conftest.py returns it from
``pytest_xdist_make_scheduler`` for ``--dist loadfile``/``loadgroup``):

* **one file, one worker**: a module-scoped fixture (a baseline run, CDO-built
  members, the DAPPER runs) is built once, not once per worker that gets
  some of the file's tests;
* **all SLURM files on one worker** (``tests/test_slurm_*.py``, one scope
  ``slurm``): their jobs share a one-node cluster and mostly wait on its
  timers, so they run one after another while the other worker runs
  CPU-bound files. (xdist's ``xdist_group`` marks would say the same, but
  under pytest 9 they do not reach its scheduler: xdist renames
  ``item._nodeid``, which pytest 9 no longer reads.)
* **all Veros files on one worker** (``tests/test_veros_*.py``, scope
  ``veros``): they share the small OSSE that ``tests/veros_support.py``
  sets up once per worker (a minute of Veros runs);
* **longest first**: a worker that becomes free takes the longest remaining
  file, so no long file starts last while the other worker idles. The
  order comes from ``--durations`` of whole-suite runs (2026-11-28);
  a file not listed goes after them in xdist's own order.
"""

from __future__ import annotations

from pathlib import Path

#: Scopes that take longest (wall, seconds on 2 busy cores), longest first.
LONGEST_FIRST = (
    "veros",
    "slurm",
    "tests/test_transfer_cycle.py",
    "tests/test_real_files.py",
    "tests/test_lorenz96_dapper.py",
    "tests/test_shuffle_commit.py",
    "tests/test_cycle.py",
    "tests/test_online_spawn.py",
    "tests/test_journal_kill.py",
    "tests/test_ioserver_core.py",
    "tests/test_exactly_once.py",
    "tests/test_write_kill.py",
)


def scope_of(nodeid: str) -> str:
    """The file of a test, ``slurm`` for every SLURM file, ``veros`` for every Veros file."""
    path = nodeid.split("::", 1)[0]
    name = Path(path).name
    if name.startswith("test_slurm_"):
        return "slurm"
    return "veros" if name.startswith("test_veros_") else path


def make_scheduler(config, log):
    """A :class:`xdist.scheduler.LoadScopeScheduling` by :func:`scope_of`, longest first."""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            for scope in reversed(LONGEST_FIRST):  # the first of them ends up in front
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return FileScheduling(config, log)
