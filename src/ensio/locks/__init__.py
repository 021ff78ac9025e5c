"""Every lock of ensio, in one place below io/ and workflow/ (standard library only).

Two kinds of hold, one owner record:

* :mod:`.ensemble` — the ensemble lock (``<root>/.ensio-lock``): one writer of a
  set of member files for a run's whole life; never waits, a live holder of
  another run is refused with :class:`LockError` naming it
  (:meth:`Holder.describe`), a holder of the same run is joined, a dead
  holder's lock taken over. Used by io/txn (journal, commit, shuffle journal),
  io/modes/shuffle and ``ensio recover``.
* :mod:`.filelock` — blocking locks of milliseconds (the to-do list of
  workflow/), with the fallback chain a shared file system needs:
  ``flock`` → ``lockf`` → a lock directory holding the owner record
  (:func:`detect_lock_kind`, :func:`make_lock`).
* :mod:`.owner` — :class:`Holder`, the record both write (host, pid, pid start
  time, boot id, start time, command, run) and how it is judged alive.

It sits with ``errors``/``durable`` at the bottom of DESIGN.md's order (it
imports only ``errors`` and ``faults``), so io/ and workflow/ (which may
import neither the other) share one implementation; worker jobs import it at
start-up, hence the standard library only.
"""

from .ensemble import LOCK_NAME, EnsembleLock, LockError, held_by_me, lock_path, read_holder
from .filelock import (
    LOCK_KINDS,
    FileLock,
    LockKind,
    LockUnsupported,
    MkdirLock,
    detect_lock_kind,
    make_lock,
)
from .owner import Holder, command_line, process_start, run_id

__all__ = [
    "LOCK_KINDS",
    "LOCK_NAME",
    "EnsembleLock",
    "FileLock",
    "Holder",
    "LockError",
    "LockKind",
    "LockUnsupported",
    "MkdirLock",
    "command_line",
    "detect_lock_kind",
    "held_by_me",
    "lock_path",
    "make_lock",
    "process_start",
    "read_holder",
    "run_id",
]
