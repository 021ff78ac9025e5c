"""The ``ensio`` command: thin argument parsing over the library.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``
(which sets ``func``, a callable ``(args) -> int``). Errors ensio understands
(bad config, bad input files, a locked ensemble) and every operating-system
error (permission, full disk, I/O error) are printed as one line on stderr
naming the file, exit 2; Ctrl-C exits 130.

When the command line names a sub-command, only that sub-command's module is
imported (and ``ensio --version`` imports none): building every parser imports
the whole library (MPI, the analysis), and commands started once per member and cycle (``ensio model
synthrun``, ``ensio model l96 run``) must start fast.
"""

from __future__ import annotations

import os
import sys

from .. import __version__

TYPE_CHECKING = False  # typing itself costs ~15 ms of every launch (issue 28 item 2)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

#: Subcommand modules, in the order ``ensio --help`` lists them.
COMMANDS = (
    "synth",
    "analyse",
    "index",
    "cycle",
    "report",
    "worker",
    "bench",
    "recover",
    "model",
    "ioserver",
    "ioclient",
    "run",
    "transfer",
    "stage",
    "example",
)


def build_parser(commands: Sequence[str] = COMMANDS) -> argparse.ArgumentParser:
    """The ``ensio`` parser with the sub-commands ``commands`` (default: all)."""
    import argparse
    import importlib

    parser = argparse.ArgumentParser(
        prog="ensio",
        description="High-throughput ensemble data assimilation.",
    )
    parser.add_argument("--version", action="version", version=f"ensio {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in commands:
        importlib.import_module(f".{name}", __package__).add_parser(sub)
    return parser


def commands_for(argv: Sequence[str]) -> tuple[str, ...]:
    """The sub-commands whose parsers ``argv`` needs: the one it names, else all.

    ``ensio --help``, ``ensio --version`` and a misspelt command get the full
    parser (so its help and its error list every command).
    """
    first = next((a for a in argv if not a.startswith("-")), None)
    return (first,) if first in COMMANDS else COMMANDS


def main(argv: Sequence[str] | None = None) -> int:
    whole_process = argv is None  # the process's own command line (not a caller's list)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--version"]:
        # what argparse's version action does, without building the sub-command
        # parsers (which import every sub-command's module): ~1 s saved
        print(f"ensio {__version__}")
        raise SystemExit(0)
    if argv[:1] == ["run"]:
        # ensio run --transfer: exec COMMAND from its launch record when it holds (standard
        # library only); otherwise, on to the full path below (which writes the record)
        from ..transfer.launch import launch_recorded

        launch_recorded(argv[1:])
    from ..errors import ConfigError, EnsioError, os_error_message

    parser = build_parser(commands_for(argv))
    if argv[:1] == ["ioserver"]:  # an MPMD job's server ranks: errors reach every rank
        from .ioserver import guard_parse_errors

        guard_parse_errors(parser, argv)
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        if code == 0 and whole_process and getattr(args, "exit_fast", False):
            _exit_fast()
        return code
    except (ConfigError, EnsioError) as exc:
        _report(f"ensio: error: {_one_line(str(exc))}")
        return 2
    except OSError as exc:  # not wrapped where it happened: the file, without the step
        _report(f"ensio {args.command}: error: {os_error_message(exc, 'access')}")
        return 2
    except KeyboardInterrupt:
        print("ensio: interrupted", file=sys.stderr)
        return 130


def _report(line: str) -> None:
    """Print an error once: MPI ranks agree on their errors, so rank 0 speaks for all."""
    if _MPI_RANK in (None, 0):
        print(line, file=sys.stderr)


# the launcher's rank variable: read without importing mpi4py (this module starts every command)
_MPI_RANK = next((int(os.environ[v]) for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
                  if os.environ.get(v, "").isdigit()), None)


def _one_line(text: str) -> str:
    return " ".join(text.split()) if "\n" in text else text


def _exit_fast() -> None:
    """End a command whose work is committed without tearing the interpreter down.

    With numpy, scipy, numba, h5py and netCDF4 loaded, Python's orderly exit takes
    about 0.2 s per process, which a pool's analysis task pays on every cycle's
    critical path. Exit handlers still run and MPI is finalized; a command that
    left threads running (a background copy) exits the normal way, and so does a
    job of several ranks: under the mpich wheel's launcher, ranks that leave with
    ``_exit`` right after ``MPI_Finalize`` were often reported killed (signal 9).
    """
    import atexit
    import threading

    mpi = sys.modules.get("mpi4py.MPI")
    if threading.active_count() > 1 or (mpi is not None and mpi.Is_initialized()
                                        and not mpi.Is_finalized()
                                        and mpi.COMM_WORLD.Get_size() > 1):
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
