"""A small Python model for the end-to-end tests of the I/O server.

Usage (under mpiexec): ``python model.py IODEF NSTEPS [FAIL_RANK FAIL_STEP]``.
The model ranks split the 24 x 12 lon/lat grid into unequal row blocks (rank r
gets 1 + 2r rows, the last rank the rest), declare a land mask, and send
``tas`` (2-D), ``ta`` (3 levels) and ``pr`` every step from the formula in
``fields.py`` (the test evaluates the same formula on the whole grid). With
FAIL_RANK, that model rank raises inside ``with client:`` at FAIL_STEP.
"""

import sys
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from fields import NI, area, lat, lon, mask, pr, rows_of, ta, tas  # noqa: E402

from ensio import ioserver  # noqa: E402

iodef, nsteps = sys.argv[1], int(sys.argv[2])
fail_rank, fail_step = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (-1, -1)
client = ioserver.start(MPI.COMM_WORLD, iodef)
if client is None:
    sys.exit(0)
comm = client.comm
j0, nj = rows_of(comm.rank, comm.size)
with client:
    sl = slice(j0, j0 + nj)
    client.set_domain("atm", ibegin=0, ni=NI, jbegin=j0, nj=nj, lon=lon(), lat=lat()[sl],
                      mask=mask()[sl], area=area()[sl])
    client.close_definition()
    for step in range(1, nsteps + 1):
        client.update_timestep(step)
        if comm.rank == fail_rank and step == fail_step:
            raise RuntimeError(f"the model blew up at step {step}")
        for name, f in (("tas", tas), ("ta", ta), ("pr", pr)):
            if client.is_active(name, step):
                client.send(name, f(step)[..., sl, :])
    report = client.close()
if comm.rank == 0:
    print("report", report)
