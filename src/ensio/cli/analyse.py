"""``ensio analyse CONFIG``: one offline analysis (under ``mpiexec -n N`` or alone)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mpi4py import MPI

from ..config import load_config
from ..locks import command_line
from ..offline import run_analysis
from ..progress import PhaseProgress
from ..workflow.prestart import PRESTART_ENV, await_go
from .options import add_members_option, add_set_option, member_list, select_members

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``analyse`` sub-command."""
    p = subparsers.add_parser(
        "analyse",
        help="read the members, assimilate the observations, write the analysis",
        description=(
            "Read the member files with N_io I/O tasks, assimilate the observation files "
            "with the configured filter, and write the analysis in place (journaled) or, "
            "with io.in_place: false, into copies at output.members; write output.mean and "
            "output.spread. Run under `mpiexec -n N` for N ranks; the result does not "
            "depend on N or on io.tasks. The run holds a lock on the members (a second "
            "run fails at once, naming the holder), commits members and products "
            "together (an interrupted run is rolled back), and does nothing if the "
            "members already hold this analysis (same config, observation files and "
            "cycle; see --force)."
        ),
    )
    p.add_argument("config", type=Path, metavar="CONFIG", help="YAML configuration file")
    add_set_option(p, "override a config key, e.g. --set analysis.filter=etkf (repeatable)")
    p.add_argument("--cycle", type=int, default=0, help="cycle number (keys random streams)")
    add_members_option(p, "analyse only these member numbers, e.g. 1,2,4 (sets ensemble.ids "
                       "and ensemble.size; the cycle driver passes the members that succeeded)")
    p.add_argument(
        "--force",
        action="store_true",
        help="assimilate even if the run record shows the members already hold this "
        "analysis (same config, observation files and cycle): the observations are "
        "then assimilated a second time",
    )
    p.set_defaults(func=run, exit_fast=True)  # a pool's analysis: no 0.2 s teardown


def run(args: argparse.Namespace) -> int:
    comm = MPI.COMM_WORLD
    config = load_config(args.config, args.overrides)
    members = args.members
    if os.environ.get(PRESTART_ENV):  # started ahead by a pool worker: warm up, then wait
        go = await_go(comm, lambda: _warm(config))
        if go is None:  # not needed after all: nothing was read or written
            return 0
        members = member_list(go["members"]) if "members" in go else members
    config = select_members(config, members)
    with PhaseProgress.for_rank(comm.rank) as progress:
        report = run_analysis(config, comm, cycle=args.cycle, force=args.force,
                              command=command_line(), progress=progress)
    if comm.rank == 0:
        if report.took_over:
            print(f"ensio analyse: took over the stale lock of {report.took_over}",
                  file=sys.stderr)
        for line in report.lines():
            print(line, flush=True)
        target = os.environ.get("ENSIO_REPORT")
        if target:  # a pool worker asks for the I/O seconds of the task (records)
            io = sum(report.seconds.get(k, 0.0) for k in ("read", "write", "products"))
            Path(target).write_text(json.dumps({"io_seconds": io, "seconds": report.seconds}))
    return 0


def _warm(config) -> None:
    """What an analysis started ahead loads before its go (:mod:`ensio.workflow.prestart`)."""
    if config.analysis is not None:
        from ..analysis.warm import warm_for

        warm_for(config.analysis, config.ensemble.size)
