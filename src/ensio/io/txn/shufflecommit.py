"""The atomic commit of an ``io.mode: shuffle`` run across every local directory.

A shuffle run writes its analysis into tiles on many node-local disks, each
directory with its own undo journal. A per-directory commit would leave some
directories with the analysis and others with the prior after a kill between
two commits, so the commit is two-phase, and its decision lives on the
global file system, in the ensemble's run record (:mod:`ensio.io.txn.runrecord`).
:class:`ShuffleTransaction` is that commit as a
:class:`~ensio.io.txn.transaction.Transaction`; its participants are the
per-directory :class:`DirectoryJournal` s, decided by the global record:

1. **prepare** (:meth:`ShuffleTransaction.prepare`): every local journal is
   begun with a ``SHUFFLE`` marker (the transaction id, chosen by rank 0, and
   the global directory; :mod:`ensio.io.txn.shufflejournal`) before any undo
   record; every rank saves its prior bytes, writes its tile and makes it
   durable (``io.fsync``); then every rank agrees. A failure anywhere rolls
   every directory back.
2. **decide** (:meth:`ShuffleTransaction.commit`): rank 0 appends the run's
   entry (:meth:`ShuffleTransaction.record`), with the transaction id, to the
   global record: written to a temporary name, fsynced, renamed, directory
   fsynced (:func:`ensio.durable.replacing`). That rename is the commit point
   of the whole run (fault points ``shuffle-prepared`` before,
   ``shuffle-decided`` after).
3. **finish**: every local directory drops its journal (``shuffle-dropped``);
   the new bytes are already in place. The product tiles staged under
   :meth:`ShuffleTransaction.stage` names are renamed into place; a kill
   before that is rolled forward by the next run
   (:meth:`ShuffleTransaction.publish_recorded`).

Recovery (the next run under the lock, or ``ensio recover LOCAL_DIR``;
:meth:`DirectoryJournal.recover`) of a journal with a marker asks the record:
the id is there → drop the journal, else roll back. So after a kill at any
instant every local directory ends on the same side. The whole run holds the
global ensemble lock (rank 0) and each local directory's lock (the rank that
owns its journal).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mpi4py import MPI

from ... import faults
from ...durable import replacing
from ...errors import file_op
from ...parallel.agree import ErrorNote, agree, guard, note_error, raise_if_any, rebuild
from . import journal, staging
from .runrecord import runs_path, sha256_file, staged_runs
from .shufflejournal import ShuffleMarker, recorded
from .transaction import RecoveryReport, Transaction
from .undolog import UndoLog

__all__ = ["DirectoryJournal", "ShuffleTransaction"]


class DirectoryJournal(Transaction):
    """A participant: the undo journal of one node-local directory under one shuffle run.

    Local: only the first rank of the directory's ranks acts on it. It writes
    in place (journaled by the ranks' undo logs), so it stages nothing; it is
    never marked ``COMMITTED``: the global record decides it.
    """

    def __init__(self, root: Path, marker: ShuffleMarker, *, fsync: bool) -> None:
        self.root, self.marker, self.fsync = root, marker, fsync

    def begin(self) -> None:
        """The journal directory with its ``SHUFFLE`` marker, before any undo record."""
        self.marker.write(self.root / journal.JOURNAL_DIRNAME, fsync=self.fsync)

    def stage(self, target: str | Path) -> Path:
        """``target`` itself: the tiles are written in place (the undo log saves the prior)."""
        return Path(target)

    def commit(self) -> int:
        """The run is decided: drop the journal, the new bytes stay (roll forward)."""
        journal.drop(self.root, fsync=self.fsync)
        faults.point("shuffle-dropped")
        return 0

    def discard(self) -> None:
        """Remove a journal that holds its marker only (begun, nothing written)."""
        journal.drop(self.root, fsync=self.fsync)

    def abort(self) -> None:
        """Not decided: every journaled byte of the directory back to the prior."""
        journal.abort(self.root, fsync=self.fsync, locked=Path(self.marker.global_root))

    @classmethod
    def recover(cls, directory: Path, **options: Any) -> RecoveryReport:
        """The journal of ``directory``, decided by the global record its marker names
        (:func:`ensio.io.txn.journal.recover`; ``options``: ``fsync``, ``locked``)."""
        return journal.recover(directory, **options)


class ShuffleTransaction(Transaction):
    """Collective: one shuffle run's two-phase commit over every local directory.

    Parameters
    ----------
    comm : MPI.Comm
        Every rank of the run; rank 0 draws the id and records the decision.
    disk : MPI.Comm
        The ranks sharing this rank's local directory ``root`` (its rank 0
        drives that directory's :class:`DirectoryJournal`).
    root : Path
        This rank's local directory.
    global_root : Path
        The global directory whose run record decides the transaction.
    fsync : bool
    journaled : bool
        ``io.journal``: without it nothing is journaled and nothing can be
        rolled back (the decision is still recorded).
    """

    def __init__(self, comm: MPI.Comm, disk: MPI.Comm, root: Path, global_root: Path, *,
                 fsync: bool, journaled: bool = True) -> None:
        txid = comm.bcast(uuid.uuid4().hex if comm.rank == 0 else None)
        self.comm, self.disk, self.root, self.fsync = comm, disk, root, fsync
        self.global_root = Path(os.path.abspath(global_root))
        self.marker = ShuffleMarker(txid, str(self.global_root))
        self.journaled = journaled
        self.local = DirectoryJournal(root, self.marker, fsync=fsync)
        self.entry: Mapping[str, Any] | None = None
        self.products: dict[str, str] = {}
        self.open = False

    @property
    def txid(self) -> str:
        return self.marker.txid

    def _on_disk_roots(self, fn: Callable[[], object]) -> None:
        """Collective: ``fn`` on the first rank of every local directory; its error
        on every rank."""
        raise_if_any(self.comm, guard(fn) if self.disk.rank == 0 else None)

    # ------------------------------------------------------------------ protocol
    def begin(self) -> None:
        """Collective: every local journal with its marker; on a failure anywhere the
        markers that were made are removed and the error raised on every rank."""
        if not self.journaled:
            self.open = True
            return
        made = guard(self.local.begin) if self.disk.rank == 0 else None
        note = agree(self.comm, made)
        if note is not None:  # nothing written yet: remove the markers that were made
            if self.disk.rank == 0 and made is None:
                self.local.discard()
            raise rebuild(note)
        self.open = True

    def stage(self, target: str | Path) -> Path:
        """Where a product tile is written until the decision (renamed by :meth:`commit`)."""
        return staging.partial_path(target)

    def prepare(self, write: Callable[[UndoLog | None], ErrorNote]) -> None:
        """Collective, phase 1: :meth:`begin`, then every rank's in-place write, journaled.

        ``write(undo)`` writes this rank's bytes (saving prior bytes in ``undo``
        first) and returns an error note instead of raising. On return every
        rank's bytes are written and, with ``fsync``, durable. If any rank
        failed, every local directory is rolled back and the error raised on
        every rank.
        """
        self.begin()
        undo: UndoLog | None = None
        note = None
        try:
            if self.journaled:
                undo = UndoLog.create(self.root, self.disk.rank, fsync=self.fsync)
            note = write(undo)
        except Exception as exc:  # shared below, so no rank waits alone
            note = note_error(exc)
        finally:
            if undo is not None:
                try:
                    undo.close()  # with fsync: this rank's new bytes are durable
                except Exception as exc:
                    note = note or note_error(exc)
        note = agree(self.comm, note)  # "prepared": every rank's bytes are written
        if note is not None:
            self.abort()
            raise rebuild(note)

    def record(self, entry: Mapping[str, Any] | None, products: Mapping[str, str]) -> None:
        """What :meth:`commit` decides with: the run-record ``entry`` (rank 0; its
        ``txid`` is this transaction's) and the staged product tiles
        (``{final path: sha256}``, the same on every rank)."""
        assert entry is None or entry.get("txid") == self.txid
        self.entry, self.products = entry, dict(products)

    def commit(self) -> int:
        """Collective, phases 2 and 3: rank 0 records the entry, every local directory
        drops its journal, the product tiles are renamed into place.

        If recording fails, the directories follow what the record holds (a
        rename that happened before a failed directory fsync counts as
        committed; an unreadable record leaves the journals to the next
        recovery) and the error is raised on every rank. Returns the number
        of product tiles this rank renamed.
        """
        note: ErrorNote = None
        done: bool | None = False
        if self.comm.rank == 0:
            assert self.entry is not None
            try:
                self._decide(self.entry)
                done = True
            except Exception as exc:  # every rank must follow the record, then raise
                note = note_error(exc)
                try:
                    done = recorded(self.global_root, self.txid)
                except Exception:
                    done = None  # unknown: the journals stay for the next recovery to decide
        note, done = self.comm.bcast((note, done))
        if self.journaled and done is not None:
            if done:
                self._on_disk_roots(self.local.commit)
            else:
                self._on_disk_roots(self.local.abort)
        self.open = False
        if note is not None:
            raise rebuild(note)
        return self._publish()

    def abort(self) -> None:
        """Collective: every local directory back to its prior bytes (not decided).

        Idempotent: a no-op once committed or rolled back."""
        if self.open and self.journaled:
            self.open = False
            self._on_disk_roots(self.local.abort)
        self.open = False

    @classmethod
    def recover(cls, directory: Path, **options: Any) -> RecoveryReport:
        """A local directory after a kill: its participant's recovery, decided by the
        global record (:meth:`DirectoryJournal.recover`)."""
        return DirectoryJournal.recover(directory, **options)

    # ------------------------------------------------------------------ steps
    def _decide(self, entry: Mapping[str, Any]) -> None:
        """Rank 0: the decision, the entry appended to the global record atomically."""
        faults.point("shuffle-prepared")
        path = runs_path(self.global_root)
        with replacing(path, fsync=self.fsync, label="shuffle-record") as tmp:
            staged_runs(self.global_root, entry, tmp)
        faults.point("shuffle-decided")

    def _publish(self) -> int:
        """Collective, after the decision: each staged product tile renamed into place.

        Renames are spread over the ranks; an error is raised on every rank (the
        run is committed: the next run rolls the rest forward).
        """
        mine = sorted(self.products)[self.comm.rank :: self.comm.size]

        def rename() -> None:
            for target in mine:
                with file_op("write", target):
                    os.replace(self.stage(target), target)
        raise_if_any(self.comm, guard(rename))
        return len(mine)

    @staticmethod
    def publish_recorded(products: Mapping[str, str]) -> list[str]:
        """Rank 0, rerun of a committed run: staged product tiles of it renamed into place.

        A product whose final file does not hold the recorded digest but whose
        staged file does was left by a kill between the decision and the
        renames of :meth:`commit`: it is renamed now. Returns the products
        that hold neither (changed or removed since).
        """
        def holds(path: str, target: str) -> bool:
            return os.path.isfile(path) and sha256_file(Path(path)) == products[target]

        pairs = [(staging.partial_path(t), t) for t in products]
        with file_op("roll forward"):
            return staging.roll_forward(pairs, fsync=False, holds=holds)[1]
