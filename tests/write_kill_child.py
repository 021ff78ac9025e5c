"""Child of test_write_kill.py: read the ensemble, change it, write it in place.

Run serially or under mpiexec; killed by the fault hook (ENSIO_FAULT_KILL_AT)
or by the parent. The analysis is a deterministic function of the prior, so
every complete run produces the same bytes. With ENSIO_TEST_REPORT_POINTS set,
rank 0 prints ``point <label>`` at every fault point of the write, so the
parent can kill it from outside while it is writing.
"""

import os
import sys

from mpi4py import MPI

from ensio import faults
from ensio.config import load_config
from ensio.io.modes.ensemble import open_ensemble

comm = MPI.COMM_WORLD
cfg = load_config(sys.argv[1])
with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, comm) as ens:
    block = ens.read()
    block.data[...] = 0.5 * block.data + 1.0
    if comm.rank == 0:
        print("ready", flush=True)
        if os.environ.get("ENSIO_TEST_REPORT_POINTS"):
            faults.set_hook(lambda label: print(f"point {label}", flush=True))
    ens.write(block)
