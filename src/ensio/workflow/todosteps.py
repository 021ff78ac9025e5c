"""The transitions of the to-do list, as pure functions of the loaded list.

:class:`~ensio.workflow.todo.TodoList` runs each under its lock
(``_transact``): a step gets the list (tasks wrapped so missing fields read
as their defaults) and the time, changes it in place, and returns its result
and whether it changed anything (only then is the list written). Split out
of :mod:`ensio.workflow.todo`, which owns the file, the lock and the API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .leases import Idle, Lease, StaleLease, TaskView
from .summary import analysis_gate

__all__ = ["early_step", "held", "lease_step", "reclaim", "settle_step"]


def lease_step(owner: str, fits: Callable[[TaskView], bool] | None,
                duration: float | None, spare: bool = False,
                ) -> Callable[[dict[str, Any], float], tuple[Lease | Idle, bool]]:
    """The transition of :meth:`TodoList.lease` (also run after ``done``)."""

    def step(st: dict[str, Any], now: float) -> tuple[Lease | Idle, bool]:
        if st["error"]:
            return Idle("failed", st["error"]), False
        members = [t for t in st["tasks"] if t["kind"] == "member"]
        settled = all(t["state"] in ("done", "failed") for t in members)
        gate = analysis_gate(st, members) if settled else None
        if gate is not None and any(t["kind"] == "analysis" and t["state"] == "pending"
                                    for t in st["tasks"]):
            st["error"] = gate
            for t in st["tasks"]:
                if t["kind"] == "analysis":
                    t.set(state="failed", error=gate)
            return Idle("failed", gate), True
        if spare:
            free = sum(t["state"] == "pending" and (t["kind"] == "member" or settled)
                       for t in st["tasks"])
            others = {t["owner"] for t in st["tasks"] if t["state"] == "leased"} - {owner}
            if free - 1 < len(others):
                return Idle("busy", "no task to spare"), False
        blocked = None
        for t in st["tasks"]:
            if t["state"] != "pending" or (t["kind"] == "analysis" and not settled):
                continue
            view = TaskView.of(t)
            if fits is not None and not fits(view):
                blocked = blocked or view
                continue
            st["token"] += 1
            t.set(state="leased", owner=owner, token=st["token"],
                  deadline=now + (duration or st["lease_seconds"]), attempts=t["attempts"] + 1)
            return Lease(t["id"], t["kind"], t.get("member"), st["cycle"], t["token"],
                         owner, t["deadline"], t["attempts"], now), True
        if blocked is not None:
            return Idle("no_fit", f"{blocked.id} does not fit", blocked), False
        if all(t["state"] in ("done", "failed") for t in st["tasks"]):
            if gate is not None:  # a list without analysis that missed min_members
                st["error"] = gate
                return Idle("failed", gate), True
            return Idle("finished"), False
        return Idle("busy"), False

    return step


def early_step(owner: str, fits: Callable[[TaskView], bool] | None,
                ) -> Callable[[dict[str, Any], float], tuple[Lease | None, bool]]:
    """The transition of :meth:`TodoList.lease_analysis_early`."""

    def step(st: dict[str, Any], now: float) -> tuple[Lease | None, bool]:
        members = [t for t in st["tasks"] if t["kind"] == "member"]
        if (st["error"] or any(t["state"] == "pending" for t in members)
                or all(t["state"] in ("done", "failed") for t in members)):
            return None, False
        for t in st["tasks"]:
            if t["kind"] == "analysis" and t["state"] == "pending":
                if fits is not None and not fits(TaskView.of(t)):
                    return None, False
                st["token"] += 1
                t.set(state="leased", owner=owner, token=st["token"],
                      deadline=now + st["lease_seconds"], attempts=t["attempts"] + 1)
                return Lease(t["id"], t["kind"], None, st["cycle"], t["token"], owner,
                             t["deadline"], t["attempts"], now), True
        return None, False

    return step


def held(st: dict[str, Any], lease: Lease) -> dict[str, Any]:
    """The task of a valid lease, or :class:`StaleLease` (fencing check)."""
    for t in st["tasks"]:
        if t["id"] == lease.task:
            if t["state"] == "leased" and t["token"] == lease.token:
                return t
            raise StaleLease(f"{lease.task}: lease token {lease.token} is stale "
                             f"(task {t['state']}, current token {t['token']})")
    raise StaleLease(f"{lease.task}: no such task")


def reclaim(st: dict[str, Any], now: float) -> bool:
    """Expired leases back to the front, in their list order."""
    expired = [t for t in st["tasks"] if t["state"] == "leased" and t["deadline"] < now]
    if not expired:
        return False
    rest = [t for t in st["tasks"] if not (t["state"] == "leased" and t["deadline"] < now)]
    for t in expired:
        t.set(state="pending", owner=None, deadline=None, expiries=t["expiries"] + 1)
    st["tasks"] = expired + rest
    return True


def settle_step(lease: Lease) -> Callable[[dict[str, Any], float], tuple[str | Idle, bool]]:
    """The transition of :meth:`TodoList.settle_early`."""

    def step(st: dict[str, Any], now: float) -> tuple[str | Idle, bool]:
        t = held(st, lease)
        members = [u for u in st["tasks"] if u["kind"] == "member"]
        if any(u["state"] == "pending" for u in members):
            return "pending", False
        if not all(u["state"] in ("done", "failed") for u in members):
            return "running", False
        gate = analysis_gate(st, members)
        if gate is None:
            return "ready", False
        st["error"] = gate
        t.set(state="failed", error=gate, owner=None, deadline=None)
        return Idle("failed", gate), True

    return step
