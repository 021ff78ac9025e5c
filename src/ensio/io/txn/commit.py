"""Collective pieces of an all-or-nothing run: the held lock and the run transaction.

One offline analysis writes the members (in place, journaled, or as copies),
the products and the run record; all of that commits at one point, the
journal's ``COMMITTED`` marker (:mod:`ensio.io.txn.journal`, :mod:`ensio.io.txn.staging`):

1. rank 0 takes the ensemble lock (:func:`ensemble_lock`), every rank agrees;
2. the ensemble-I/O object recovers any earlier journal (under the lock);
3. :meth:`RunTransaction.begin` lists every file the run will create beside
   its target (staged) in a new journal;
4. the members are written (the undo logs join that journal), the products,
   copies and the run record are written to their staged names;
5. :meth:`RunTransaction.commit`: the marker, then the renames.

Any failure before the marker (an error on any rank, SIGINT) rolls back to
the prior files (:meth:`RunTransaction.abort`); a SIGKILL is rolled back, or
forward after the marker, by the next run or ``ensio recover``.

SIGINT inside a transaction is *deferred* (:class:`DeferredInterrupt`): a
``KeyboardInterrupt`` raised while the writer threads of the ensemble I/O
still write could let them overwrite bytes the rollback has just restored.
The run notes the signal and stops at the next :meth:`RunTransaction.checkpoint`,
where every rank agrees, then rolls back.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mpi4py import MPI

from ...locks import EnsembleLock, run_id
from ...parallel.agree import ErrorNote, agree, rebuild, root_call
from . import journal, staging
from .transaction import RecoveryReport, Transaction

__all__ = ["DeferredInterrupt", "RunTransaction", "ensemble_lock", "journaled_write", "run_of"]


@contextmanager
def ensemble_lock(root: Path, comm: MPI.Comm, command: str) -> Iterator[EnsembleLock | None]:
    """Collective: rank 0 holds the ensemble lock of ``root`` inside the block.

    Raises :class:`~ensio.locks.LockError` on every rank if another run holds
    it. Yields the lock on rank 0 (``taken_over`` names a dead holder whose
    stale lock was taken over), None elsewhere. The lock records the run
    (:func:`run_of`), so a rank of this run locking the same directory again
    (a node-local directory that is the global one) joins it.
    """
    run = run_of(comm)
    lock = EnsembleLock(root, command, run=run) if comm.rank == 0 else None
    root_call(comm, lambda: lock.acquire() and None)
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


def run_of(comm: MPI.Comm) -> str:
    """Collective: the identity of this run, rank 0's :func:`~ensio.io.lock.run_id`."""
    return str(comm.bcast(run_id() if comm.rank == 0 else None))


class DeferredInterrupt:
    """While active, SIGINT only sets :attr:`pending` (main thread only; elsewhere a no-op)."""

    def __init__(self) -> None:
        self.pending = False
        self._previous: object = None

    def _note(self, signum: int, frame: object) -> None:
        self.pending = True

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


class RunTransaction(Transaction):
    """Collective: the staged files and the single commit point of one run.

    The :class:`~ensio.io.txn.transaction.Transaction` of ``files`` mode (and
    of tiled files): :meth:`stage` names the staged file of a declared target,
    :meth:`commit` is the journal's ``COMMITTED`` marker then the renames,
    :meth:`recover` is :func:`ensio.io.txn.journal.recover` of its root.

    Parameters
    ----------
    root : Path
        The journal root (the first member's directory).
    comm : MPI.Comm
        Every rank knows the staged names; rank 0 drives the journal.
    targets : sequence of Path
        Every file the run creates or replaces besides the members written in
        place: products, member copies, the run record.
    fsync : bool
        Make the journal, the staged files and the renames durable.
    """

    def __init__(self, root: Path, comm: MPI.Comm, targets: Sequence[Path], *,
                 fsync: bool) -> None:
        self.root, self.comm, self.fsync = Path(os.path.abspath(root)), comm, fsync
        token = comm.bcast(staging.new_token() if comm.rank == 0 else None)
        self._staged = {os.path.abspath(t): staging.staged_path(t, token) for t in targets}
        self.open = False
        self.interrupt = DeferredInterrupt()

    def __enter__(self) -> RunTransaction:
        """Begin; on leaving, abort unless committed (any error, SIGINT)."""
        self.interrupt.__enter__()
        try:
            self.begin()
        except BaseException:
            self.interrupt.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.abort()
        finally:
            self.interrupt.__exit__()

    def checkpoint(self) -> None:
        """Collective: raise KeyboardInterrupt on every rank if any rank got SIGINT."""
        if self.comm.allreduce(int(self.interrupt.pending), op=MPI.MAX):
            raise KeyboardInterrupt

    def stage(self, target: str | Path) -> Path:
        """The staged name of ``target`` (a declared target)."""
        return self._staged[os.path.abspath(target)]

    def begin(self) -> None:
        """Collective: create the journal listing the staged files (none exists yet)."""
        pairs = [(s, Path(t)) for t, s in self._staged.items()]
        root_call(self.comm, lambda: journal.begin(self.root, pairs, fsync=self.fsync))
        self.open = True

    def commit(self) -> int:
        """Collective, after every write: the commit marker, then the staged renames."""
        self.checkpoint()  # also: every rank's staged files are complete
        moved = root_call(self.comm, lambda: journal.commit(self.root, fsync=self.fsync,
                                                            transaction=True))
        self.open = False
        return moved

    def abort(self) -> None:
        """Roll everything back (rank 0 only, no collective: also after SIGINT).

        Call it once no rank writes any more (after an agreed error) or when
        every rank was interrupted. Idempotent.
        """
        if self.open and self.comm.rank == 0:
            journal.abort(self.root, fsync=self.fsync)
        self.open = False

    @classmethod
    def recover(cls, directory: Path, **options: Any) -> RecoveryReport:
        """The journal of ``directory`` rolled back, or forward after its marker
        (:func:`ensio.io.txn.journal.recover`; ``options``: ``fsync``, ``force``,
        ``locked``)."""
        return journal.recover(directory, **options)


def journaled_write(comm: MPI.Comm, root: Path, journaled: bool, fsync: bool,
                    write: Callable[[journal.UndoLog | None], ErrorNote]) -> None:
    """Every rank's in-place write as one all-or-nothing step (collective over ``comm``).

    Each rank runs ``write(undo)`` with its own undo log (``None`` unjournaled), which
    records prior bytes before it overwrites them and returns an error note instead of
    raising. If any rank failed, the journal is rolled back on the root and the error
    is raised on every rank; else, once every rank's bytes are written, the journal is
    committed. One home for the file and the tiled ensemble writers.
    """
    undo = journal.UndoLog.create(root, comm.rank, fsync=fsync) if journaled else None
    try:
        note = write(undo)
    finally:
        if undo is not None:
            undo.close()
    note = agree(comm, note)
    if note is not None:
        if journaled:
            root_call(comm, lambda: journal.abort(root, fsync=fsync))
        raise rebuild(note)
    # agree() is an allgather: no rank gets past it before every rank's bytes are
    # written, so it already orders the commit after all writes (no extra barrier)
    if journaled:
        root_call(comm, lambda: journal.commit(root, fsync=fsync))
