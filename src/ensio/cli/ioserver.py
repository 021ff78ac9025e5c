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
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from .options import add_set_option

__all__ = ["add_parser", "run", "refuse", "guard_parse_errors"]


def refuse(text: str) -> int:
    """A server rank's own error before its setup (its command line): exit status 2.

    It goes through the setup handshake (:mod:`ensio.ioserver.handshake`), so the
    model ranks of the MPMD job learn it and end too (one line) instead of waiting
    in their first collective for a process that exited; alone, this process
    prints the line itself.
    """
    from mpi4py import MPI

    from ..ioserver.handshake import SetupFailed, exchange_status

    try:
        exchange_status(MPI.COMM_WORLD, True, text)
    except SetupFailed:
        return 2
    raise AssertionError("a setup with an error raises SetupFailed")


def guard_parse_errors(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Route argparse's errors of ``ensio ioserver CONFIG ...`` through :func:`refuse`.

    argparse would print the usage and exit before MPI starts, and the model
    ranks would wait for this process forever. Not for ``convert``/``recover``
    (no MPMD job).
    """
    if list(argv[1:2]) in (["convert"], ["recover"]):
        return

    def error(message: str) -> NoReturn:
        raise SystemExit(refuse(f"command line: {message}"))

    parsers = [parser]
    for action in parser._actions:  # the sub-command parsers (argparse keeps no public list)
        if isinstance(action, argparse._SubParsersAction):
            parsers += list(action.choices.values())
    for p in parsers:
        p.error = error  # type: ignore[method-assign]


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
        return refuse(f"command line: {args.source or '-o'}: only convert takes a second "
                      "argument or -o")
    from mpi4py import MPI

    from ..ioserver import start
    from ..ioserver.handshake import SetupFailed

    try:  # the config is read inside start: its errors reach every rank of the job
        start(MPI.COMM_WORLD, args.config, context=args.context, role="server",
              overrides=args.overrides)
    except SetupFailed:
        return 2  # the one line is out (a model rank or the first failed server printed it)
    return 0
