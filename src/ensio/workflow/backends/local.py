"""Local back-end: worker jobs are processes on this machine.

Each job is one process in its own process group (``start_new_session``), so
cancelling a job reaches everything it started. The back-end behaves like a
small scheduler so the pool logic can be tested without one:

* **Start delay** (optional, :class:`StartDelay`): a job is *pending* for
  ``base + per_node * nodes + X`` seconds, with ``X`` exponential of mean
  ``mean_extra`` drawn from a ``random.Random(seed)`` stream in submission
  order, so a run is reproducible. Exponential waits are the simplest model
  of a queue in which resources free up at random; ``base`` and ``per_node``
  model a larger job waiting longer. A pending job that is cancelled never starts.
* **Time limit**: at ``JobSpec.time_limit`` seconds after its start the job
  gets SIGTERM, and SIGKILL ``kill_wait`` seconds later (SLURM's KillWait).
* **Cancel**: pending jobs are dropped; running ones get SIGTERM, then
  SIGKILL after ``kill_wait`` seconds.

Each job's output goes to ``WORKDIR/NAME.JOBID.log``; the job's environment
carries ``ENSIO_JOB_ID`` and ``ENSIO_SUBMITTED`` (epoch seconds) for the records.

The coupled job of the online mode (``own_session=False``) stays in the
driver's process group instead, so it dies with the driver: no later driver
could adopt it, and a second coupled job on the same run directory must never
run beside it.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .base import Backend, JobShape, JobSpec, JobState

if TYPE_CHECKING:
    from ...config.workflow import WorkflowSection

__all__ = ["LocalBackend", "StartDelay"]


@dataclass(frozen=True)
class StartDelay:
    """Queueing model of the local back-end (see the module docstring).

    ``delay = base + per_node * nodes + Exp(mean_extra)``, seeded.
    """

    base: float = 0.0
    per_node: float = 0.0
    mean_extra: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.base, self.per_node, self.mean_extra) < 0:
            raise ValueError("StartDelay: base, per_node and mean_extra must be >= 0")


class _Job:
    def __init__(self, job_id: str, spec: JobSpec, submitted: float) -> None:
        self.id = job_id
        self.spec = spec
        self.submitted = submitted
        self.state: JobState = "pending"
        self.proc: subprocess.Popen | None = None
        self.cancelled = False
        self.timers: list[threading.Timer] = []
        self.log: Path | None = None


class LocalBackend(Backend):
    """N_j worker processes on this machine (see the module docstring).

    Parameters
    ----------
    delay : StartDelay, optional
        Queueing model; none: jobs start at once.
    nodes : int
        Nodes per job in the delay model.
    kill_wait : float
        Seconds between SIGTERM and SIGKILL (time limit and cancel).
    enforce_time_limit : bool
        Signal jobs at their time limit like a scheduler would.
    own_session : bool
        Start each job in its own session (process group); ``False`` keeps it
        in the driver's group (see the module docstring).
    """

    name = "local"

    def __init__(self, delay: StartDelay | None = None, *, nodes: int = 1,
                 kill_wait: float = 5.0, enforce_time_limit: bool = True,
                 own_session: bool = True) -> None:
        self.delay = delay
        self.nodes = nodes
        self.kill_wait = kill_wait
        self.enforce_time_limit = enforce_time_limit
        self.own_session = own_session
        self._rng = random.Random(delay.seed if delay else 0)
        self._jobs: dict[str, _Job] = {}
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._closed = False

    @classmethod
    def from_config(cls, wf: WorkflowSection, shape: JobShape) -> LocalBackend:
        """``workflow.start_delay`` as the queueing imitation; a coupled job keeps
        the driver's process group and is not cut at the time limit."""
        delay = StartDelay(base=wf.start_delay) if wf.start_delay > 0 else None
        return cls(delay, enforce_time_limit=not shape.coupled, own_session=not shape.coupled)

    # ------------------------------------------------------------------ Backend
    def submit(self, spec: JobSpec) -> str:
        """Queue one job; it starts after its start delay (at once without a model)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("LocalBackend is closed")
            job = _Job(f"local-{os.getpid()}-{next(self._ids)}", spec, time.time())
            job.log = Path(spec.workdir) / f"{spec.name}.{job.id}.log"
            self._jobs[job.id] = job
            wait = self.sample_delay()
            if wait > 0:
                self._later(job, wait, self._start)
            else:
                self._start(job)
            return job.id

    def states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """``pending`` (in its start delay), ``running``, ``done`` (exit 0),
        ``failed``, ``cancelled``; ``unknown`` for ids not from this back-end."""
        out: dict[str, JobState] = {}
        with self._lock:
            for jid in job_ids:
                job = self._jobs.get(jid)
                out[jid] = "unknown" if job is None else self._state(job)
        return out

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Pending jobs never start; running ones get SIGTERM, then SIGKILL."""
        with self._lock:
            for jid in job_ids:
                job = self._jobs.get(jid)
                if job is None or self._state(job) not in ("pending", "running"):
                    continue
                job.cancelled = True
                if job.proc is None:
                    job.state = "cancelled"
                    for t in job.timers:
                        t.cancel()
                else:
                    self._terminate(job)

    def close(self) -> None:
        """Cancel what is still pending or running and reap every process."""
        with self._lock:
            self._closed = True
            live = [j.id for j in self._jobs.values() if self._state(j) in ("pending",
                                                                             "running")]
        self.cancel(live)
        self.wait(list(self._jobs), timeout=self.kill_wait + 5)
        with self._lock:
            for job in self._jobs.values():
                for t in job.timers:
                    t.cancel()

    # ------------------------------------------------------------------ extras
    def sample_delay(self) -> float:
        """The next start delay of the model (0 without one)."""
        d = self.delay
        if d is None:
            return 0.0
        extra = self._rng.expovariate(1.0 / d.mean_extra) if d.mean_extra > 0 else 0.0
        return d.base + d.per_node * self.nodes + extra

    def wait(self, job_ids: Sequence[str], timeout: float | None = None) -> bool:
        """Block until the jobs have ended (True) or ``timeout`` passed (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        for jid in job_ids:
            job = self._jobs.get(jid)
            while job is not None:
                with self._lock:
                    proc, state = job.proc, self._state(job)
                if state not in ("pending", "running"):
                    break
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                if proc is None:  # pending: wait for its start (or cancellation)
                    time.sleep(min(0.01, left) if left is not None else 0.01)
                    continue
                try:
                    proc.wait(left)
                except subprocess.TimeoutExpired:
                    return False
        return True

    def ending(self, job_id: str, state: JobState) -> str:
        """``exit status N`` of a job that ran, else its state."""
        job = self._jobs.get(job_id)
        rc = None if job is None or job.proc is None else job.proc.poll()
        return f"exit status {rc}" if rc is not None else super().ending(job_id, state)

    def pid(self, job_id: str) -> int | None:
        """Process id of a started job (its process group id too)."""
        job = self._jobs.get(job_id)
        return None if job is None or job.proc is None else job.proc.pid

    def log_path(self, job_id: str) -> Path | None:
        """Where the job's output goes."""
        job = self._jobs.get(job_id)
        return None if job is None else job.log

    # ------------------------------------------------------------------ internals
    def _state(self, job: _Job) -> JobState:
        if job.proc is None:
            return job.state
        rc = job.proc.poll()
        if rc is None:
            return "running"
        if job.cancelled:
            return "cancelled"
        return "done" if rc == 0 else "failed"

    def _later(self, job: _Job, seconds: float, action) -> None:  # noqa: ANN001
        t = threading.Timer(seconds, action, (job,))
        t.daemon = True
        job.timers.append(t)
        t.start()

    def _start(self, job: _Job) -> None:
        with self._lock:
            if job.state != "pending" or job.cancelled or self._closed:
                return
            spec = job.spec
            workdir = Path(spec.workdir)
            workdir.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ)
            env.update(spec.env)
            env.update(ENSIO_JOB_ID=job.id, ENSIO_SUBMITTED=repr(job.submitted))
            assert job.log is not None
            with open(job.log, "ab") as out:
                try:
                    job.proc = subprocess.Popen(
                        list(spec.argv), cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                        stdout=out, stderr=subprocess.STDOUT,
                        start_new_session=self.own_session)
                except OSError as exc:
                    out.write(f"ensio local back-end: cannot start {spec.argv[0]}: {exc}\n"
                              .encode())
                    job.state = "failed"
                    return
            job.state = "running"
            if self.enforce_time_limit and spec.time_limit > 0:
                self._later(job, spec.time_limit, self._terminate)

    def _terminate(self, job: _Job) -> None:
        self._signal(job, signal.SIGTERM)
        self._later(job, self.kill_wait, lambda j: self._signal(j, signal.SIGKILL))

    def _signal(self, job: _Job, sig: int) -> None:
        with self._lock:
            if job.proc is None or job.proc.poll() is not None:
                return  # never signal a reaped pid (it may have been reused)
            try:
                if self.own_session:
                    os.killpg(job.proc.pid, sig)
                else:  # in the driver's group: the job's own process only
                    job.proc.send_signal(sig)
            except (ProcessLookupError, PermissionError):
                pass
