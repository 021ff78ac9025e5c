"""``ensio recover DIR``: finish or undo an interrupted in-place analysis write.

After a crash the member files in DIR may hold a mix of forecast and analysis
bytes; the undo journal next to them (see :mod:`ensio.io.txn.journal`) knows which.
DIR may be a node-local directory of ``io.mode: shuffle``: its journal names
the run's transaction and the global directory, whose run record decides
(forward if the transaction is recorded, else back; the global lock is taken
for the look-up, and an unreachable global directory is an error that
changes nothing), so every local directory of one run ends on the same side.
This command makes DIR consistent again and says in one line what it did, so
an operator (or a job script) can run it unconditionally before a restart.
It holds the ensemble lock while it works: while a run holds it, it refuses
(exit 2, naming the run) instead of undoing a write in progress.

``ensio recover --from-backup [--cycle N] CONFIG`` instead restores the files
the analysis works on (the node-local copies in ``io.mode: shuffle``, else the
member files) from the newest complete backup in ``io.backup_dir`` (or cycle
N's), checking its completion marker and every file's sha256 before any file
is replaced (:func:`ensio.io.node.backup.restore_from_backup`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import EnsioError, file_op
from ..io.txn.journal import JOURNAL_DIRNAME, recover
from ..io.txn.transaction import RecoveryReport
from ..locks import EnsembleLock, command_line
from .options import add_set_option

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``recover`` sub-command."""
    p = subparsers.add_parser(
        "recover",
        help="roll back (or finish) an interrupted in-place analysis write",
        description=(
            f"Look for an undo journal ({JOURNAL_DIRNAME}) in DIR, the directory of the "
            "member files (or a node-local directory of io.mode shuffle). If the run had "
            "committed (for shuffle: its transaction is in the global run record), move "
            "its staged products into place and remove the journal; otherwise restore "
            "every member file to its prior "
            "content and delete the staged files. Safe to run at any time: it takes the "
            "members' lock, and refuses while another run holds it. With --from-backup "
            "CONFIG: restore the files the analysis works on (node-local copies in io.mode "
            "shuffle, else the member files) from the newest complete backup of "
            "io.backup_dir (or --cycle N's), every file checked against the sha256 of its "
            "COMPLETE marker before any file is replaced."
        ),
    )
    p.add_argument("dir", type=Path, metavar="DIR",
                   help="directory of the member files (with --from-backup: CONFIG)")
    p.add_argument(
        "--no-fsync",
        action="store_true",
        help="skip fsync of restored files (faster; not safe against power loss)",
    )
    p.add_argument(
        "--from-backup",
        action="store_true",
        help="restore the working files from the newest complete backup of io.backup_dir "
        "(DIR is then the YAML config); refuses an incomplete backup. Under mpiexec, run "
        "with the ranks and hosts of the analysis",
    )
    p.add_argument("--cycle", type=int, default=None, metavar="N",
                   help="with --from-backup: restore cycle N's backup (it must be complete)")
    p.add_argument("--ranks", type=int, default=None, metavar="R",
                   help="with --from-backup, run alone: restore for R ranks on this host")
    add_set_option(p, "with --from-backup: override a config key (repeatable)")
    p.set_defaults(func=run)


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _undone(report: RecoveryReport) -> str:
    """What a roll back wrote: byte ranges, whole files put back from their copies, or
    nothing (the bytes of whole files are not ranges, so they are named apart)."""
    size = f"({_size(report.bytes)})"
    ranges = f"rolled back {_plural(report.ranges, 'range')}"
    copies = "copy" if report.whole == 1 else "copies"
    whole = f"put back the prior {copies} of {_plural(report.whole, 'whole file')}"
    if report.ranges and report.whole:
        return f"{ranges} and {whole} {size} in {_plural(report.files, 'file')}"
    if report.ranges:
        return f"{ranges} {size} in {_plural(report.files, 'file')}"
    if report.whole:
        return f"{whole} {size}"
    if report.missing:
        return "rolled back nothing (the journaled files no longer exist)"
    return "rolled back nothing (no prior bytes had been saved)"


def run(args: argparse.Namespace) -> int:
    """Recover ``args.dir`` and print one line.

    Returns 0, or 1 if journaled files had vanished (named on stderr). Problems
    that stop recovery raise :class:`~ensio.errors.EnsioError` (one line, exit 2).
    """
    if args.from_backup:
        return _from_backup(args)
    if args.cycle is not None or args.ranks is not None or args.overrides:
        raise EnsioError("recover: --cycle, --ranks and --set go with --from-backup")
    root: Path = args.dir
    if root.is_file():  # a member file given instead of its directory
        root = root.parent
    if not root.is_dir():
        raise EnsioError(f"recover: no such directory: {root}")
    with file_op("recover"), EnsembleLock(root, command_line()) as lock:
        report = recover(root, fsync=not args.no_fsync)
    if lock.taken_over is not None:
        print(f"ensio recover: took over the stale lock of {lock.taken_over.describe()}",
              file=sys.stderr)
    if report.state == "clean":
        print("clean: no journal")
    elif report.state == "committed":
        staged = f"; {_plural(report.staged, 'staged file')} moved into place" * bool(
            report.staged)
        why = (f" (shuffle transaction {report.transaction} is in the global run record)"
               * bool(report.transaction))
        print(f"committed: analysis was complete{why}{staged}; journal removed")
    else:
        staged = f"; {_plural(report.staged, 'staged file')} deleted" * bool(report.staged)
        why = (f" (shuffle transaction {report.transaction} is not in the global run record)"
               * bool(report.transaction))
        print(f"recovered: {_undone(report)}{staged}{why}")
    for path in report.missing:
        print(f"ensio recover: warning: {path} no longer exists; not restored", file=sys.stderr)
    return 1 if report.missing else 0


def _from_backup(args: argparse.Namespace) -> int:
    """Restore a cycle's working files from its complete backup; print one line on rank 0."""
    from mpi4py import MPI

    from ..config import load_config
    from ..io.node.backup import restore_from_backup
    from ..parallel.nodes import this_host

    comm = MPI.COMM_WORLD
    config = load_config(args.dir, args.overrides)
    cycle, report = restore_from_backup(config, comm, host=this_host(), cycle=args.cycle,
                                        n_ranks=args.ranks, fsync=not args.no_fsync)
    if comm.rank == 0:
        print(report.line(f"restored cycle {cycle} from backup"), flush=True)
    return 0
