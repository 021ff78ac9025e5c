"""``ensio cycle CONFIG --cycles K --workdir DIR``: run or resume an experiment."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import load_config
from ..workflow.cycle import run_cycles
from .options import add_set_option

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``cycle`` sub-command."""
    p = subparsers.add_parser(
        "cycle",
        help="run (or resume) K assimilation cycles through the job pool",
        description=(
            "Each cycle: N_e member forecasts and the analysis, drained from a to-do list by "
            "workflow.jobs worker jobs (local processes or SLURM jobs); the next cycle starts "
            "from the analysis. Rerunning the same command after a crash finishes the "
            "experiment without redoing finished work. --mode online runs the same cycles as "
            "one coupled MPI job (mpiexec -n N_e*P workflow.online.command)."
        ),
    )
    p.add_argument("config", type=Path, metavar="CONFIG")
    p.add_argument("--cycles", type=int, required=True, metavar="K")
    p.add_argument("--workdir", type=Path, required=True, metavar="DIR")
    p.add_argument("--mode", choices=("offline", "online"), default="offline",
                   help="offline: the job pool (default); online: one coupled MPI job")
    add_set_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    if args.mode == "online":
        from ..workflow.online import run_online_cycles

        run_online_cycles(args.config, config, args.workdir, args.cycles, args.overrides)
    else:
        run_cycles(args.config, config, args.workdir, args.cycles, args.overrides)
    return 0
