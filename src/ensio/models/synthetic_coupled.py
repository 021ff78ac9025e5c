"""The seed paper's synthetic-field model coupled: ``ensio cycle --mode online``.

``workflow.online.command`` of ``examples/synthetic/cycle.yaml``; started by
the driver as ``mpiexec -n N_e*P ensio model synthetic-coupled --workdir DIR
--first F --cycles K --initial PATTERN --tasks-per-member P [--sleep S]
[--shift D] [--variable state]`` (the arguments are parsed in
:mod:`ensio.cli.model`).

The coupled twin of ``ensio model synthrun``: each member's model
rank 0 reads the state field of its restart (cycle F: ``PATTERN``) and
scatters the rows to its P model ranks; per cycle every model rank sleeps S
seconds (the cost of a forecast; all ranks of a member at once, like a real
parallel model), the field is advected eastward by D grid points (gathered on
model rank 0, rolled along longitude, scattered back) and the rows are
assimilated in memory. No forecast file is written or read: that is what the
online mode saves. The filter writes the analysis members as copies of the
restarts each cycle started from (the same auxiliary variables as the
offline forecasts, which are copies of the same files) with the state
replaced, and ``mean.nc``/``spread.nc``.

The state vector is the single, unmasked variable ``--variable`` in C order
(``ensemble.variables: [state]``), as ``ensio synth`` writes it.

Like :mod:`ensio.models.l96_coupled`, an example *user* of :mod:`ensio.online`.
"""

from __future__ import annotations

import time
from pathlib import Path

import netCDF4
import numpy as np
from mpi4py import MPI

from ..online.cycling import CoupledRun
from ..online.ensemble import OnlineReport

__all__ = ["run_coupled"]


def _read_field(path: Path, variable: str) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        v = ds[variable]
        v.set_auto_maskandscale(False)
        return np.asarray(v[...], dtype=np.float64)


def run_coupled(
    world: MPI.Comm,
    workdir: Path,
    first: int,
    last: int,
    initial: str,
    *,
    tasks_per_member: int = 1,
    sleep: float = 0.0,
    shift: int = 0,
    variable: str = "state",
    timeout: float | None = None,
) -> list[OnlineReport]:
    """Collective: cycles ``first..last`` of the coupled synthetic model.

    Returns
    -------
    list of OnlineReport
        One per cycle (the same on every rank).
    """
    run = CoupledRun(workdir, world, first=first, last=last, initial=initial,
                     tasks_per_member=tasks_per_member, timeout=timeout, forecast_files=False)
    model = run.ens.model_comm
    counts = np.array(model.allgather(run.ens.count))
    shape = None
    full = None
    if model.rank == 0:
        t = time.perf_counter()
        field = _read_field(run.initial_path, variable)
        run.add_io(time.perf_counter() - t)
        shape, full = field.shape, field.ravel()
        if full.size != run.ens.n_rows:
            raise ValueError(f"{run.initial_path}: {variable} has {full.size} values, the "
                             f"state vector {run.ens.n_rows} (one unmasked variable expected)")
    shape = model.bcast(shape, root=0)
    x = np.empty(run.ens.count)
    model.Scatterv([full, counts] if model.rank == 0 else None, x, root=0)
    for c in run.cycles():
        if sleep > 0:
            time.sleep(sleep)  # imitates the cost of a forecast
        if shift:
            model.Gatherv(x, [full, counts] if model.rank == 0 else None, root=0)
            if model.rank == 0:
                full = np.roll(full.reshape(shape), shift, axis=-1).ravel()
            model.Scatterv([full, counts] if model.rank == 0 else None, x, root=0)
        x = run.assimilate(c, x)
    run.close()
    return run.reports

