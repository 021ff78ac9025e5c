"""``ensio bench …``: benchmark drivers (a sub-command group).

``bench`` is a group so later drivers (``bench analysis``, ``bench pool``)
register beside ``io`` by adding one entry to :data:`COMMANDS`. Run under
``mpiexec -n N_mpi``; only rank 0 prints and writes the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .bench_shuffle import add_command as _add_shuffle
from .options import add_set_option

__all__ = ["COMMANDS", "add_parser", "main", "run", "run_analysis", "run_io", "run_startup"]


def _add_io(sub: Any) -> None:
    p = sub.add_parser(
        "io", help="parallel ensemble read/write vs. raw limit and naive scheme",
        description="Read all members into the distributed ensemble matrix and write them "
                    "back in place (identity), REPEAT times, next to two baselines on the same "
                    "byte ranges: the raw limit (one process, plain pread/pwrite) and a naive "
                    "scheme (rank 0 reads with netCDF4 and scatters). Run under mpiexec.",
    )
    p.add_argument("config", metavar="CONFIG", help="ensio YAML config (e.g. from ensio synth)")
    p.add_argument("--repeat", type=int, default=3, metavar="N",
                   help="repeats; the best time of each measurement is reported (default 3)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="write the result as JSON (rank 0)")
    add_set_option(p, "override a config key, e.g. --set io.journal=false (repeatable)")
    p.set_defaults(bench_run=run_io)


def _add_analysis(sub: Any) -> None:
    p = sub.add_parser(
        "analysis", help="batched local analysis vs. the pointwise reference, per phase",
        description="Read the members once (not timed), then run the analysis of CONFIG with "
                    "its kernel and with kernel: pointwise in the same run, REPEAT times each: "
                    "seconds per phase (slowest rank), GFLOP/s of the GEMM part, speed-up, and "
                    "the largest relative difference of the two analyses. Run under mpiexec.",
    )
    p.add_argument("config", metavar="CONFIG",
                   help="ensio YAML config with observations and an analysis section")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="repeats of each kernel; the best time is reported (default 1)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="write the result as JSON (rank 0)")
    p.add_argument("--weight-stride", type=int, action="append", default=None, metavar="K",
                   help="instead of the kernel comparison: the exact analysis against weight "
                        "interpolation with stride K (repeatable): speed-up per phase and "
                        "increment_rel_rms")
    add_set_option(p, "override a config key, e.g. --set analysis.tile_points=64 (repeatable)")
    p.set_defaults(bench_run=run_analysis)


def _add_pool(sub: Any) -> None:
    from .bench_pool import add_arguments, run

    p = sub.add_parser(
        "pool", help="dynamic job pool: per-task overhead and makespan / ideal",
        description="(a) 1000 no-op tasks on N_j local workers: per-task overhead (median, "
                    "p99) and tasks/s; (b) 100 tasks of 0.2 s: makespan / ideal (goal <= 1.05). "
                    "No MPI needed.",
    )
    add_arguments(p)
    p.set_defaults(bench_run=run)


def _add_modes(sub: Any) -> None:
    from .bench_modes import add_arguments, run

    p = sub.add_parser(
        "modes", help="offline vs online mode: time to solution, measured and under a queue model",
        description="Run the same K-cycle experiment offline (job pool) and online (one coupled "
                    "MPI job), one submission per cycle; per cycle total, queuing, running and "
                    "I/O from the records; replay every cycle under a batch-queue model at low "
                    "and high machine load; with SLURM, also both modes through sbatch. "
                    "No mpiexec needed around it.",
    )
    add_arguments(p)
    p.set_defaults(bench_run=run)


def _add_ioserver(sub: Any) -> None:
    from .bench_ioserver import add_arguments, run

    p = sub.add_parser(
        "ioserver", help="output cost of a computing model: no output, sync, attached, server",
        description="Run the stencil model (P ranks, F 3-D fields every K steps) without "
                    "output and with the sync, attached and server (S servers) modes of the "
                    "I/O server; output cost (t - t_no_output) / t_no_output, client wait, and "
                    "the server cost projected to dedicated server cores. Starts its own "
                    "mpiexec jobs: no mpiexec needed around it.",
    )
    add_arguments(p)
    p.set_defaults(bench_run=run)


def _add_transfer(sub: Any) -> None:
    from .bench_transfer import add_arguments, run

    p = sub.add_parser(
        "transfer", help="netCDF files from a producer to a consumer: files vs direct transfer",
        description="A producer process writes N netCDF-4 files of S MiB and a consumer "
                    "process reads every variable of them, through plain files (page cache; "
                    "fsync) and through the transfer layer (ensio run --transfer): time from "
                    "the first write to the last byte read, speedups over the file "
                    "exchanges, bandwidth relative to memcpy. No mpiexec needed.",
    )
    add_arguments(p)
    p.set_defaults(bench_run=run)


def _add_startup(sub: Any) -> None:
    p = sub.add_parser(
        "startup", help="start-up time of ensio commands against bare Python",
        description="Time, as child processes, `ensio --version`, `ensio analyse` up to "
                    "reading, a worker up to its to-do list and `ensio run --transfer ... -- "
                    "true`, next to `python -c pass`: median (and minimum) of REPEAT runs "
                    "after one untimed run, the difference and ratio to bare Python, and "
                    "issue 24's targets. No mpiexec needed.",
    )
    p.add_argument("--repeat", type=int, default=7, metavar="N",
                   help="timed runs per command (default 7)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="write the result as JSON")
    p.set_defaults(bench_run=run_startup)


def run_startup(args: argparse.Namespace) -> int:
    """``ensio bench startup``: measure, print the table, write the JSON."""
    from rich.console import Console

    from ensio.bench.startup import bench_startup, startup_table

    from .benchout import run_with_status, write_results

    res = run_with_status("ensio bench startup",
                          lambda on_step: bench_startup(repeat=args.repeat, on_step=on_step))
    Console().print(startup_table(res))
    if res["note"]:
        Console(stderr=True).print(f"[bold yellow]note:[/] {res['note']}")
    write_results(res, args.json, None, lambda res, path: None)
    return 0


#: Sub-commands of ``ensio bench``: name → function adding its parser.
COMMANDS: dict[str, Callable[[Any], None]] = {"io": _add_io, "analysis": _add_analysis,
                                              "pool": _add_pool, "modes": _add_modes,
                                              "ioserver": _add_ioserver,
                                              "transfer": _add_transfer,
                                              "shuffle": _add_shuffle,
                                              "startup": _add_startup}


def add_parser(subparsers: Any) -> None:
    """Register the ``bench`` group on the ``ensio`` sub-command parser."""
    p = subparsers.add_parser("bench", help="benchmarks (io and analysis: run under mpiexec)",
                              description="Benchmark drivers; each writes a table and JSON.")
    configure(p)


def configure(p: argparse.ArgumentParser) -> None:
    """Add the ``bench`` sub-commands to ``p``."""
    sub = p.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)
    for add in COMMANDS.values():
        add(sub)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch to the selected benchmark."""
    return int(args.bench_run(args))


def run_io(args: argparse.Namespace) -> int:
    """``ensio bench io``: measure, print the table (rank 0), write the JSON (rank 0)."""
    from ensio.bench.io import bench_io, result_table

    _run_mpi_bench(
        args, "io", bench_io, result_table,
        lambda res: "ensio's matrix differs from the netCDF4 reference read (naive scheme)"
        if res["verified"] is False else None,
    )  # fmt: skip
    return 0


def run_analysis(args: argparse.Namespace) -> int:
    """``ensio bench analysis``: measure, print the table (rank 0), write the JSON (rank 0)."""
    from ensio.bench.analysis import bench_analysis, result_table

    if getattr(args, "weight_stride", None):
        return _run_winterp(args)
    res = _run_mpi_bench(
        args, "analysis", bench_analysis, result_table,
        lambda res: f"the kernels disagree by more than {res['tolerance']:.0e} (relative)"
        if not res["agree"] else None,
    )  # fmt: skip
    return 0 if res["agree"] else 1


def _run_winterp(args: argparse.Namespace) -> int:
    """``ensio bench analysis --weight-stride K …``: exact vs weight-interpolated analysis."""
    import functools

    from ensio.bench.analysis_winterp import bench_weight_interpolation, winterp_table

    measure = functools.partial(bench_weight_interpolation, strides=args.weight_stride)
    _run_mpi_bench(args, "analysis", measure, winterp_table, lambda res: None)
    return 0


def _run_mpi_bench(
    args: argparse.Namespace,
    name: str,
    measure: Callable[..., dict[str, Any]],
    table: Callable[[dict[str, Any]], Any],
    warning: Callable[[dict[str, Any]], str | None],
) -> dict[str, Any]:
    """The shared shell of the MPI benchmarks: config, a status line, table, warning, JSON.

    ``measure(config, comm, repeat=, on_step=)`` runs on every rank and returns
    the result everywhere; only rank 0 prints and writes.
    """
    from mpi4py import MPI
    from rich.console import Console

    from ensio.config import load_config

    comm = MPI.COMM_WORLD
    config = load_config(args.config, args.overrides)
    console = Console(stderr=True)
    show = comm.rank == 0 and console.is_terminal
    title = f"ensio bench {name}"
    with console.status(title, spinner="dots") if show else contextlib.nullcontext() as status:
        def on_step(label: str) -> None:
            if status is not None:
                status.update(f"{title}: {label}")

        res = measure(config, comm, repeat=args.repeat, on_step=on_step)
    if comm.rank == 0:
        res["config"] = str(Path(args.config).resolve())
        res["overrides"] = list(args.overrides)
        Console().print(table(res))
        message = warning(res)
        if message is not None:
            console.print(f"[bold red]warning:[/] {message}")
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(res, indent=2) + "\n")
    return res


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m ensio.cli.bench io …``), same as ``ensio bench``."""
    from ensio.config import ConfigError
    from ensio.errors import EnsioError

    p = argparse.ArgumentParser(prog="ensio bench")
    configure(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except (ConfigError, EnsioError) as exc:
        print(f"ensio bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
