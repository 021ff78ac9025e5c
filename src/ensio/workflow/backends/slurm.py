"""SLURM back-end: worker jobs are batch jobs (sbatch / squeue / scancel).

Everything SLURM-specific lives here and is thin on purpose: the pool logic is
the same worker command as with the local back-end; this module only

* generates the batch script (:func:`job_script`, a pure function, so the part
  that must be exactly right is unit-tested without a scheduler),
* submits it with ``sbatch --parsable``,
* follows jobs with ``squeue``, and
* cancels them with ``scancel``.

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
import math
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from .base import Backend, JobSpec, JobState

__all__ = [
    "DEFAULT_SIGNAL_LEAD",
    "SlurmBackend",
    "SlurmError",
    "format_time_limit",
    "job_script",
    "slurm_state",
    "slurm_unavailable_reason",
]

_log = logging.getLogger(__name__)

#: Seconds before the time limit at which SLURM sends SIGUSR1 to the worker.
#: SLURM checks limits only every ~30 s, so the warning can come up to ~60 s
#: earlier than asked; the worker also keeps its own timer.
DEFAULT_SIGNAL_LEAD = 60

#: Largest ``--signal`` lead SLURM accepts (it is stored in 16 bits).
_MAX_SIGNAL_LEAD = 0xFFFF

#: Options the back-end sets itself. Overriding them through ``extra`` would
#: silently break the worker's timing (--time/--signal), the log locations or
#: the parsing of sbatch's answer, so such ``extra`` lines are refused.
_RESERVED_OPTIONS = frozenset(
    {
        "--time",
        "--signal",
        "--job-name",
        "--output",
        "--error",
        "--chdir",
        "--parsable",
        "--wrap",
        "--array",
    }
)

_NAME_RE = re.compile(r"^[\w.+-]+$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EXTRA_RE = re.compile(r"^(--[A-Za-z][A-Za-z0-9_-]*)(?:[= ](.*))?$")
_JOB_ID_RE = re.compile(r"^\d+$")
_VALUE_RE = re.compile(r"^[^\s\"\\#]+$")

#: SLURM's long job states (``squeue -o %T``) -> the back-end-neutral states.
_STATE_MAP: dict[str, JobState] = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_FED": "pending",
    "REQUEUE_HOLD": "pending",
    "RESV_DEL_HOLD": "pending",
    "SPECIAL_EXIT": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",  # processes may still be alive: not done yet
    "SIGNALING": "running",
    "STAGE_OUT": "running",
    "RESIZING": "running",
    "SUSPENDED": "running",
    "STOPPED": "running",
    "COMPLETED": "done",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "DEADLINE": "failed",
    "PREEMPTED": "failed",
    "CANCELLED": "cancelled",
    "REVOKED": "cancelled",
}

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


# --------------------------------------------------------------------------- #
# pure functions
# --------------------------------------------------------------------------- #


def _granted_seconds(seconds: float) -> int:
    """The limit SLURM grants for *seconds*: whole minutes, rounded up, >= 1."""
    if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
            or not math.isfinite(seconds) or seconds <= 0):
        raise ValueError(f"time limit must be a positive number of seconds, got {seconds!r}")
    return 60 * max(1, math.ceil(seconds / 60 - 1e-9))


def format_time_limit(seconds: float) -> str:
    """Format a wall-clock limit for ``--time`` as ``D-HH:MM:SS``.

    SLURM's time limits have a granularity of one minute and it rounds
    seconds *up* (``--time=0:20`` becomes one minute). Rounding here, the same
    way, makes the script show the limit the job really gets.

    Parameters
    ----------
    seconds : float
        Requested limit, > 0.

    Returns
    -------
    str
        E.g. ``"0-00:01:00"`` for 1 to 60 s, ``"1-02:03:00"``.

    Raises
    ------
    ValueError
        If *seconds* is not a positive finite number.
    """
    minutes = _granted_seconds(seconds) // 60
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00"


def _check_directive_value(what: str, value: str) -> None:
    """Refuse values that cannot be written safely on a ``#SBATCH`` line.

    sbatch splits directive lines at blanks, honours double quotes and drops
    backslashes; ``#`` starts a comment. Rather than guess how a value would be
    mangled, such values are refused with a clear message.
    """
    if not value or not _VALUE_RE.match(value):
        raise ValueError(
            f"{what} {value!r} cannot be written on an #SBATCH line "
            "(empty, or contains blanks, quotes, backslashes or '#')"
        )


def _check_path(what: str, path: str) -> None:
    """Refuse paths sbatch cannot parse inside a double-quoted directive."""
    if not os.path.isabs(path):
        raise ValueError(f"{what} must be an absolute path, got {path!r}")
    bad = [c for c in path if c in '"\\' or not c.isprintable()]
    if bad:
        raise ValueError(
            f"{what} {path!r} contains characters sbatch cannot read in a "
            f"#SBATCH line: {''.join(sorted(set(bad)))!r}"
        )


def _check_extra(line: str) -> str:
    """Validate one user-supplied ``#SBATCH`` option and return it stripped."""
    if not isinstance(line, str):
        raise ValueError(f"workflow.slurm.extra entries must be strings, got {line!r}")
    text = line.strip()
    if any(not c.isprintable() for c in text):
        raise ValueError(f"workflow.slurm.extra entry {line!r} contains control characters")
    m = _EXTRA_RE.match(text)
    if not m:
        raise ValueError(
            f"workflow.slurm.extra entry {line!r} must be one long sbatch option "
            "starting with '--' (e.g. '--mem=4G', '--qos=normal')"
        )
    option = m.group(1)
    if option in _RESERVED_OPTIONS:
        raise ValueError(
            f"workflow.slurm.extra entry {line!r} sets {option}, which ensio sets itself "
            "(time limit, warning signal, name, logs); use the workflow keys instead"
        )
    if "\\" in text or text.count('"') % 2:
        raise ValueError(
            f"workflow.slurm.extra entry {line!r}: sbatch drops backslashes and needs "
            "balanced double quotes in #SBATCH lines"
        )
    return text


def job_script(
    spec: JobSpec,
    *,
    partition: str | None = None,
    account: str | None = None,
    extra: Sequence[str] = (),
    signal_lead: int = DEFAULT_SIGNAL_LEAD,
    cpus_per_task: int = 1,
) -> str:
    """Generate the batch script of one worker job.

    A pure function of its arguments: this is the part of the SLURM back-end
    that must be exactly right (quoting, limits, the warning signal), so it is
    unit-tested without a scheduler.

    The script asks for one task on one node, the limit and the warning signal
    ``--signal=B:USR1@<lead>``; ``B:`` sends it to the batch shell only, and the
    script ``exec``-s the worker, so the worker *is* the batch shell and
    receives the warning itself (it must handle SIGUSR1: its default action is
    to terminate). Logs go to ``<workdir>/<name>-<jobid>.out`` / ``.err``.
    Environment values and the worker argv are quoted with :func:`shlex.quote`,
    so any bytes survive; values on ``#SBATCH`` lines cannot be quoted that
    way and are validated instead.

    Parameters
    ----------
    spec : JobSpec
        The job: name, worker argv, time limit (s), workdir, environment.
    partition, account : str or None
        ``--partition`` / ``--account`` if given.
    extra : sequence of str
        Further sbatch options, each one ``--option[=value]`` written verbatim
        after validation (no options ensio sets itself, no control characters).
    signal_lead : int
        Seconds before the limit at which SLURM sends SIGUSR1; must be smaller
        than the (rounded) time limit.
    cpus_per_task : int
        ``--cpus-per-task`` (e.g. the analysis ranks a worker may start).

    Returns
    -------
    str
        The script text, ending with a newline.

    Raises
    ------
    ValueError
        On anything that cannot be expressed safely (bad name, relative or
        unparsable workdir, bad environment name, bad extra line, bad lead).
    """
    if not _NAME_RE.match(spec.name):
        raise ValueError(
            f"job name {spec.name!r} must be letters, digits, '.', '_', '+' or '-'"
        )
    if not spec.argv:
        raise ValueError("job argv is empty")
    _check_path("job workdir", spec.workdir)
    time_str = format_time_limit(spec.time_limit)
    limit_s = _granted_seconds(spec.time_limit)
    if isinstance(signal_lead, bool) or not isinstance(signal_lead, int):
        raise ValueError(f"signal_lead must be an integer number of seconds, got {signal_lead!r}")
    if not 0 < signal_lead <= _MAX_SIGNAL_LEAD or signal_lead >= limit_s:
        raise ValueError(
            f"signal_lead must be in 1..{min(_MAX_SIGNAL_LEAD, limit_s - 1)} s for a "
            f"{time_str} time limit, got {signal_lead}"
        )
    if isinstance(cpus_per_task, bool) or not isinstance(cpus_per_task, int) or cpus_per_task < 1:
        raise ValueError(f"cpus_per_task must be a positive integer, got {cpus_per_task!r}")
    for key, _ in spec.env:
        if not _ENV_NAME_RE.match(key):
            raise ValueError(f"environment variable name {key!r} is not a valid shell name")

    workdir = spec.workdir.rstrip("/") or "/"
    # In --output/--error patterns '%' introduces a replacement; '%%' is a '%'.
    log_base = os.path.join(workdir, spec.name).replace("%", "%%")
    lines = [
        "#!/bin/bash",
        "# Generated by ensio (SLURM back-end): one worker job of the dynamic job scheme.",
        f"#SBATCH --job-name={spec.name}",
        f"#SBATCH --time={time_str}",
        f"#SBATCH --signal=B:USR1@{signal_lead}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        f"#SBATCH --cpus-per-task={cpus_per_task}",
        f'#SBATCH --chdir="{workdir}"',
        f'#SBATCH --output="{log_base}-%j.out"',
        f'#SBATCH --error="{log_base}-%j.err"',
    ]
    if partition:
        _check_directive_value("partition", partition)
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        _check_directive_value("account", account)
        lines.append(f"#SBATCH --account={account}")
    lines.extend(f"#SBATCH {_check_extra(x)}" for x in extra)
    lines.extend(f"export {key}={shlex.quote(value)}" for key, value in spec.env)
    # --chdir falls back to /tmp silently if the directory is missing: fail loudly.
    lines.append(f"cd -- {shlex.quote(workdir)} || exit 1")
    lines.append("exec " + shlex.join(spec.argv))
    return "\n".join(lines) + "\n"


def slurm_state(state: str) -> JobState:
    """Map a SLURM job state (``squeue -o %T``) to a back-end-neutral state."""
    return _STATE_MAP.get(state.strip().upper().rstrip("+"), "unknown")


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
    command_timeout : float
        Seconds any single sbatch/squeue/scancel call may take.
    submit_attempts : int
        Attempts of ``sbatch`` on transient controller errors (busy clusters
        answer "Socket timed out"); a duplicate job from a retried submission
        is harmless, since it only drains the same to-do list.
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
        command_timeout: float = 60.0,
        submit_attempts: int = 3,
    ) -> None:
        self.partition = partition
        self.account = account
        self.extra = tuple(_check_extra(x) for x in extra)
        if partition:
            _check_directive_value("partition", partition)
        if account:
            _check_directive_value("account", account)
        self.signal_lead = signal_lead
        self.cpus_per_task = cpus_per_task
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
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(script)
        os.replace(tmp, path)
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
