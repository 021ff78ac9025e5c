"""One job of the dynamic job scheme: drain the to-do list (issue 4 item 2).

A worker leases the first task, runs it, commits it and repeats until the
list has nothing it may take. The list carries a :class:`WorkerSpec` (the
commands and path templates of its cycle), so a job needs nothing but the
list's path and its own time limit: ``python -m ensio.workflow.worker LIST
--time-limit SECONDS`` (or ``ensio worker``).

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
* A thread renews the lease while a command runs, so a long task never
  expires; if the lease is lost anyway (the job was stalled), the command is
  stopped and nothing is committed.

The command's environment also holds ``ENSIO_TASK``, ``ENSIO_MEMBER``,
``ENSIO_CYCLE``, ``ENSIO_TOKEN``, ``ENSIO_ATTEMPT``, ``ENSIO_JOB_ID``,
``ENSIO_FORECAST`` (the final path) and ``ENSIO_REPORT``: a file the command
may write as JSON (``{"io_seconds": 1.5}``) to report its I/O time.
"""

from __future__ import annotations

import argparse
import json
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
from typing import Any

from ..config.errors import ConfigError
from ..config.workflow import ANALYSIS_PLACEHOLDERS, MEMBER_PLACEHOLDERS, parse_duration
from .records import RecordTail, append_record
from .spec import WorkerSpec, create_todo, default_margin, render, worker_argv
from .todo import Idle, Lease, StaleLease, TaskView, TodoError, TodoList

__all__ = [
    "Worker",
    "WorkerSpec",
    "add_arguments",
    "create_todo",
    "default_margin",
    "main",
    "render",
    "run_from_args",
    "worker_argv",
]

class _Renewer(threading.Thread):
    """Renews a lease every quarter of its length until halted or lost."""

    def __init__(self, todo: TodoList, lease: Lease, wake: threading.Event,
                 log: Callable[[str], None]) -> None:
        super().__init__(name=f"renew-{lease.task}", daemon=True)
        self.todo, self.lease, self.wake, self.log = todo, lease, wake, log
        self.period = max(0.01, (lease.deadline - time.time()) / 4)
        self.lost = False
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.period):
            try:
                self.lease = self.todo.renew(self.lease)
            except StaleLease as exc:
                self.lost = True
                self.log(f"lost the lease of {self.lease.task}: {exc}")
                self.wake.set()
                return
            except (OSError, TodoError) as exc:  # transient file-system trouble: retry
                self.log(f"renewing {self.lease.task} failed, retrying: {exc}")

    def halt(self) -> None:
        self._halt.set()
        self.join()


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
        self.spec = WorkerSpec.from_meta(todo.meta)
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
        self.records = self._path(rec) if rec else None
        self._tail = RecordTail(self.records, skip_owner=self.owner) if self.records else None
        self._check: tuple[Mapping[str, float], float] = ({}, float("inf"))
        self._log = log or (lambda m: print(f"ensio worker {self.job_id}: {m}",
                                            file=sys.stderr, flush=True))
        self._stop = threading.Event()
        self._wake = threading.Event()
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

    def _fits(self) -> Callable[[TaskView], bool]:
        """Lease predicate: the task's expected duration fits in the time left now.

        Estimates come from the records of other jobs plus this job's own
        runs; the numbers used are kept for the task's record.
        """
        s = self.spec
        defaults = {"member": s.task_estimate,
                    "analysis": s.analysis_estimate or s.task_estimate}
        est = defaults
        if self._tail is not None:
            self._tail.refresh()
            est = {k: self._tail.estimate(k, v) for k, v in defaults.items()}
        remaining = self.remaining()
        self._check = (est, remaining)
        return lambda v: est[v.kind] <= remaining

    def _path(self, template: str, **values: Any) -> Path:
        p = Path(template.format_map(values)) if values else Path(template)
        return p if p.is_absolute() else self.base / p

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        """Drain the list; 0 when done or out of time, 1 if the list failed,
        3 if a task can never fit in a job's time limit."""
        started, code, reason = time.time(), 0, "finished"
        nxt: Lease | Idle | None = None
        while True:
            if self._stop.is_set():
                reason = self.stop_reason or "stopped"
                if isinstance(nxt, Lease):
                    self._give_back(nxt)
                break
            lease_call = 0.0
            if nxt is None:
                if self.remaining() <= 0:
                    reason = "time_limit"
                    break
                t = time.time()
                nxt = self.todo.lease(self.owner, fits=self._fits())
                lease_call = time.time() - t
            if isinstance(nxt, Idle):
                reason, code = nxt.reason, self._idle_code(nxt, self._check[0])
                break
            if self._stop.is_set():
                continue
            nxt = self._run_task(nxt, lease_call)
        if self.records is not None:
            append_record(self.records, {
                "kind": "job", "job": self.job_id, "host": self.host, "owner": self.owner,
                "submitted": self.submitted, "started": started, "finished": time.time(),
                "tasks": self.tasks_run, "reason": reason, "exit": code})
        self._log(f"exits ({reason}) after {self.tasks_run} task(s)")
        return code

    def _idle_code(self, idle: Idle, est: Mapping[str, float]) -> int:
        if idle.reason == "failed":
            self._log(idle.message)
            return 1
        if idle.reason == "no_fit" and idle.blocked is not None:
            need = est[idle.blocked.kind]
            if self.time_limit is not None and need > self.time_limit - self.margin:
                self._log(f"{idle.blocked.id} is expected to take {need:.0f} s but a job has "
                          f"only {self.time_limit - self.margin:.0f} s: raise the time limit")
                return 3
            self._log(f"{idle.blocked.id} (expected {need:.1f} s) does not fit in the "
                      f"{self.remaining():.1f} s left; leaving it to a fresh job")
        return 0

    def _give_back(self, lease: Lease) -> None:
        try:
            self.todo.interrupt(lease)
        except StaleLease:
            pass

    # ------------------------------------------------------------------ one task
    def _prepare(self, lease: Lease) -> tuple[list[str], Path, dict[str, str], Path | None,
                                              Path | None]:
        """argv, working directory, environment, staged and final output of a task."""
        s, cycle = self.spec, lease.cycle
        final = staged = None
        if lease.kind == "member":
            m = lease.member
            workdir = self._path(s.workdir, member=m, cycle=cycle) if s.workdir else self.base
            if s.forecast is not None:
                final = self._path(s.forecast, member=m, cycle=cycle)
                staged = (final.parent / ".ensio-stage" / f"t{lease.token}" / final.name
                          if s.stage else final)
                for attempt in range(5):  # another job may remove an empty .ensio-stage
                    try:
                        staged.parent.mkdir(parents=True, exist_ok=True)
                        break
                    except FileNotFoundError:
                        if attempt == 4:
                            raise
            values = {"member": m, "cycle": cycle, "workdir": str(workdir),
                      "forecast": str(staged) if staged else "",
                      "analysis": str(self._path(s.analysis, member=m, cycle=cycle))
                      if s.analysis else ""}
            argv = render(s.member_command, values, MEMBER_PLACEHOLDERS, "member_command")
        else:
            workdir = (self._path(s.analysis_workdir, member=0, cycle=cycle)
                       if s.analysis_workdir else self.base)
            done = [t.member for t in self.todo.tasks()
                    if t.kind == "member" and t.state == "done"]
            values = {"cycle": cycle, "workdir": str(workdir),
                      "analysis_ranks": s.analysis_ranks,
                      "members": ",".join(str(m) for m in sorted(done)),  # type: ignore[type-var]
                      "n_members": len(done)}
            argv = render(s.analysis_command or "", values, ANALYSIS_PLACEHOLDERS,
                          "analysis_command")
        workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(ENSIO_TASK=lease.task, ENSIO_CYCLE=str(cycle), ENSIO_TOKEN=str(lease.token),
                   ENSIO_ATTEMPT=str(lease.attempt), ENSIO_JOB_ID=self.job_id,
                   ENSIO_MEMBER="" if lease.member is None else str(lease.member),
                   ENSIO_FORECAST="" if final is None else str(final),
                   ENSIO_REPORT=str(workdir / f".ensio-report-t{lease.token}.json"))
        return argv, workdir, env, staged, final

    def _run_task(self, lease: Lease, lease_call: float) -> Lease | Idle | None:
        """Run one leased task; return the next lease when it was taken with the commit."""
        leased = time.time()
        rec: dict[str, Any] = {
            "kind": lease.kind, "task": lease.task, "member": lease.member,
            "cycle": lease.cycle, "job": self.job_id, "host": self.host, "owner": self.owner,
            "submitted": self.submitted, "leased": leased, "lease_call": lease_call,
            "started": None, "ended": None, "finished": None, "status": None, "exit": None,
            "io_seconds": None, "attempt": lease.attempt, "token": lease.token,
            "expected": self._check[0].get(lease.kind),
            "remaining": None if self._check[1] == float("inf") else self._check[1]}
        self._log(f"runs {lease.task} (token {lease.token}, attempt {lease.attempt})")
        staged = final = None
        nxt: Lease | Idle | None = None
        try:
            argv, workdir, env, staged, final = self._prepare(lease)
            rec["started"] = time.time()
            proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except (OSError, ConfigError, KeyError, ValueError) as exc:
            rec["started"] = rec["started"] or time.time()
            rec["ended"] = time.time()
            status, nxt = self._failed(lease, f"cannot start the command: {exc}")
        else:
            status, nxt = self._supervise(lease, proc, rec, env, staged, final)
        if staged is not None and self.spec.stage:
            shutil.rmtree(staged.parent, ignore_errors=True)
            try:
                staged.parent.parent.rmdir()  # .ensio-stage, once no other task uses it
            except OSError:
                pass
        rec["status"], rec["finished"] = status, time.time()
        if self.records is not None:
            append_record(self.records, rec)
        self.tasks_run += 1
        return nxt

    def _supervise(self, lease: Lease, proc: subprocess.Popen, rec: dict[str, Any],
                   env: Mapping[str, str], staged: Path | None,
                   final: Path | None) -> tuple[str, Lease | Idle | None]:
        exited = threading.Event()

        def wait() -> None:
            proc.wait()
            exited.set()
            self._wake.set()

        threading.Thread(target=wait, name=f"wait-{lease.task}", daemon=True).start()
        renewer = _Renewer(self.todo, lease, self._wake, self._log)
        renewer.start()
        outcome = "exited"
        while not exited.is_set():
            left = self.remaining()
            self._wake.wait(None if left == float("inf") else max(0.0, left))
            self._wake.clear()
            if exited.is_set():
                break
            if renewer.lost:
                outcome = "lost"
                break
            if self._stop.is_set() or self.remaining() <= 0:
                self.request_stop("time_limit")
                outcome = "interrupted"
                break
        renewer.halt()
        if outcome != "exited":
            self._stop_process(proc, exited)
        rec["ended"], rec["exit"] = time.time(), proc.returncode
        rec["io_seconds"] = _reported_io(Path(env["ENSIO_REPORT"]))
        if outcome == "lost" or renewer.lost:
            return "stale", None
        if outcome == "interrupted":
            self._log(f"stops {lease.task} at the time limit; back to the front")
            try:
                self.todo.interrupt(lease)
            except StaleLease:
                return "stale", None
            return "interrupted", None
        rc = proc.returncode
        if rc != 0:
            how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
            return self._failed(lease, f"{lease.task}: {how}")
        if staged is not None and not staged.exists():
            return self._failed(lease, f"{lease.task}: exit status 0 but {final} was not "
                                       f"written")
        commit = None
        if staged is not None and final is not None and staged != final:
            def commit() -> None:
                _move_durably(staged, final, self.spec.fsync)
        if self._tail is not None:
            self._tail.note(lease.kind, rec["ended"] - rec["started"])
        try:
            nxt = self.todo.done(lease, commit=commit, next_owner=None if self._stop.is_set()
                                 else self.owner, fits=self._fits())
        except StaleLease as exc:
            self._log(f"commit of {lease.task} refused: {exc}")
            return "stale", None
        return "done", nxt

    def _failed(self, lease: Lease, reason: str) -> tuple[str, None]:
        self._log(reason)
        try:
            retry = self.todo.fail(lease, reason)
        except StaleLease:
            return "stale", None
        if not retry:
            self._log(f"{lease.task} failed for good after its retries")
        return "failed", None

    def _stop_process(self, proc: subprocess.Popen, exited: threading.Event) -> None:
        """SIGTERM the command's process group, SIGKILL it after ``grace`` seconds."""
        for sig, wait in ((signal.SIGTERM, self.spec.grace), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            if exited.wait(wait):
                break
        proc.wait()
        try:  # stragglers of the group (the leader is gone)
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _move_durably(src: Path, dst: Path, fsync: bool) -> None:
    if fsync:
        fd = os.open(src, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(src, dst)
    if fsync:
        fd = os.open(dst.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _reported_io(path: Path) -> float | None:
    """``io_seconds`` from the command's ``ENSIO_REPORT`` file, if it wrote one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    finally:
        path.unlink(missing_ok=True)
    try:
        value = data.get("io_seconds") if isinstance(data, dict) else None
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------------- command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``ensio worker`` / ``python -m ensio.workflow.worker``."""
    p.add_argument("todo", type=Path, metavar="LIST", help="the to-do list file of the cycle")
    p.add_argument("--time-limit", default=None, metavar="DURATION",
                   help="this job's wall-clock limit (seconds, HH:MM:SS or D-HH:MM:SS), "
                        "counted from the worker's start")
    p.add_argument("--margin", type=float, default=None, metavar="SECONDS",
                   help="seconds kept free before the limit (default: 10%% of it, at most 60)")
    p.add_argument("--job-id", default=None, help="job id for the records "
                   "(default: $ENSIO_JOB_ID, $SLURM_JOB_ID or the pid)")
    p.add_argument("--submitted", type=float, default=None, metavar="EPOCH",
                   help="submission time of the job (default: $ENSIO_SUBMITTED)")
    p.add_argument("--records", type=Path, default=None, metavar="FILE",
                   help="records file (default: the one named in the list)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run_from_args(args: argparse.Namespace) -> int:
    """Run one worker with SIGTERM/SIGUSR1/SIGINT meaning "stop and requeue"."""
    limit = (parse_duration(args.time_limit, "--time-limit")
             if args.time_limit is not None else None)
    worker = Worker(TodoList(args.todo), time_limit=limit, margin=args.margin,
                    job_id=args.job_id, submitted=args.submitted, records=args.records,
                    log=(lambda m: None) if args.quiet else None)

    def on_signal(signum: int, _frame: object) -> None:
        worker.request_stop(f"signal {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, on_signal)
    return worker.run()


def main(argv: list[str] | None = None) -> int:
    """``python -m ensio.workflow.worker LIST …`` (the light entry point jobs use)."""
    p = argparse.ArgumentParser(prog="ensio worker", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run_from_args(args)
    except (ConfigError, TodoError) as exc:
        print(f"ensio worker: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
