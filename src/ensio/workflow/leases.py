"""Plain data the to-do list hands out: leases, task views, summaries, errors.

Kept apart from :mod:`ensio.workflow.todo` so drivers and workers can type
against them without the list's machinery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Idle",
    "IdleReason",
    "Lease",
    "StaleLease",
    "Summary",
    "TaskKind",
    "TaskState",
    "TaskView",
    "TodoError",
]

TaskKind = Literal["member", "analysis"]
TaskState = Literal["pending", "leased", "done", "failed"]
IdleReason = Literal["finished", "failed", "busy", "no_fit"]


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
    """The right to run one task until ``deadline`` (renewable), proven by ``token``.

    ``granted`` is when the lease was taken; ``attempt`` counts the leases of the task.
    """

    task: str
    kind: TaskKind
    member: int | None
    cycle: int
    token: int
    owner: str
    deadline: float
    attempt: int
    granted: float


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
