"""SLURM batch scripts of worker jobs: pure functions, tested without a scheduler.

The part of the SLURM back-end that must be exactly right — the ``#SBATCH``
directives, the time-limit format, the warning signal, quoting of the
environment and the worker argv — is a pure function of the job spec
(:func:`job_script`), kept apart from the scheduler calls of
:mod:`ensio.workflow.backends.slurm`, which re-exports everything public here.
:func:`slurm_state` maps SLURM's job states to the back-end-neutral ones.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Sequence

from .base import JobSpec, JobState

__all__ = [
    "DEFAULT_SIGNAL_LEAD",
    "STATE_MAP",
    "check_directive_value",
    "check_extra",
    "format_time_limit",
    "granted_seconds",
    "job_script",
    "slurm_state",
]

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
_VALUE_RE = re.compile(r"^[^\s\"\\#]+$")

#: SLURM's long job states (``squeue -o %T``) -> the back-end-neutral states.
STATE_MAP: dict[str, JobState] = {
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


def granted_seconds(seconds: float) -> int:
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
    minutes = granted_seconds(seconds) // 60
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00"


def check_directive_value(what: str, value: str) -> None:
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


def check_extra(line: str) -> str:
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


# job_script is ~110 lines, half of them its docstring: the checks and the
# directives read best in one place, in the order they appear in the script.
def job_script(
    spec: JobSpec,
    *,
    partition: str | None = None,
    account: str | None = None,
    extra: Sequence[str] = (),
    signal_lead: int = DEFAULT_SIGNAL_LEAD,
    cpus_per_task: int = 1,
    ntasks: int = 1,
) -> str:
    """Generate the batch script of one worker job (or of the coupled online job).

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
    ntasks : int
        ``--ntasks``: 1 for a worker job (then also ``--nodes=1``); N_e × P
        for the coupled job of ``ensio cycle --mode online``, whose
        ``mpiexec`` starts its ranks inside the allocation (any node count).

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
    # Over ~80 lines only through its docstring (every parameter documented); the body is
    # about 54 lines, kept whole so it reads top to bottom.
    if not _NAME_RE.match(spec.name):
        raise ValueError(
            f"job name {spec.name!r} must be letters, digits, '.', '_', '+' or '-'"
        )
    if not spec.argv:
        raise ValueError("job argv is empty")
    _check_path("job workdir", spec.workdir)
    time_str = format_time_limit(spec.time_limit)
    limit_s = granted_seconds(spec.time_limit)
    if isinstance(signal_lead, bool) or not isinstance(signal_lead, int):
        raise ValueError(f"signal_lead must be an integer number of seconds, got {signal_lead!r}")
    if not 0 < signal_lead <= _MAX_SIGNAL_LEAD or signal_lead >= limit_s:
        raise ValueError(
            f"signal_lead must be in 1..{min(_MAX_SIGNAL_LEAD, limit_s - 1)} s for a "
            f"{time_str} time limit, got {signal_lead}"
        )
    if isinstance(cpus_per_task, bool) or not isinstance(cpus_per_task, int) or cpus_per_task < 1:
        raise ValueError(f"cpus_per_task must be a positive integer, got {cpus_per_task!r}")
    if isinstance(ntasks, bool) or not isinstance(ntasks, int) or ntasks < 1:
        raise ValueError(f"ntasks must be a positive integer, got {ntasks!r}")
    for key, _ in spec.env:
        if not _ENV_NAME_RE.match(key):
            raise ValueError(f"environment variable name {key!r} is not a valid shell name")

    workdir = spec.workdir.rstrip("/") or "/"
    # In --output/--error patterns '%' introduces a replacement; '%%' is a '%'.
    log_base = os.path.join(workdir, spec.name).replace("%", "%%")
    lines = [
        "#!/bin/bash",
        "# Generated by ensio (SLURM back-end): "
        + ("one worker job of the dynamic job scheme." if ntasks == 1
           else "the coupled job of the online mode."),
        f"#SBATCH --job-name={spec.name}",
        f"#SBATCH --time={time_str}",
        f"#SBATCH --signal=B:USR1@{signal_lead}",
        *(["#SBATCH --nodes=1"] if ntasks == 1 else []),
        f"#SBATCH --ntasks={ntasks}",
        f"#SBATCH --cpus-per-task={cpus_per_task}",
        f'#SBATCH --chdir="{workdir}"',
        f'#SBATCH --output="{log_base}-%j.out"',
        f'#SBATCH --error="{log_base}-%j.err"',
    ]
    if partition:
        check_directive_value("partition", partition)
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        check_directive_value("account", account)
        lines.append(f"#SBATCH --account={account}")
    lines.extend(f"#SBATCH {check_extra(x)}" for x in extra)
    lines.extend(f"export {key}={shlex.quote(value)}" for key, value in spec.env)
    # --chdir falls back to /tmp silently if the directory is missing: fail loudly.
    lines.append(f"cd -- {shlex.quote(workdir)} || exit 1")
    lines.append("exec " + shlex.join(spec.argv))
    return "\n".join(lines) + "\n"


def slurm_state(state: str) -> JobState:
    """Map a SLURM job state (``squeue -o %T``) to a back-end-neutral state."""
    return STATE_MAP.get(state.strip().upper().rstrip("+"), "unknown")
