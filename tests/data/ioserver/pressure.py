"""Back-pressure program of tests/test_ioserver_core.py (under mpiexec).

usage: pressure.py CONFIG [KEY=VALUE ...]

Model ranks of unequal speed send 3-D fields of 800 kB to two servers whose
budget is far below one field; the sink checks every global array against
the formula and the model ranks print the server memory high-water mark.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

from ensio import ioserver
from ensio.ioserver.configload import load_ioserver_config

STEPS = 30
ROWS = [10, 50, 40]


class Sink:
    nbytes = 0

    def __init__(self, cfg, files, geometry, out_dir, history):
        self.pushes = 0

    def push(self, f, s, d):
        if not np.all(d == s * 1000 + ord(f) - 96):
            raise AssertionError(f"{f} step {s}: wrong values")
        self.pushes += 1

    def advance(self, s):
        pass

    def finish(self, s):
        pass

    def close(self):
        class Stats:
            bytes_written = self.pushes
            files = []
        return Stats()


def periods(cfg, files):
    used = {fd.field_ref for f in cfg.files if f.id in files for fd in f.fields}
    return {s: (1,) if s in used else () for s in cfg.sources}


def main():
    cfg = load_ioserver_config(sys.argv[1], sys.argv[2:])
    client = ioserver.start(MPI.COMM_WORLD, cfg, sink_factory=Sink, periods=periods)
    if client is None:
        return
    comm = client.comm
    nj, j0 = ROWS[comm.rank], sum(ROWS[:comm.rank])
    with client:
        client.set_domain("atm", ibegin=0, ni=200, jbegin=j0, nj=nj)
        client.close_definition()
        for s in range(1, STEPS + 1):
            client.update_timestep(s)
            if comm.rank == 0:
                time.sleep(0.002)  # a slower rank: the others run ahead
            for f in "abc":
                shape = (5, nj, 200) if f != "c" else (nj, 200)
                if client.is_active(f):
                    client.send(f, np.full(shape, s * 1000.0 + ord(f) - 96))
        rep = client.close()
    rows = comm.gather(f"REPORT {comm.rank} {rep.server_memory_hwm_bytes} {rep.bytes_written}")
    if comm.rank == 0:  # one writer: lines of several ranks may interleave
        print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
