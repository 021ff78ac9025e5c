"""The locked to-do list of the dynamic job scheme (DESIGN.md, issue 4 item 1).

One JSON file on the shared file system holds the tasks of one cycle: the
member IDs followed by the analysis. Jobs lock it, *lease* the first
available task, unlock, run the task, and lock again to mark it done.

Why each rule exists:

* **Leases with a fencing token.** A lease names its owner and a deadline; a
  job that dies stops renewing and its task comes back when the deadline
  passes. Every lease carries a token from a counter that only grows, and
  ``done``/``fail``/``interrupt``/``renew`` are accepted only from the current
  holder with the current token *before its deadline*. A stalled ("zombie")
  job that wakes up after its task was re-leased is refused, and the commit
  callback of :meth:`TodoList.done` (which moves the output into place) runs
  under the lock after that check, so the zombie's output never lands.
* **Back to the front.** A task interrupted at a job's time limit, or whose
  lease expired, goes to the *front* of the list: it is the oldest work and
  the next free job takes it. A *failed* attempt goes behind the remaining
  members (before the analysis), so a retry does not hit the same transient
  problem at once; ``retries`` bounds the failed attempts per task.
  Interruptions and expiries are not the task's fault and do not count.
* **The analysis last.** It is leased only when every member is settled
  (done, or failed after its retries) and at least ``min_members`` are done;
  otherwise the list records a clear refusal and every worker stops.
* **Atomic, durable transitions.** Each change rewrites the whole file: write
  a temporary file, ``fsync`` it, ``rename`` it over the list, ``fsync`` the
  directory — under the lock. A crash at any instant leaves either the old or
  the new list, never a mix, so nothing is lost or duplicated. Readers that
  only look (:meth:`TodoList.snapshot`) need no lock. The rewrite costs
  O(tasks) (JSON; fields at their default are left out) plus two fsyncs,
  which is why a list holds one cycle, and why :meth:`TodoList.done` can
  lease the next task in the same transition.

Assumptions, in one place: the directory is shared by all jobs with atomic
``rename`` and close-to-open consistency (NFS' default; not ``nocto``); node
clocks agree to well within the lease time (NTP), since deadlines are wall
clock; the lock kind (see :mod:`ensio.locks.filelock`) is detected when the
list is created and recorded in ``NAME.lock``, and every job uses that kind.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from .. import faults
from ..durable import atomic_write
from ..locks import (
    LOCK_KINDS,
    FileLock,
    LockKind,
    MkdirLock,
    detect_lock_kind,
    make_lock,
)
from .leases import (
    Idle,
    Lease,
    StaleLease,
    Summary,
    TaskView,
    TodoError,
)
from .summary import summarize
from .todosteps import early_step, held, lease_step, reclaim, settle_step

__all__ = [
    "ANALYSIS",
    "Idle",
    "Lease",
    "StaleLease",
    "Summary",
    "TaskView",
    "TodoError",
    "TodoList",
    "member_task",
]

ANALYSIS = "analysis"
FORMAT = "ensio-todo"
VERSION = 1

#: Fields of a task and their defaults; defaults are left out of the file to keep it small.
_DEFAULTS: dict[str, Any] = {
    "state": "pending", "attempts": 0, "failures": 0, "interrupts": 0, "expiries": 0,
    "token": 0, "owner": None, "deadline": None, "done_at": None,
    "done_by": None, "done_token": None, "error": None,
}

class _Task(dict):
    """A task as stored: ``state`` and the fields that differ from :data:`_DEFAULTS`.

    Reading a missing field gives its default, and :meth:`set` drops fields
    that return to their default, so the file stays small and no per-write
    pass over every task is needed (the list is rewritten at every transition).
    """

    def __missing__(self, key: str) -> Any:
        return _DEFAULTS[key]

    def set(self, **fields: Any) -> None:
        for k, v in fields.items():
            if k != "state" and v == _DEFAULTS[k] and type(v) is type(_DEFAULTS[k]):
                self.pop(k, None)
            else:
                self[k] = v


def member_task(member: int) -> str:
    """Task id of a member (``mem001``)."""
    return f"mem{member:03d}"


class TodoList:
    """A to-do list file shared by the jobs of one cycle.

    Parameters
    ----------
    path : path
        The list file (e.g. ``DIR/cycle_001/todo.json``); ``path.lock`` records
        the lock kind and is the lock file.
    lock : {"flock", "lockf", "mkdir"}, optional
        Override the recorded lock kind (tests only; all jobs must agree).
    stale_after : float
        Age after which a ``mkdir`` lock is considered abandoned.
    """

    def __init__(self, path: str | Path, *, lock: LockKind | None = None,
                 stale_after: float = 30.0) -> None:
        self.path = Path(path)
        kind_file = self.path.with_name(self.path.name + ".lock")
        if lock is None:
            try:
                recorded = kind_file.read_text().strip()
            except FileNotFoundError:
                raise TodoError(f"{self.path}: no such to-do list") from None
            if recorded not in LOCK_KINDS:
                raise TodoError(f"{kind_file}: unknown lock kind {recorded!r}")
            lock = recorded  # type: ignore[assignment]
        self.lock_kind: LockKind = lock  # type: ignore[assignment]
        self._lock: FileLock = make_lock(self.lock_kind, self.path, stale_after)

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(
        cls,
        path: str | Path,
        members: Iterable[int],
        *,
        cycle: int = 0,
        analysis: bool = True,
        retries: int = 0,
        min_members: int | None = None,
        lease_seconds: float = 60.0,
        meta: Mapping[str, Any] | None = None,
        lock: LockKind | Literal["auto"] = "auto",
        exist_ok: bool = False,
    ) -> TodoList:
        """Write a new list: members in the given order, then the analysis.

        Parameters
        ----------
        members : iterable of int
            Member numbers (1-based by convention), run in this order.
        analysis : bool
            Append the analysis task (leased after all members settled).
        retries : int
            Extra attempts after a failed one, per task.
        min_members : int, optional
            Members that must be done for the analysis (default: all).
        lease_seconds : float
            Lease duration; holders renew it well before it ends.
        meta : mapping, optional
            JSON data carried with the list (the worker's commands and paths).
        lock : {"auto", "flock", "lockf", "mkdir"}
            Lock kind; ``auto`` detects it on this directory.
        exist_ok : bool
            Return the existing list instead of failing (resuming a cycle).
        """
        path = Path(path)
        members = [int(m) for m in members]
        if len(set(members)) != len(members):
            raise TodoError(f"{path}: duplicate member numbers")
        n = len(members)
        if min_members is None:
            min_members = n
        if n and not 1 <= min_members <= n:
            raise TodoError(f"{path}: min_members must be in 1..{n}, got {min_members}")
        if retries < 0 or not lease_seconds > 0:
            raise TodoError(f"{path}: retries must be >= 0 and lease_seconds > 0")
        kind_file = path.with_name(path.name + ".lock")
        if path.exists():
            if exist_ok:
                return cls(path)
            raise TodoError(f"{path}: to-do list exists already")
        path.parent.mkdir(parents=True, exist_ok=True)
        kind: LockKind = detect_lock_kind(path.parent) if lock == "auto" else lock
        if kind not in LOCK_KINDS:
            raise TodoError(f"unknown lock kind {kind!r}")
        atomic_write(kind_file, kind + "\n", label="todo")
        tasks = [{"id": member_task(m), "kind": "member", "member": m, "state": "pending"}
                 for m in members]
        if analysis:
            tasks.append({"id": ANALYSIS, "kind": "analysis", "state": "pending"})
        state = {
            "format": FORMAT, "version": VERSION, "cycle": int(cycle), "created": time.time(),
            "seq": 0, "token": 0, "retries": int(retries), "min_members": int(min_members),
            "lease_seconds": float(lease_seconds), "error": None, "meta": dict(meta or {}),
            "tasks": [_Task(t) for t in tasks],
        }
        todo = cls(path, lock=kind)
        with todo._lock:
            if path.exists():
                if exist_ok:
                    return todo
                raise TodoError(f"{path}: to-do list exists already")
            todo._store(state)
        return todo

    # ------------------------------------------------------------------ reading
    def snapshot(self) -> dict[str, Any]:
        """The current list as plain data, read without the lock (always consistent).

        Tasks omit fields at their default value; indexing (``t["state"]``)
        still gives the default, ``t.get(...)`` does not.
        """
        return self._load()

    @property
    def meta(self) -> dict[str, Any]:
        """The ``meta`` data given at creation (immutable afterwards)."""
        return self._load()["meta"]

    def summary(self, now: float | None = None) -> Summary:
        """Counts at ``now`` from a lock-free snapshot (for drivers that poll)."""
        return summarize(self._load(wrap=False), time.time() if now is None else now)

    def tasks(self) -> list[TaskView]:
        """Every task in list order (front first)."""
        return [TaskView.of(t) for t in self._load()["tasks"]]

    # ------------------------------------------------------------------ transitions
    def lease(self, owner: str, *, now: float | None = None,
              fits: Callable[[TaskView], bool] | None = None,
              duration: float | None = None, spare: bool = False) -> Lease | Idle:
        """Lease the first available task that ``fits`` (or say why none).

        Members are available when pending; the analysis when pending, every
        member is settled and at least ``min_members`` are done. ``fits`` is
        called under the lock, so it must be cheap (compare precomputed numbers).
        With ``spare`` (a lease taken ahead, while the owner still runs a task)
        the lease is granted only if at least as many available tasks remain
        as other owners hold leases, so no other job runs dry because of it.
        """
        return self._transact(lease_step(owner, fits, duration, spare), now)

    def renew(self, lease: Lease, *, now: float | None = None,
              duration: float | None = None) -> Lease:
        """Extend a valid lease; :class:`StaleLease` if it is no longer ours."""

        def step(st: dict[str, Any], now: float) -> tuple[Lease, bool]:
            t = held(st, lease)
            t.set(deadline=now + (duration or st["lease_seconds"]))
            return dataclasses.replace(lease, deadline=t["deadline"]), True

        return self._transact(step, now)

    def lease_analysis_early(self, owner: str, *, now: float | None = None,
                             fits: Callable[[TaskView], bool] | None = None) -> Lease | None:
        """Lease the analysis before the last members end, to start it ahead (or None).

        Granted only when no member is pending (every one runs or is
        settled, so the caller has nothing else to do), some member still
        runs, the analysis is pending and ``fits``. Other jobs then see the
        analysis leased and leave it alone. The holder waits with
        :meth:`settle_early` and gives the lease back unstarted
        (:meth:`interrupt`) when a member becomes pending again; a holder
        that dies lets the lease expire like any other.
        """
        return self._transact(early_step(owner, fits), now)

    def settle_early(self, lease: Lease, *, now: float | None = None) -> str | Idle:
        """Where an early analysis lease stands: ``"running"`` (members still run),
        ``"pending"`` (a member waits for a job: give the lease back), ``"ready"``
        (every member settled, the gate passed: start), or :class:`Idle` ``failed``
        (the gate refused the analysis, which is now failed as :meth:`lease` does).
        :class:`StaleLease` if the lease is no longer ours."""
        return self._transact(settle_step(lease), now)

    def done(self, lease: Lease, *, commit: Callable[[], None] | None = None,
             now: float | None = None, next_owner: str | None = None,
             fits: Callable[[TaskView], bool] | None = None,
             spare: bool = False) -> Lease | Idle | None:
        """Mark the leased task done; ``commit`` runs under the lock after the fencing check.

        ``commit`` (e.g. renaming the staged output into place) must be safe to
        repeat: a crash after it but before the list is written leaves the
        task leased, and it is redone later. With ``next_owner`` the next task
        is leased in the same transaction (one rewrite instead of two per
        task) and returned as by :meth:`lease` (with ``fits`` and ``spare``);
        otherwise None is returned.
        """
        then = lease_step(next_owner, fits, None, spare) if next_owner is not None else None

        def step(st: dict[str, Any], now: float) -> tuple[Lease | Idle | None, bool]:
            t = held(st, lease)
            if isinstance(self._lock, MkdirLock) and not self._lock.still_held():
                raise TodoError(f"{self.path}: lock was broken as stale during the commit")
            if commit is not None:
                commit()
            t.set(state="done", done_at=round(now, 3), done_by=lease.owner,
                  done_token=lease.token, owner=None, deadline=None, error=None)
            return (then(st, now)[0] if then is not None else None), True

        return self._transact(step, now)

    def fail(self, lease: Lease, reason: str, *, now: float | None = None) -> bool:
        """Record a failed attempt; return True if the task will be retried."""

        def step(st: dict[str, Any], now: float) -> tuple[bool, bool]:
            t = held(st, lease)
            t.set(failures=t["failures"] + 1, owner=None, deadline=None, error=reason)
            retry = t["failures"] <= st["retries"]
            if retry:
                t.set(state="pending")
                tasks = st["tasks"]
                tasks.remove(t)
                at = next((i for i, u in enumerate(tasks) if u["kind"] == "analysis"),
                          len(tasks))
                tasks.insert(at, t)
            else:
                t.set(state="failed")
                if t["kind"] == "analysis":
                    st["error"] = (f"cycle {st['cycle']}: the analysis failed after "
                                   f"{t['failures']} attempt(s): {reason}")
            return retry, True

        return self._transact(step, now)

    def interrupt(self, lease: Lease, *, now: float | None = None,
                  started: bool = True) -> None:
        """Give the task back unfinished (time limit): it goes to the front.

        Neither way counts as a failed attempt. With ``started=False`` the
        lease was taken ahead and its command never ran (the job stops, or the
        task no longer fits): the lease is undone — the attempt count goes
        back and no interruption is recorded — so the next holder sees
        ``ENSIO_ATTEMPT`` of the first real attempt, not of a lease nobody used.
        """

        def step(st: dict[str, Any], now: float) -> tuple[None, bool]:
            t = held(st, lease)
            if started:
                t.set(state="pending", owner=None, deadline=None,
                      interrupts=t["interrupts"] + 1)
            else:
                t.set(state="pending", owner=None, deadline=None, attempts=t["attempts"] - 1)
            st["tasks"].remove(t)
            st["tasks"].insert(0, t)
            return None, True

        self._transact(step, now)

    # ------------------------------------------------------------------ machinery
    def _transact(self, step: Callable[[dict[str, Any], float], tuple[Any, bool]],
                  now: float | None) -> Any:
        with self._lock:
            faults.point("todo-locked")
            now = time.time() if now is None else now
            st = self._load()
            changed = reclaim(st, now)
            result, stepped = step(st, now)
            if changed or isinstance(result, Idle):  # a job died, or one is leaving
                self._remove_temporaries()
            if changed or stepped:
                st["seq"] += 1
                self._store(st)
            return result

    def _load(self, wrap: bool = True) -> dict[str, Any]:
        for attempt in range(5):
            try:
                data = self.path.read_bytes()
                break
            except FileNotFoundError:
                raise TodoError(f"{self.path}: no such to-do list") from None
            except OSError as exc:  # NFS: the old file was replaced under our handle
                if exc.errno != errno.ESTALE or attempt == 4:
                    raise
        try:
            st = json.loads(data)
        except ValueError:
            raise TodoError(f"{self.path}: corrupt to-do list (not JSON)") from None
        if not isinstance(st, dict) or st.get("format") != FORMAT:
            raise TodoError(f"{self.path}: not an ensio to-do list")
        if st.get("version") != VERSION:
            raise TodoError(f"{self.path}: to-do list version {st.get('version')} "
                            f"(this ensio reads {VERSION})")
        if wrap:
            st["tasks"] = [_Task(t) for t in st["tasks"]]
        return st

    def _store(self, st: dict[str, Any]) -> None:
        atomic_write(self.path, json.dumps(st, separators=(",", ":")), label="todo")

    def _remove_temporaries(self) -> None:
        """Delete temporary files of writers that died (only called under the lock)."""
        prefix = self.path.name + ".tmp."
        for entry in os.scandir(self.path.parent):
            if entry.name.startswith(prefix):
                try:
                    os.unlink(entry.path)
                except FileNotFoundError:
                    pass
