"""``ensio bench modes``: the command line of :func:`ensio.bench.modes.bench_modes`."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..bench.modes import ModesSettings
from ..bench.queueing import LOADS, QueueModel
from ..errors import EnsioError
from .options import add_set_option

__all__ = ["add_arguments", "loads_arg", "run", "settings_from_args"]


def loads_arg(text: str) -> dict[str, float]:
    """``NAME=RHO[,NAME=RHO…]`` → load presets, each ρ in [0, 1)."""
    out = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise argparse.ArgumentTypeError(f"expected NAME=RHO[,NAME=RHO…], got {text!r}")
        try:
            rho = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: ρ must be a number, got {value!r}") \
                from None
        if not 0 <= rho < 1:
            raise argparse.ArgumentTypeError(f"{name}: ρ must be in [0, 1), got {rho}")
        out[name.strip()] = rho
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``ensio bench modes``."""
    d = QueueModel()
    p.add_argument("config", type=Path, metavar="CONFIG",
                   help="ensio cycle config with workflow.online.command "
                        "(e.g. examples/lorenz96/cycle.yaml)")
    p.add_argument("--cycles", type=int, default=4, metavar="K",
                   help="cycles per mode, one submission each (default 4)")
    p.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                   help="parent of the run directories (default: a temporary directory)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="write all numbers as JSON")
    p.add_argument("--plot", type=Path, default=None, metavar="PNG",
                   help="stacked bar chart (queuing, running, I/O) per mode and setting")
    add_set_option(p, "override a config key in both modes (repeatable)")
    p.add_argument("--loads", type=loads_arg, default=dict(LOADS), metavar="NAME=RHO,…",
                   help="load presets of the queue model (default "
                        + ",".join(f"{k}={v:g}" for k, v in LOADS.items()) + ")")
    p.add_argument("--base", type=float, default=d.base,
                   help=f"model: size-independent wait in cycle units (default {d.base:g})")
    p.add_argument("--per-node", type=float, default=d.per_node,
                   help=f"model: wait per node**alpha in cycle units (default {d.per_node:g})")
    p.add_argument("--alpha", type=float, default=d.alpha,
                   help=f"model: growth exponent with the node count (default {d.alpha:g})")
    p.add_argument("--shape", type=float, default=d.shape,
                   help=f"model: Gamma shape of the random factor, 1 = exponential "
                        f"(default {d.shape:g})")
    p.add_argument("--unit", type=float, default=None, metavar="SECONDS",
                   help="model time unit (default: measured mean online cycle time)")
    p.add_argument("--nodes-per-member", type=float, default=None, metavar="N",
                   help="nodes of one member (default workflow.online.tasks_per_member)")
    p.add_argument("--draws", type=int, default=200, metavar="N",
                   help="replays of every measured cycle per load (default 200)")
    p.add_argument("--seed", type=int, default=1, help="seed of the queue waits (default 1)")
    p.add_argument("--slurm", choices=("auto", "yes", "no"), default="auto",
                   help="also run both modes through SLURM (auto: when sinfo answers)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary run directories")


def settings_from_args(args: argparse.Namespace) -> ModesSettings:
    """The :class:`ModesSettings` of the parsed arguments."""
    try:
        model = QueueModel(base=args.base, per_node=args.per_node, alpha=args.alpha,
                           shape=args.shape)
    except ValueError as exc:
        raise EnsioError(f"bench modes: {exc}") from None
    return ModesSettings(cycles=args.cycles, overrides=tuple(args.overrides), model=model,
                         loads=args.loads, unit=args.unit,
                         nodes_per_member=args.nodes_per_member, draws=args.draws,
                         seed=args.seed, slurm=args.slurm, keep=args.keep)


def run(args: argparse.Namespace) -> int:
    """``ensio bench modes``: run, print the table, write JSON and plot."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..bench.modes import bench_modes
    from ..bench.modes_output import plot_result, result_table
    from .benchout import write_results

    err = Console(stderr=True)
    settings = settings_from_args(args)
    with Progress(TextColumn("ensio bench modes: {task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=err, transient=False, disable=not err.is_terminal) as progress:
        task = progress.add_task("starting", total=None)

        def on_step(label: str, done: int, total: int) -> None:
            progress.update(task, description=label, completed=done, total=total)
            if not err.is_terminal:
                err.print(f"ensio bench modes: {label}")

        res = bench_modes(args.config, args.workdir, settings, on_step=on_step)
        progress.update(task, description="done", completed=progress.tasks[0].total or 0)
    out = Console()
    if not out.is_terminal:
        out = Console(width=150)
    out.print(result_table(res))
    write_results(res, args.json, args.plot, plot_result)
    return 0
