"""``ensio ioserver CONFIG``: the server processes of an MPMD job.

``mpiexec -n P model : -n S ensio ioserver iodef.yaml`` — the model (Python,
C or Fortran) calls its client's start; these S processes declare themselves
servers in the same collective setup, serve until every model rank closed,
and exit 0 (or end the job with status 2 and a line naming the failed rank).
A setup error on any rank (a bad config here, a bad environment on a model
rank) is printed once and every rank exits 2 (:mod:`ensio.ioserver.handshake`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .options import add_set_option

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``ioserver`` sub-command."""
    p = subparsers.add_parser(
        "ioserver",
        help="run I/O server ranks of an MPMD job (mpiexec ... : -n S ensio ioserver CONFIG)",
        description=(
            "Serve the model ranks of an MPMD job: receive their fields, post-process them "
            "as the ioserver: section of CONFIG says and write CF-1.8 netCDF files. Start it "
            "as the last part of the mpiexec command line; it returns when every model rank "
            "closed its client."
        ),
    )
    p.add_argument("config", type=Path, metavar="CONFIG",
                   help="YAML file with an ioserver: section, or an XIOS iodef.xml; "
                        "'convert' to convert an iodef.xml to YAML; 'recover' to publish "
                        "what a killed server left in a directory")
    p.add_argument("source", nargs="?", default=None, metavar="IODEF_XML",
                   help="with CONFIG = convert: the iodef.xml to convert; with recover: "
                        "the output directory")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="with convert: the YAML file to write (default standard output)")
    p.add_argument("--context", default="model", help="label of the files' history (default model)")
    add_set_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if str(args.config) == "recover" and args.output is None:
        from .ioserver_recover import run_recover

        return run_recover(args)
    if str(args.config) == "convert":
        from .ioserver_convert import run_convert

        return run_convert(args)
    if args.source is not None or args.output is not None:
        from ..errors import ConfigError

        raise ConfigError(f"ensio ioserver: {args.source or '-o'}: only convert takes a "
                          "second argument or -o")
    from mpi4py import MPI

    from ..ioserver import start
    from ..ioserver.handshake import SetupFailed

    try:  # the config is read inside start: its errors reach every rank of the job
        start(MPI.COMM_WORLD, args.config, context=args.context, role="server",
              overrides=args.overrides)
    except SetupFailed:
        return 2  # the one line is out (a model rank or the first failed server printed it)
    return 0
