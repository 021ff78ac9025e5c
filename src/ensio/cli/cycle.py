"""``ensio cycle CONFIG --cycles K --workdir DIR``: run or resume an experiment."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import load_config
from ..errors import EnsioError
from ..workflow.cycle import run_cycles

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
            "experiment without redoing finished work."
        ),
    )
    p.add_argument("config", type=Path, metavar="CONFIG")
    p.add_argument("--cycles", type=int, required=True, metavar="K")
    p.add_argument("--workdir", type=Path, required=True, metavar="DIR")
    p.add_argument("--mode", choices=("offline", "online"), default="offline")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    if args.mode == "online":
        raise EnsioError("--mode online: the coupled cycle driver is not available yet")
    run_cycles(args.config, config, args.workdir, args.cycles, args.overrides)
    return 0
