"""Read-only judgements of a to-do list: the analysis gate and the counts drivers poll.

Split out of :mod:`ensio.workflow.todo` because neither changes the list:
:func:`analysis_gate` decides whether enough members succeeded for the
analysis (the list's lease step and :func:`summarize` must agree on it, so it
exists once), and :func:`summarize` turns a lock-free snapshot into the
:class:`~ensio.workflow.leases.Summary` the pool driver acts on. Both work on
the plain loaded data (tasks as mappings; a field missing from a task means
its default), so they need none of the list's locking machinery.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .leases import Summary

__all__ = ["analysis_gate", "summarize"]


def analysis_gate(st: Mapping[str, Any], members: Sequence[Mapping[str, Any]]) -> str | None:
    """None if enough members are done for the analysis, else the refusal message.

    Parameters
    ----------
    st : mapping
        The loaded list (``cycle``, ``min_members``).
    members : sequence of mapping
        Its member tasks, all settled (done or failed) — the caller checks that.
    """
    done = sum(t["state"] == "done" for t in members)
    if done >= st["min_members"]:
        return None
    failed = [t for t in members if t["state"] == "failed"]
    detail = "; ".join(
        f"member {t['member']} after {t.get('failures', 0)} attempt(s): {t.get('error')}"
        for t in failed[:10])
    more = f" (and {len(failed) - 10} more)" if len(failed) > 10 else ""
    return (f"cycle {st['cycle']}: analysis refused: only {done} of {len(members)} members "
            f"succeeded, workflow.min_members = {st['min_members']}. Failed: {detail}{more}")


def summarize(st: Mapping[str, Any], now: float) -> Summary:
    """Counts of a loaded list at ``now`` (see :class:`Summary`); one pass over the tasks.

    Expired leases count as available, as the next lease would reclaim them;
    the analysis counts only once every member is settled, and a list whose
    analysis the gate would refuse reports that error (with nothing available)
    before any job tries, so the driver stops at once.
    """
    count = {"pending": 0, "leased": 0, "done": 0, "failed": 0}
    expired = free_members = free_analysis = 0
    members: list[Mapping[str, Any]] = []
    settled = True
    for t in st["tasks"]:
        state = t["state"]
        count[state] += 1
        gone = state == "leased" and t["deadline"] < now
        expired += gone
        free = state == "pending" or gone
        if t["kind"] == "member":
            members.append(t)
            free_members += free
            settled = settled and state in ("done", "failed")
        else:
            free_analysis += free
    error = st.get("error")
    if error is None and settled:
        error = analysis_gate(st, members)  # as the lease step would
    available = free_members + (free_analysis if settled else 0)
    finished = error is None and count["pending"] == count["leased"] == 0
    return Summary(len(st["tasks"]), count["pending"], count["leased"], expired, count["done"],
                   count["failed"], 0 if error else available, finished, error, st["seq"],
                   st["token"])
