"""``ensio cycle --mode online``: the same experiment as one coupled MPI job.

The driver does what the offline driver does around the job and nothing in
it: the set-up (``workflow.setup``), the analysis config of every cycle it
will run (``DIR/cycle_CCC/analysis.yaml``, written by the offline driver's own
function so the two modes cannot drift apart), then one ``mpiexec -n N_e*P``
of ``workflow.online.command``, a program built on
:class:`ensio.online.cycling.CoupledRun`. That program keeps the run
directory of the offline mode (analysis files, ``.done`` markers, records),
so a run can be resumed in either mode and ``ensio report`` reads both.

Resuming: cycles with ``cycle_CCC/.done`` are skipped; the job starts from
the analysis members of the last complete cycle (``{initial}``). A coupled
job that dies loses the cycle in flight, never a complete one: the filter
writes every analysis file (temporary names, then rename) before ``.done``.

The job is submitted through the back-end ``workflow.backend`` names (the
registry of :mod:`ensio.workflow.backends`, job shape ``ntasks=N_e*P``,
``coupled``), like the worker jobs of the offline mode; the driver waits for
it (one state query every ``min_poll`` seconds) and cancels it if it is
interrupted itself. Its output goes to ``DIR/logs``.

* ``local``: ``mpiexec`` here, in the driver's process group and without a
  time limit; with ``workflow.start_delay`` the job is pending that many
  seconds first (the local back-end's queueing imitation, recorded as the
  first cycle's queuing).
* ``slurm``: one batch job of ``--ntasks=N_e*P`` (``workflow.slurm``
  options, ``--time=workflow.time_limit``) whose script runs the same
  ``mpiexec`` inside the allocation. The queuing of the first cycle is then
  the scheduler's. A job that hits its limit loses the cycle in flight only;
  rerun the command to continue.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config.schema import Config, ConfigError
from ..config.workflow import ONLINE_PLACEHOLDERS, command_fields
from ..errors import EnsioError
from .backends import Backend, JobShape, JobSpec, backend_from_config
from .cycle import _env, _mpiexec, prepare_run, write_analysis_config
from .rundir import done_marker, restart_pattern

__all__ = ["online_argv", "run_online_cycles"]


def online_argv(
    config: Config, mpiexec: str, workdir: Path, first: int, cycles: int
) -> list[str]:
    """The ``mpiexec`` command line of the coupled job for cycles ``first..cycles``."""
    wf = config.workflow
    assert wf is not None and wf.online.command is not None
    p = wf.online.tasks_per_member
    initial = restart_pattern(workdir, first, wf.initial)
    values = {
        "workdir": str(workdir), "first": first, "cycles": cycles, "initial": initial,
        "tasks_per_member": p, "members": config.ensemble.size,
    }  # fmt: skip
    fields = command_fields(wf.online.command, ONLINE_PLACEHOLDERS, "workflow.online.command")
    argv = [a.format_map(values) for a in fields]  # {initial} keeps its {member}
    return [mpiexec, "-n", str(config.ensemble.size * p), *argv]


def run_online_cycles(
    config_path: Path,
    config: Config,
    workdir: Path,
    cycles: int,
    overrides: Sequence[str] = (),
    *,
    log: Any = print,
) -> None:
    """Run (or resume) ``cycles`` cycles as one coupled job into ``workdir``."""
    wf = config.workflow
    if wf is not None and wf.online.command is None:
        raise ConfigError("workflow.online.command: required for --mode online")
    workdir, raw = prepare_run(config_path, config, workdir, cycles, overrides)
    assert wf is not None
    first = next((c for c in range(1, cycles + 1)
                  if not done_marker(workdir, c).exists()), None)
    if first is None:
        log(f"cycles 1..{cycles}: already done")
        return
    for c in range(first, cycles + 1):
        write_analysis_config(raw, config, workdir, c)
    argv = online_argv(config, _mpiexec(), workdir, first, cycles)
    extra_env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if wf.online.timeout is not None:
        extra_env["ENSIO_ONLINE_TIMEOUT"] = repr(wf.online.timeout)
    backend = backend_from_config(
        wf, JobShape(ntasks=config.ensemble.size * wf.online.tasks_per_member, coupled=True))
    where = f" through {backend.label}" if backend.label else ""
    log(f"cycles {first}..{cycles}: coupled job of {config.ensemble.size} members "
        f"× {wf.online.tasks_per_member} ranks{where}")
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    spec = JobSpec(
        name=f"ensio-online-c{first:03d}", argv=tuple(argv), time_limit=wf.time_limit_seconds,
        workdir=str(logs), env=(("PATH", _env()["PATH"]), *sorted(extra_env.items())),
    )  # fmt: skip
    status, reason = _run_job(backend, spec, log)
    missing = [c for c in range(first, cycles + 1)
               if not done_marker(workdir, c).exists()]
    if status != 0 or missing:
        done = [c for c in range(first, cycles + 1) if c not in missing]
        raise EnsioError(
            f"the coupled job ended with "
            f"{status if isinstance(status, str) else f'exit status {status}'}"
            + (f" ({reason})" if reason else "") + "; cycles "
            f"{', '.join(map(str, missing)) or 'none'} not done"
            + (f" ({', '.join(map(str, done))} done)" if done else "")
            + "; rerun the same command to resume"
        )
    for c in range(first, cycles + 1):
        log(f"cycle {c}: done ({config.ensemble.size} members, coupled)")


def _run_job(backend: Backend, spec: JobSpec, log: Any) -> tuple[int | str, str | None]:
    """Submit the coupled job and wait for it: (0 or how it ended, the reason from its log)."""
    state = "pending"
    try:
        job = backend.submit(spec)
        log(f"submitted {backend.label or backend.name} job {job} ({spec.name}); "
            f"log {backend.log_path(job)}")
        try:
            while True:
                state = backend.states([job]).get(job, "unknown")
                if state in ("done", "failed", "cancelled"):
                    break
                # one state query per poll: a scheduler's controller is shared
                time.sleep(max(backend.min_poll, 0.1))
        except BaseException:
            backend.cancel([job])
            raise
        if state == "done":
            return 0, None
        return backend.ending(job, state), failure_reason(backend.log_path(job))
    finally:
        backend.close()


def failure_reason(log_path: Path | None) -> str | None:
    """The last error line a failed job left in its log (stdout, then the ``.err`` beside it).

    The coupled job's output goes to its log, not to the driver's terminal;
    the line that says why it failed belongs in the driver's message: the
    first line ensio wrote there (its messages start with ``ensio``), else the
    last line mentioning an error or an abort.
    """
    if log_path is None:
        return None
    lines: list[str] = []
    for path in (log_path, log_path.with_suffix(".err")):
        try:
            lines += path.read_text(errors="replace").splitlines()
        except OSError:
            continue
    ours = [ln.strip() for ln in lines if ln.startswith("ensio")]
    other = [ln.strip() for ln in lines if "error" in ln.lower() or "abort" in ln.lower()]
    picked = ours[0] if ours else (other[-1] if other else None)  # the first cause we reported
    return None if picked is None else picked[:500]
