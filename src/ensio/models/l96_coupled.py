"""The Lorenz-96 example coupled: cycles of ``ensio cycle --mode online`` in one MPI job.

``workflow.online.command`` of ``examples/lorenz96/cycle.yaml``; started by the
driver as ``mpiexec -n N_e*P ensio model l96-coupled --workdir DIR --first F
--cycles K --initial PATTERN --steps S --tasks-per-member P`` (the arguments are
parsed in :mod:`ensio.cli.model`).

Every member runs on P ranks (the 40-variable model is integrated redundantly
on each of them, which costs nothing; each passes its block ``run.rows``); the
filter runs on the ranks of member 1. Per cycle c = F..K:

1. forecast: integrate the member's state (cycle F: the restart ``PATTERN``,
   later: the analysis in memory) by ``--steps`` RK4 steps; model rank 0
   writes ``DIR/cycle_CCC/forecast/memMMM.nc`` exactly as ``ensio model l96
   run`` does (only for the run-directory layout and the
   RMSE table: the filter never reads it);
2. analysis: :meth:`ensio.online.cycling.CoupledRun.assimilate` with the
   cycle's ``analysis.yaml``: the filter writes ``DIR/cycle_CCC/analysis/``
   (members, ``mean.nc``, ``spread.nc``) as ``ensio analyse`` does offline.

The offline cycle (``ensio model l96 run`` tasks + ``ensio analyse``) and this
program start from the same files and give the same analyses.

This module is an example *user* of :mod:`ensio.online` (a model program): it
sits in :mod:`ensio.models`, beside the model it couples, and not in the
library room :mod:`ensio.online`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..online.cycling import CoupledRun
from ..online.ensemble import OnlineReport
from .l96case import read_state, write_state
from .lorenz96 import DT, integrate

__all__ = ["run_coupled"]


def run_coupled(
    world: MPI.Comm,
    workdir: Path,
    first: int,
    last: int,
    initial: str,
    *,
    tasks_per_member: int = 1,
    steps: int = 1,
    timeout: float | None = None,
) -> list[OnlineReport]:
    """Collective: cycles ``first..last`` of the coupled Lorenz-96 example.

    Returns
    -------
    list of OnlineReport
        One per cycle (the same on every rank).
    """
    run = CoupledRun(workdir, world, first=first, last=last, initial=initial,
                     tasks_per_member=tasks_per_member, timeout=timeout)
    x, model_time = read_state(run.initial_path)
    if x.size != run.ens.n_rows:
        raise ValueError(f"{run.initial_path}: {x.size} values, the layout has {run.ens.n_rows}")
    counts = run.ens.model_comm.allgather(run.ens.count)
    for c in run.cycles():
        x = integrate(x, steps)
        model_time = model_time + steps * DT
        if run.ens.model_rank == 0:  # not counted as I/O: `l96 run` does not report it either
            write_state(run.forecast_path(c), x, model_time)
        xa = run.assimilate(c, x[run.rows])
        full = np.empty(run.ens.n_rows)
        run.ens.model_comm.Allgatherv(xa, [full, counts])
        x = full
    run.close()
    return run.reports

