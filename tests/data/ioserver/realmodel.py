"""Model program with the real output pipeline (graph + writer), run under mpiexec.

usage: realmodel.py CONFIG OUTDIR [KEY=VALUE ...]   (overrides, e.g. ioserver.mode=sync)

Sends the fields of iocore_model.py (same formulas and decomposition); the files it
makes in OUTDIR must not depend on the mode.
"""

import sys

import numpy as np
from mpi4py import MPI

from ensio import ioserver
from ensio.ioserver.configload import load_ioserver_config

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import iocore_model as M  # noqa: E402


def main():
    cfg = load_ioserver_config(sys.argv[1], [f"ioserver.output_dir={sys.argv[2]}",
                                             *sys.argv[3:]])
    client = ioserver.start(MPI.COMM_WORLD, cfg, context="test")
    if client is None:
        return
    comm = client.comm
    j0, nj, i0, ni = M.DECOMP[comm.size][comm.rank]
    jj, ii = np.meshgrid(np.arange(j0, j0 + nj), np.arange(i0, i0 + ni), indexing="ij")
    kk = np.arange(M.NK)[:, None, None]
    with client:
        client.set_domain("atm", ibegin=i0, ni=ni, jbegin=j0, nj=nj,
                          lon=M.lon(np.arange(i0, i0 + ni)), lat=M.lat(np.arange(j0, j0 + nj)),
                          mask=M.mask(jj, ii))
        client.close_definition()
        for step in range(1, M.STEPS + 1):
            client.update_timestep(step)
            for name, values in (("tas", M.tas(step, jj, ii)), ("pr", M.pr(step, jj, ii)),
                                 ("ta", M.ta(step, kk, jj, ii))):
                if client.is_active(name):
                    client.send(name, values)
        client.close()


if __name__ == "__main__":
    main()
