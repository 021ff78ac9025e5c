"""The Lorenz-96 example coupled: K cycles in one MPI job, the run directory of the offline cycle.

``mpiexec -n N_e*P python -m ensio.online.l96 CONFIG --workdir DIR --cycles K``

Every member runs on P ranks (the 40-variable model is integrated redundantly
on each of them, which costs nothing; each passes its block ``ens.rows``); the
filter runs on the ranks of member 1. Per cycle c = 1..K:

1. forecast: integrate the member's state (cycle 1: ``DIR/init/memMMM.nc``,
   later: the analysis in memory) by ``--steps`` RK4 steps; model rank 0 writes
   ``DIR/cycle_CCC/forecast/memMMM.nc`` exactly as
   ``python -m ensio.models.l96case run`` does;
2. analysis: ``ens.assimilate(block, cycle=c)`` with ``DIR/obs/obs_CCC.nc`` and
   the analysis section of CONFIG; the filter writes
   ``DIR/cycle_CCC/analysis/memMMM.nc`` (copies of the forecast files with the
   state replaced, as ``ensio analyse`` with ``io.in_place: false`` does) and
   ``mean.nc`` / ``spread.nc`` beside them.

The set-up is :func:`ensio.models.l96case.setup` with the same arguments, so the
offline and online modes start from identical files and give the same
analyses. CONFIG is an ``ensio analyse`` config whose ``ensemble`` section
names the state variable ``x`` and the size N_e; its member paths,
observation files and outputs are replaced per cycle as above. A rerun starts
again from cycle 1 (the online mode keeps its state in memory, there is
nothing to resume).

This module is an example *user* of :mod:`ensio.online` (a model program), so
it also imports the example model of :mod:`ensio.models`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..config import load_config
from ..config.analysis import ObservationFile
from ..config.schema import Config
from ..models.l96case import read_state, setup, write_state
from ..models.lorenz96 import DT, integrate
from ..parallel.agree import root_call
from .ensemble import Ensemble, OnlineReport

__all__ = ["cycle_config", "main", "run_online"]


def cycle_config(config: Config, workdir: Path, cycle: int) -> Config:
    """The analysis config of one cycle (paths of the offline run directory)."""
    cdir = workdir / f"cycle_{cycle:03d}"
    return dataclasses.replace(
        config,
        ensemble=dataclasses.replace(
            config.ensemble, members=str(cdir / "forecast" / "mem{member:03d}.nc")
        ),
        observations=(ObservationFile(str(workdir / "obs" / f"obs_{cycle:03d}.nc")),),
        io=dataclasses.replace(config.io, in_place=False, journal=False),
        output=dataclasses.replace(
            config.output,
            members=str(cdir / "analysis" / "mem{member:03d}.nc"),
            mean=str(cdir / "analysis" / "mean.nc"),
            spread=str(cdir / "analysis" / "spread.nc"),
        ),
    )


def run_online(
    config: Config,
    world: MPI.Comm,
    workdir: Path,
    cycles: int,
    *,
    tasks_per_member: int = 1,
    seed: int = 1,
    steps: int = 1,
    sigma: float = 1.0,
    timeout: float | None = None,
) -> list[OnlineReport]:
    """Collective: set up (idempotently) and run ``cycles`` coupled cycles.

    Parameters
    ----------
    config : Config
        ``ensemble`` (size N_e, variables ``[x]``) and ``analysis`` as for
        ``ensio analyse``; paths are replaced per cycle (:func:`cycle_config`).
    world : MPI.Comm
        N_e × P ranks.
    workdir : Path
        The run directory (shared by all ranks).
    cycles : int
        K.
    tasks_per_member : int
        P.
    seed, steps, sigma
        As for ``python -m ensio.models.l96case setup`` / ``run``.
    timeout : float, optional
        Passed to :class:`~ensio.online.Ensemble` (hang guard per cycle).

    Returns
    -------
    list of OnlineReport
        One per cycle (the same on every rank).
    """
    workdir = Path(workdir).resolve()
    n_e = config.ensemble.size
    root_call(world, lambda: setup(workdir, n_e, cycles, seed, steps, sigma))  # type: ignore[func-returns-value]
    init = dataclasses.replace(
        config,
        ensemble=dataclasses.replace(
            config.ensemble, members=str(workdir / "init" / "mem{member:03d}.nc")
        ),
    )
    ens = Ensemble(init, world, tasks_per_member=tasks_per_member, timeout=timeout)
    x, t = read_state(init.member_paths()[ens.member - 1])
    if x.size != ens.n_rows:
        raise ValueError(f"state has {x.size} values, the layout {ens.n_rows}")
    reports = []
    counts = ens.model_comm.allgather(ens.count)
    for c in range(1, cycles + 1):
        x = integrate(x, steps)
        t = t + steps * DT
        cfg = cycle_config(config, workdir, c)
        if ens.model_rank == 0:
            write_state(cfg.member_paths()[ens.member - 1], x, t)
        xa = ens.assimilate(x[ens.rows], cycle=c, config=cfg)
        full = np.empty(ens.n_rows)
        ens.model_comm.Allgatherv(xa, [full, counts])
        x = full
        assert ens.last is not None
        reports.append(ens.last)
    ens.close()
    return reports


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ensio.online.l96", description=__doc__)
    p.add_argument("config", type=Path, metavar="CONFIG")
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--cycles", type=int, required=True)
    p.add_argument("--tasks-per-member", type=int, default=1, help="P (default 1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=1, help="RK4 steps per cycle")
    p.add_argument("--sigma", type=float, default=1.0, help="observation error std (set-up)")
    p.add_argument("--timeout", type=float, default=None, help="hang guard per cycle (s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    world = MPI.COMM_WORLD
    config = load_config(args.config, args.overrides)
    reports = run_online(
        config,
        world,
        args.workdir,
        args.cycles,
        tasks_per_member=args.tasks_per_member,
        seed=args.seed,
        steps=args.steps,
        sigma=args.sigma,
        timeout=args.timeout,
    )
    if world.rank == 0:
        for r in reports:
            print(
                f"cycle {r.cycle}: prior rms {r.prior.rms:.4g}  posterior rms "
                f"{r.posterior.rms:.4g}  accepted {r.qc.accepted}  "
                f"total {r.seconds['total']:.3f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
