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
  only look (:meth:`TodoList.snapshot`) need no lock.

Assumptions, in one place: the directory is shared by all jobs with atomic
``rename`` and close-to-open consistency (NFS' default; not ``nocto``); node
clocks agree to well within the lease time (NTP), since deadlines are wall
clock; the lock kind (see :mod:`ensio.workflow.locks`) is detected when the
list is created and recorded in ``NAME.lock``, and every job uses that kind.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .locks import LOCK_KINDS, FileLock, LockKind, MkdirLock, detect_lock_kind, make_lock

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
TaskKind = Literal["member", "analysis"]
TaskState = Literal["pending", "leased", "done", "failed"]
IdleReason = Literal["finished", "failed", "busy", "no_fit"]

#: Fields of a task and their defaults; defaults are left out of the file to keep it small.
_DEFAULTS: dict[str, Any] = {
    "state": "pending", "attempts": 0, "failures": 0, "interrupts": 0, "expiries": 0,
    "token": 0, "owner": None, "deadline": None, "leased_at": None, "done_at": None,
    "done_by": None, "done_token": None, "error": None,
}

#: Test hook: called with a stage name at each step of a transition (crash tests).
_fault: Callable[[str], None] | None = None


def _hook(stage: str) -> None:
    if _fault is not None:
        _fault(stage)


def member_task(member: int) -> str:
    """Task id of a member (``mem001``)."""
    return f"mem{member:03d}"


class TodoError(Exception):
    """A to-do list that is missing, corrupt or used wrongly."""


class StaleLease(TodoError):
    """The lease is no longer valid (expired, re-leased or already settled): do not commit."""


@dataclass(frozen=True)
class TaskView:
    """Read-only view of one task (what ``fits`` predicates and snapshots see)."""

    id: str
    kind: TaskKind
    member: int | None
    state: TaskState
    attempts: int
    failures: int
    interrupts: int
    expiries: int
    token: int
    owner: str | None
    deadline: float | None
    error: str | None

    @classmethod
    def of(cls, t: Mapping[str, Any]) -> TaskView:
        return cls(t["id"], t["kind"], t.get("member"), t["state"], t["attempts"],
                   t["failures"], t["interrupts"], t["expiries"], t["token"], t["owner"],
                   t["deadline"], t["error"])


@dataclass(frozen=True)
class Lease:
    """The right to run one task until ``deadline`` (renewable), proven by ``token``."""

    task: str
    kind: TaskKind
    member: int | None
    cycle: int
    token: int
    owner: str
    deadline: float
    attempt: int


@dataclass(frozen=True)
class Idle:
    """No task was leased, and why.

    ``finished``: nothing left to do. ``failed``: the list cannot finish (the
    analysis was refused or failed; ``message`` says why). ``busy``: all
    remaining tasks are leased by other jobs or wait for them. ``no_fit``:
    available tasks exist but ``fits`` refused them all (``blocked`` is the first).
    """

    reason: IdleReason
    message: str = ""
    blocked: TaskView | None = None


@dataclass(frozen=True)
class Summary:
    """Counts of a list at one moment; ``available`` counts expired leases as free."""

    total: int
    pending: int
    leased: int
    expired: int
    done: int
    failed: int
    available: int
    finished: bool
    error: str | None
    seq: int
    token: int


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
        _write_atomic(kind_file, (kind + "\n").encode())
        tasks = [{"id": member_task(m), "kind": "member", "member": m} for m in members]
        if analysis:
            tasks.append({"id": ANALYSIS, "kind": "analysis"})
        state = {
            "format": FORMAT, "version": VERSION, "cycle": int(cycle), "created": time.time(),
            "seq": 0, "token": 0, "retries": int(retries), "min_members": int(min_members),
            "lease_seconds": float(lease_seconds), "error": None, "meta": dict(meta or {}),
            "tasks": [{**_DEFAULTS, **t} for t in tasks],
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
        """The current list as plain data, read without the lock (always consistent)."""
        return self._load()

    @property
    def meta(self) -> dict[str, Any]:
        """The ``meta`` data given at creation (immutable afterwards)."""
        return self._load()["meta"]

    def summary(self, now: float | None = None) -> Summary:
        """Counts at ``now`` from a lock-free snapshot (for drivers that poll)."""
        return summarize(self._load(), time.time() if now is None else now)

    def tasks(self) -> list[TaskView]:
        """Every task in list order (front first)."""
        return [TaskView.of(t) for t in self._load()["tasks"]]

    # ------------------------------------------------------------------ transitions
    def lease(self, owner: str, *, now: float | None = None,
              fits: Callable[[TaskView], bool] | None = None,
              duration: float | None = None) -> Lease | Idle:
        """Lease the first available task that ``fits`` (or say why none).

        Members are available when pending; the analysis when pending, every
        member is settled and at least ``min_members`` are done. ``fits`` is
        called under the lock, so it must be cheap (compare precomputed numbers).
        """
        return self._transact(_lease_step(owner, fits, duration), now)

    def renew(self, lease: Lease, *, now: float | None = None,
              duration: float | None = None) -> Lease:
        """Extend a valid lease; :class:`StaleLease` if it is no longer ours."""

        def step(st: dict[str, Any], now: float) -> tuple[Lease, bool]:
            t = _held(st, lease)
            t["deadline"] = now + (duration or st["lease_seconds"])
            return Lease(lease.task, lease.kind, lease.member, lease.cycle, lease.token,
                         lease.owner, t["deadline"], lease.attempt), True

        return self._transact(step, now)

    def done(self, lease: Lease, *, commit: Callable[[], None] | None = None,
             now: float | None = None, next_owner: str | None = None,
             fits: Callable[[TaskView], bool] | None = None) -> Lease | Idle | None:
        """Mark the leased task done; ``commit`` runs under the lock after the fencing check.

        ``commit`` (e.g. renaming the staged output into place) must be safe to
        repeat: a crash after it but before the list is written leaves the
        task leased, and it is redone later. With ``next_owner`` the next task
        is leased in the same transaction (one rewrite instead of two per
        task) and returned as by :meth:`lease`; otherwise None is returned.
        """
        then = _lease_step(next_owner, fits, None) if next_owner is not None else None

        def step(st: dict[str, Any], now: float) -> tuple[Lease | Idle | None, bool]:
            t = _held(st, lease)
            if isinstance(self._lock, MkdirLock) and not self._lock.still_held():
                raise TodoError(f"{self.path}: lock was broken as stale during the commit")
            if commit is not None:
                commit()
            t.update(state="done", done_at=now, done_by=lease.owner, done_token=lease.token,
                     owner=None, deadline=None, error=None)
            return (then(st, now)[0] if then is not None else None), True

        return self._transact(step, now)

    def fail(self, lease: Lease, reason: str, *, now: float | None = None) -> bool:
        """Record a failed attempt; return True if the task will be retried."""

        def step(st: dict[str, Any], now: float) -> tuple[bool, bool]:
            t = _held(st, lease)
            t.update(failures=t["failures"] + 1, owner=None, deadline=None, error=reason)
            retry = t["failures"] <= st["retries"]
            if retry:
                t["state"] = "pending"
                tasks = st["tasks"]
                tasks.remove(t)
                at = next((i for i, u in enumerate(tasks) if u["kind"] == "analysis"),
                          len(tasks))
                tasks.insert(at, t)
            else:
                t["state"] = "failed"
                if t["kind"] == "analysis":
                    st["error"] = (f"cycle {st['cycle']}: the analysis failed after "
                                   f"{t['failures']} attempt(s): {reason}")
            return retry, True

        return self._transact(step, now)

    def interrupt(self, lease: Lease, *, now: float | None = None) -> None:
        """Give the task back unfinished (time limit): it goes to the front."""

        def step(st: dict[str, Any], now: float) -> tuple[None, bool]:
            t = _held(st, lease)
            t.update(state="pending", owner=None, deadline=None,
                     interrupts=t["interrupts"] + 1)
            st["tasks"].remove(t)
            st["tasks"].insert(0, t)
            return None, True

        self._transact(step, now)

    # ------------------------------------------------------------------ machinery
    def _transact(self, step: Callable[[dict[str, Any], float], tuple[Any, bool]],
                  now: float | None) -> Any:
        with self._lock:
            _hook("locked")
            now = time.time() if now is None else now
            st = self._load()
            changed = _reclaim(st, now)
            result, stepped = step(st, now)
            if changed or isinstance(result, Idle):  # a job died, or one is leaving
                self._remove_temporaries()
            if changed or stepped:
                st["seq"] += 1
                self._store(st)
            return result

    def _load(self) -> dict[str, Any]:
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
        st["tasks"] = [{**_DEFAULTS, **t} for t in st["tasks"]]
        return st

    def _store(self, st: dict[str, Any]) -> None:
        out = dict(st)
        out["tasks"] = [{k: v for k, v in t.items() if _DEFAULTS.get(k, ...) != v}
                        for t in st["tasks"]]
        _write_atomic(self.path, json.dumps(out, separators=(",", ":")).encode())

    def _remove_temporaries(self) -> None:
        """Delete temporary files of writers that died (only called under the lock)."""
        prefix = self.path.name + ".tmp."
        for entry in os.scandir(self.path.parent):
            if entry.name.startswith(prefix):
                try:
                    os.unlink(entry.path)
                except FileNotFoundError:
                    pass


def _lease_step(owner: str, fits: Callable[[TaskView], bool] | None,
                duration: float | None) -> Callable[[dict[str, Any], float],
                                                    tuple[Lease | Idle, bool]]:
    """The transition of :meth:`TodoList.lease` (also run after ``done``)."""

    def step(st: dict[str, Any], now: float) -> tuple[Lease | Idle, bool]:
        if st["error"]:
            return Idle("failed", st["error"]), False
        members = [t for t in st["tasks"] if t["kind"] == "member"]
        settled = all(t["state"] in ("done", "failed") for t in members)
        gate = _analysis_gate(st, members) if settled else None
        if gate is not None and any(t["kind"] == "analysis" and t["state"] == "pending"
                                    for t in st["tasks"]):
            st["error"] = gate
            for t in st["tasks"]:
                if t["kind"] == "analysis":
                    t["state"], t["error"] = "failed", gate
            return Idle("failed", gate), True
        blocked = None
        for t in st["tasks"]:
            if t["state"] != "pending" or (t["kind"] == "analysis" and not settled):
                continue
            view = TaskView.of(t)
            if fits is not None and not fits(view):
                blocked = blocked or view
                continue
            st["token"] += 1
            t.update(state="leased", owner=owner, token=st["token"], leased_at=now,
                     deadline=now + (duration or st["lease_seconds"]),
                     attempts=t["attempts"] + 1)
            return Lease(t["id"], t["kind"], t.get("member"), st["cycle"], t["token"],
                         owner, t["deadline"], t["attempts"]), True
        if blocked is not None:
            return Idle("no_fit", f"{blocked.id} does not fit", blocked), False
        if all(t["state"] in ("done", "failed") for t in st["tasks"]):
            if gate is not None:  # a list without analysis that missed min_members
                st["error"] = gate
                return Idle("failed", gate), True
            return Idle("finished"), False
        return Idle("busy"), False

    return step


def _held(st: dict[str, Any], lease: Lease) -> dict[str, Any]:
    """The task of a valid lease, or :class:`StaleLease` (fencing check)."""
    for t in st["tasks"]:
        if t["id"] == lease.task:
            if t["state"] == "leased" and t["token"] == lease.token:
                return t
            raise StaleLease(f"{lease.task}: lease token {lease.token} is stale "
                             f"(task {t['state']}, current token {t['token']})")
    raise StaleLease(f"{lease.task}: no such task")


def _reclaim(st: dict[str, Any], now: float) -> bool:
    """Expired leases back to the front, in their list order."""
    expired = [t for t in st["tasks"] if t["state"] == "leased" and t["deadline"] < now]
    if not expired:
        return False
    rest = [t for t in st["tasks"] if not (t["state"] == "leased" and t["deadline"] < now)]
    for t in expired:
        t.update(state="pending", owner=None, deadline=None, expiries=t["expiries"] + 1)
    st["tasks"] = expired + rest
    return True


def _analysis_gate(st: dict[str, Any], members: list[dict[str, Any]]) -> str | None:
    """None if enough members are done for the analysis, else the refusal message."""
    done = sum(t["state"] == "done" for t in members)
    if done >= st["min_members"]:
        return None
    failed = [t for t in members if t["state"] == "failed"]
    detail = "; ".join(f"member {t['member']} after {t['failures']} attempt(s): {t['error']}"
                       for t in failed[:10])
    more = f" (and {len(failed) - 10} more)" if len(failed) > 10 else ""
    return (f"cycle {st['cycle']}: analysis refused: only {done} of {len(members)} members "
            f"succeeded, workflow.min_members = {st['min_members']}. Failed: {detail}{more}")


def summarize(st: Mapping[str, Any], now: float) -> Summary:
    """Counts of a loaded list at ``now`` (see :class:`Summary`)."""
    tasks = st["tasks"]
    count = {s: sum(t["state"] == s for t in tasks) for s in ("pending", "leased", "done",
                                                               "failed")}
    expired = sum(t["state"] == "leased" and t["deadline"] < now for t in tasks)
    members = [t for t in tasks if t["kind"] == "member"]
    settled = all(t["state"] in ("done", "failed") for t in members)
    free = [t for t in tasks if t["state"] == "pending"
            or (t["state"] == "leased" and t["deadline"] < now)]
    available = sum(t["kind"] == "member" or settled for t in free)
    error = st.get("error")
    if error is None and settled:
        error = _analysis_gate(dict(st), members)  # what the next lease would record
    finished = error is None and count["pending"] == count["leased"] == 0
    return Summary(len(tasks), count["pending"], count["leased"], expired, count["done"],
                   count["failed"], 0 if error else available, finished, error, st["seq"],
                   st["token"])


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old or the new file."""
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        _hook("written")
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    _hook("synced")
    os.replace(tmp, path)
    _hook("renamed")
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    _hook("dir-synced")
