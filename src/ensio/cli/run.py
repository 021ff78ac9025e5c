"""``ensio run --transfer CONFIG --component NAME -- COMMAND ...``.

Starts COMMAND (unmodified: a model, ``cdo``, ``nccopy``, ``ensio analyse``) so
that the files of the transfer config's connections move between components through
memory on this host instead of the file system. ``ensio run`` becomes COMMAND
(``exec``): the exit status is COMMAND's.

A launch whose record holds never reaches this module: ``cli/main.py`` hands it to
:mod:`ensio.transfer.launch` before argparse is imported. ``--launcher`` prints the path
of ``ensio-launch`` (:mod:`ensio.transfer.launcher`), the same command without Python.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``run`` sub-command."""
    p = subparsers.add_parser(
        "run",
        help="run a program whose files are transferred through memory (--transfer)",
        description=(
            "Run COMMAND with the transfer interposer: files of the config's connections "
            "that COMMAND's component produces are held in memory by the per-host staging "
            "daemon (started if absent) and handed to the consumers, without the file "
            "system. The interposer is compiled on first use with the system C compiler."
        ),
    )
    p.add_argument("--transfer", metavar="CONFIG",
                   help="transfer config (YAML: components, connections); required")
    p.add_argument("--component", metavar="NAME",
                   help="the component COMMAND belongs to; required")
    p.add_argument("--socket-dir", metavar="DIR",
                   help="the daemon's directory (default: $ENSIO_TRANSFER_DIR, "
                        "$XDG_RUNTIME_DIR/ensio-transfer or /tmp/ensio-transfer-UID)")
    p.add_argument("--launcher", action="store_true",
                   help="print the path of ensio-launch (building it first if needed): the "
                        "same command without Python, for job scripts, and exit")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the program and its arguments")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Prepare, then exec COMMAND (returns only if it cannot be started)."""
    if args.launcher:
        from ..transfer.launcher import launcher

        print(launcher())
        return 0
    from ..transfer.run import exec_command, prepare

    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    for option, value in (("--transfer", args.transfer), ("--component", args.component)):
        if value is None:
            print(f"ensio run: error: the following arguments are required: {option}",
                  file=sys.stderr)
            return 2
    if not argv:
        print("ensio run: error: no COMMAND given (ensio run --transfer T --component C "
              "-- COMMAND ...)", file=sys.stderr)
        return 2
    env = prepare(args.transfer, args.component, socket_dir=args.socket_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        exec_command(argv, env)
    except FileNotFoundError:
        print(f"ensio run: error: command not found: {argv[0]}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"ensio run: error: cannot execute {argv[0]}: permission denied", file=sys.stderr)
        return 126
