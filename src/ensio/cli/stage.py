"""``ensio stage in|out CONFIG``: copy member files between the global and node-local disks."""

from __future__ import annotations

import argparse
from pathlib import Path

from .options import add_members_option, add_set_option, select_members

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``stage`` sub-command."""
    p = subparsers.add_parser(
        "stage",
        help="copy member files (or tiles) to or from the node-local directories",
        description=(
            "in: copy every file of ensemble.members (each tile of a {tile} pattern) to the "
            "node-local directory io.local_dir of the rank that holds it; out: copy the local "
            "files back. File f = m*P + p (member m, 0-based, tile p of P) belongs to rank "
            "f mod R, so with R = N_e*P ranks rank m*P+p holds tile p of member m; its local "
            "copy is io.local_dir ({host}, {rank} filled in for that rank) / the file's name. "
            "Run under mpiexec with the ranks and hosts of the analysis: one process per node "
            "copies its ranks' files. Alone, one process stands for --ranks ranks on this "
            "host. Copies are written beside their target, verified and renamed into place "
            "only when every copy of every node succeeded; files already up to date "
            "(same size and modification time, or same sha256 with --checksum) are skipped. "
            "--members stages a selection, numbered within it as the analysis of the "
            "same selection numbers it."
        ),
    )
    p.add_argument("direction", choices=("in", "out"), help="in: global -> local; out: back")
    p.add_argument("config", type=Path, metavar="CONFIG", help="YAML configuration file")
    add_set_option(p)
    add_members_option(p, "stage only these member numbers, e.g. 1,2,4, placed as `ensio "
                       "analyse --members` with the same list reads them (sets ensemble.ids "
                       "and ensemble.size)")
    p.add_argument("--checksum", action="store_true",
                   help="compare sha256 to skip, and read every copy back to verify it")
    p.add_argument("--ranks", type=int, default=None, metavar="R",
                   help="run alone: stage for R ranks on this host (default N_e*P)")
    p.add_argument("--threads", type=int, default=4, metavar="T",
                   help="copies in flight per node (default 4)")
    p.add_argument("--no-fsync", action="store_true",
                   help="do not flush copies (faster; not safe against power loss)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from ..config import load_config
    from ..io.node.placenode import place_ensemble
    from ..parallel.nodes import this_host

    comm = MPI.COMM_WORLD
    config = select_members(load_config(args.config, args.overrides), args.members)
    report = place_ensemble(config, args.direction, comm, host=this_host(), checksum=args.checksum,
                   threads=max(1, args.threads), n_ranks=args.ranks, fsync=not args.no_fsync)
    if comm.rank == 0:
        print(report.line(f"stage {args.direction}"), flush=True)
    return 0
