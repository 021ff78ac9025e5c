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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..config.load import apply_overrides
from ..config.schema import Config, ConfigError
from ..config.workflow import SETUP_PLACEHOLDERS, command_fields
from ..durable import atomic_write
from ..errors import EnsioError
from . import transferred
from .backends import JobShape, JobSpec, backend_from_config
from .pool import drain
from .records import append_record, reconcile_done
from .resident import Resident, client_argv
from .rundir import (
    analysis_config_path,
    analysis_pattern,
    cycle_dir,
    diagnostics_path,
    done_marker,
    forecast_pattern,
    restart_pattern,
)
from .spec import WorkerSpec, create_todo, worker_argv
from .todo import TodoList
from .transferred import RunTransfer

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
    if config.ensemble.grid is not None:  # resolved against the user's config, not this one's
        out["ensemble"]["grid"] = config.ensemble.grid
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
        # output.diagnostics: false turns them off; any path the user gave is the cycle's
        "diagnostics": (False if (raw.get("output") or {}).get("diagnostics") is False
                        else str(diagnostics_path(workdir, cycle))),
    }
    return out


def write_analysis_config(
    raw: dict[str, Any], config: Config, workdir: Path, cycle: int
) -> Path:
    """Write ``DIR/cycle_CCC/analysis.yaml`` (both modes) and return its path."""
    path = analysis_config_path(workdir, cycle)
    _write_atomic(path, yaml.safe_dump(_analysis_config(raw, config, workdir, cycle)))
    return path


def _analysed(workdir: Path, cycle: int, members: Sequence[int],
              rt: RunTransfer | None = None) -> list[int]:
    """Members of ``members`` that have an analysis file in ``cycle`` (on disk, or held
    by the staging daemon with ``workflow.transfer``)."""
    pattern = analysis_pattern(workdir, cycle)
    if rt is None:
        return [m for m in members if Path(pattern.format(member=m)).exists()]
    there = transferred.available([pattern.format(member=m) for m in members], rt.socket_dir)
    return [m for m in members if there[pattern.format(member=m)]]


def _done_members(workdir: Path, cycle: int) -> list[int]:
    """Members whose task is done in ``cycle``'s to-do list (none without a list)."""
    path = cycle_dir(workdir, cycle) / "todo.json"
    if not path.exists():
        return []
    return [t.member for t in TodoList(path).tasks()
            if t.kind == "member" and t.state == "done" and t.member is not None]


def _lost(what: str, paths: Sequence[str], cure: str) -> EnsioError:
    """The error of files a run needs that the staging daemon no longer holds."""
    more = f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""
    return EnsioError(f"{paths[0]}{more}: {what} lost: the staging daemon that held them is "
                      f"gone and they are not on disk; {cure} (persist: true on the "
                      "connection in workflow.transfer keeps them on disk)")


def _members(workdir: Path, cycle: int, n: int, log: Any,
             rt: RunTransfer | None = None) -> list[int]:
    """The members of ``cycle``: all at first, then those the last analysis updated.

    A member that finally failed (``workflow.min_members`` let the analysis
    run without it) has no analysis to start from, so it leaves the
    experiment; continuing it from another member's state would duplicate
    that member and silently shrink the ensemble's spread instead. Under
    ``workflow.transfer`` an analysis member can also be *lost* with the staging
    daemon: the members the last analysis updated are those done in its list, and
    one of them missing is an error, never a smaller ensemble.
    """
    if cycle == 1:
        return list(range(1, n + 1))
    if rt is not None and (updated := _done_members(workdir, cycle - 1)):
        alive = _analysed(workdir, cycle - 1, updated, rt)
        if len(alive) < len(updated):
            pattern = analysis_pattern(workdir, cycle - 1)
            raise _lost("analysis members", [pattern.format(member=m) for m in updated
                                             if m not in alive],
                        f"remove {cycle_dir(workdir, cycle - 1)} to rerun cycle {cycle - 1}")
        if len(alive) < n:
            log(f"cycle {cycle}: {len(alive)} of {n} members (the others failed earlier)")
        return alive
    alive = _analysed(workdir, cycle - 1, range(1, n + 1), rt)
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


def _check_transfer(config: Config, workdir: Path) -> Path | None:
    """``workflow.transfer``'s file, checked against the run's paths (nothing written)."""
    wf = config.workflow
    if wf is None or wf.transfer is None:
        return None
    path = config.resolve(wf.transfer)
    transferred.check(path, workdir.resolve(), (forecast_pattern(workdir, 1).format(member=1),
                                                analysis_pattern(workdir, 1).format(member=1)))
    return path


def _check_forecasts(workdir: Path, cycle: int, todo: TodoList, rt: RunTransfer) -> None:
    """Resuming under transfer: the members done in ``todo`` still have their forecasts."""
    pattern = forecast_pattern(workdir, cycle)
    done = [pattern.format(member=t.member) for t in todo.tasks()
            if t.kind == "member" and t.state == "done"]
    there = transferred.available(done, rt.socket_dir)
    lost = [p for p in done if not there[p]]
    if lost:
        raise _lost("forecasts", lost, f"remove {cycle_dir(workdir, cycle)} to rerun the cycle")


def _release(workdir: Path, cycle: int, members: Sequence[int], rt: RunTransfer) -> None:
    """Cycle ``cycle`` is done: its forecasts and the restarts it started from leave memory."""
    paths = [forecast_pattern(workdir, cycle).format(member=m) for m in members]
    if cycle > 1:
        paths += [analysis_pattern(workdir, cycle - 1).format(member=m) for m in members]
    transferred.release(paths, rt.socket_dir)


def _worker_spec(raw: dict[str, Any], config: Config, workdir: Path, cycle: int,
                 rt: RunTransfer | None, resident: Resident | None = None) -> WorkerSpec:
    """What the tasks of ``cycle`` run (its ``analysis.yaml`` written first)."""
    wf = config.workflow
    assert wf is not None
    cdir = cycle_dir(workdir, cycle)
    cfg_path = write_analysis_config(raw, config, workdir, cycle)
    analyse = [sys.executable, "-m", "ensio", "analyse", str(cfg_path), "--cycle", str(cycle),
               "--members", "{members}"]  # the members that succeeded (min_members)
    if wf.analysis_ranks > 1:
        analyse = [_mpiexec(), "-n", "{analysis_ranks}", *analyse]
    if resident is not None:  # run on the resident analysis; cold when it is gone
        analyse = client_argv(resident.socket, analyse)
    return WorkerSpec(
        member_command=wf.member_command,
        forecast=forecast_pattern(workdir, cycle),
        analysis=restart_pattern(workdir, cycle, wf.initial),
        workdir=str(cdir / "work" / "mem{member:03d}"),
        analysis_command=" ".join(shlex.quote(a) for a in analyse),
        analysis_workdir=str(cdir),
        analysis_ranks=wf.analysis_ranks,
        task_estimate=wf.task_estimate_seconds,
        records=str(workdir / "records.jsonl"),
        stage=rt is None,  # under transfer the daemon, not a staging directory, keeps writers apart
        transfer=None if rt is None else str(rt.config),
        prestart=wf.prestart and resident is None,  # ensio analyse waits for its go
    )


def run_cycles(
    config_path: Path,
    config: Config,
    workdir: Path,
    cycles: int,
    overrides: Sequence[str] = (),
    *,
    log: Any = print,
) -> None:
    """Run (or resume) ``cycles`` cycles of the experiment into ``workdir``.

    With ``workflow.transfer`` the tasks run under the transfer layer; what reaches
    the disk and how a resume checks its inputs is :mod:`.transferred`'s docstring.
    """
    tconfig = _check_transfer(config, workdir) if config.workflow is not None else None
    workdir, raw = prepare_run(config_path, config, workdir, cycles, overrides)
    wf = config.workflow
    assert wf is not None
    rt = None if tconfig is None else transferred.start(tconfig, workdir)
    resident = None
    if wf.resident:
        launcher = [_mpiexec(), "-n", str(wf.analysis_ranks)] if wf.analysis_ranks > 1 else []
        resident = Resident(tuple(launcher), workdir / "logs" / "resident.log", _env())
    try:
        _run_cycles(config, raw, workdir, cycles, rt, resident, log)
    finally:
        if resident is not None:
            resident.stop()


def _run_cycles(config: Config, raw: dict[str, Any], workdir: Path, cycles: int,
                rt: RunTransfer | None, resident: Resident | None, log: Any) -> None:
    wf = config.workflow
    assert wf is not None
    n = config.ensemble.size
    env = [("PATH", _env()["PATH"])]
    if rt is not None:  # jobs on this host talk to the driver's daemon
        env.append(("ENSIO_TRANSFER_DIR", str(rt.socket_dir)))
    for c in range(1, cycles + 1):
        cdir = cycle_dir(workdir, c)
        if done_marker(workdir, c).exists():
            if rt is not None:
                _release(workdir, c, range(1, n + 1), rt)  # a kill may have come before
            continue
        spec = _worker_spec(raw, config, workdir, c, rt, resident)
        if resident is not None and not resident.alive():
            if resident.proc is not None:
                log(f"cycle {c}: the resident analysis had ended; starting it again")
            resident.launch(warm=analysis_config_path(workdir, c))
        members = _members(workdir, c, n, log, rt)
        todo = create_todo(
            cdir / "todo.json",
            spec,
            members,
            cycle=c,
            retries=wf.retries,
            min_members=wf.min_members,
            lease_seconds=wf.lease_seconds,
            exist_ok=True,
        )
        if rt is not None:
            _check_forecasts(workdir, c, todo, rt)
        job = JobSpec(
            name=f"ensio-c{c:03d}",
            argv=tuple(worker_argv(todo.path, time_limit=wf.time_limit_seconds)),
            time_limit=wf.time_limit_seconds,
            workdir=str(workdir / "logs"),
            env=tuple(env),
        )
        Path(job.workdir).mkdir(exist_ok=True)
        # any job may run the analysis: every job asks for its ranks
        backend = backend_from_config(wf, JobShape(cpus_per_task=wf.analysis_ranks))
        try:
            res = drain(todo, backend, job, wf.jobs, poll=0.5, job_file=cdir / "jobs.jsonl")
        finally:
            backend.close()
        # what the driver did with the jobs at the end, so that a job whose worker
        # starts after the cycle can be told from one that should have been cancelled
        append_record(workdir / "records.jsonl", {
            "kind": "pool", "cycle": c, "ended": round(time.time(), 3), "jobs": res.jobs,
            "adopted": res.adopted, "cancelled": res.cancelled, "left_running": res.running})
        if res.error:
            raise EnsioError(res.error)
        done = [t for t in todo.snapshot()["tasks"] if t["state"] == "done"]
        reconcile_done(workdir / "records.jsonl", c, done)  # records lost to a kill
        analysed = _analysed(workdir, c, members, rt)
        if rt is not None and c == cycles:  # the run's result reaches the disk
            pattern = analysis_pattern(workdir, c)
            transferred.export([pattern.format(member=m) for m in analysed], rt.socket_dir)
        _write_atomic(done_marker(workdir, c), "")
        if rt is not None:
            _release(workdir, c, members, rt)
        failed = sorted(set(members) - set(analysed))
        log(f"cycle {c}: done ({len(members) - len(failed)} of {len(members)} members + analysis"
            + (f"; failed: {', '.join(f'mem{m:03d}' for m in failed)})" if failed else ")"))
