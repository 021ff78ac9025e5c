"""Staged files of a run transaction: written beside their targets, renamed at the commit.

A run (``ensio analyse``) changes the members *and* writes products (mean,
spread, member copies, the run record). To commit them together, every new
file is first written under a *staged* name beside its target
(``.NAME.ensio-staged.TOKEN``, same directory, so the final rename is atomic)
and the journal lists the (staged, target) pairs *before* any of them is
created (``STAGED``). The journal's ``COMMITTED`` marker is the single commit
point:

* before it, recovery deletes every staged file (and the temporaries of
  :func:`ensio.durable.replacing` a kill left beside them) and rolls the
  members back;
* after it, recovery renames the staged files that still exist into place
  (rolling *forward*; a rename already done left no staged file).

``TRANSACTION`` (the owner: host, pid, pid start time) marks a journal as part
of a transaction: the ensemble writer's own commit then waits for the
transaction's (:func:`ensio.io.txn.journal.commit`), and a recovery started by
the owning process itself (a second ensemble-I/O object of the same run)
leaves it alone.

:class:`PartialFiles` is the transaction of files written without a run
transaction (the online mode's member copies): partial names, each renamed
by its commit.

Standard library only (with :mod:`ensio.locks` for the owner record).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ... import faults
from ...durable import copy_identity, fsync_path, temporary_name, temporary_of
from ...errors import file_op
from ...locks import Holder, process_start
from .transaction import RecoveryReport, Transaction

__all__ = ["STAGED_NAME", "TRANSACTION_NAME", "PartialFiles", "discard", "is_own", "new_token",
           "partial_path", "read_pairs", "remove_temporaries", "roll_forward", "staged_path",
           "write_transaction"]

TRANSACTION_NAME = "TRANSACTION"
STAGED_NAME = "STAGED"


def new_token() -> str:
    """A fresh token naming one transaction's staged files."""
    return secrets.token_hex(6)


def staged_path(target: str | Path, token: str) -> Path:
    """Where ``target`` is written until the commit (beside the file a symlink points to)."""
    return temporary_name(os.path.realpath(target), "staged", token)


def partial_path(target: str | Path) -> Path:
    """Where a file without a journal is written until its rename: a member copy of
    the online mode, a shuffle run's product tile until its decision. No token: a
    rerun reuses (overwrites) it."""
    return temporary_name(target, "partial")


def _write_durable(path: Path, data: bytes, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_transaction(jdir: Path, pairs: Sequence[tuple[Path, Path]], *, fsync: bool) -> None:
    """Create the journal directory of a transaction with its owner and staged list.

    Raises FileExistsError if ``jdir`` exists (an unrecovered journal).
    """
    os.mkdir(jdir)
    faults.point("transaction-mkdir")
    if fsync:
        fsync_path(jdir.parent, directory=True)
    listing = [[os.fsdecode(os.path.realpath(s)), os.fsdecode(os.path.realpath(t))]
               for s, t in pairs]
    tmp = jdir / (STAGED_NAME + ".tmp")  # a torn list must never look like one
    _write_durable(tmp, json.dumps(listing).encode(), fsync)
    os.replace(tmp, jdir / STAGED_NAME)
    me = Holder.current("transaction")
    _write_durable(jdir / TRANSACTION_NAME, me.encode(), fsync)
    if fsync:
        fsync_path(jdir, directory=True)
    faults.point("transaction-begun")


def read_pairs(jdir: Path) -> list[tuple[str, str]]:
    """The (staged, target) pairs of the journal (none if it is not a transaction's)."""
    try:
        raw = json.loads((jdir / STAGED_NAME).read_text())
    except FileNotFoundError:
        return []
    return [(str(s), str(t)) for s, t in raw]


def is_own(jdir: Path) -> bool:
    """True if ``jdir`` is the journal of a transaction this very process runs."""
    try:
        owner = Holder.parse((jdir / TRANSACTION_NAME).read_text())
    except OSError:
        return False
    return (owner is not None and owner.is_local() and owner.pid == os.getpid()
            and owner.pid_start == process_start(os.getpid()))


def is_transaction(jdir: Path) -> bool:
    """True if ``jdir`` belongs to a transaction (its commit is the transaction's)."""
    return (jdir / TRANSACTION_NAME).exists() or (jdir / STAGED_NAME).exists()


def roll_forward(pairs: Iterable[tuple[str | Path, str | Path]], *, fsync: bool,
                 holds: Callable[[str, str], bool] | None = None) -> tuple[int, list[str]]:
    """After the commit point: rename every staged file still there to its target.

    The one roll-forward of ensio: a journal's staged files after its
    ``COMMITTED`` marker (``pairs``: :func:`read_pairs`), a shuffle run's
    product tiles after its decision
    (:meth:`ensio.io.txn.shufflecommit.ShuffleTransaction.publish_recorded`).
    Idempotent (a renamed file is gone from its staged name). The new file
    takes the permission bits and owner of the file it replaces.

    ``holds(path, target)``, if given, says whether ``path`` holds what was
    committed for ``target`` (a recorded digest): a target that already
    holds it is left alone, a staged file that does not is not renamed, and
    such a target is returned as *lost* (changed or removed since). Without
    it (staged names are unique per transaction) a staged file that exists
    is the committed one and a missing one was renamed already.

    Returns (files renamed, targets lost).
    """
    moved, lost, dirs = 0, list[str](), set[str]()
    for staged_name, target_name in pairs:
        staged, target = os.fspath(staged_name), os.fspath(target_name)
        if holds is not None and os.path.isfile(target) and holds(target, target):
            continue
        if not os.path.exists(staged) or (holds is not None and not holds(staged, target)):
            if holds is not None:
                lost.append(target)
            continue
        copy_identity(target, staged)
        if fsync:
            fsync_path(staged)
        os.replace(staged, target)
        faults.point("staged-rename")
        dirs.add(os.path.dirname(target))
        moved += 1
    if fsync:
        for d in sorted(dirs):
            fsync_path(d, directory=True)
    return moved, lost


def remove_temporaries(path: str | Path) -> None:
    """Delete the temporaries :func:`ensio.durable.replacing` left beside ``path``."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(path.parent):
            found = temporary_of(entry.name)
            if found is not None and found[:2] == (path.name, "tmp"):
                Path(entry.path).unlink(missing_ok=True)


def discard(jdir: Path) -> int:
    """Before the commit marker: delete every staged file and its writers' temporaries."""
    removed = 0
    for staged, _target in read_pairs(jdir):
        remove_temporaries(staged)
        if os.path.exists(staged):
            os.unlink(staged)
            removed += 1
    faults.point("staged-discarded")
    return removed


class PartialFiles(Transaction):
    """Files without a journal, each its own commit: written under its partial name
    (:func:`partial_path`), renamed over its target by :meth:`commit`.

    What the online mode's member copies are (no run transaction there): a
    copy that is not renamed is never mistaken for a finished one, and a
    rerun overwrites the partial file (no token). A rename keeps the
    target's identity (mode, owner; a symbolic link stays a link).
    """

    def __init__(self, targets: Iterable[str | Path]) -> None:
        self.targets = [Path(t) for t in targets]

    def begin(self) -> None:
        """Nothing to publish: a partial file is recognised by its name."""

    def stage(self, target: str | Path) -> Path:
        return partial_path(target)

    def commit(self) -> int:
        """Rename every partial file over its target; how many."""
        for target in self.targets:
            real = Path(os.path.realpath(target))
            with file_op("write", target):
                copy_identity(real, self.stage(target))
                os.replace(self.stage(target), real)
        return len(self.targets)

    def abort(self) -> None:
        """Delete the partial files (the targets stay as they were)."""
        for target in self.targets:
            self.stage(target).unlink(missing_ok=True)

    @classmethod
    def recover(cls, directory: Path, **options: Any) -> RecoveryReport:
        """Delete the partial files a killed writer left in ``directory`` (only when no
        writer runs there: a partial file is never renamed after a kill)."""
        removed = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(directory):
                found = temporary_of(entry.name)
                if found is not None and found[1] == "partial":
                    Path(entry.path).unlink(missing_ok=True)
                    removed += 1
        return RecoveryReport("rolled_back" if removed else "clean", staged=removed)
