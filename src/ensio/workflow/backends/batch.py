"""Batch schedulers as data: :class:`BatchBackend` owns every scheduler call.

A batch scheduler (SLURM, PBS, LSF, ...) differs from another only in the
spelling of four commands, the shape of their answers and its job states;
what is done with them is the same everywhere. So this base class owns

* :meth:`~BatchBackend.submit`: write the job script next to the logs, run
  the submit command (retrying on transient controller errors), parse and
  validate the job id;
* :meth:`~BatchBackend.states`: one status listing of the jobs, mapped to the
  back-end-neutral states; a job the scheduler no longer lists has ended;
* :meth:`~BatchBackend.adopt`: the live jobs of an earlier driver, checked
  against the recorded name and working directory;
* :meth:`~BatchBackend.cancel`: cancel, ignoring the scheduler's complaints
  about jobs that already ended;
* the one loop that cuts long id lists into chunks (:meth:`~BatchBackend.each_chunk`),

and a scheduler is a subclass of **class attributes** (argv templates, job-id
patterns, the state map, the messages that mean "already gone") plus its
**script function** (:attr:`BatchBackend.script`, a pure function of the
:class:`~ensio.workflow.backends.base.JobSpec`, tested without a scheduler),
as in dask-jobqueue. See :mod:`ensio.workflow.backends.slurm` and the PBS-like
back-end of ``tests/test_backend_pbs.py``.

Every scheduler call is an argv list with a timeout; no shell is ever
involved, so job names, paths and ids can never be interpreted by one.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from ...durable import atomic_write
from .base import Backend, JobSpec, JobState

__all__ = ["IDS", "IDS_COMMA", "SCRIPT", "BatchBackend", "BatchError", "run_command",
           "same_dir"]

_log = logging.getLogger(__name__)

#: Placeholder in an argv template: the job ids, one argument each.
IDS = "{ids}"
#: Placeholder in an argv template: the job ids as one comma-separated argument.
IDS_COMMA = "{ids,}"
#: Placeholder in :attr:`BatchBackend.submit_argv`: the path of the job script.
SCRIPT = "{script}"

#: Columns every status listing must have (in any order, more are allowed).
_NEEDED_COLUMNS = frozenset({"id", "name", "state", "workdir"})


class BatchError(RuntimeError):
    """A scheduler command failed in a way the caller has to know about."""


def run_command(argv: Sequence[str], *, timeout: float, cwd: str | None = None,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one scheduler command (argv list, never a shell) with a timeout."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=None if env is None else dict(env), check=False,
                          stdin=subprocess.DEVNULL)


def same_dir(listed: str, recorded: object) -> bool:
    """Whether the scheduler's working directory ``listed`` is the ``recorded`` one."""
    if not isinstance(recorded, str) or not listed.strip():
        return False
    a = listed.strip()
    return (os.path.normpath(a) == os.path.normpath(recorded)
            or os.path.realpath(a) == os.path.realpath(recorded))


class BatchBackend(Backend):
    """Worker jobs as batch jobs of a scheduler described by class attributes.

    Parameters
    ----------
    command_timeout : float
        Seconds any single scheduler command may take.
    submit_attempts : int
        Attempts of the submit command on transient controller errors (busy
        clusters answer "Socket timed out"); a duplicate job from a retried
        submission is harmless, since it only drains the same to-do list.
    min_poll : float
        Shortest interval between two job-state queries of the pool driver
        (:attr:`Backend.min_poll`). Each is a request to the scheduler's
        controller, shared by every user of the cluster; the to-do list, not
        the job states, tells the driver when a cycle is finished, so a few
        seconds of delay cost nothing.
    """

    # ------------------------------------------------------------ the scheduler
    #: Submit command; :data:`SCRIPT` is the job script. It runs in the job's
    #: workdir with ``ENSIO_SUBMITTED`` (epoch seconds) in its environment,
    #: which jobs inherit, so the records can tell queuing time.
    submit_argv: ClassVar[tuple[str, ...]]
    #: Status listing of the jobs :data:`IDS` / :data:`IDS_COMMA`, finished ones included.
    status_argv: ClassVar[tuple[str, ...]]
    #: Its columns, split at :attr:`status_separator`; the last may hold the separator.
    status_columns: ClassVar[tuple[str, ...]] = ("id", "name", "state", "workdir")
    status_separator: ClassVar[str] = "|"
    #: Cancel command of the jobs :data:`IDS` / :data:`IDS_COMMA`.
    cancel_argv: ClassVar[tuple[str, ...]]
    #: The submit command's answer (stripped); group 1 is the job id.
    submitted_id: ClassVar[re.Pattern[str]]
    #: The only ids ever passed to the status and cancel commands.
    job_id: ClassVar[re.Pattern[str]]
    #: Scheduler state (as normalised by :meth:`parse_state`) -> neutral state.
    state_map: ClassVar[Mapping[str, JobState]]
    #: State of a job the scheduler does not list: it ended and was purged.
    missing_state: ClassVar[JobState] = "done"
    #: Error text (lower case) of a status or cancel command about jobs that
    #: already ended or were purged: not an error for ensio.
    gone_messages: ClassVar[tuple[str, ...]] = ()
    #: Submit errors (lower case) after which a new attempt may succeed.
    transient_messages: ClassVar[tuple[str, ...]] = ()
    #: File names in the job's workdir: the script written, the job's output.
    script_name: ClassVar[str] = "{name}.job"
    log_name: ClassVar[str] = "{name}-{id}.out"
    #: Ids per status or cancel command (keeps command lines short).
    chunk_size: ClassVar[int] = 500
    #: The pure script function: ``script(spec) -> text``.
    script: ClassVar[Callable[[JobSpec], str]]

    def __init__(self, *, command_timeout: float = 60.0, submit_attempts: int = 3,
                 min_poll: float = 2.0) -> None:
        if not min_poll >= 1.0:
            raise ValueError(f"min_poll must be at least 1 s for a real scheduler, got {min_poll}")
        missing = _NEEDED_COLUMNS - set(self.status_columns)
        if missing:
            raise TypeError(f"{type(self).__name__}.status_columns lacks {sorted(missing)}")
        self.min_poll = float(min_poll)
        self.command_timeout = command_timeout
        self.submit_attempts = max(1, submit_attempts)
        self._logs: dict[str, Path] = {}

    # ------------------------------------------------------------ hooks
    @property
    def title(self) -> str:
        """The scheduler's name in messages (``label``, else ``name``)."""
        return self.label or self.name

    def error(self, message: str) -> BatchError:
        """The exception raised on a failed scheduler command (subclasses narrow it)."""
        return BatchError(message)

    def script_for(self, spec: JobSpec) -> str:
        """The job script of *spec*; back-ends with options pass them to :attr:`script`."""
        return type(self).script(spec)

    def parse_state(self, text: str) -> JobState:
        """Neutral state of one listed scheduler state (case and a ``+`` suffix ignored)."""
        return self.state_map.get(text.strip().upper().rstrip("+"), "unknown")

    def call(self, argv: Sequence[str], *, cwd: str | None = None,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run one scheduler command with :attr:`command_timeout` (tests replace it)."""
        return run_command(argv, timeout=self.command_timeout, cwd=cwd, env=env)

    # ------------------------------------------------------------ Backend
    def submit(self, spec: JobSpec) -> str:
        """Write the job script into the workdir and submit it; return the job id.

        The script is kept next to the job's logs so a failed job can be
        inspected and resubmitted by hand; the script itself stays a pure
        function of the spec.

        Raises
        ------
        BatchError
            If the submit command fails (after retries on transient errors)
            or answers something that is not a job id.
        """
        script = self.script_for(spec)
        path = Path(spec.workdir) / self.script_name.format(name=spec.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, script, fsync=False)
        argv = [str(path) if a == SCRIPT else a for a in self.submit_argv]
        err = ""
        for attempt in range(self.submit_attempts):
            if attempt:
                time.sleep(min(2.0**attempt, 10.0))  # back off from a busy controller
            env = {**os.environ, "ENSIO_SUBMITTED": repr(time.time())}
            try:
                proc = self.call(argv, cwd=spec.workdir, env=env)
            except subprocess.TimeoutExpired:
                err = f"{argv[0]} timed out after {self.command_timeout:g} s"
                continue
            except OSError as exc:
                raise self.error(f"cannot run {argv[0]}: {exc}") from exc
            if proc.returncode == 0:
                return self._submitted(spec, proc.stdout)
            err = proc.stderr.strip() or f"exit status {proc.returncode}"
            if not any(t in err.lower() for t in self.transient_messages):
                break
        raise self.error(f"{argv[0]} {path} failed: {err}")

    def _submitted(self, spec: JobSpec, answer: str) -> str:
        m = self.submitted_id.fullmatch(answer.strip())
        job_id = m.group(1) if m else None
        if job_id is None or not self.job_id.match(job_id):
            raise self.error(f"{self.submit_argv[0]} answered {answer.strip()!r}, not a job id")
        _log.debug("submitted %s as %s job %s", spec.name, self.title, job_id)
        self._logs[job_id] = Path(spec.workdir) / self.log_name.format(name=spec.name, id=job_id)
        return job_id

    def log_path(self, job_id: str) -> Path | None:
        """Where the job's standard output goes."""
        return self._logs.get(job_id)

    def states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """State of each job from the status listing.

        Jobs the scheduler no longer lists (purged some time after they ended)
        get :attr:`missing_state`; if the listing itself fails, ``"unknown"``.
        """
        ids = self._checked(job_ids)
        result: dict[str, JobState] = {}
        for chunk, rows in self._listings(ids, "job states unknown"):
            for j in chunk:
                row = None if rows is None else rows.get(j)
                result[j] = ("unknown" if rows is None else
                             self.missing_state if row is None else self.parse_state(row["state"]))
        return result

    def adopt(self, jobs: Sequence[Mapping[str, Any]]) -> dict[str, JobState]:
        """Pending or running jobs of an earlier driver, checked against the listing.

        A job is adopted only if the scheduler lists it under the recorded job
        name *and* working directory: a job id alone could name an unrelated
        job (ids restart when a test cluster's state is wiped), and the driver
        cancels what it adopts. If the listing fails, nothing is adopted: the
        jobs then drain the list or, finding it finished, exit by themselves.
        """
        wanted = {str(j.get("id")): j for j in jobs if self.job_id.match(str(j.get("id")))}
        adopted: dict[str, JobState] = {}
        for _chunk, rows in self._listings(list(wanted), "jobs of an earlier driver not adopted"):
            for jid, row in (rows or {}).items():
                entry, st = wanted.get(jid), self.parse_state(row["state"])
                if (entry is not None and st in ("pending", "running")
                        and row["name"] == entry.get("name")
                        and same_dir(row["workdir"], entry.get("workdir"))):
                    adopted[jid] = st
        return adopted

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Cancel the jobs; pending ones are removed before they start.

        Jobs that already ended are ignored (schedulers report them as errors).

        Raises
        ------
        BatchError
            If the cancel command fails for another reason (e.g. the
            controller is down).
        """
        for _chunk, proc in self.each_chunk(self.cancel_argv, self._checked(job_ids)):
            what = self.cancel_argv[0]
            if isinstance(proc, Exception):
                raise self.error(f"{what} failed: {proc}") from proc
            errors = self._errors(proc)
            if errors:
                raise self.error(f"{what} failed: " + "; ".join(errors))

    # ------------------------------------------------------------ the one loop
    def each_chunk(self, template: Sequence[str], ids: Sequence[str]
                   ) -> Iterator[tuple[list[str], subprocess.CompletedProcess[str] | Exception]]:
        """Run ``template`` for every chunk of ``ids``: (chunk, answer or the exception).

        The only loop over chunks of job ids: status, adoption and cancel all
        go through it. A command that cannot run or times out yields its
        exception; the caller decides what that means.
        """
        for start in range(0, len(ids), self.chunk_size):
            chunk = list(ids[start : start + self.chunk_size])
            argv: list[str] = []
            for a in template:
                argv.extend(chunk if a == IDS else [",".join(chunk)] if a == IDS_COMMA else [a])
            try:
                yield chunk, self.call(argv)
            except (OSError, subprocess.TimeoutExpired) as exc:
                yield chunk, exc

    def _listings(self, ids: Sequence[str], failing: str
                  ) -> Iterator[tuple[list[str], dict[str, dict[str, str]] | None]]:
        """(chunk, rows by id) of the status listing; rows ``None`` if it failed."""
        for chunk, proc in self.each_chunk(self.status_argv, ids):
            problem = str(proc) if isinstance(proc, Exception) else "; ".join(self._errors(proc))
            if problem:
                _log.warning("%s failed, %s: %s", self.status_argv[0], failing, problem)
                yield chunk, None
                continue
            assert not isinstance(proc, Exception)
            yield chunk, self._rows(proc.stdout)

    def _rows(self, text: str) -> dict[str, dict[str, str]]:
        cols, rows = self.status_columns, {}
        for line in text.splitlines():
            parts = line.strip().split(self.status_separator, len(cols) - 1)
            if len(parts) == len(cols):
                row = dict(zip(cols, parts, strict=True))
                rows[row["id"].strip()] = row
        return rows

    def _errors(self, proc: subprocess.CompletedProcess[str]) -> list[str]:
        """The error lines of a failed command that are not about jobs already gone."""
        if proc.returncode == 0:
            return []
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if not any(g in ln.lower() for g in self.gone_messages)]
        return errors if errors or lines else [f"exit status {proc.returncode}"]

    def _checked(self, job_ids: Sequence[str]) -> list[str]:
        ids = [str(j) for j in job_ids]
        for j in ids:
            if not self.job_id.match(j):
                raise ValueError(f"not a {self.title} job id: {j!r}")
        return ids
