"""Child of test_write_kill.py: read the ensemble, change it, write it in place.

Run serially or under mpiexec; killed by the fault hook (ENSIO_FAULT_KILL_AT)
or by the parent. The analysis is a deterministic function of the prior, so
every complete run produces the same bytes.
"""

import sys

from mpi4py import MPI

from ensio.config import load_config
from ensio.io.ensemble import read_ensemble, write_ensemble

comm = MPI.COMM_WORLD
cfg = load_config(sys.argv[1])
block = read_ensemble(cfg, comm)
block.data[...] = 0.5 * block.data + 1.0
if comm.rank == 0:
    print("ready", flush=True)
write_ensemble(cfg, comm, block)
