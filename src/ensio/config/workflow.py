"""Config section of the dynamic job scheme: ``workflow:`` (issue 4).

Key names are part of the interface (issue 4)::

    workflow:
      backend: local             # local | slurm
      jobs: 4                    # N_j
      time_limit: "00:20:00"     # per job; also D-HH:MM:SS or a number of seconds
      member_command: "python -m mymodel --init {analysis} --out {forecast}"
      analysis_ranks: 2
      prestart: true             # start the analysis while the last members run
      resident: false            # local: one analysis program serves every cycle
      retries: 1
      min_members: 40            # null: every member must succeed
      task_estimate: "00:01:00"  # used until records give a better estimate
      lease: "00:01:00"          # a killed job's task is taken over after this
      slurm: {partition: null, account: null, extra: []}
      transfer: transfer.yaml    # optional: restarts through memory (issue 12)

Durations are strings because that is how schedulers spell them; YAML 1.1
reads an unquoted ``1:00:00`` as the integer 3600, so numbers are accepted too
(seconds). The command template is checked here, once, so a typo in a
placeholder fails when the config is loaded and not in the hundredth job.

This module also holds the two small parsers the worker needs at run time
(:func:`parse_duration`, :func:`command_fields`), so the rules live in one place.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .errors import ConfigError
from .yamlfile import read_yaml

__all__ = [
    "MEMBER_PLACEHOLDERS",
    "ANALYSIS_PLACEHOLDERS",
    "BackendName",
    "ONLINE_PLACEHOLDERS",
    "OnlineSection",
    "SlurmSection",
    "TRANSFER_COMPONENTS",
    "WorkflowSection",
    "check_placeholders",
    "check_transfer_file",
    "command_fields",
    "parse_duration",
]

BackendName = Literal["local", "slurm"]

#: Placeholders of ``workflow.member_command`` (issue 4).
MEMBER_PLACEHOLDERS: frozenset[str] = frozenset(
    {"member", "cycle", "forecast", "analysis", "workdir"}
)
#: Placeholders of ``workflow.setup`` (run by ``ensio cycle`` before the first cycle).
SETUP_PLACEHOLDERS: frozenset[str] = frozenset({"workdir", "members", "cycles"})
#: Placeholders of ``workflow.online.command`` (``ensio cycle --mode online``).
ONLINE_PLACEHOLDERS: frozenset[str] = frozenset(
    {"workdir", "first", "cycles", "initial", "tasks_per_member", "members"}
)
#: The components a ``workflow.transfer`` config must name: the member tasks and the
#: analysis task run under the interposer as these components.
TRANSFER_COMPONENTS: tuple[str, str] = ("members", "analysis")
#: Placeholders of the analysis command the cycle driver builds.
ANALYSIS_PLACEHOLDERS: frozenset[str] = frozenset(
    {"cycle", "workdir", "analysis_ranks", "members", "n_members"}
)


def parse_duration(value: str | float | int, key: str = "duration") -> float:
    """Seconds of a scheduler-style duration.

    Accepts ``SS``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS`` (SLURM's forms) and plain numbers of seconds.

    Parameters
    ----------
    value : str or float
        The duration as written in YAML or on the command line.
    key : str
        Dotted key named in the error message.

    Returns
    -------
    float
        Seconds (> 0).

    Raises
    ------
    ConfigError
        Malformed or non-positive durations, naming ``key``.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected HH:MM:SS, D-HH:MM:SS or seconds, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        seconds = _parse_clock(value.strip(), key)
    if not (seconds > 0 and seconds < float("inf")):
        raise ConfigError(f"{key}: must be a positive duration, got {value!r}")
    return seconds


def _parse_clock(text: str, key: str) -> float:
    bad = ConfigError(f"{key}: expected HH:MM:SS, D-HH:MM:SS or seconds, got {text!r}")
    days = 0
    rest = text
    if "-" in text:
        d, _, rest = text.partition("-")
        if not d.isdigit():
            raise bad
        days = int(d)
        parts = rest.split(":")
        if not 1 <= len(parts) <= 3:
            raise bad
        parts += ["0"] * (3 - len(parts))  # D-HH, D-HH:MM
    else:
        parts = rest.split(":")
        if not 1 <= len(parts) <= 3:
            raise bad
        parts = ["0"] * (3 - len(parts)) + parts  # SS, MM:SS
    try:
        h, m = int(parts[0]), int(parts[1])
        s = float(parts[2])
    except ValueError:
        raise bad from None
    if any(p.strip() != p or not p for p in parts) or h < 0 or m < 0 or s < 0:
        raise bad
    if (len(rest.split(":")) > 1 or days) and (m >= 60 or s >= 60):
        raise bad
    return days * 86400.0 + h * 3600.0 + m * 60.0 + s


def command_fields(template: str, allowed: frozenset[str], key: str = "command") -> list[str]:
    """Split a command template into arguments and check its placeholders.

    The template is split like a POSIX shell would split words
    (:func:`shlex.split`, so quotes group words) but is never run by a
    shell; each argument is later filled in with :meth:`str.format`, so a
    value with spaces or quotes stays one argument. Placeholders are checked
    by :func:`check_placeholders`.

    Returns
    -------
    list of str
        The unformatted arguments (at least one).

    Raises
    ------
    ConfigError
        Unbalanced quotes, an empty command, a malformed or unknown placeholder.
    """
    try:
        args = shlex.split(template)
    except ValueError as exc:
        raise ConfigError(f"{key}: cannot split {template!r} ({exc})") from None
    if not args:
        raise ConfigError(f"{key}: empty command")
    for arg in args:
        check_placeholders(arg, allowed, key)
    return args


def check_placeholders(text: str, allowed: frozenset[str], key: str = "template") -> set[str]:
    """The placeholder names of ``text``, all plain names from ``allowed``.

    Attribute access or indexing (``{member.__class__}``, ``{x[0]}``) and
    nested fields are refused, so formatting can do nothing but substitute.

    Raises
    ------
    ConfigError
        A malformed or unknown placeholder, naming ``key``.
    """
    names: set[str] = set()
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ConfigError(f"{key}: bad placeholder in {text!r} ({exc})") from None
    for _, name, spec, _ in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise ConfigError(
                f"{key}: placeholder {{{name}}} in {text!r} is not a plain name "
                f"(allowed: {', '.join(sorted(allowed))})"
            )
        if name not in allowed:
            raise ConfigError(
                f"{key}: unknown placeholder {{{name}}} "
                f"(allowed: {', '.join('{' + a + '}' for a in sorted(allowed))})"
            )
        if spec and ("{" in spec or "}" in spec):
            raise ConfigError(f"{key}: nested placeholder in {text!r} is not allowed")
        names.add(name)
    return names


@dataclass(frozen=True)
class SlurmSection:
    """``workflow.slurm`` — scheduler options added to every job script.

    ``extra`` holds further ``#SBATCH`` options verbatim (e.g. ``--qos=debug``).
    """

    partition: str | None = None
    account: str | None = None
    extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("partition", "account"):
            v = getattr(self, name)
            if v is not None and (not v.strip() or any(c.isspace() for c in v)):
                raise ConfigError(f"workflow.slurm.{name}: must be one word, got {v!r}")
        for i, opt in enumerate(self.extra):
            if not opt.startswith("--") or "\n" in opt:
                raise ConfigError(
                    f"workflow.slurm.extra[{i}]: expected an sbatch option like "
                    f"'--qos=debug', got {opt!r}"
                )


@dataclass(frozen=True)
class OnlineSection:
    """``workflow.online`` — the coupled program of ``ensio cycle --mode online``.

    Attributes
    ----------
    command : str or None
        The coupled model program, started as ``mpiexec -n N_e*P COMMAND``;
        placeholders ``{workdir}``, ``{first}`` (first cycle to run),
        ``{cycles}`` (last cycle, K), ``{initial}`` (pattern with
        ``{member}`` of the restarts cycle ``first`` starts from),
        ``{tasks_per_member}`` (P) and ``{members}`` (N_e). Never run through
        a shell. ``None``: the config cannot run online.
    tasks_per_member : int
        P, the ranks of every member (and of the filter).
    timeout : float or None
        Hang guard: seconds a rank may wait in one coupled analysis call
        before the job is aborted (``ensio.online.Ensemble(timeout=...)``).
    """

    command: str | None = None
    tasks_per_member: int = 1
    timeout: float | None = None

    def __post_init__(self) -> None:
        if self.command is not None:
            command_fields(self.command, ONLINE_PLACEHOLDERS, "workflow.online.command")
        if self.tasks_per_member < 1:
            raise ConfigError(
                f"workflow.online.tasks_per_member: must be at least 1, got "
                f"{self.tasks_per_member}"
            )
        if self.timeout is not None and self.timeout <= 0:
            raise ConfigError(f"workflow.online.timeout: must be > 0, got {self.timeout}")


@dataclass(frozen=True, kw_only=True)
class WorkflowSection:
    """``workflow:`` — N_j jobs draining the to-do list of each cycle.

    Attributes
    ----------
    backend : {"local", "slurm"}
        Where the worker jobs run.
    jobs : int
        N_j, the number of worker jobs kept alive while work is left.
    time_limit : str or float
        Wall-clock limit per job (``HH:MM:SS``, ``D-HH:MM:SS`` or seconds).
    member_command : str
        Forecast of one member; placeholders ``{member}``, ``{cycle}``,
        ``{forecast}``, ``{analysis}``, ``{workdir}``. It succeeds only if it
        exits 0 and wrote ``{forecast}``. Never run through a shell.
    analysis_ranks : int
        MPI ranks of the analysis task.
    prestart : bool
        A job with nothing left but the analysis starts it while the last
        members run: interpreter, imports and warm-up happen then, and the
        analysis proper begins the moment the members are settled
        (:mod:`ensio.workflow.prestart`). ``false``: the analysis starts then.
    resident : bool
        Local back-end: ``ensio cycle`` starts the analysis program once and
        every cycle's analysis task runs on it (:mod:`ensio.workflow.resident`),
        so no cycle pays the analysis' interpreter start, imports and
        teardown. Not with ``backend: slurm`` (the analysis would run on the
        driver's node) or ``transfer``.
    retries : int
        Extra attempts of a failed task (exit status ≠ 0 or no output).
    min_members : int or None
        Members that must succeed for the analysis to run; ``None``: all.
    task_estimate : str or float
        Expected duration of a task until records of finished tasks exist; a
        job never starts a task that would not fit in its remaining time.
    lease : str or float
        How long a task's lease lasts unless renewed (a running job renews it
        every quarter of it): a job killed without a word (SIGKILL, a lost node)
        holds its task this long, so a resumed run waits up to this long for
        it. Shorter means faster take-over and more renewals of the list.
    slurm : SlurmSection
        SLURM-only options.
    setup : str or None
        Command run once into a fresh run directory (and again, idempotently,
        when more cycles are asked for); placeholders ``{workdir}``,
        ``{members}``, ``{cycles}``.
    initial : str
        The initial ensemble of cycle 1, relative to the run directory.
    start_delay : float
        Local back-end: seconds a job stays pending (imitates queueing).
    online : OnlineSection
        ``ensio cycle --mode online``: the coupled program and P.
    transfer : str or None
        A transfer config (``ensio run --transfer``; path relative to this
        config's directory): ``ensio cycle`` runs the member tasks as its
        component ``members`` and the analysis as ``analysis``, so restarts move
        through memory. Its file patterns, when relative, are taken from the run
        directory (``--workdir``), since one config serves many runs; the
        connections and what reaches the disk are checked and decided by
        :mod:`ensio.workflow.transferred`.
    """

    backend: BackendName = "local"
    jobs: int = 4
    time_limit: str | float = "00:20:00"
    member_command: str
    analysis_ranks: int = 1
    prestart: bool = True
    resident: bool = False
    retries: int = 1
    min_members: int | None = None
    task_estimate: str | float = "00:01:00"
    lease: str | float = "00:01:00"
    slurm: SlurmSection = field(default_factory=SlurmSection)
    setup: str | None = None
    initial: str = "init/mem{member:03d}.nc"
    start_delay: float = 0.0
    online: OnlineSection = field(default_factory=OnlineSection)
    transfer: str | None = None

    def __post_init__(self) -> None:
        key = "workflow"
        if self.transfer is not None and not self.transfer.strip():
            raise ConfigError(f"{key}.transfer: must name a transfer config file")
        if self.setup is not None:
            command_fields(self.setup, SETUP_PLACEHOLDERS, f"{key}.setup")
        check_placeholders(self.initial, frozenset({"member"}), f"{key}.initial")
        if self.start_delay < 0:
            raise ConfigError(f"{key}.start_delay: must be >= 0, got {self.start_delay}")
        if self.jobs < 1:
            raise ConfigError(f"{key}.jobs: must be at least 1, got {self.jobs}")
        limit = parse_duration(self.time_limit, f"{key}.time_limit")
        estimate = parse_duration(self.task_estimate, f"{key}.task_estimate")
        if estimate >= limit:
            raise ConfigError(
                f"{key}.task_estimate: {self.task_estimate!r} does not fit in "
                f"workflow.time_limit {self.time_limit!r}; no job could start a task"
            )
        if not parse_duration(self.lease, f"{key}.lease") >= 1.0:
            raise ConfigError(f"{key}.lease: must be at least 1 second, got {self.lease!r}")
        command_fields(self.member_command, MEMBER_PLACEHOLDERS, f"{key}.member_command")
        if self.analysis_ranks < 1:
            raise ConfigError(
                f"{key}.analysis_ranks: must be at least 1, got {self.analysis_ranks}"
            )
        if self.resident and (self.backend != "local" or self.transfer is not None):
            raise ConfigError(f"{key}.resident: only with backend local and without "
                              "transfer (the analysis runs beside the driver)")
        if self.retries < 0:
            raise ConfigError(f"{key}.retries: must be >= 0, got {self.retries}")
        if self.min_members is not None and self.min_members < 1:
            raise ConfigError(f"{key}.min_members: must be at least 1, got {self.min_members}")

    @property
    def time_limit_seconds(self) -> float:
        """``time_limit`` in seconds."""
        return parse_duration(self.time_limit, "workflow.time_limit")

    @property
    def lease_seconds(self) -> float:
        """``lease`` in seconds."""
        return parse_duration(self.lease, "workflow.lease")

    @property
    def task_estimate_seconds(self) -> float:
        """``task_estimate`` in seconds."""
        return parse_duration(self.task_estimate, "workflow.task_estimate")


def check_transfer_file(path: Path) -> None:
    """The file ``workflow.transfer`` names exists, parses and lists the components the
    workflow runs (:data:`TRANSFER_COMPONENTS`).

    Only what the workflow needs is checked here (the config room imports nothing of
    ensio); the transfer room resolves the rest when ``ensio cycle`` starts, with the
    same key in its messages.

    Raises
    ------
    ConfigError
        One line naming ``workflow.transfer`` and the file.
    """
    key = "workflow.transfer"
    raw = read_yaml(path, "the transfer config", prefix=f"{key}: ")
    comps = raw.get("components") if isinstance(raw, Mapping) else None
    if not isinstance(comps, list):
        raise ConfigError(f"{key}: {path}: components: expected a list of names")
    missing = [c for c in TRANSFER_COMPONENTS if c not in comps]
    if missing:
        raise ConfigError(f"{key}: {path}: components: must include "
                          f"{' and '.join(TRANSFER_COMPONENTS)} (the member tasks and the "
                          f"analysis run as these); missing {', '.join(missing)}")
