"""``ensio bench pool``: the command line of :func:`ensio.bench.pool.bench_pool`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``ensio bench pool``."""
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="write the result as JSON")
    p.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                   help="directory of the to-do lists (default: a temporary directory)")
    p.add_argument("--jobs", type=int, default=4, metavar="N", help="N_j (default 4)")
    p.add_argument("--noop-tasks", type=int, default=1000, metavar="N",
                   help="tasks of case (a) (default 1000; 0 skips it)")
    p.add_argument("--sleep-tasks", type=int, default=100, metavar="N",
                   help="tasks of case (b) (default 100; 0 skips it)")
    p.add_argument("--sleep-seconds", type=float, default=0.2, metavar="S",
                   help="task length of case (b) (default 0.2)")
    p.add_argument("--repeat", type=int, default=3, metavar="N",
                   help="runs of case (b); the median is reported (default 3)")
    p.add_argument("--lock", choices=("auto", "flock", "lockf", "mkdir"), default="auto",
                   help="lock kind of the lists (default: detected)")
    p.add_argument("--keep", action="store_true", help="keep lists, records and logs")


def run(args: argparse.Namespace) -> int:
    """``ensio bench pool``: measure, print the table, write the JSON."""
    from rich.console import Console

    from ..bench.pool import bench_pool, result_table

    res = bench_pool(args.workdir, noop_tasks=args.noop_tasks, sleep_tasks=args.sleep_tasks,
                     sleep_seconds=args.sleep_seconds, repeat=args.repeat, jobs=args.jobs,
                     lock=args.lock, keep=args.keep,
                     on_step=lambda m: Console(stderr=True).print(f"ensio bench pool: {m}"))
    Console().print(result_table(res))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0
