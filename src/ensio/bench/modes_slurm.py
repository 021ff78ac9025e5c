"""The SLURM part of ``ensio bench modes``: online cycles as ``sbatch --wait`` jobs.

Kept apart from :mod:`ensio.bench.modes` because it is the only part that
talks to a scheduler (``sbatch``, ``scontrol``, ``squeue``) and it runs only
when SLURM answers. The offline mode needs nothing from here under SLURM (it
is ``ensio cycle`` with ``workflow.backend=slurm``). What is measured, and why,
is part 3 of :mod:`ensio.bench.modes`.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import EnsioError
from ..workflow.records import cycle_summaries, read_records
from .modes import _env, cycle_argv

__all__ = ["online_script", "parse_scontrol"]


def online_script(argv: Sequence[str], *, name: str, log: str, started: str, cpus: int,
                  time_limit: str, partition: str | None = None,
                  account: str | None = None) -> str:
    """Batch script of one online cycle: ``--ntasks=1``, runs ``argv`` (quoted, no expansion).

    Parameters
    ----------
    argv : sequence of str
        The ``ensio cycle --mode online`` command line.
    name, log : str
        Job name and output file (absolute path; ``%j`` is the job id).
    started : str
        File the script writes its start time to (epoch seconds, ``date +%s.%N``).
    cpus : int
        ``--cpus-per-task``.
    time_limit : str
        ``--time`` value.
    partition, account : str, optional
    """
    lines = ["#!/bin/sh", f"#SBATCH --job-name={name}", "#SBATCH --ntasks=1",
             f"#SBATCH --cpus-per-task={cpus}", f"#SBATCH --time={time_limit}",
             f'#SBATCH --output="{log}"']
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    lines += ["set -e", f"date +%s.%N > {shlex.quote(started)}", f"exec {shlex.join(argv)}", ""]
    return "\n".join(lines)


def parse_scontrol(text: str) -> dict[str, str]:
    """``KEY=VALUE`` pairs of ``scontrol show job -o ID`` (values without blanks)."""
    out = {}
    for tok in text.split():
        key, eq, value = tok.partition("=")
        if eq and key not in out:
            out[key] = value
    return out


def _epoch(stamp: str | None) -> float | None:
    """SLURM's local ``YYYY-MM-DDTHH:MM:SS`` as epoch seconds (None if unknown)."""
    if not stamp or stamp in ("Unknown", "None", "N/A"):
        return None
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _sbatch_wait(script: Path, log: Path) -> tuple[str, float]:
    """Submit ``script`` with ``sbatch --wait``: (job id, epoch second of the call)."""
    t0 = time.time()
    proc = subprocess.run(["sbatch", "--parsable", "--wait", str(script)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          env=_env())
    job = proc.stdout.strip().split(";", 1)[0]
    with open(log, "a") as f:
        f.write(f"$ sbatch --parsable --wait {script}\n{proc.stdout}{proc.stderr}")
    if proc.returncode != 0:
        raise EnsioError(f"bench modes: sbatch --wait {script} failed (exit {proc.returncode}, "
                         f"job {job or '?'}): {(proc.stderr.strip() or 'no message')}")
    return job, t0


def _scheduler_times(job: str) -> dict[str, float | None]:
    try:
        proc = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {"submit": None, "start": None, "end": None}
    kv = parse_scontrol(proc.stdout)
    return {"submit": _epoch(kv.get("SubmitTime")), "start": _epoch(kv.get("StartTime")),
            "end": _epoch(kv.get("EndTime"))}


def _slurm_online(config: Path, workdir: Path, cycles: int, overrides: Sequence[str],
                  cfg: Any, log: Path, step: Callable[[str], None]
                  ) -> tuple[dict[int, float], list[dict[str, Any]]]:
    """One ``sbatch --wait`` per cycle; (queue time per cycle, job details).

    The queue time of cycle c is the job script's first command − the
    ``sbatch`` call (the scheduler's wait plus the job launch). The time the
    driver then spends before it submits the coupled program (Python start,
    ``workflow.setup``) is not counted, as the offline driver's is not
    (``pre_launch`` in the job details).
    """
    from ..workflow.backends.slurm import format_time_limit

    wf = cfg.workflow
    workdir.mkdir(parents=True, exist_ok=True)
    queued: dict[int, float] = {}
    jobs = []
    for c in range(1, cycles + 1):
        step(f"SLURM online, cycle {c}/{cycles}")
        script = workdir / f"online-c{c:03d}.sbatch"
        started = workdir / f"online-c{c:03d}.started"
        script.write_text(online_script(
            cycle_argv(config, "online", workdir, c, overrides), name=f"ensio-online-c{c:03d}",
            log=str(workdir / f"online-c{c:03d}.%j.log"), started=str(started),
            cpus=wf.analysis_ranks, time_limit=format_time_limit(wf.time_limit_seconds),
            partition=wf.slurm.partition, account=wf.slurm.account))
        job, t0 = _sbatch_wait(script, log)
        times = _scheduler_times(job)
        try:
            t_start: float | None = float(started.read_text().strip())
        except (OSError, ValueError):
            t_start = times["start"]
        wait = (times["start"] - times["submit"]
                if times["start"] is not None and times["submit"] is not None else None)
        subs = [s.submitted for s in cycle_summaries(read_records(workdir / "records.jsonl"))
                if s.cycle == c and s.submitted is not None]
        queued[c] = (t_start - t0) if t_start is not None else 0.0
        jobs.append({"cycle": c, "job": job, "sbatch_called": t0, "job_started": t_start,
                     "queued": queued[c], "scheduler": times, "scheduler_wait": wait,
                     "pre_launch": (subs[0] - t_start) if subs and t_start is not None
                     else None})
    return queued, jobs


def _queue_length() -> int | None:
    """Jobs in the SLURM queue right now (all users), or None if squeue fails."""
    try:
        proc = subprocess.run(["squeue", "-h", "-a", "-o", "%i"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return len(proc.stdout.split()) if proc.returncode == 0 else None
