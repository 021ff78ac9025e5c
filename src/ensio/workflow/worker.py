"""One job of the dynamic job scheme: drain the to-do list (issue 4 item 2).

A worker leases the first task, runs it, commits it and repeats until the
list has nothing it may take. The list carries a :class:`WorkerSpec` (the
commands and path templates of its cycle), so a job needs nothing but the
list's path and its own time limit: ``python -m ensio.cli.worker LIST
--time-limit SECONDS`` (the same as ``ensio worker``, without loading the
other sub-commands).

Why it works the way it does:

* Commands are templates split with :func:`shlex.split` and filled in per
  argument with :meth:`str.format` (plain placeholder names only), then run
  without a shell: values with spaces or quotes stay one argument and nothing
  is ever evaluated.
* A member succeeds only if it exits 0 *and* wrote ``{forecast}``. The
  command writes into a private staging directory (``…/.ensio-stage/tTOKEN/``,
  same file name); the worker moves the file into place inside
  :meth:`TodoList.done`, under the lock, after the fencing check: a zombie
  whose lease was taken over can never overwrite the committed output.
* Time: the job's deadline is ``--time-limit`` from the worker's start minus
  a margin. The worker never starts a task whose expected duration (the
  longest of the recent successful runs of that kind in the records, else
  ``task_estimate``) exceeds the time left. SIGTERM, SIGUSR1 (SLURM's
  ``--signal``, which can come up to 60 s early) or its own timer — whichever
  comes first — stop the running command's process group, put the task back
  at the *front* and end the job with status 0.
* A thread renews the leases while a command runs, so a long task never
  expires; if the lease is lost anyway (the job was stalled), the command is
  stopped and nothing is committed.
* While a task runs, the next one is leased ahead (``WorkerSpec.prefetch``)
  and started the moment the running one exits; the exited one is committed
  after that, while the next runs. So the commit — a locked, fsynced rewrite
  of the list, milliseconds on a local disk, more on a parallel file system —
  costs no time between tasks. A task leased ahead that no longer fits in the
  time left, or that the job cannot run because it stops, goes back to the
  front unstarted, behind an interrupted task, and counts as no attempt.

The command's environment also holds ``ENSIO_TASK``, ``ENSIO_MEMBER``,
``ENSIO_CYCLE``, ``ENSIO_TOKEN``, ``ENSIO_ATTEMPT``, ``ENSIO_JOB_ID``,
``ENSIO_FORECAST`` (the final path) and ``ENSIO_REPORT``: a file the command
may write as JSON (``{"io_seconds": 1.5}``) to report its I/O time.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from ..config.errors import ConfigError
from ..errors import EnsioError
from .prestart import Prestarted, await_members
from .records import RecordTail, append_record
from .renewer import Renewer
from .running import Running
from .spec import (
    WorkerSpec,
    create_todo,
    default_margin,
    move_durably,
    prepare_task,
    render,
    reported_io,
    worker_argv,
)
from .todo import Idle, Lease, StaleLease, TaskView, TodoList

__all__ = [
    "Worker",
    "WorkerSpec",
    "create_todo",
    "default_margin",
    "render",
    "run_job",
    "worker_argv",
]

Outcome = Literal["exited", "lost", "interrupted"]

#: Exit statuses of a command killed by the signals a scheduler sends a whole job:
#: killed by the signal (-N), or reporting it the shell's way (128 + N), as
#: wrappers such as ``mpiexec`` or a trapping script do.
_JOB_SIGNALS = frozenset(
    code for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1) for code in (-sig, 128 + sig)
)


class Worker:
    """The loop of one job over one list (see the module docstring).

    Parameters
    ----------
    todo : TodoList
        The list to drain (its ``meta`` holds the :class:`WorkerSpec`).
    time_limit : float, optional
        Seconds this job may run, counted from construction.
    margin : float, optional
        Seconds kept free before the limit (default :func:`default_margin`).
    job_id, submitted : optional
        Scheduler job id and submission time for the records (default from
        ``ENSIO_JOB_ID``/``SLURM_JOB_ID`` and ``ENSIO_SUBMITTED``).
    records : path, optional
        Records file (default: the spec's).
    log : callable, optional
        Receives one line per event (default: stderr).
    """

    def __init__(self, todo: TodoList, *, time_limit: float | None = None,
                 margin: float | None = None, job_id: str | None = None,
                 submitted: float | None = None, records: str | Path | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self._t0 = time.monotonic()
        self.todo = todo
        snap = todo.snapshot()
        self.spec = WorkerSpec.from_meta(snap["meta"])
        self.base = todo.path.parent
        self.time_limit = time_limit
        self.margin = default_margin(time_limit) if margin is None else margin
        env = os.environ
        self.job_id = (job_id or env.get("ENSIO_JOB_ID") or env.get("SLURM_JOB_ID")
                       or f"pid{os.getpid()}")
        sub = submitted if submitted is not None else env.get("ENSIO_SUBMITTED")
        self.submitted = float(sub) if sub not in (None, "") else None
        self.host = socket.gethostname()
        self.owner = f"{self.job_id}@{self.host}:{os.getpid()}"
        rec = records if records is not None else self.spec.records
        self.records = (Path(rec) if Path(rec).is_absolute() else self.base / rec) if rec else None
        self._tail = RecordTail(self.records, skip_owner=self.owner) if self.records else None
        self._check: tuple[Mapping[str, float], float] = ({}, float("inf"))
        self._log = log or (lambda m: print(f"ensio worker {self.job_id}: {m}",
                                            file=sys.stderr, flush=True))
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._renewer = Renewer(todo, snap["lease_seconds"] / 4, self._wake, self._log)
        self.stop_reason: str | None = None
        self.tasks_run = 0

    # ------------------------------------------------------------------ control
    def request_stop(self, reason: str) -> None:
        """Stop soon: interrupt the running task (requeued at the front) and exit."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop.set()
        self._wake.set()

    def remaining(self) -> float:
        """Seconds left before the job's deadline minus the margin."""
        if self.time_limit is None:
            return float("inf")
        return self._t0 + self.time_limit - self.margin - time.monotonic()

    def _estimates(self) -> Mapping[str, float]:
        """Expected seconds per task kind: records of other jobs plus our own runs."""
        s = self.spec
        est = {"member": s.task_estimate, "analysis": s.analysis_estimate or s.task_estimate}
        if self._tail is not None:
            self._tail.refresh()
            est = {k: self._tail.estimate(k, v) for k, v in est.items()}
        return est

    def _fits(self, busy: Running | None = None) -> Callable[[TaskView], bool]:
        """Lease predicate: the task fits in the time left (after ``busy`` ends).

        The numbers used are kept for the task's record.
        """
        est = self._estimates()
        remaining = self.remaining()
        if busy is not None:  # leasing ahead: the running task's expected rest comes first
            remaining -= max(0.0, est[busy.lease.kind] - (time.time() - busy.rec["started"]))
        self._check = (est, remaining)
        return lambda v: est[v.kind] <= remaining

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        """Drain the list; 0 when done or out of time, 1 if the list failed,
        3 if a task can never fit in a job's time limit."""
        started, code, reason = time.time(), 0, "finished"
        ahead: Lease | None = None  # leased, not started
        cur: Running | None = None
        self._renewer.start()
        try:
            while True:
                if cur is None:
                    if self._stop.is_set():
                        reason = self.stop_reason or "stopped"
                        break
                    lease, lease_call = ahead, 0.0
                    ahead = None
                    if lease is not None and not self._startable(lease):
                        self._give_back(lease)
                        continue
                    if lease is None:
                        t = time.time()
                        res = self.todo.lease(self.owner, fits=self._fits())
                        lease_call = time.time() - t
                        if isinstance(res, Idle):
                            early = (self._ahead() if res.reason == "busy" and self.spec.prestart
                                     and self.spec.transfer is None else None)
                            if early == "again":
                                continue
                            if isinstance(early, Running):
                                cur = early
                                continue
                            reason, code = res.reason, self._idle_code(res)
                            break
                        lease = res
                    cur = self._start(lease, lease_call)
                    continue
                if ahead is None and self.spec.prefetch and cur.lease.kind == "member":
                    res = self.todo.lease(self.owner, fits=self._fits(cur), spare=True)
                    ahead = res if isinstance(res, Lease) else None
                    if ahead is not None:
                        self._renewer.hold(ahead)
                outcome = self._wait(cur)
                if outcome == "exited" and cur.proc.returncode in _JOB_SIGNALS:
                    # scancel and time limits signal every process of the job at once:
                    # give our own signal a moment to arrive before calling this a failure
                    self._stop.wait(1.0)
                if outcome == "exited" and self._stop.is_set() and cur.proc.returncode != 0:
                    outcome = "interrupted"  # killed with the job, not the task's fault
                if outcome != "exited":
                    cur.stop(self.spec.grace)
                    if ahead is not None:  # behind the interrupted task, which goes first
                        self._give_back(ahead)
                        ahead = None
                    self._close(cur, outcome, None)
                    cur = None
                    continue
                following = None
                if ahead is not None:
                    if self._startable(ahead):
                        following = self._start(ahead, 0.0)
                    else:
                        self._give_back(ahead)
                    ahead = None
                ahead = self._close(cur, outcome, following)
                cur = following
        finally:
            if cur is not None:  # only on an unexpected error: do not leave a process behind
                cur.stop(self.spec.grace)
            if ahead is not None:
                self._give_back(ahead)
            self._renewer.halt()
        if self.records is not None:
            append_record(self.records, {
                "kind": "job", "job": self.job_id, "host": self.host, "owner": self.owner,
                "submitted": self.submitted, "started": started, "finished": time.time(),
                "tasks": self.tasks_run, "reason": reason, "exit": code})
        self._log(f"exits ({reason}) after {self.tasks_run} task(s)")
        return code

    def _startable(self, lease: Lease) -> bool:
        """A lease taken ahead may be started: still ours, still fits, not stopping."""
        est = self._estimates()
        self._check = (est, self.remaining())
        return (not self._stop.is_set() and self._renewer.valid(lease)
                and est[lease.kind] <= self._check[1])

    def _idle_code(self, idle: Idle) -> int:
        if idle.reason == "failed":
            self._log(idle.message)
            return 1
        if idle.reason == "no_fit" and idle.blocked is not None:
            need = self._check[0][idle.blocked.kind]
            if self.time_limit is not None and need > self.time_limit - self.margin:
                self._log(f"{idle.blocked.id} is expected to take {need:.0f} s but a job has "
                          f"only {self.time_limit - self.margin:.0f} s: raise the time limit")
                return 3
            self._log(f"{idle.blocked.id} (expected {need:.1f} s) does not fit in the "
                      f"{self.remaining():.1f} s left; leaving it to a fresh job")
        return 0

    def _give_back(self, lease: Lease) -> None:
        """Return a task leased ahead, never started, to the front of the list.

        Its lease is undone (``started=False``): no failed attempt, no
        interruption, and the next holder's ``ENSIO_ATTEMPT`` is the first run's.
        """
        self._renewer.drop(lease)
        try:
            self.todo.interrupt(lease, started=False)
        except StaleLease:
            pass

    # ------------------------------------------------------------------ the analysis ahead
    def _ahead(self) -> Running | Literal["again"] | None:
        """Start the analysis ahead while the last members run (:mod:`.prestart`).

        Returns the running analysis once it got its go, ``"again"`` when the
        lease went back (lease anew), or None when no early lease was granted.
        """
        lease = self.todo.lease_analysis_early(self.owner, fits=self._fits())
        if lease is None:
            return None
        self._renewer.hold(lease)
        try:
            guess = [t.member for t in self.todo.tasks()
                     if t.kind == "member" and t.state != "failed"]
            warm = Prestarted.start(prepare_task(self.spec, lease, self.base, self.job_id,
                                                 guess))  # type: ignore[arg-type]
        except (OSError, ConfigError, KeyError, ValueError, EnsioError) as exc:
            self._log(f"cannot start {lease.task} ahead ({exc}); it starts when due")
            self._give_back(lease)
            return None
        self._log(f"starts {lease.task} ahead (token {lease.token}) while the last members run")
        state = await_members(self.todo, lease, self._wake, lambda: (
            self._stop.is_set() or self._renewer.lost(lease) or self.remaining() <= 0))
        if state != "ready":
            warm.cancel()
            if state in ("pending", "stop") and not self._renewer.lost(lease):
                if state == "pending":
                    self._log(f"a member waits again: {lease.task} goes back until it is due")
                self._give_back(lease)
            else:
                self._renewer.drop(lease)
            return "again"
        done = [t.member for t in self.todo.tasks() if t.kind == "member" and t.state == "done"]
        cmd = prepare_task(self.spec, lease, self.base, self.job_id, done)  # type: ignore[arg-type]
        rec = self._task_record(lease, 0.0)
        rec["prestarted"] = warm.started
        rec["started"] = time.time()
        self._log(f"runs {lease.task} (token {lease.token}, attempt {lease.attempt}; "
                  f"started {rec['started'] - warm.started:.1f} s ahead)")
        if not warm.go(done):
            self._log(f"{lease.task} started ahead is gone (exit {warm.proc.returncode}); "
                      "starting it afresh")
            return self._start(lease, 0.0, rec)
        return Running(lease, cmd, warm.proc, rec).watch(self._wake)

    # ------------------------------------------------------------------ one task
    def _task_record(self, lease: Lease, lease_call: float) -> dict[str, Any]:
        return {
            "kind": lease.kind, "task": lease.task, "member": lease.member,
            "cycle": lease.cycle, "job": self.job_id, "host": self.host, "owner": self.owner,
            "submitted": self.submitted, "leased": lease.granted, "lease_call": lease_call,
            "started": None, "ended": None, "finished": None, "status": None, "exit": None,
            "io_seconds": None, "attempt": lease.attempt, "token": lease.token,
            "expected": self._check[0].get(lease.kind),
            "remaining": None if self._check[1] == float("inf") else self._check[1]}

    def _start(self, lease: Lease, lease_call: float,
               rec: dict[str, Any] | None = None) -> Running | None:
        """Start a leased task; a task that cannot start is a failed attempt (None)."""
        if rec is None:
            rec = self._task_record(lease, lease_call)
            self._log(f"runs {lease.task} (token {lease.token}, attempt {lease.attempt})")
        self._renewer.hold(lease)
        try:
            done = ([t.member for t in self.todo.tasks() if t.kind == "member"
                     and t.state == "done"] if lease.kind == "analysis" else [])
            cmd = prepare_task(self.spec, lease, self.base, self.job_id, done)  # type: ignore[arg-type]
            rec["started"] = time.time()
            proc = subprocess.Popen(cmd.argv, cwd=cmd.workdir, env=cmd.env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except (OSError, ConfigError, KeyError, ValueError, EnsioError) as exc:
            rec["started"] = rec["started"] or time.time()
            rec["ended"] = time.time()
            rec["status"] = self._failed(lease, f"{lease.task}: cannot start the command: {exc}")
            self._record(rec)
            return None
        return Running(lease, cmd, proc, rec).watch(self._wake)

    def _wait(self, task: Running) -> Outcome:
        """Until the command exits, the lease is lost, or the job must stop."""
        while True:
            if task.exited.is_set():
                break
            if self._renewer.lost(task.lease):
                return "lost"
            if self._stop.is_set() or self.remaining() <= 0:
                self.request_stop("time_limit")
                return "interrupted"
            left = self.remaining()
            self._wake.wait(None if left == float("inf") else max(0.0, left))
            self._wake.clear()
        task.rec["exit"] = task.proc.returncode
        return "exited"

    def _close(self, task: Running, outcome: Outcome,
               following: Running | None) -> Lease | None:
        """Commit (or give back) a task that ended; maybe lease the next in the same step.

        Returns the lease taken with the commit: to run next, or — when
        ``following`` already runs — to run after it.
        """
        lease, rec, cmd = task.lease, task.rec, task.cmd
        if rec["ended"] is None:
            rec["ended"], rec["exit"] = time.time(), task.proc.returncode
        rec["io_seconds"] = reported_io(cmd.report)
        nxt: Lease | None = None
        if outcome == "lost":
            rec["status"] = "stale"
        elif outcome == "interrupted":
            self._log(f"stops {lease.task} at the time limit; back to the front")
            self._renewer.drop(lease)
            try:
                self.todo.interrupt(lease)
                rec["status"] = "interrupted"
            except StaleLease:
                rec["status"] = "stale"
        elif task.proc.returncode != 0:
            rc = task.proc.returncode
            how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
            rec["status"] = self._failed(lease, f"{lease.task}: {how}")
        elif cmd.staged is not None and not self._written(cmd.staged):
            rec["status"] = self._failed(lease, f"{lease.task}: exit status 0 but "
                                                f"{cmd.final} was not written")
        else:
            rec["status"], nxt = self._commit(task, following)
        self._renewer.drop(lease)
        if cmd.staged is not None and self.spec.stage:
            shutil.rmtree(cmd.staged.parent, ignore_errors=True)
            try:
                cmd.staged.parent.parent.rmdir()  # .ensio-stage, once no other task uses it
            except OSError:
                pass
        self._record(rec)
        return nxt

    def _written(self, path: Path) -> bool:
        """Whether a member wrote its output: on disk, or held complete by the staging
        daemon (``workflow.transfer``)."""
        if self.spec.transfer is None:
            return path.exists()
        from .transferred import available

        return available([path])[str(path)]

    def _commit(self, task: Running, following: Running | None) -> tuple[str, Lease | None]:
        lease, cmd = task.lease, task.cmd
        staged, final = cmd.staged, cmd.final
        commit = None
        if staged is not None and final is not None and staged != final:
            def commit() -> None:
                move_durably(staged, final, self.spec.fsync)
        if self._tail is not None:
            self._tail.note(lease.kind, task.rec["ended"] - task.rec["started"])
        more = not self._stop.is_set() and (following is None or
                                           (self.spec.prefetch and
                                            following.lease.kind == "member"))
        try:
            res = self.todo.done(lease, commit=commit,
                                 next_owner=self.owner if more else None,
                                 fits=self._fits(following), spare=following is not None)
        except StaleLease as exc:
            self._log(f"commit of {lease.task} refused: {exc}")
            return "stale", None
        except OSError as exc:  # e.g. the output could not be moved into place
            return self._failed(lease, f"{lease.task}: commit failed: {exc}"), None
        if isinstance(res, Lease):
            if following is not None:
                self._renewer.hold(res)
            return "done", res
        return "done", None

    def _failed(self, lease: Lease, reason: str) -> str:
        self._log(reason)
        self._renewer.drop(lease)
        try:
            retry = self.todo.fail(lease, reason)
        except StaleLease:
            return "stale"
        if not retry:
            self._log(f"{lease.task} failed for good after its retries")
        return "failed"

    def _record(self, rec: dict[str, Any]) -> None:
        rec["finished"] = time.time()
        if self.records is not None:
            append_record(self.records, rec)
        self.tasks_run += 1


def run_job(todo: str | Path, *, time_limit: float | None = None,
            margin: float | None = None, job_id: str | None = None,
            submitted: float | None = None, records: str | Path | None = None,
            quiet: bool = False) -> int:
    """One worker job in this process (what ``ensio worker`` runs).

    SIGTERM, SIGUSR1 and SIGINT mean "stop the running task, put it back at
    the front, exit 0". Returns the exit status of :meth:`Worker.run`.
    """
    worker = Worker(TodoList(todo), time_limit=time_limit, margin=margin, job_id=job_id,
                    submitted=submitted, records=records,
                    log=(lambda m: None) if quiet else None)

    def on_signal(signum: int, _frame: object) -> None:
        worker.request_stop(f"signal {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, on_signal)
    return worker.run()
