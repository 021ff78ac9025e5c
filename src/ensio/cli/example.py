"""``ensio example ...``: complete experiments with real models, set up and run by one command.

``ensio example veros DIR [--members N] [--cycles C] [--days D] [--json FILE]``
    :mod:`ensio.models.veros.osse`: the OSSE with the unmodified Veros ``acc`` ocean
    (spin-up, truth, ensemble, observations, ``ensio cycle``, free ensemble, report and
    plots under ``DIR``). Needs the extra ``veros`` (``pip install -e '.[veros]'``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``example`` and its sub-commands."""
    p = subparsers.add_parser(
        "example", help="complete experiments with real models (the Veros OSSE)",
        description="Complete experiments with real models, set up and run by one command.")
    sub = p.add_subparsers(dest="example", metavar="EXAMPLE", required=True)
    v = sub.add_parser(
        "veros", help="OSSE with the unmodified Veros acc ocean: truth, ensemble, "
                      "observations, ensio cycle with the LETKF, free ensemble, report",
        description="Set up and run an observing-system simulation experiment with the "
                    "unmodified acc setup of Veros 1.7 under DIR: spin-up, truth run, "
                    "initial ensemble, synthetic SST and T/S profile observations, ensio "
                    "cycle (each member a veros run job, LETKF with horizontal and vertical "
                    "localization), a free ensemble beside it, then a JSON report and PNG "
                    "plots. Rerunning the same command continues an interrupted run.")
    v.add_argument("dir", type=Path, metavar="DIR", help="experiment directory")
    v.add_argument("--members", type=int, default=16, help="ensemble size (default 16)")
    v.add_argument("--cycles", type=int, default=20, help="assimilation cycles (default 20)")
    v.add_argument("--days", type=float, default=5.0,
                   help="model days per cycle (default 5)")
    v.add_argument("--json", type=Path, metavar="FILE",
                   help="the report (default DIR/osse.json)")
    v.add_argument("--spinup-days", type=float, default=360.0,
                   help="spin-up from rest before the ensemble is drawn (default 360, "
                        "at least 10)")
    v.add_argument("--spacing-days", type=float, default=6.0,
                   help="days between the spin-up states of the members, a multiple of 1.5 "
                        "so that all are at the same Veros time level (default 6)")
    v.add_argument("--jobs", type=int, default=2,
                   help="member runs at a time (workflow.jobs; default 2)")
    v.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    v.add_argument("--template", type=Path, metavar="YAML",
                   help="the config template (default examples/veros/cycle.yaml of the "
                        "source tree)")
    v.add_argument("--no-free", action="store_true",
                   help="skip the free ensemble (no rmse_free_* in the report)")
    v.set_defaults(func=run_veros)


def run_veros(args: argparse.Namespace) -> int:
    from ..models.veros.osse import OsseOptions, run_osse
    from ..models.veros.run import VerosFailed

    opts = OsseOptions(members=args.members, cycles=args.cycles, days=args.days,
                       spinup_days=args.spinup_days, spacing_days=args.spacing_days,
                       seed=args.seed, jobs=args.jobs, template=args.template,
                       free=not args.no_free)
    t0 = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f} s] {line}", flush=True)

    try:
        report = run_osse(args.dir, opts, args.json, log)
    except VerosFailed as exc:
        print(f"ensio example veros: error: {exc}", file=sys.stderr)
        return 1
    for v in ("temp", "salt"):
        free = report.get(f"rmse_free_{v}")
        log(f"{v}: RMSE analysis {report[f'rmse_analysis_{v}']:.4g}"
            + (f", free {free:.4g} (ratio {report[f'rmse_analysis_{v}'] / free:.2f})"
               if free else "")
            + f", spread/RMSE {report[f'spread_ratio_{v}']:.2f}")
    return 0
