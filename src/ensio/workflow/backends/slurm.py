"""SLURM back-end: worker jobs are batch jobs (sbatch / squeue / scancel).

Everything SLURM-specific lives here and is thin on purpose: the pool logic is
the same worker command as with the local back-end; this module only

* generates the batch script (:func:`job_script`, a pure function in
  :mod:`ensio.workflow.backends.slurm_script`, re-exported here, so the part
  that must be exactly right is unit-tested without a scheduler),
* submits it with ``sbatch --parsable``,
* follows jobs with ``squeue``, and
* cancels them with ``scancel``, and
* adopts the live jobs of a killed driver (:meth:`SlurmBackend.adopt`).

Every scheduler call is an argv list with a timeout; no shell is ever involved,
so job names, paths and ids can never be interpreted by one.

Job states without accounting
-----------------------------
``sacct`` needs the accounting daemon, which many small or CI clusters lack.
:meth:`SlurmBackend.states` therefore asks ``squeue --states=all``, which also
lists finished jobs for ``MinJobAge`` seconds after they end (300 s by
default; 60 s in the CI cluster of ``.ci/setup-slurm.sh``) with their final
state (COMPLETED, FAILED, TIMEOUT, CANCELLED, ...). A job the controller no
longer knows has ended and was purged: it is reported as ``"done"`` (it can
neither start nor run any more) although its exit status is forgotten. That is
enough, because the to-do list, not the job state, records which tasks
succeeded. ``"unknown"`` is reserved for "the scheduler did not answer".

MPI inside a job
----------------
The analysis task runs ``mpiexec -n R`` inside a worker job. MPICH's Hydra
sees ``SLURM_JOB_ID`` and launches its proxy with ``srun`` into the job's own
allocation (checked on the CI cluster: one proxy, R ranks). Where cgroups
confine jobs, a worker that may run the analysis needs ``cpus_per_task`` ≥ R.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...durable import atomic_write
from .base import Backend, JobSpec, JobState
from .slurm_script import (
    DEFAULT_SIGNAL_LEAD,
    _check_directive_value,
    _check_extra,
    _granted_seconds,
    format_time_limit,
    job_script,
    slurm_state,
)

__all__ = [
    "DEFAULT_MIN_POLL",
    "DEFAULT_SIGNAL_LEAD",
    "SlurmBackend",
    "SlurmError",
    "format_time_limit",
    "job_script",
    "slurm_state",
    "slurm_unavailable_reason",
]

_log = logging.getLogger(__name__)

#: Default :attr:`SlurmBackend.min_poll`: seconds between two squeue calls of the driver.
DEFAULT_MIN_POLL = 2.0

#: What ``sbatch --parsable`` answers and the only ids passed to squeue/scancel.
_JOB_ID_RE = re.compile(r"^\d+$")

#: sbatch errors after which a new attempt may succeed (busy controller).
_TRANSIENT = (
    "Socket timed out",
    "temporarily unavailable",
    "Unable to contact slurm controller",
    "Connection refused",
    "try again",
)


class SlurmError(RuntimeError):
    """A SLURM command failed in a way the caller has to know about."""


def _same_dir(a: str, b: object) -> bool:
    """Whether squeue's working directory ``a`` is the recorded one ``b``."""
    if not isinstance(b, str) or not a.strip():
        return False
    a = a.strip()
    return os.path.normpath(a) == os.path.normpath(b) or os.path.realpath(a) == os.path.realpath(b)


# --------------------------------------------------------------------------- #
# scheduler calls
# --------------------------------------------------------------------------- #


def _run(argv: Sequence[str], *, timeout: float, stdin: str | None = None,
         cwd: str | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one SLURM command (argv list, never a shell) with a timeout."""
    return subprocess.run(
        list(argv),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
        check=False,
    )


def slurm_unavailable_reason(timeout: float = 10.0) -> str | None:
    """Why SLURM cannot run jobs here, or ``None`` if it can.

    Used to skip the SLURM tests with a visible reason and to give the driver a
    clear message instead of a failing ``sbatch``.

    Parameters
    ----------
    timeout : float
        Seconds to wait for ``sinfo``.

    Returns
    -------
    str or None
        ``None`` if the SLURM commands exist and at least one node is idle,
        mixed or allocated (it can run jobs now or later).
    """
    for tool in ("sbatch", "squeue", "scancel", "sinfo", "scontrol"):
        if shutil.which(tool) is None:
            return f"SLURM not running: {tool} not found"
    # `scontrol ping` answers at once when slurmctld is down; sinfo retries ~10 s.
    try:
        ping = _run(["scontrol", "ping"], timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"SLURM not running: scontrol ping failed ({exc})"
    if ping.returncode != 0 or " is UP" not in ping.stdout:
        first = (ping.stdout.strip() or ping.stderr.strip() or "scontrol ping").splitlines()[0]
        return f"SLURM not running: slurmctld does not answer ({first})"
    try:
        proc = _run(["sinfo", "-h", "-N", "-o", "%T"], timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"SLURM not running: sinfo failed ({exc})"
    if proc.returncode != 0:
        return f"SLURM not running: sinfo failed ({proc.stderr.strip() or proc.returncode})"
    # Suffixes: '*' not responding, '~' powered off, '%' powering down make a
    # node useless; '$' reservation, '@' pending reboot, '#' powering up do not.
    states = {s.strip().rstrip("$@^-#") for s in proc.stdout.split()}
    if not states & {"idle", "mixed", "allocated", "completing"}:
        return f"SLURM not running: no idle node (sinfo: {', '.join(sorted(states)) or 'none'})"
    return None


class SlurmBackend(Backend):
    """Worker jobs as SLURM batch jobs.

    Parameters
    ----------
    partition, account : str or None
        ``--partition`` / ``--account`` of every job (``workflow.slurm``).
    extra : sequence of str
        Further ``#SBATCH`` options (``workflow.slurm.extra``), validated at
        construction so a bad configuration fails before anything is queued.
    signal_lead : int or None
        Seconds before the time limit at which the worker gets SIGUSR1.
        ``None``: :data:`DEFAULT_SIGNAL_LEAD`, but at most half the (rounded)
        limit, so that short jobs (e.g. a one-minute test limit) stay valid.
    cpus_per_task : int
        CPUs per worker job.
    ntasks : int
        Tasks (MPI ranks) per job: 1 for worker jobs; N_e × P for the coupled
        job of the online mode.
    command_timeout : float
        Seconds any single sbatch/squeue/scancel call may take.
    submit_attempts : int
        Attempts of ``sbatch`` on transient controller errors (busy clusters
        answer "Socket timed out"); a duplicate job from a retried submission
        is harmless, since it only drains the same to-do list.
    min_poll : float
        Shortest interval between two job-state queries of the pool driver
        (:attr:`Backend.min_poll`). Each is an RPC to slurmctld, shared by every
        user of the cluster; the to-do list, not the job states, tells the
        driver when a cycle is finished, so job states are only needed to
        replace jobs that ended and a few seconds of delay cost nothing.
    """

    name = "slurm"

    def __init__(
        self,
        *,
        partition: str | None = None,
        account: str | None = None,
        extra: Sequence[str] = (),
        signal_lead: int | None = None,
        cpus_per_task: int = 1,
        ntasks: int = 1,
        command_timeout: float = 60.0,
        submit_attempts: int = 3,
        min_poll: float = DEFAULT_MIN_POLL,
    ) -> None:
        if not min_poll >= 1.0:
            raise ValueError(f"min_poll must be at least 1 s for a real scheduler, got {min_poll}")
        self.min_poll = float(min_poll)
        self.partition = partition
        self.account = account
        self.extra = tuple(_check_extra(x) for x in extra)
        if partition:
            _check_directive_value("partition", partition)
        if account:
            _check_directive_value("account", account)
        self.signal_lead = signal_lead
        self.cpus_per_task = cpus_per_task
        self.ntasks = ntasks
        self.command_timeout = command_timeout
        self.submit_attempts = max(1, submit_attempts)
        self._logs: dict[str, Path] = {}

    #: The pure script generator, also reachable as ``SlurmBackend.job_script``.
    job_script = staticmethod(job_script)

    def script_for(self, spec: JobSpec) -> str:
        """The batch script of *spec* with this back-end's settings."""
        lead = self.signal_lead
        if lead is None:
            try:
                lead = min(DEFAULT_SIGNAL_LEAD, _granted_seconds(spec.time_limit) // 2)
            except ValueError:
                lead = DEFAULT_SIGNAL_LEAD  # job_script reports the bad limit
        return job_script(
            spec,
            partition=self.partition,
            account=self.account,
            extra=self.extra,
            signal_lead=lead,
            cpus_per_task=self.cpus_per_task,
            ntasks=self.ntasks,
        )

    def submit(self, spec: JobSpec) -> str:
        """Write ``<workdir>/<name>.sbatch`` and submit it; return the job id.

        The script is kept in the workdir next to the job's logs so a failed
        job can be inspected and resubmitted by hand. The submission time goes
        to the job as ``ENSIO_SUBMITTED`` (epoch seconds, as with the local
        back-end) through sbatch's environment, which jobs inherit by default
        (``--export=ALL``), so the records can tell queuing time; the script
        itself stays a pure function of the spec.

        Raises
        ------
        SlurmError
            If sbatch fails (after retries on transient errors) or answers
            something that is not a job id.
        """
        script = self.script_for(spec)
        path = Path(spec.workdir) / f"{spec.name}.sbatch"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, script, fsync=False)
        argv = ["sbatch", "--parsable", str(path)]
        err = ""
        for attempt in range(self.submit_attempts):
            if attempt:
                time.sleep(min(2.0**attempt, 10.0))  # back off from a busy controller
            env = {**os.environ, "ENSIO_SUBMITTED": repr(time.time())}
            try:
                proc = _run(argv, timeout=self.command_timeout, cwd=spec.workdir, env=env)
            except subprocess.TimeoutExpired:
                err = f"sbatch timed out after {self.command_timeout:g} s"
                continue
            except OSError as exc:
                raise SlurmError(f"cannot run sbatch: {exc}") from exc
            if proc.returncode == 0:
                # --parsable prints "jobid" or "jobid;cluster".
                job_id = proc.stdout.strip().split(";", 1)[0]
                if not _JOB_ID_RE.match(job_id):
                    raise SlurmError(f"sbatch answered {proc.stdout.strip()!r}, not a job id")
                _log.debug("submitted %s as SLURM job %s", spec.name, job_id)
                self._logs[job_id] = Path(spec.workdir) / f"{spec.name}-{job_id}.out"
                return job_id
            err = proc.stderr.strip() or f"exit status {proc.returncode}"
            if not any(t.lower() in err.lower() for t in _TRANSIENT):
                break
        raise SlurmError(f"sbatch {path} failed: {err}")

    def log_path(self, job_id: str) -> Path | None:
        """Where the job's standard output goes (stderr: same name, ``.err``)."""
        return self._logs.get(job_id)

    def states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """State of each job from ``squeue --states=all``.

        Jobs the controller no longer lists (purged ``MinJobAge`` after they
        ended) are ``"done"``; if squeue itself fails, all are ``"unknown"``.
        """
        ids = [str(j) for j in job_ids]
        for j in ids:
            if not _JOB_ID_RE.match(j):
                raise ValueError(f"not a SLURM job id: {j!r}")
        result: dict[str, JobState] = {}
        for start in range(0, len(ids), 500):  # keep the command line short
            chunk = ids[start : start + 500]
            argv = ["squeue", "-h", "--states=all", "-o", "%i %T", "-j", ",".join(chunk)]
            try:
                proc = _run(argv, timeout=self.command_timeout)
            except (OSError, subprocess.TimeoutExpired) as exc:
                _log.warning("squeue failed: %s", exc)
                result.update(dict.fromkeys(chunk, "unknown"))
                continue
            if proc.returncode != 0:
                if "invalid job id" in proc.stderr.lower():
                    # A lone purged id makes squeue fail; several are just omitted.
                    result.update(dict.fromkeys(chunk, "done"))
                else:
                    _log.warning("squeue failed: %s", proc.stderr.strip())
                    result.update(dict.fromkeys(chunk, "unknown"))
                continue
            seen: dict[str, JobState] = {}
            for line in proc.stdout.splitlines():
                parts = line.split()
                if len(parts) == 2:
                    seen[parts[0]] = slurm_state(parts[1])
            for j in chunk:
                result[j] = seen.get(j, "done")
        return result

    def adopt(self, jobs: Sequence[Mapping[str, Any]]) -> dict[str, JobState]:
        """Pending or running jobs of an earlier driver, checked against squeue.

        A job is adopted only if squeue lists it under the recorded job name
        *and* working directory: a job id alone could name an unrelated job
        (ids restart when a test cluster's state is wiped), and the driver
        cancels what it adopts. If squeue fails, nothing is adopted: the jobs
        then drain the list or, finding it finished, exit by themselves.
        """
        wanted = {str(j.get("id")): j for j in jobs if _JOB_ID_RE.match(str(j.get("id")))}
        ids = sorted(wanted, key=int)
        adopted: dict[str, JobState] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            argv = ["squeue", "-h", "--states=all", "-o", "%i|%j|%T|%Z", "-j", ",".join(chunk)]
            try:
                proc = _run(argv, timeout=self.command_timeout)
            except (OSError, subprocess.TimeoutExpired) as exc:
                _log.warning("squeue failed, jobs of an earlier driver not adopted: %s", exc)
                continue
            if proc.returncode != 0:  # "invalid job id": a lone id that was purged
                if "invalid job id" not in proc.stderr.lower():
                    _log.warning("squeue failed, jobs of an earlier driver not adopted: %s",
                                 proc.stderr.strip())
                continue
            for line in proc.stdout.splitlines():
                parts = line.split("|", 3)
                if len(parts) != 4 or parts[0] not in wanted:
                    continue
                jid, name, state, workdir = parts
                entry, st = wanted[jid], slurm_state(state)
                if (st in ("pending", "running") and name == entry.get("name")
                        and _same_dir(workdir, entry.get("workdir"))):
                    adopted[jid] = st
        return adopted

    def cancel(self, job_ids: Sequence[str]) -> None:
        """``scancel`` the jobs; pending ones are removed before they start.

        Jobs that already ended are ignored (scancel reports them as errors).

        Raises
        ------
        SlurmError
            If scancel fails for another reason (e.g. the controller is down).
        """
        ids = [str(j) for j in job_ids]
        for j in ids:
            if not _JOB_ID_RE.match(j):
                raise ValueError(f"not a SLURM job id: {j!r}")
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            try:
                proc = _run(["scancel", *chunk], timeout=self.command_timeout)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SlurmError(f"scancel failed: {exc}") from exc
            if proc.returncode == 0:
                continue
            benign = ("invalid job id", "already completing or completed")
            errors = [
                ln for ln in proc.stderr.splitlines()
                if ln.strip() and not any(b in ln.lower() for b in benign)
            ]
            if errors:
                raise SlurmError("scancel failed: " + "; ".join(errors))
