"""``ensio bench transfer``: the command line of :func:`ensio.bench.transfer.bench_transfer`."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_arguments", "run"]


def _cases(text: str) -> tuple[str, ...]:
    from ..bench.transfer_cases import CASES

    out = tuple(x.strip() for x in text.split(",") if x.strip())
    for name in out:
        if name not in CASES:
            raise argparse.ArgumentTypeError(f"unknown case {name!r} (known: {', '.join(CASES)})")
    if not out:
        raise argparse.ArgumentTypeError("name at least one case")
    return out


def _positive(kind: type) -> object:
    def parse(text: str) -> object:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``ensio bench transfer``."""
    from ..bench.transfer import TransferBenchSettings

    d = TransferBenchSettings()
    p.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                   help="run directories (specs, logs, results of both programs; the data "
                        "files are removed after each run) (default: a temporary directory)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write all numbers")
    p.add_argument("--plot", type=Path, default=None, metavar="PNG",
                   help="bar chart of the bandwidth per case")
    p.add_argument("--files", type=_positive(int), default=d.files, metavar="N",
                   help=f"files the producer writes (default {d.files})")
    p.add_argument("--size-mb", type=_positive(float), default=d.size_mb, metavar="S",
                   help=f"MiB of data per file (default {d.size_mb:g})")
    p.add_argument("--fields", type=_positive(int), default=d.fields, metavar="F",
                   help=f"float32 2-D variables per file (default {d.fields})")
    p.add_argument("--repeat", type=_positive(int), default=d.repeat, metavar="R",
                   help=f"runs per case, interleaved; the best is reported (default {d.repeat})")
    p.add_argument("--cases", type=_cases, default=d.cases, metavar="NAME[,NAME…]",
                   help=f"cases to run (default all: {','.join(d.cases)}); cases the transfer "
                        "layer does not support yet are reported as not measured")
    p.add_argument("--no-warm", dest="warm", action="store_false",
                   help="do not touch and free the memory a run will allocate before its start "
                        "(on a VM with lazily backed memory the first touch of a page then "
                        "dominates the times)")
    p.add_argument("--poll-ms", type=_positive(float), default=d.poll_ms, metavar="MS",
                   help=f"poll interval of the *-poll cases (default {d.poll_ms:g})")
    p.add_argument("--compute-ms", type=float, default=d.compute_ms, metavar="MS",
                   help="the producer computes this long after each variable it writes, as a "
                        f"model between outputs (default {d.compute_ms:g}: back to back)")
    p.add_argument("--warmup", type=int, default=d.warmup, metavar="N",
                   help=f"rounds of every case run first and not counted (default "
                        f"{d.warmup}: the first met empty daemons)")
    p.add_argument("--launches", type=int, default=d.launches, metavar="N",
                   help=f"launches of `ensio run --transfer … -- true` whose median is "
                        f"launch_ms (default {d.launches}; 0: not measured)")
    p.add_argument("--pool-mb", type=float, default=None, metavar="MIB",
                   help="the staging daemons' pool of pre-faulted memory for new files "
                        "(ensio transfer daemon --pool-mb; default: the daemon's, 256; "
                        "0 measures without it)")


def run(args: argparse.Namespace) -> int:
    """Measure, print the table, write JSON and PNG."""
    from rich.console import Console

    from ..bench.transfer import TransferBenchSettings, bench_transfer
    from ..bench.transfer_report import plot_result, result_table
    from .benchout import run_with_status, write_results

    st = TransferBenchSettings(files=args.files, size_mb=args.size_mb, fields=args.fields,
                               repeat=args.repeat, cases=args.cases, poll_ms=args.poll_ms,
                               warm=args.warm, compute_ms=args.compute_ms,
                               pool_mb=args.pool_mb, launches=max(0, args.launches),
                               warmup=max(0, args.warmup))
    res = run_with_status("ensio bench transfer",
                          lambda on_step: bench_transfer(st, args.workdir, on_step))
    Console().print(result_table(res))
    write_results(res, args.json, args.plot, plot_result)
    return 0
