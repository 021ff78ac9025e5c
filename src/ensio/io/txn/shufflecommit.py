"""The atomic commit of an ``io.mode: shuffle`` run across every local directory.

A shuffle run writes its analysis into tiles on many node-local disks, each
directory with its own undo journal. A per-directory commit would leave some
directories with the analysis and others with the prior after a kill between
two commits, so the commit is two-phase, and its decision lives on the
global file system, in the ensemble's run record (:mod:`ensio.io.txn.runrecord`):

1. **prepare** (:func:`prepare`): every local journal is created with a
   ``SHUFFLE`` marker (the transaction id, chosen by rank 0, and the global
   directory; :mod:`ensio.io.txn.shufflejournal`) before any undo record; every
   rank saves its prior bytes, writes its tile and makes it durable
   (``io.fsync``); then every rank agrees. A failure anywhere rolls every
   directory back.
2. **decide** (:func:`commit`): rank 0 appends the run's entry, with the
   transaction id, to the global record: written to a temporary name,
   fsynced, renamed, directory fsynced (:func:`ensio.durable.replacing`).
   That rename is the commit point of the whole run (fault points
   ``shuffle-prepared`` before, ``shuffle-decided`` after).
3. **finish**: every local directory drops its journal (``shuffle-dropped``);
   the new bytes are already in place.

Recovery (the next run under the lock, or ``ensio recover LOCAL_DIR``) of a
journal with a marker asks the record: the id is there → drop the journal,
else roll back. So after a kill at any instant every local directory ends
on the same side. The whole run holds the global ensemble lock (rank 0) and
each local directory's lock (the rank that owns its journal).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpi4py import MPI

from ... import faults
from ...durable import replacing
from ...parallel.agree import ErrorNote, agree, guard, note_error, raise_if_any, rebuild
from . import journal
from .runrecord import runs_path, staged_runs
from .shufflejournal import ShuffleMarker, recorded, write_marker
from .undolog import UndoLog

__all__ = ["ShuffleTransaction", "commit", "prepare", "roll_back"]


@dataclass(frozen=True)
class ShuffleTransaction:
    """One shuffle run's commit: its id and the global directory whose record decides it.

    Build it with :meth:`begin` (collective), so every rank has the same id.
    """

    txid: str
    global_root: Path  # absolute
    fsync: bool

    @classmethod
    def begin(cls, comm: MPI.Comm, global_root: Path, *, fsync: bool) -> ShuffleTransaction:
        """Collective: a new transaction, its id drawn on rank 0."""
        txid = comm.bcast(uuid.uuid4().hex if comm.rank == 0 else None)
        return cls(txid, Path(os.path.abspath(global_root)), fsync)

    @property
    def marker(self) -> ShuffleMarker:
        return ShuffleMarker(self.txid, str(self.global_root))


def _on_disk_roots(comm: MPI.Comm, disk: MPI.Comm, fn: Callable[[], object]) -> None:
    """Collective over ``comm``: ``fn`` on the first rank of every local directory;
    its error, if any, on every rank."""
    raise_if_any(comm, guard(fn) if disk.rank == 0 else None)


def roll_back(comm: MPI.Comm, disk: MPI.Comm, root: Path, txn: ShuffleTransaction,
              journaled: bool = True) -> None:
    """Collective: every local directory back to its prior bytes (``txn`` was not decided)."""
    if journaled:
        _on_disk_roots(comm, disk, lambda: journal.abort(root, fsync=txn.fsync,
                                                          locked=txn.global_root))


def prepare(comm: MPI.Comm, disk: MPI.Comm, root: Path, txn: ShuffleTransaction,
            journaled: bool, write: Callable[[UndoLog | None], ErrorNote]) -> None:
    """Collective, phase 1: every rank's in-place write, journaled under ``txn``.

    ``disk`` groups the ranks sharing the local directory ``root``; its rank 0
    creates the journal with the marker before any rank creates its undo log.
    ``write(undo)`` writes this rank's bytes (saving prior bytes in ``undo``
    first) and returns an error note instead of raising. On return every
    rank's bytes are written and, with ``txn.fsync``, durable. If any rank
    failed, every local directory is rolled back and the error raised on
    every rank.
    """
    jdir = root / journal.JOURNAL_DIRNAME
    if journaled:
        made = guard(lambda: write_marker(jdir, txn.marker, fsync=txn.fsync)) \
            if disk.rank == 0 else None
        note = agree(comm, made)
        if note is not None:  # nothing written yet: remove the markers that were made
            if disk.rank == 0 and made is None:
                journal.drop(root, fsync=txn.fsync)
            raise rebuild(note)
    undo: UndoLog | None = None
    note = None
    try:
        if journaled:
            undo = UndoLog.create(root, disk.rank, fsync=txn.fsync)
        note = write(undo)
    except Exception as exc:  # shared below, so no rank waits alone
        note = note_error(exc)
    finally:
        if undo is not None:
            try:
                undo.close()  # with fsync: this rank's new bytes are durable
            except Exception as exc:
                note = note or note_error(exc)
    note = agree(comm, note)  # "prepared": every rank's bytes are written
    if note is not None:
        if journaled:
            roll_back(comm, disk, root, txn)
        raise rebuild(note)


def _record(txn: ShuffleTransaction, entry: Mapping[str, Any]) -> None:
    """Rank 0: the decision, the entry appended to the global record atomically."""
    faults.point("shuffle-prepared")
    path = runs_path(txn.global_root)
    with replacing(path, fsync=txn.fsync, label="shuffle-record") as tmp:
        staged_runs(txn.global_root, entry, tmp)
    faults.point("shuffle-decided")


def commit(comm: MPI.Comm, disk: MPI.Comm, root: Path, txn: ShuffleTransaction,
           journaled: bool, entry: Mapping[str, Any] | None) -> None:
    """Collective, phases 2 and 3: rank 0 records ``entry`` (its ``txid`` is ``txn``'s),
    then every local directory drops its journal.

    ``entry`` is needed on rank 0 only. If recording fails, the directories
    follow what the record holds (a rename that happened before a failed
    directory fsync counts as committed; an unreadable record leaves the
    journals to the next recovery) and the error is raised on every rank.
    """
    note: ErrorNote = None
    done: bool | None = False
    if comm.rank == 0:
        assert entry is not None and entry.get("txid") == txn.txid
        try:
            _record(txn, entry)
            done = True
        except Exception as exc:  # every rank must follow the record, then raise
            note = note_error(exc)
            try:
                done = recorded(txn.global_root, txn.txid)
            except Exception:
                done = None  # unknown: the journals stay for the next recovery to decide
    note, done = comm.bcast((note, done))
    if journaled and done is not None:
        if done:
            _on_disk_roots(comm, disk, lambda: _drop(root, txn.fsync))
        else:
            roll_back(comm, disk, root, txn)
    if note is not None:
        raise rebuild(note)


def _drop(root: Path, fsync: bool) -> None:
    journal.drop(root, fsync=fsync)
    faults.point("shuffle-dropped")
