import shutil
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
