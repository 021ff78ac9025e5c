"""``ensio bench shuffle``: the command line of :func:`ensio.bench.shuffle.bench_shuffle`.

Started without ``mpiexec``: it writes the case and starts one ``mpiexec``
job per N_mpi, each running this same command with ``--worker SPEC`` (a
hidden option) to measure inside the job.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .options import positive_int_list

__all__ = ["add_arguments", "add_command", "run"]


def add_command(sub: Any) -> None:
    """Register ``ensio bench shuffle`` on the ``bench`` sub-parsers."""
    p = sub.add_parser(
        "shuffle", help="tiled members: files mode (N_io readers + scatter) vs group shuffle",
        description="The same tiled synthetic case through io.mode files and shuffle at "
                    "N_mpi = 2, 4, 8 (one mpiexec job each): seconds per phase, bytes moved "
                    "over MPI, partners per rank; a cost model fed with the measured costs "
                    "projects both to thousands of nodes. No mpiexec needed around it.",
    )
    add_arguments(p)
    p.set_defaults(bench_run=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``ensio bench shuffle``."""
    from ..bench.shuffle import ShuffleBenchSettings

    d = ShuffleBenchSettings()
    p.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                   help="keep the case, tiles, local directories and logs here "
                        "(default: a temporary directory, removed)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write all numbers")
    p.add_argument("--plot", type=Path, default=None, metavar="PNG",
                   help="measured phases and the projection, one PNG")
    p.add_argument("--ranks", type=positive_int_list("rank counts"), default=d.ranks,
                   metavar="N[,N…]",
                   help="N_mpi of the runs, multiples of --members (default 2,4,8)")
    for name, help_ in (("nx", "longitudes"), ("ny", "latitudes"), ("levels", "levels"),
                        ("members", "N_e"), ("repeat", "read+write cycles per mode; best"),
                        ("proj_members", "model: N_e"),
                        ("proj_ranks_per_node", "model: ranks per node"),
                        ("proj_max_nodes", "model: largest node count")):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(d, name),
                       help=f"{help_} (default {getattr(d, name)})")
    for name, help_ in (("proj_member_gb", "model: GB of state per member"),
                        ("proj_fs_gbs", "model: aggregate global file-system bandwidth, GB/s")):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(d, name),
                       help=f"{help_} (default {getattr(d, name)})")
    p.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)


def _worker(spec_path: Path) -> int:
    """Inside one ``mpiexec`` job: measure, rank 0 writes ``result.json`` beside the spec."""
    from mpi4py import MPI

    from ..bench.shuffle import measure

    spec = json.loads(spec_path.read_text())
    res = measure(spec, MPI.COMM_WORLD)
    if MPI.COMM_WORLD.rank == 0:
        (spec_path.parent / "result.json").write_text(json.dumps(res, indent=2) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    """Measure, print the table, write JSON and PNG."""
    if args.worker is not None:
        return _worker(args.worker)
    from rich.console import Console

    from ..bench.shuffle import ShuffleBenchSettings, bench_shuffle, result_table
    from ..bench.shuffle_model import plot_result
    from .benchout import run_with_status, write_results

    st = ShuffleBenchSettings(
        nx=args.nx, ny=args.ny, levels=args.levels, members=args.members, ranks=args.ranks,
        repeat=args.repeat, proj_members=args.proj_members, proj_member_gb=args.proj_member_gb,
        proj_ranks_per_node=args.proj_ranks_per_node, proj_max_nodes=args.proj_max_nodes,
        proj_fs_gbs=args.proj_fs_gbs,
    )
    bad = [n for n in st.ranks if n % st.members]
    if bad:
        from ..config.errors import ConfigError

        raise ConfigError(f"--ranks: {bad} not multiples of --members {st.members} (N_e x P)")
    res = run_with_status("ensio bench shuffle",
                          lambda on_step: bench_shuffle(st, args.workdir, on_step))
    Console().print(result_table(res))
    write_results(res, args.json, args.plot, plot_result)
    return 0
