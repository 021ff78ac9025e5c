"""A small atmosphere-like model that writes its output through the ensio I/O server.

What a user's Python model looks like with ``iodef.yaml`` beside this file: each
model rank owns a band of latitude rows of a 36 × 18 grid with 4 pressure levels,
computes hourly fields (a travelling wave for ``tas`` and ``ta``, a positive
``pr``) and sends them; the server ranks write the hourly, daily and weekly
files that ``iodef.yaml`` defines (instant, mean, maximum, an expression, global
and zonal means, a box, the weekly mean of daily maxima).

Run it (2 model ranks and the 1 server rank that ``ioserver.servers`` asks for)::

    mpiexec -n 3 python examples/ioserver/model.py [--days 8]

The files appear in ``examples/ioserver/output/`` (``ioserver.output_dir`` is
relative to the config file).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ensio import ioserver

HERE = Path(__file__).resolve().parent
NI, NJ, LEVELS = 36, 18, np.array([1000.0, 850.0, 500.0, 250.0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=int, default=8, help="days to run (hourly steps)")
    p.add_argument("--iodef", type=Path, default=HERE / "iodef.yaml")
    args = p.parse_args()

    client = ioserver.start(MPI.COMM_WORLD, args.iodef)
    if client is None:  # a server rank: it served the whole run inside start()
        return 0
    comm = client.comm
    rank, size = comm.Get_rank(), comm.Get_size()
    j0 = rank * NJ // size
    nj = (rank + 1) * NJ // size - j0
    lon = (np.arange(NI) + 0.5) * 360.0 / NI
    lat = -90.0 + (np.arange(j0, j0 + nj) + 0.5) * 180.0 / NJ
    lon2, lat2 = np.meshgrid(np.deg2rad(lon), np.deg2rad(lat))
    with client:  # an exception here ends the run cleanly, naming this rank
        client.set_domain("atm", ibegin=0, ni=NI, jbegin=j0, nj=nj, lon=lon, lat=lat)
        client.close_definition()
        for step in range(1, 24 * args.days + 1):
            client.update_timestep(step)
            phase = 2.0 * np.pi * step / 24.0  # one revolution a day
            tas = 288.0 + 30.0 * np.cos(lat2) - 15.0 + 5.0 * np.cos(lon2 - phase)
            if client.is_active("tas", step):
                client.send("tas", tas)
            if client.is_active("pr", step):
                client.send("pr", 1e-5 * (1.0 + np.sin(lon2 + phase) ** 2))
            if client.is_active("ta", step):
                lapse = 0.0065 * 7000.0 * np.log(1000.0 / LEVELS)  # K cooler aloft
                client.send("ta", tas[None, :, :] - lapse[:, None, None])
        report = client.close()
    if rank == 0:
        print(f"sent {report.bytes_sent} bytes in {report.messages} messages; waited "
              f"{report.blocked_seconds:.3f} s; servers wrote {report.files_written} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
