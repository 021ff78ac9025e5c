"""``ensio worker LIST``: one job of the dynamic job scheme (drains a to-do list).

Jobs started by ensio run ``python -m ensio.cli.worker`` (same arguments):
this module imports only the worker, while ``ensio`` loads every sub-command
(MPI, the analysis) before parsing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config.errors import ConfigError
from ..config.workflow import parse_duration
from ..workflow.leases import TodoError
from ..workflow.worker import run_job

__all__ = ["add_arguments", "add_parser", "main", "run"]

DESCRIPTION = (
    "Lease the first task of the to-do list, run it, mark it done, repeat until nothing is "
    "left that this job may take. On SIGTERM/SIGUSR1 or at its own time limit (minus a "
    "margin) the running member is stopped and put back at the front of the list, and the "
    "job exits with status 0. Exit status 1: the list failed (e.g. the analysis was "
    "refused); 3: a task is expected to take longer than a whole job may run."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``ensio worker`` / ``python -m ensio.cli.worker``."""
    p.add_argument("todo", type=Path, metavar="LIST", help="the to-do list file of the cycle")
    p.add_argument("--time-limit", default=None, metavar="DURATION",
                   help="this job's wall-clock limit (seconds, HH:MM:SS or D-HH:MM:SS), "
                        "counted from the worker's start")
    p.add_argument("--margin", type=float, default=None, metavar="SECONDS",
                   help="seconds kept free before the limit (default: 10%% of it, at most 60)")
    p.add_argument("--job-id", default=None, help="job id for the records "
                   "(default: $ENSIO_JOB_ID, $SLURM_JOB_ID or the pid)")
    p.add_argument("--submitted", type=float, default=None, metavar="EPOCH",
                   help="submission time of the job (default: $ENSIO_SUBMITTED)")
    p.add_argument("--records", type=Path, default=None, metavar="FILE",
                   help="records file (default: the one named in the list)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``worker`` sub-command."""
    p = subparsers.add_parser(
        "worker", help="drain a cycle's to-do list (one job of the dynamic job scheme)",
        description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the worker; exit status 0 (done or out of time), 1 (the list failed),
    3 (a task cannot fit in any job)."""
    limit = (parse_duration(args.time_limit, "--time-limit")
             if args.time_limit is not None else None)
    return run_job(args.todo, time_limit=limit, margin=args.margin, job_id=args.job_id,
                   submitted=args.submitted, records=args.records, quiet=args.quiet)


def main(argv: list[str] | None = None) -> int:
    """``python -m ensio.cli.worker LIST …``: errors as one line, exit status 2."""
    p = argparse.ArgumentParser(prog="ensio worker", description=DESCRIPTION)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except (ConfigError, TodoError) as exc:
        print(f"ensio worker: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
