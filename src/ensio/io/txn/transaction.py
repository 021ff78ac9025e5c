"""The one transaction protocol every writer of ensio joins.

Each writer that must never leave a half-done result behind (the offline
run's members, products, copies and run record; the shuffle mode's tiles
across node-local directories; the node-local copies of ``ensio stage``; the
cycle backup) is a :class:`Transaction`: it **begins** (its journal or
attempt directory exists before any byte is written), **stages** each new
file under a name beside its target (:meth:`Transaction.stage`; a writer in
place is journaled instead and stages nothing), may stop at a
**checkpoint** where every process agrees, and then either **commits** (one
marker, or one decision record, appears atomically: the single commit point)
or **aborts** (every staged file and every journaled byte back as before).
A kill at any instant is turned into one of those two ends by
:meth:`Transaction.recover`, a class method over a directory, run by the next
writer there or by ``ensio recover``: before the commit point it rolls back,
after it it rolls forward (:func:`ensio.io.txn.staging.roll_forward`, the one
roll-forward).

Why an ABC: the five writers had five spellings of the same four steps;
one protocol lets a new writer (a new ``io.mode``'s participant) be checked
against the same expectations, and recovery asks each one the same question.

The implementations: :class:`~ensio.io.txn.commit.RunTransaction` (files
mode: staged names, the journal's ``COMMITTED`` marker),
:class:`~ensio.io.txn.shufflecommit.ShuffleTransaction` (shuffle mode: a
two-phase commit whose participants are the per-directory
:class:`~ensio.io.txn.shufflejournal.DirectoryJournal` s, decided by the
global run record), :class:`~ensio.io.node.placecopy.CopySet` (the verified
node-local copies: temporaries, then renames) and
:class:`~ensio.io.node.backupworker.BackupAttempt` (the backup: a data
directory, then the ``COMPLETE`` marker).

Standard library only (the backup's detached worker and ``ensio recover``
import it without MPI or netCDF).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["RecoveryReport", "Staging", "Transaction"]

#: A transaction's :meth:`Transaction.stage` as a plain function: the name a file is
#: written under until the commit (what the product and copy writers receive).
Staging = Callable[[Path], Path]


@dataclass(frozen=True)
class RecoveryReport:
    """What :meth:`Transaction.recover` found and did.

    Attributes
    ----------
    state : {"clean", "rolled_back", "committed", "open"}
        Nothing to recover / an incomplete write was undone / the write was
        complete (staged files moved into place) / the journal is this
        process's own open transaction (left alone).
    files : int
        Files whose prior content was restored (ranges or whole-file backups).
    ranges : int
        Undo records (byte ranges) written back.
    bytes : int
        Bytes written back (ranges plus sizes of restored whole-file backups).
    missing : tuple of str
        Journaled files that no longer exist, so could not be restored.
    staged : int
        Staged files renamed into place ("committed") or deleted ("rolled_back").
    transaction : str
        The shuffle transaction of the journal (decided by the global run
        record), or "".
    whole : int
        Files put back from a whole-file backup (a library-path rewrite):
        their bytes count in ``bytes`` but they are not ``ranges``.
    """

    state: Literal["clean", "rolled_back", "committed", "open"]
    files: int = 0
    ranges: int = 0
    bytes: int = 0
    missing: tuple[str, ...] = ()
    staged: int = 0
    transaction: str = ""
    whole: int = 0


class Transaction(abc.ABC):
    """One all-or-nothing write: begin, stage, checkpoint, commit or abort; recover.

    As a context manager it begins on entry and aborts on exit unless it
    committed (any error, SIGINT), so the abort of an implementation must be
    idempotent and a no-op after the commit.
    """

    @abc.abstractmethod
    def begin(self) -> None:
        """Make the transaction visible to recovery before anything is written."""

    @abc.abstractmethod
    def stage(self, target: str | Path) -> Path:
        """The name ``target`` is written under until the commit (beside it).

        A participant that writes in place (journaled by an undo log) returns
        ``target`` itself: it has nothing to rename.
        """

    def checkpoint(self) -> None:  # noqa: B027 -- a writer without deferred signals needs none
        """Where every process stops if any was interrupted (default: nothing deferred)."""

    @abc.abstractmethod
    def commit(self) -> int:
        """The single commit point, then the roll forward; how many staged files moved."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Everything back to before :meth:`begin` (idempotent; nothing after the commit)."""

    @classmethod
    @abc.abstractmethod
    def recover(cls, directory: Path, **options: Any) -> RecoveryReport:
        """After a kill: bring ``directory`` to one end, rolled back or rolled forward."""

    def __enter__(self) -> Transaction:
        self.begin()
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()
