"""What the tasks of a to-do list run, and how a worker job is started.

The :class:`WorkerSpec` travels inside the list (``meta["worker"]``), so a
job needs only the list's path and its time limit; :func:`create_todo` checks
every template once, in the driver, before any job starts, and
:func:`worker_argv` is the command line of a job (``JobSpec.argv``).

Commands are templates split with :func:`shlex.split` and filled in per
argument with :meth:`str.format` (plain placeholder names only,
:func:`ensio.config.workflow.check_placeholders`), then run without a shell:
values with spaces or quotes stay one argument and nothing is evaluated.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.errors import ConfigError
from ..config.workflow import (
    ANALYSIS_PLACEHOLDERS,
    MEMBER_PLACEHOLDERS,
    check_placeholders,
    command_fields,
)
from ..durable import fsync_path
from .todo import Lease, TodoList

__all__ = [
    "PATH_PLACEHOLDERS",
    "WorkerSpec",
    "TaskCommand",
    "create_todo",
    "default_margin",
    "move_durably",
    "prepare_task",
    "render",
    "reported_io",
    "worker_argv",
]

PATH_PLACEHOLDERS = frozenset({"member", "cycle"})


def render(template: str, values: Mapping[str, Any], allowed: frozenset[str],
           key: str = "command") -> list[str]:
    """Argument vector of a command template (no shell; see the module docstring)."""
    return [arg.format_map(values) for arg in command_fields(template, allowed, key)]


@dataclass(frozen=True)
class WorkerSpec:
    """What the tasks of one list run; stored in the list (``meta["worker"]``).

    Attributes
    ----------
    member_command : str
        Template with ``{member}``, ``{cycle}``, ``{forecast}``, ``{analysis}``, ``{workdir}``.
    forecast : str or None
        Path template (``{member}``, ``{cycle}``) of the file a member must
        produce; ``None``: no output is required (benchmarks).
    analysis : str or None
        Path template of the member's initial state (``{analysis}``).
    workdir : str or None
        Path template of a member's working directory (its current directory);
        default: the list's directory.
    analysis_command : str or None
        Template with ``{cycle}``, ``{workdir}``, ``{analysis_ranks}``,
        ``{members}`` (comma-separated done members), ``{n_members}``;
        ``None``: the list has no analysis task.
    analysis_workdir : str or None
        Working directory of the analysis (default: the list's directory).
    analysis_ranks : int
        Value of ``{analysis_ranks}``.
    task_estimate, analysis_estimate : float
        Expected seconds of a member / the analysis until records exist.
    records : str or None
        The records file (JSON lines); ``None``: no records.
    grace : float
        Seconds between SIGTERM and SIGKILL when a command is stopped.
    stage : bool
        Let members write into a staging directory, moved into place on commit.
    fsync : bool
        fsync a member's output before committing it.
    transfer : str or None
        The run's transfer config (``workflow.transfer``): member tasks run as its
        component ``members``, the analysis as ``analysis``
        (:mod:`ensio.workflow.transferred`); set ``stage`` false with it.
    prefetch : bool
        Lease the next task while one runs and start it as soon as the
        running one exits, committing that one afterwards: the commit (a
        locked, fsynced rewrite of the list) leaves the critical path. Only
        done while at least as many tasks stay free as other jobs hold
        leases, so it never starves another job at the end of the list.
    prestart : bool
        The analysis command understands :mod:`.prestart` (``ensio analyse``
        does): a job with nothing else to run starts it ahead of its go.
    """

    member_command: str
    forecast: str | None = None
    analysis: str | None = None
    workdir: str | None = None
    analysis_command: str | None = None
    analysis_workdir: str | None = None
    analysis_ranks: int = 1
    task_estimate: float = 60.0
    analysis_estimate: float | None = None
    records: str | None = None
    grace: float = 5.0
    stage: bool = True
    fsync: bool = True
    prefetch: bool = True
    transfer: str | None = None
    prestart: bool = False

    def validate(self) -> None:
        """Check every template once, before any job runs (raises ConfigError)."""
        used = {a for arg in command_fields(self.member_command, MEMBER_PLACEHOLDERS,
                                            "member_command")
                for a in check_placeholders(arg, MEMBER_PLACEHOLDERS)}
        for name in ("forecast", "analysis"):
            if name in used and getattr(self, name) is None:
                raise ConfigError(f"member_command: uses {{{name}}} but no {name} path is set")
        if self.analysis_command is not None:
            command_fields(self.analysis_command, ANALYSIS_PLACEHOLDERS, "analysis_command")
        for name in ("forecast", "analysis", "workdir", "analysis_workdir"):
            value = getattr(self, name)
            if value is not None:
                check_placeholders(value, PATH_PLACEHOLDERS, name)
        if not self.task_estimate > 0 or self.grace < 0 or self.analysis_ranks < 1:
            raise ConfigError("worker spec: task_estimate > 0, grace >= 0, analysis_ranks >= 1")

    def to_meta(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> WorkerSpec:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in meta["worker"].items() if k in fields})


def create_todo(path: str | Path, spec: WorkerSpec, members: Iterable[int], *, cycle: int,
                retries: int = 0, min_members: int | None = None,
                lease_seconds: float = 60.0, lock: str = "auto",
                exist_ok: bool = False) -> TodoList:
    """The to-do list of one cycle: members, then the analysis if ``spec`` has one.

    With ``exist_ok`` an existing list is returned unchanged (resuming).
    """
    spec.validate()
    return TodoList.create(path, members, cycle=cycle,
                           analysis=spec.analysis_command is not None, retries=retries,
                           min_members=min_members, lease_seconds=lease_seconds,
                           meta={"worker": spec.to_meta()}, lock=lock,  # type: ignore[arg-type]
                           exist_ok=exist_ok)


def worker_argv(todo: str | Path, *, time_limit: float | None = None,
                margin: float | None = None, python: str | None = None,
                entry: str = "module") -> tuple[str, ...]:
    """The command line of one worker job (``JobSpec.argv``).

    ``entry="module"`` runs ``python -m ensio.cli.worker`` (loads only the
    worker, not the other sub-commands); ``"cli"`` runs ``ensio worker``
    next to ``python``.
    """
    exe = python or sys.executable
    if entry == "module":
        argv = [exe, "-m", "ensio.cli.worker"]
    else:
        argv = [str(Path(exe).with_name("ensio")), "worker"]
    argv.append(str(Path(todo).resolve()))
    if time_limit is not None:
        argv += ["--time-limit", repr(float(time_limit))]
    if margin is not None:
        argv += ["--margin", repr(float(margin))]
    return tuple(argv)


def default_margin(time_limit: float | None) -> float:
    """Time kept free before the job's end: 10 % of the limit, at most 60 s."""
    return 0.0 if time_limit is None else min(60.0, 0.1 * time_limit)


@dataclass(frozen=True)
class TaskCommand:
    """How to run one leased task: argv, working directory, environment, output paths.

    ``staged`` is where a member writes (``{forecast}``), ``final`` where the
    output goes on commit (equal without staging; both None without output).
    """

    argv: list[str]
    workdir: Path
    env: dict[str, str]
    staged: Path | None
    final: Path | None
    report: Path


def prepare_task(spec: WorkerSpec, lease: Lease, base: Path, job_id: str,
                 done_members: Iterable[int] = ()) -> TaskCommand:
    """Fill in the templates of ``spec`` for ``lease`` and create its directories.

    Relative paths are resolved against ``base`` (the list's directory).
    ``done_members`` feeds ``{members}``/``{n_members}`` of the analysis.
    """

    def path(template: str, **values: Any) -> Path:
        p = Path(template.format_map(values))
        return p if p.is_absolute() else base / p

    cycle = lease.cycle
    final = staged = None
    if lease.kind == "member":
        m = lease.member
        workdir = path(spec.workdir, member=m, cycle=cycle) if spec.workdir else base
        if spec.forecast is not None:
            final = path(spec.forecast, member=m, cycle=cycle)
            staged = (final.parent / ".ensio-stage" / f"t{lease.token}" / final.name
                      if spec.stage else final)
            for attempt in range(5):  # another job may remove an empty .ensio-stage
                try:
                    staged.parent.mkdir(parents=True, exist_ok=True)
                    break
                except FileNotFoundError:
                    if attempt == 4:
                        raise
        values = {"member": m, "cycle": cycle, "workdir": str(workdir),
                  "forecast": str(staged) if staged else "",
                  "analysis": str(path(spec.analysis, member=m, cycle=cycle))
                  if spec.analysis else ""}
        argv = render(spec.member_command, values, MEMBER_PLACEHOLDERS, "member_command")
    else:
        workdir = (path(spec.analysis_workdir, member=0, cycle=cycle)
                   if spec.analysis_workdir else base)
        done = sorted(done_members)
        values = {"cycle": cycle, "workdir": str(workdir), "analysis_ranks": spec.analysis_ranks,
                  "members": ",".join(str(m) for m in done), "n_members": len(done)}
        argv = render(spec.analysis_command or "", values, ANALYSIS_PLACEHOLDERS,
                      "analysis_command")
    workdir.mkdir(parents=True, exist_ok=True)
    report = workdir / f".ensio-report-t{lease.token}.json"
    env = dict(os.environ)
    env.update(ENSIO_TASK=lease.task, ENSIO_CYCLE=str(cycle), ENSIO_TOKEN=str(lease.token),
               ENSIO_ATTEMPT=str(lease.attempt), ENSIO_JOB_ID=job_id,
               ENSIO_MEMBER="" if lease.member is None else str(lease.member),
               ENSIO_FORECAST="" if final is None else str(final), ENSIO_REPORT=str(report))
    if spec.transfer is not None:
        from .transferred import task_env  # the transfer room, only when configured

        env.update(task_env(spec.transfer, "members" if lease.kind == "member" else "analysis"))
    return TaskCommand(argv, workdir, env, staged, final, report)


def move_durably(src: Path, dst: Path, fsync: bool) -> None:
    """Move a staged output into place (atomic rename; fsynced file and directory)."""
    if fsync:
        fsync_path(src)
    os.replace(src, dst)
    if fsync:
        fsync_path(dst.parent, directory=True)


def reported_io(path: Path) -> float | None:
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
