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

Polling: the list is read every ``poll`` seconds (a file read), the job
states at most every :attr:`Backend.min_poll <ensio.workflow.backends.base.Backend.min_poll>`
seconds, since on a real scheduler each look is a request to its controller.

Resuming: batch jobs outlive a driver that is killed. With ``job_file`` every
submitted job is appended to that file (one JSON line, fsynced) before it is
counted, and a driver started later on the same list first *adopts* the jobs
recorded there that still wait or run (:meth:`Backend.adopt
<ensio.workflow.backends.base.Backend.adopt>`): they count toward N_j, and the
pending ones are cancelled at the end like its own. Running leftovers may
still commit their tasks: the leases' fencing tokens make that safe. The one
gap is a driver killed between the scheduler's answer and the append: that
job is not adopted, and exits by itself once it starts and finds the list
finished.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..durable import fsync_path
from ..errors import EnsioError
from ..jsonlines import read_json_lines
from .backends.base import Backend, JobSpec
from .todo import Summary, TodoList

__all__ = ["PoolError", "PoolResult", "drain", "read_job_file"]

_LIVE = ("pending", "running", "unknown")

#: Seconds between looks at the running jobs while settling (at least the back-end's min_poll).
_SETTLE_POLL = 0.05


class PoolError(EnsioError):
    """The pool cannot make progress (workers keep failing, or a timeout)."""


@dataclass
class PoolResult:
    """Outcome of :func:`drain`.

    ``error`` is the list's failure message (e.g. the analysis was refused)
    or None; ``jobs`` every job id submitted, in order; ``adopted`` the live
    jobs of an earlier driver taken over from the job file; ``cancelled`` the
    ids cancelled at the end; ``running`` those still running on return.
    """

    summary: Summary
    error: str | None
    jobs: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    failed_jobs: int = 0
    seconds: float = 0.0


def read_job_file(path: str | Path) -> list[dict[str, Any]]:
    """The jobs recorded in a pool's job file, oldest first (none if it is missing).

    Lines that are not complete JSON objects with an ``id`` (a write cut by a
    crash) are skipped.
    """
    return read_json_lines(path, keep=lambda entry: "id" in entry)


def _append_job(path: Path, entry: dict[str, Any]) -> None:
    """Append one job line durably (O_APPEND, one write, fsync; the directory too when new).

    A line cut short by a crash is ended first, so it stays one skipped line
    instead of swallowing the new one.
    """
    new = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        os.write(fd, (("\n" + line) if torn else line).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if new:
        fsync_path(path.parent, directory=True)


def drain(todo: TodoList, backend: Backend, job: JobSpec | Callable[[int], JobSpec],
          jobs: int, *, poll: float = 0.5, max_failed_jobs: int | None = None,
          timeout: float | None = None, settle: float = 0.0,
          on_submit: Callable[[str, JobSpec], None] | None = None,
          job_file: str | Path | None = None) -> PoolResult:
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
        Seconds between looks at the list; job states are asked at most every
        ``max(poll, backend.min_poll)`` seconds.
    max_failed_jobs : int, optional
        Give up (:class:`PoolError`) after this many jobs ended as ``failed``
        while the list was unfinished (default ``2 * jobs + 2``).
    timeout : float, optional
        Give up after this many seconds (:class:`PoolError`).
    settle : float
        After the end, wait up to this long for running jobs to exit.
    on_submit : callable, optional
        Called with (job id, spec) after each submission (logging).
    job_file : path, optional
        Append-only record of the jobs submitted for this list (JSON lines:
        ``id``, ``backend``, ``name``, ``workdir``, ``submitted``); live jobs
        recorded there by an earlier driver of the same back-end are adopted
        (see the module docstring). Keep it next to the list.
    """
    # Over ~80 lines only through its docstring (every parameter documented); the body is
    # about 53 lines, kept whole so it reads top to bottom.
    t0 = time.monotonic()
    limit = 2 * jobs + 2 if max_failed_jobs is None else max_failed_jobs
    result = PoolResult(summary=todo.summary(), error=None)
    live: set[str] = set()
    path = None if job_file is None else Path(job_file)
    if path is not None:
        earlier = [e for e in read_job_file(path) if e.get("backend") == backend.name]
        adopted = backend.adopt(earlier) if earlier else {}
        result.adopted = [j for j in dict.fromkeys(str(e["id"]) for e in earlier)
                          if j in adopted]
        live.update(result.adopted)

    def submit(n: int) -> None:
        for _ in range(n):
            spec = job(len(result.jobs)) if callable(job) else job
            jid = backend.submit(spec)
            if path is not None:
                _append_job(path, {"id": jid, "backend": backend.name, "name": spec.name,
                                   "workdir": spec.workdir, "submitted": round(time.time(), 3)})
            result.jobs.append(jid)
            live.add(jid)
            if on_submit is not None:
                on_submit(jid, spec)

    state_every = max(poll, backend.min_poll)
    next_states = time.monotonic() + (state_every if result.adopted else 0.0)  # just asked
    while True:
        s = todo.summary()
        result.summary = s
        if s.finished or s.error:
            break
        if live and time.monotonic() >= next_states:
            next_states = time.monotonic() + state_every
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
    _wind_down(result, backend, live, poll, settle)
    result.seconds = time.monotonic() - t0
    return result


def _wind_down(result: PoolResult, backend: Backend, live: set[str], poll: float,
               settle: float) -> None:
    """The list ended: cancel what still waits (everything, if it failed), let the rest exit."""
    states = backend.states(sorted(live)) if live else {}
    ending = [j for j, st in states.items()
              if st == "pending" or (result.error and st == "running")]
    if ending:
        backend.cancel(ending)
        result.cancelled = ending
    running = [j for j, st in states.items() if st == "running" and j not in ending]
    end = time.monotonic() + settle
    while running and time.monotonic() < end:
        time.sleep(min(max(min(poll, _SETTLE_POLL), backend.min_poll),
                       max(0.0, end - time.monotonic())))
        now = backend.states(running)
        running = [j for j in running if now[j] in ("running", "unknown")]
    result.running = running
