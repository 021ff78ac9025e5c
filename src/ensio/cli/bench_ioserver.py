"""``ensio bench ioserver``: the command line of :func:`ensio.bench.ioserver.bench_ioserver`."""

from __future__ import annotations

import argparse
from pathlib import Path

from .options import positive_int_list

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``ensio bench ioserver``."""
    from ..bench.ioserver import MODELS, IOServerBenchSettings

    d = IOServerBenchSettings()
    p.add_argument("--model", choices=MODELS, default=d.model,
                   help="the stencil model in Python (ensio model stencil, the default) or "
                        "its Fortran twin, built with ensio ioclient build into DIR/fortran "
                        "(needs mpicc and gfortran); server mode then runs MPMD with "
                        "ensio ioserver")
    p.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                   help="keep every run's iodef, log and output files here "
                        "(default: a temporary directory, kept)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write all numbers")
    p.add_argument("--plot", type=Path, default=None, metavar="PNG",
                   help="bar chart of the output cost per mode")
    p.add_argument("--ranks", type=int, default=d.ranks, metavar="P",
                   help=f"model ranks (default {d.ranks})")
    p.add_argument("--servers", type=positive_int_list("server counts"), default=d.servers,
                   metavar="S[,S…]",
                   help="server counts of the server mode (default 1,2)")
    for name, help_ in (("nx", "longitudes"), ("ny", "latitudes"), ("nz", "levels"),
                        ("fields", "3-D output fields"),
                        ("every", "output every K steps (a step is 15 min: 24 = 6-hourly)"),
                        ("steps", "model steps"), ("sweeps", "stencil sweeps per step"),
                        ("repeat", "runs per mode; the best is reported"),
                        ("compression", "zlib level of the output file, 0 = none")):
        p.add_argument(f"--{name}", type=int, default=getattr(d, name),
                       help=f"{help_} (default {getattr(d, name)})")


def run(args: argparse.Namespace) -> int:
    """Measure, print the table, write JSON and PNG."""
    from rich.console import Console

    from ..bench.ioserver import IOServerBenchSettings, bench_ioserver, plot_result, result_table
    from .benchout import run_with_status, write_results

    st = IOServerBenchSettings(ranks=args.ranks, nx=args.nx, ny=args.ny, nz=args.nz,
                               fields=args.fields, every=args.every, steps=args.steps,
                               sweeps=args.sweeps, repeat=args.repeat, servers=args.servers,
                               compression=args.compression, model=args.model)
    res = run_with_status("ensio bench ioserver",
                          lambda on_step: bench_ioserver(st, args.workdir, on_step))
    Console().print(result_table(res))
    write_results(res, args.json, args.plot, plot_result)
    return 0
