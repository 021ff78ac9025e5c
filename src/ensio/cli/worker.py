"""``ensio worker LIST``: one job of the dynamic job scheme (drains a to-do list).

Jobs started by ensio itself use the lighter ``python -m ensio.workflow.worker``
(same arguments, no import of the other sub-commands); this entry is for job
scripts written by hand.
"""

from __future__ import annotations

import argparse

from ..workflow.worker import add_arguments, run_from_args

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``worker`` sub-command."""
    p = subparsers.add_parser(
        "worker",
        help="drain a cycle's to-do list (one job of the dynamic job scheme)",
        description=(
            "Lease the first task of the to-do list, run it, mark it done, repeat until "
            "nothing is left that this job may take. On SIGTERM/SIGUSR1 or at its own "
            "time limit (minus a margin) the running member is stopped and put back at "
            "the front of the list, and the job exits with status 0."
        ),
    )
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the worker; exit status 0 (done or out of time), 1 (the list failed),
    3 (a task cannot fit in any job)."""
    return run_from_args(args)
