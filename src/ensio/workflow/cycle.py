"""``ensio cycle``: K assimilation cycles through the job pool, resumable.

Run directory::

    DIR/records.jsonl                       per-task records (all cycles)
    DIR/init/mem001.nc …                    initial ensemble (``workflow.initial``)
    DIR/cycle_001/todo.json                 the cycle's to-do list (the state)
    DIR/cycle_001/jobs.jsonl                worker jobs submitted (a resumed driver adopts them)
    DIR/cycle_001/analysis.yaml             the analysis config of the cycle
    DIR/cycle_001/forecast/mem001.nc …      member forecasts (from the previous analysis)
    DIR/cycle_001/analysis/mem001.nc …      analysis members, mean.nc, spread.nc
    DIR/cycle_001/.done                     written when the cycle is complete

Each cycle is a forecast phase of N_e member tasks and one analysis task,
drained by N_j worker jobs (local processes or SLURM jobs); the next cycle
starts from the analysis. Resuming after a SIGKILL of everything is the same
command again: complete cycles are skipped, an interrupted cycle continues
from its to-do list (finished members are not redone; a leased task comes
back when its lease expires), and the analysis writes complete copies under
temporary names before renaming them, so it can always be rerun.

The driver runs the analysis as a command (``ensio analyse``), never imports
it: the workflow room stays independent of the numerics.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..config.load import apply_overrides
from ..config.schema import Config, ConfigError
from ..config.workflow import SETUP_PLACEHOLDERS, command_fields
from ..durable import atomic_write
from ..errors import EnsioError
from .backends import JobShape, JobSpec, backend_from_config
from .pool import drain
from .records import reconcile_done
from .rundir import (
    analysis_config_path,
    analysis_pattern,
    cycle_dir,
    done_marker,
    forecast_pattern,
    restart_pattern,
)
from .spec import WorkerSpec, create_todo, worker_argv

__all__ = ["prepare_run", "run_cycles", "write_analysis_config"]


def _env() -> dict[str, str]:
    """Environment of jobs and set-up: this interpreter's directory first on PATH.

    So ``python`` and ``ensio`` in command templates are the ones of this
    installation (the venv), whether or not it is activated.
    """
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _mpiexec() -> str:
    beside = Path(sys.executable).with_name("mpiexec")
    return str(beside) if beside.exists() else (shutil.which("mpiexec") or "mpiexec")


def _run_setup(config: Config, workdir: Path, cycles: int) -> None:
    wf = config.workflow
    assert wf is not None
    if wf.setup is None:
        return
    values = {"workdir": str(workdir), "members": config.ensemble.size, "cycles": cycles}
    argv = [a.format_map(values) for a in command_fields(wf.setup, SETUP_PLACEHOLDERS)]
    proc = subprocess.run(argv, cwd=workdir, env=_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise EnsioError(f"workflow.setup failed (exit {proc.returncode}): {last}")


def _analysis_config(
    raw: dict[str, Any], config: Config, workdir: Path, cycle: int
) -> dict[str, Any]:
    """The ``ensio analyse`` config of one cycle: members, observations and outputs set."""
    cdir = cycle_dir(workdir, cycle)
    out = {k: v for k, v in raw.items() if k != "workflow"}
    out["ensemble"] = {**raw["ensemble"], "members": forecast_pattern(workdir, cycle)}
    obs = []
    for entry in config.observations:
        try:
            name = entry.file.format(cycle=cycle, workdir=str(workdir))
        except (KeyError, IndexError, ValueError):
            raise ConfigError(
                f"observations.file: {entry.file!r}: only {{cycle}} and {{workdir}} are allowed"
            ) from None
        obs.append({"file": str(config.resolve(name))})
    out["observations"] = obs
    out["io"] = {**raw.get("io", {}), "in_place": False, "journal": False}
    out["output"] = {
        "members": analysis_pattern(workdir, cycle),
        "mean": str(cdir / "analysis" / "mean.nc"),
        "spread": str(cdir / "analysis" / "spread.nc"),
    }
    return out


def write_analysis_config(
    raw: dict[str, Any], config: Config, workdir: Path, cycle: int
) -> Path:
    """Write ``DIR/cycle_CCC/analysis.yaml`` (both modes) and return its path."""
    path = analysis_config_path(workdir, cycle)
    _write_atomic(path, yaml.safe_dump(_analysis_config(raw, config, workdir, cycle)))
    return path


def _analysed(workdir: Path, cycle: int, members: Sequence[int]) -> list[int]:
    """Members of ``members`` that have an analysis file in ``cycle``."""
    pattern = analysis_pattern(workdir, cycle)
    return [m for m in members if Path(pattern.format(member=m)).exists()]


def _members(workdir: Path, cycle: int, n: int, log: Any) -> list[int]:
    """The members of ``cycle``: all at first, then those the last analysis updated.

    A member that finally failed (``workflow.min_members`` let the analysis
    run without it) has no analysis to start from, so it leaves the
    experiment; continuing it from another member's state would duplicate
    that member and silently shrink the ensemble's spread instead.
    """
    if cycle == 1:
        return list(range(1, n + 1))
    alive = _analysed(workdir, cycle - 1, range(1, n + 1))
    if not alive:
        raise EnsioError(f"{cycle_dir(workdir, cycle - 1) / 'analysis'}: no analysis members "
                         f"to start cycle {cycle} from")
    if len(alive) < n:
        log(f"cycle {cycle}: {len(alive)} of {n} members (the others failed earlier)")
    return alive


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)


def prepare_run(
    config_path: Path, config: Config, workdir: Path, cycles: int, overrides: Sequence[str]
) -> tuple[Path, dict[str, Any]]:
    """What both modes do first: check the config, create ``workdir``, run the set-up.

    Returns the resolved run directory and the raw config (with overrides) that
    the per-cycle ``analysis.yaml`` files are derived from.
    """
    if config.workflow is None:
        raise ConfigError("workflow: section required for ensio cycle")
    if config.analysis is None:
        raise ConfigError("analysis: section required for ensio cycle")
    if cycles < 1:
        raise ConfigError(f"--cycles: must be at least 1, got {cycles}")
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    raw = apply_overrides(yaml.safe_load(Path(config_path).read_text()) or {}, overrides)
    _run_setup(config, workdir, cycles)
    return workdir, raw


def run_cycles(
    config_path: Path,
    config: Config,
    workdir: Path,
    cycles: int,
    overrides: Sequence[str] = (),
    *,
    log: Any = print,
) -> None:
    """Run (or resume) ``cycles`` cycles of the experiment into ``workdir``."""
    workdir, raw = prepare_run(config_path, config, workdir, cycles, overrides)
    wf = config.workflow
    assert wf is not None
    n = config.ensemble.size
    python, mpiexec = sys.executable, _mpiexec()
    for c in range(1, cycles + 1):
        cdir = cycle_dir(workdir, c)
        if done_marker(workdir, c).exists():
            continue
        cfg_path = write_analysis_config(raw, config, workdir, c)
        analyse = [python, "-m", "ensio", "analyse", str(cfg_path), "--cycle", str(c),
                   "--members", "{members}"]  # the members that succeeded (min_members)
        if wf.analysis_ranks > 1:
            analyse = [mpiexec, "-n", "{analysis_ranks}", *analyse]
        spec = WorkerSpec(
            member_command=wf.member_command,
            forecast=forecast_pattern(workdir, c),
            analysis=restart_pattern(workdir, c, wf.initial),
            workdir=str(cdir / "work" / "mem{member:03d}"),
            analysis_command=" ".join(shlex.quote(a) for a in analyse),
            analysis_workdir=str(cdir),
            analysis_ranks=wf.analysis_ranks,
            task_estimate=wf.task_estimate_seconds,
            records=str(workdir / "records.jsonl"),
        )
        members = _members(workdir, c, n, log)
        todo = create_todo(
            cdir / "todo.json",
            spec,
            members,
            cycle=c,
            retries=wf.retries,
            min_members=wf.min_members,
            lease_seconds=60.0,
            exist_ok=True,
        )
        job = JobSpec(
            name=f"ensio-c{c:03d}",
            argv=tuple(worker_argv(todo.path, time_limit=wf.time_limit_seconds)),
            time_limit=wf.time_limit_seconds,
            workdir=str(workdir / "logs"),
            env=(("PATH", _env()["PATH"]),),
        )
        Path(job.workdir).mkdir(exist_ok=True)
        # any job may run the analysis: every job asks for its ranks
        backend = backend_from_config(wf, JobShape(cpus_per_task=wf.analysis_ranks))
        try:
            res = drain(todo, backend, job, wf.jobs, poll=0.5, job_file=cdir / "jobs.jsonl")
        finally:
            backend.close()
        if res.error:
            raise EnsioError(res.error)
        done = [t for t in todo.snapshot()["tasks"] if t["state"] == "done"]
        reconcile_done(workdir / "records.jsonl", c, done)  # records lost to a kill
        _write_atomic(done_marker(workdir, c), "")
        failed = sorted(set(members) - set(_analysed(workdir, c, members)))
        log(f"cycle {c}: done ({len(members) - len(failed)} of {len(members)} members + analysis"
            + (f"; failed: {', '.join(f'mem{m:03d}' for m in failed)})" if failed else ")"))
