import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from mpi4py import MPI


@pytest.fixture
def comm():
    return MPI.COMM_WORLD


@pytest.fixture
def shared_dir(comm):
    """A directory all ranks see (rank 0 creates and removes it)."""
    path = tempfile.mkdtemp(prefix="ensio-mpi-") if comm.rank == 0 else None
    path = Path(comm.bcast(path, root=0))
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test failed on this rank: print it and abort every rank.

    Why: the tests are collective, so a rank that fails leaves the others
    waiting in a collective of the same or the next test, and the run would
    hang instead of failing (seen with a rank raising inside the analysis).
    Only rank 0 prints its report (``run.py``), so the failure goes to stderr.
    """
    outcome = yield
    report = outcome.get_result()
    world = MPI.COMM_WORLD
    if report.failed and world.size > 1:
        sys.stderr.write(f"rank {world.rank} of {world.size}: {item.nodeid} failed "
                         f"({report.when})\n{report.longreprtext}\n")  # fmt: skip
        sys.stderr.flush()
        world.Abort(1)
