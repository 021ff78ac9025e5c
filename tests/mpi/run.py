"""Run the MPI tests on every rank of ``mpiexec -n N``; only rank 0 reports.

Every rank runs the same tests (they are collective); the exit code is
non-zero if any rank failed, so a failure on rank 3 is not hidden.
"""

import os
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

comm = MPI.COMM_WORLD
here = Path(__file__).parent
sys.path.insert(0, str(here.parent))
args = [str(here), "-p", "no:cacheprovider", *sys.argv[1:]]
if comm.rank != 0:
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    args += ["-q", "--no-header"]
code = pytest.main(args)
codes = comm.allgather(int(code))
bad = [(r, c) for r, c in enumerate(codes) if c != 0]
if comm.rank == 0 and bad:
    print(f"MPI tests failed on ranks {[r for r, _ in bad]} (size {comm.size})", file=sys.stderr)
sys.exit(max(codes))
