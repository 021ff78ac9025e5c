"""Keep N_j worker jobs on a to-do list until it is finished (the driver's side).

Workers exit when there is nothing they may take (all remaining tasks are
leased by others or wait for them, or nothing fits in their time left), and
jobs die or hit their time limit. So the driver watches the list (lock-free
snapshots) and the back-end's job states and keeps

    live jobs ≥ min(N_j, available tasks + tasks leased by live holders)

by submitting replacements, where *available* counts pending tasks the next
lease could hand out, including expired leases of dead jobs. When the list
is finished, jobs still pending in the queue are cancelled (running ones see
the finished list and exit by themselves); when it failed (the analysis was
refused), every job is cancelled. Repeatedly failing jobs (a worker that
cannot start) raise :class:`PoolError` instead of being resubmitted forever.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import EnsioError
from .backends.base import Backend, JobSpec
from .todo import Summary, TodoList

__all__ = ["PoolError", "PoolResult", "drain"]

_LIVE = ("pending", "running", "unknown")


class PoolError(EnsioError):
    """The pool cannot make progress (workers keep failing, or a timeout)."""


@dataclass
class PoolResult:
    """Outcome of :func:`drain`.

    ``error`` is the list's failure message (e.g. the analysis was refused)
    or None; ``jobs`` every job id submitted, in order; ``cancelled`` the
    ids cancelled at the end; ``running`` those still running on return.
    """

    summary: Summary
    error: str | None
    jobs: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    failed_jobs: int = 0
    seconds: float = 0.0


def drain(todo: TodoList, backend: Backend, job: JobSpec | Callable[[int], JobSpec],
          jobs: int, *, poll: float = 0.5, max_failed_jobs: int | None = None,
          timeout: float | None = None, settle: float = 0.0,
          on_submit: Callable[[str, JobSpec], None] | None = None) -> PoolResult:
    """Run the list to its end with at most ``jobs`` live worker jobs.

    Parameters
    ----------
    todo : TodoList
        The cycle's list (created with :func:`ensio.workflow.spec.create_todo`).
    backend : Backend
        Where jobs run.
    job : JobSpec or callable
        The worker job (argv from :func:`ensio.workflow.spec.worker_argv`), or
        a function of the submission number (0, 1, …) returning it.
    jobs : int
        N_j.
    poll : float
        Seconds between looks at the list and the job states.
    max_failed_jobs : int, optional
        Give up (:class:`PoolError`) after this many jobs ended as ``failed``
        while the list was unfinished (default ``2 * jobs + 2``).
    timeout : float, optional
        Give up after this many seconds (:class:`PoolError`).
    settle : float
        After the end, wait up to this long for running jobs to exit.
    on_submit : callable, optional
        Called with (job id, spec) after each submission (logging).
    """
    t0 = time.monotonic()
    limit = 2 * jobs + 2 if max_failed_jobs is None else max_failed_jobs
    result = PoolResult(summary=todo.summary(), error=None)
    live: set[str] = set()

    def submit(n: int) -> None:
        for _ in range(n):
            spec = job(len(result.jobs)) if callable(job) else job
            jid = backend.submit(spec)
            result.jobs.append(jid)
            live.add(jid)
            if on_submit is not None:
                on_submit(jid, spec)

    while True:
        s = todo.summary()
        result.summary = s
        if s.finished or s.error:
            break
        if live:
            for jid, state in backend.states(sorted(live)).items():
                if state not in _LIVE:
                    live.discard(jid)
                    result.failed_jobs += state == "failed"
        if result.failed_jobs > limit:
            backend.cancel(sorted(live))
            raise PoolError(f"{todo.path}: {result.failed_jobs} worker jobs failed; see their "
                            "logs (is the worker command right?)")
        want = min(jobs, s.available + s.leased - s.expired)
        if s.available > 0 and len(live) < want:
            submit(min(want - len(live), s.available))
        if timeout is not None and time.monotonic() - t0 > timeout:
            backend.cancel(sorted(live))
            raise PoolError(f"{todo.path}: not finished after {timeout:.0f} s ({s})")
        time.sleep(poll)

    result.error = s.error
    states = backend.states(sorted(live)) if live else {}
    ending = [j for j, st in states.items() if st == "pending" or (s.error and st == "running")]
    if ending:
        backend.cancel(ending)
        result.cancelled = ending
    running = [j for j, st in states.items() if st == "running" and j not in ending]
    end = time.monotonic() + settle
    while running and time.monotonic() < end:
        time.sleep(min(poll, 0.05))
        now = backend.states(running)
        running = [j for j in running if now[j] in ("running", "unknown")]
    result.running = running
    result.seconds = time.monotonic() - t0
    return result
