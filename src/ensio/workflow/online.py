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

Queueing: with ``workflow.start_delay`` the job waits that many seconds
before it starts (the local back-end's queueing imitation, recorded as the
first cycle's queuing). On a cluster, run ``ensio cycle --mode online``
inside the allocation (an sbatch script): ``mpiexec`` then uses its nodes.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..config.schema import Config, ConfigError
from ..config.workflow import ONLINE_PLACEHOLDERS, command_fields
from ..errors import EnsioError
from .cycle import _analysis_config, _env, _mpiexec, _write_atomic, cycle_dir, prepare_run

__all__ = ["online_argv", "run_online_cycles"]


def online_argv(
    config: Config, mpiexec: str, workdir: Path, first: int, cycles: int
) -> list[str]:
    """The ``mpiexec`` command line of the coupled job for cycles ``first..cycles``."""
    wf = config.workflow
    assert wf is not None and wf.online.command is not None
    p = wf.online.tasks_per_member
    initial = (
        str(workdir / wf.initial)
        if first == 1
        else str(cycle_dir(workdir, first - 1) / "analysis" / "mem{member:03d}.nc")
    )
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
                  if not (cycle_dir(workdir, c) / ".done").exists()), None)
    if first is None:
        log(f"cycles 1..{cycles}: already done")
        return
    for c in range(first, cycles + 1):
        cfg = _analysis_config(raw, config, workdir, c)
        _write_atomic(cycle_dir(workdir, c) / "analysis.yaml", yaml.safe_dump(cfg))
    argv = online_argv(config, _mpiexec(), workdir, first, cycles)
    env = _env()
    submitted = time.time()
    env.update(ENSIO_JOB_ID=f"online-{os.getpid()}-{first:03d}",
               ENSIO_SUBMITTED=repr(submitted), OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    if wf.online.timeout is not None:
        env["ENSIO_ONLINE_TIMEOUT"] = repr(wf.online.timeout)
    if wf.start_delay > 0:
        time.sleep(wf.start_delay)  # the queueing imitation: the job is "pending"
    log(f"cycles {first}..{cycles}: coupled job of {config.ensemble.size} members "
        f"× {wf.online.tasks_per_member} ranks")
    proc = subprocess.run(argv, cwd=workdir, env=env)
    missing = [c for c in range(first, cycles + 1)
               if not (cycle_dir(workdir, c) / ".done").exists()]
    if proc.returncode != 0 or missing:
        done = [c for c in range(first, cycles + 1) if c not in missing]
        raise EnsioError(
            f"the coupled job ended with exit status {proc.returncode}; cycles "
            f"{', '.join(map(str, missing)) or 'none'} not done"
            + (f" ({', '.join(map(str, done))} done)" if done else "")
            + "; rerun the same command to resume"
        )
    for c in range(first, cycles + 1):
        log(f"cycle {c}: done ({config.ensemble.size} members, coupled)")
