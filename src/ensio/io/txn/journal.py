"""Undo journal that makes in-place analysis writes all-or-nothing.

N_io tasks overwrite state bytes *in place* in N_e member files; a crash half-way
would leave a silent mix of forecast and analysis. So before a task overwrites a
byte range it appends the *prior* bytes to its own undo log (tasks never
coordinate), and only after every task has finished one rank marks the journal
``COMMITTED`` and deletes it. :func:`recover` turns any crash into all files
entirely prior (no marker) or entirely new (marker).

``<root>/.ensio-journal/`` holds ``task-<t>.undo`` (``_LOG_MAGIC``, then records
``header(kind, path length, offset, length) | path | data | crc32``: a record
torn by a kill fails its CRC and is ignored -- its data write had not started;
without ``fsync`` the CRC covers header and path only (kind ``ERNF``): a process
kill cannot garble what reached the page cache, only cut it short, which the
length and the trailer written last detect, and a CRC over gigabytes of prior
bytes would cost a third of the journal's time),
``task-<t>.<n>.bak`` whole-file backups (hard links when possible) and
``COMMITTED``. The directory is renamed to a trash name before it is deleted,
so a half-deleted journal can never be mistaken for an incomplete one.

A *run transaction* (:mod:`ensio.io.txn.commit`) extends the journal to the
products of a run: :func:`begin` creates the directory with ``TRANSACTION``
(the owner) and ``STAGED`` (files written beside their targets, renamed at
the commit; :mod:`ensio.io.txn.staging`). The ensemble writer's :func:`commit`
then leaves the commit to the transaction (``commit(..., transaction=True)``),
which renames the staged files after the marker; recovery rolls such a
journal back (members restored, staged files deleted) or forward (staged
files renamed into place). Recovery runs under the ensemble lock
(:mod:`ensio.locks`): taken for its duration unless this process holds it.

A *shuffle* journal (``io.mode: shuffle``, one per node-local directory)
carries a ``SHUFFLE`` marker instead (:mod:`ensio.io.txn.shufflejournal`): it
is never marked ``COMMITTED``; its run commits by recording the marker's
transaction id in the global run record, and recovery rolls it forward
(:func:`drop`) or back by asking that record.

Kill tests: every survivable step calls :func:`ensio.faults.point`.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

from ... import faults
from ...durable import fsync_path
from ...locks import EnsembleLock, command_line, held_by_me
from . import shufflejournal, staging
from .transaction import RecoveryReport
from .undolog import (
    COMMITTED_NAME,
    JOURNAL_DIRNAME,
    REC_FILE,
    JournalError,
    UndoLog,
    is_committed,
    replay_log,
    scan_log,
)

__all__ = ["COMMITTED_NAME", "JOURNAL_DIRNAME", "JournalError", "UndoLog", "abort", "begin",
           "commit", "drop", "journal_root", "recover"]

_TRASH_PREFIX = JOURNAL_DIRNAME + ".trash-"

def journal_root(first_member: Path) -> Path:
    """The first member's absolute parent: one known place ``ensio recover DIR`` finds."""
    return Path(os.path.abspath(first_member)).parent


# --------------------------------------------------------------------------- writing
def begin(root: Path, staged: Sequence[tuple[Path, Path]], *, fsync: bool) -> None:
    """Open a run transaction: the journal directory with its owner and staged files.

    ``staged`` lists (staged name, target) of every file the run will write
    beside its target and rename at the commit, *before* any of them exists.
    Raises :class:`JournalError` if a journal exists (recover first).
    """
    root = Path(os.path.abspath(root))
    try:
        staging.write_transaction(root / JOURNAL_DIRNAME, staged, fsync=fsync)
    except FileExistsError:
        raise JournalError(f"stale journal in {root / JOURNAL_DIRNAME}: "
                           f"run `ensio recover {root}`") from None


def commit(root: Path, *, fsync: bool, transaction: bool = False) -> int:
    """Declare the write complete and delete the journal (one rank, after all tasks).

    Creating ``COMMITTED`` is the single atomic commit point; staged files are
    then renamed into place and the directory is renamed away and removed. No
    journal: nothing was written, no-op. A transaction's journal is committed
    only by the transaction (``transaction=True``); the ensemble writer's call
    is then a no-op. Returns the number of staged files moved into place.
    """
    root = Path(os.path.abspath(root))
    jdir = root / JOURNAL_DIRNAME
    if not jdir.is_dir() or (staging.is_transaction(jdir) and not transaction):
        return 0
    with open(jdir / COMMITTED_NAME, "wb") as marker:
        faults.point("commit-marker")
        if fsync:
            os.fsync(marker.fileno())
    if fsync:
        fsync_path(jdir, directory=True)
        faults.point("commit-fsync")
    moved, _ = staging.roll_forward(staging.read_pairs(jdir), fsync=fsync)
    _remove_journal(root, jdir, fsync)
    return moved


# --------------------------------------------------------------------------- recovery
def _restore_backup(backup: Path, target: str, fsync: bool) -> bool:
    """Put ``backup`` back at ``target``; False if ``target`` was never replaced.

    Idempotent: a backup that was already moved back no longer exists.
    """
    if os.path.exists(target) and os.path.samefile(backup, target):
        os.unlink(backup)  # the caller crashed before replacing the file
        return False
    try:
        os.replace(backup, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.ensio-restore")
        shutil.copyfile(backup, tmp)
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, target)
        os.unlink(backup)
    faults.point("restore-backup")
    return True


def _remove_journal(root: Path, jdir: Path, fsync: bool) -> None:
    """Atomically retire ``jdir`` (rename), then delete it at leisure."""
    trash = root / f"{_TRASH_PREFIX}{uuid.uuid4().hex}"
    os.rename(jdir, trash)
    faults.point("journal-rename")
    if fsync:
        fsync_path(root, directory=True)
    shutil.rmtree(trash, ignore_errors=True)
    faults.point("journal-remove")


def recover(root: Path, *, fsync: bool = True, force: bool = False,
            locked: Path | None = None) -> RecoveryReport:
    """Bring the files under ``root`` to a consistent state after any crash.

    No journal: ``"clean"``. ``COMMITTED``: the analysis is complete; rename
    its staged files into place, delete the journal (``"committed"``). Else
    restore backups, write back every undo record, delete staged files, make
    that durable, and only then delete the journal (``"rolled_back"``): a
    crash during recovery leaves a journal from which it simply runs again.

    Runs under the ensemble lock (taken for the recovery unless this process
    holds it; :class:`~ensio.locks.LockError` if a live run holds it). The
    journal of this process's own open transaction is left alone
    (``"open"``) unless ``force`` (:func:`abort`). A shuffle journal is
    decided by the global run record its marker names
    (:func:`ensio.io.txn.shufflejournal.committed`; ``locked``: the global
    directory whose lock the caller's run holds).
    """
    root = Path(os.path.abspath(root))
    jdir = root / JOURNAL_DIRNAME
    if not jdir.is_dir():
        report = RecoveryReport("clean")
    elif staging.is_own(jdir) and not force:
        return RecoveryReport("open")
    elif held_by_me(root):
        report = _recover_locked(root, jdir, fsync, locked)
    else:
        with EnsembleLock(root, f"journal recovery in {command_line()}"):
            report = _recover_locked(root, jdir, fsync, locked)
    for trash in root.glob(_TRASH_PREFIX + "*"):  # deletions a crash interrupted
        shutil.rmtree(trash, ignore_errors=True)
    return report


def _recover_locked(root: Path, jdir: Path, fsync: bool, locked: Path | None) -> RecoveryReport:
    if not jdir.is_dir():  # recovered by the run whose lock we waited for
        return RecoveryReport("clean")
    marker = shufflejournal.ShuffleMarker.read(jdir)
    if marker is not None:  # decided by the global run record, not by COMMITTED
        if shufflejournal.committed(jdir, marker, locked=locked):
            _remove_journal(root, jdir, fsync)
            return RecoveryReport("committed", transaction=marker.txid)
        return dataclasses.replace(_rollback(root, jdir, fsync), transaction=marker.txid)
    if is_committed(jdir):
        moved, _ = staging.roll_forward(staging.read_pairs(jdir), fsync=fsync)
        _remove_journal(root, jdir, fsync)
        return RecoveryReport("committed", staged=moved)
    return _rollback(root, jdir, fsync)


def _rollback(root: Path, jdir: Path, fsync: bool) -> RecoveryReport:
    # Log order is irrelevant: different tasks journal disjoint byte ranges.
    scanned = [(log, scan_log(log)) for log in sorted(jdir.glob("task-*.undo"))]
    files, dirs, missing = set[str](), set[str](), set[str]()
    nbytes = nranges = nwhole = 0
    for _, records in scanned:  # backups first (newest first: the oldest wins), then
        for rec in reversed(records):  # the ranges journaled before them are replayed
            backup = jdir / rec.name
            if rec.kind != REC_FILE or not backup.exists():
                continue  # a missing backup was restored by an interrupted recovery
            size = backup.stat().st_size
            if _restore_backup(backup, rec.path, fsync):
                files.add(rec.path)
                dirs.add(os.path.dirname(rec.path))
                nbytes += size
                nwhole += 1
    for log, records in scanned:
        touched, n, b = replay_log(log, records, fsync, missing)
        files |= touched
        nranges += n
        nbytes += b
    for _, records in scanned:  # temporaries of a library-path rewrite a kill left
        for path in {rec.path for rec in records if rec.kind == REC_FILE}:
            staging.remove_temporaries(path)
    staged = staging.discard(jdir)
    if fsync:
        for d in sorted(dirs):
            fsync_path(d, directory=True)
    faults.point("recover-synced")
    _remove_journal(root, jdir, fsync)
    return RecoveryReport("rolled_back", len(files), nranges, nbytes,
                          tuple(sorted(missing - files)), staged, whole=nwhole)


def drop(root: Path, *, fsync: bool) -> bool:
    """Delete the journal of ``root`` as it is: the new bytes stay (a shuffle's roll forward).

    Only for a journal whose transaction is known to have committed. Returns
    False if there was none.
    """
    root = Path(os.path.abspath(root))
    jdir = root / JOURNAL_DIRNAME
    if not jdir.is_dir():
        return False
    _remove_journal(root, jdir, fsync)
    return True


def abort(root: Path, *, fsync: bool = True, locked: Path | None = None) -> RecoveryReport:
    """Roll back now, after a task failed mid-write (same rules as :func:`recover`).

    Call it from one rank once *all* tasks have stopped writing (a committed
    journal means the analysis is complete: it is kept). Unlike
    :func:`recover` it also rolls back this process's own open transaction.
    """
    return recover(root, fsync=fsync, force=True, locked=locked)
