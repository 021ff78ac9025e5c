"""SLURM back-end: worker jobs are batch jobs (sbatch / squeue / scancel).

Everything SLURM-specific lives here and is thin on purpose: the pool logic is
the same worker command as with the local back-end, and the scheduler calls
(submit with retries, states, adoption, cancel, the chunking of id lists) are
:class:`~ensio.workflow.backends.batch.BatchBackend`'s. SLURM is only

* class attributes: ``sbatch --parsable`` / ``squeue`` / ``scancel`` argv
  templates, the job-id patterns, the state map, the messages that mean
  "that job is already gone", the transient sbatch errors, file names;
* its script function (:func:`job_script`, a pure function in
  :mod:`ensio.workflow.backends.slurm_script`, re-exported here, so the part
  that must be exactly right is unit-tested without a scheduler), fed with
  the ``workflow.slurm`` options by :meth:`SlurmBackend.script_for`;
* :func:`slurm_unavailable_reason`, for a clear message (and the tests' skip
  or, on CI, failure) instead of a failing ``sbatch``.

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

import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from .base import JobShape, JobSpec, JobState
from .batch import IDS, IDS_COMMA, SCRIPT, BatchBackend, BatchError, run_command
from .slurm_script import (
    DEFAULT_SIGNAL_LEAD,
    STATE_MAP,
    check_directive_value,
    check_extra,
    format_time_limit,
    granted_seconds,
    job_script,
    slurm_state,
)

if TYPE_CHECKING:
    from ...config.workflow import WorkflowSection

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

#: Default :attr:`SlurmBackend.min_poll`: seconds between two squeue calls of the driver.
DEFAULT_MIN_POLL = 2.0


class SlurmError(BatchError):
    """A SLURM command failed in a way the caller has to know about."""


def slurm_unavailable_reason(timeout: float = 10.0) -> str | None:
    """Why SLURM cannot run jobs here, or ``None`` if it can.

    Used to skip the SLURM tests with a visible reason (to fail them on CI)
    and to give the driver a clear message instead of a failing ``sbatch``.

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
        ping = run_command(["scontrol", "ping"], timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"SLURM not running: scontrol ping failed ({exc})"
    if ping.returncode != 0 or " is UP" not in ping.stdout:
        first = (ping.stdout.strip() or ping.stderr.strip() or "scontrol ping").splitlines()[0]
        return f"SLURM not running: slurmctld does not answer ({first})"
    try:
        proc = run_command(["sinfo", "-h", "-N", "-o", "%T"], timeout=timeout)
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


class SlurmBackend(BatchBackend):
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
    command_timeout, submit_attempts, min_poll
        See :class:`~ensio.workflow.backends.batch.BatchBackend`.
    """

    name = "slurm"
    label = "SLURM"

    submit_argv = ("sbatch", "--parsable", SCRIPT)
    # One listing serves states and adoption; purged jobs are simply not listed
    # (a lone purged id makes squeue fail with "Invalid job id").
    status_argv = ("squeue", "-h", "--states=all", "-o", "%i|%j|%T|%Z", "-j", IDS_COMMA)
    status_columns = ("id", "name", "state", "workdir")
    cancel_argv = ("scancel", IDS)
    #: ``--parsable`` prints "jobid" or "jobid;cluster".
    submitted_id = re.compile(r"(\d+)(?:;.*)?", re.DOTALL)
    job_id = re.compile(r"^\d+$")
    state_map: ClassVar[dict[str, JobState]] = STATE_MAP
    gone_messages = ("invalid job id", "already completing or completed")
    transient_messages = (
        "socket timed out",
        "temporarily unavailable",
        "unable to contact slurm controller",
        "connection refused",
        "try again",
    )
    script_name = "{name}.sbatch"
    log_name = "{name}-{id}.out"
    script = staticmethod(job_script)

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
        super().__init__(command_timeout=command_timeout, submit_attempts=submit_attempts,
                         min_poll=min_poll)
        self.partition = partition
        self.account = account
        self.extra = tuple(check_extra(x) for x in extra)
        if partition:
            check_directive_value("partition", partition)
        if account:
            check_directive_value("account", account)
        self.signal_lead = signal_lead
        self.cpus_per_task = cpus_per_task
        self.ntasks = ntasks

    @classmethod
    def from_config(cls, wf: WorkflowSection, shape: JobShape) -> SlurmBackend:
        """``workflow.slurm`` options, and the CPUs and tasks each job of ``shape`` needs."""
        return cls(partition=wf.slurm.partition, account=wf.slurm.account,
                   extra=wf.slurm.extra, cpus_per_task=shape.cpus_per_task,
                   ntasks=shape.ntasks)

    def error(self, message: str) -> SlurmError:
        """SLURM's command failures are :class:`SlurmError`."""
        return SlurmError(message)

    def script_for(self, spec: JobSpec) -> str:
        """The batch script of *spec* with this back-end's settings."""
        lead = self.signal_lead
        if lead is None:
            try:
                lead = min(DEFAULT_SIGNAL_LEAD, granted_seconds(spec.time_limit) // 2)
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
