"""``ensio bench modes``: time to solution of the offline and the online mode.

The seed paper's Table 2 (Zheng et al. 2020, GMD 13, 3607) compares, per
cycle, total time to solution, queuing, running and I/O of an offline
ensemble Kalman filter (member jobs and the filter exchange files) and an
online one (members and filter in one coupled MPI job) on a lightly and a
heavily loaded supercomputer. This driver reproduces that comparison in
three parts:

1. **Measured, local** — the same K-cycle experiment (``CONFIG``, e.g.
   ``examples/lorenz96/cycle.yaml``) is run in both modes, each into its own
   run directory (``WORKDIR/offline``, ``WORKDIR/online``) by the command line
   a user would type, **one submission per cycle**: ``ensio cycle CONFIG
   --mode MODE --workdir DIR --cycles c`` for c = 1..K (a rerun with a larger
   K resumes after the last complete cycle). No start delay
   (``workflow.start_delay=0`` is forced). Per cycle, from ``DIR/records.jsonl``
   (:func:`ensio.workflow.records.cycle_summaries`), with the meaning of
   ``ensio report``: queuing = first task start − first submission, total =
   last task finish − first submission, I/O = seconds the tasks reported
   reading and writing ensemble files, running = total − queuing − I/O. The
   local "queuing" is the start-up of the jobs (processes, imports, MPI
   initialisation), no scheduler is involved.
2. **Modelled queue** — every measured cycle is replayed under the batch-queue
   model of :mod:`ensio.bench.queueing` at each load preset (``low``,
   ``high``), ``--draws`` times with seeded waits: offline = N_j jobs of
   ``nodes_per_member`` nodes, the measured tasks list-scheduled onto them as
   they start; online = one job of ``N_e · nodes_per_member`` nodes that waits,
   then runs the measured coupled cycle. The model's time unit is the
   measured mean time to solution of one coupled cycle (``--unit`` overrides
   it). Replay inputs per offline cycle: each member's command time plus the
   cycle's median worker gap (the pool's own cost between two tasks), the
   analysis task (start to commit) and its lag after the last member, and the
   median start-up of a worker job. ``replay_check`` in the JSON compares the
   zero-wait replay with the measured total of every cycle.
3. **Measured, SLURM** (when ``sinfo`` works; else skipped with the reason):
   the offline mode with ``--set workflow.backend=slurm`` (N_j worker jobs per
   cycle through the SLURM back-end), and the online mode as one ``sbatch
   --wait --ntasks=1 --cpus-per-task=R`` job per cycle (R =
   ``workflow.analysis_ranks``) whose script runs ``ensio cycle --mode online``,
   which itself calls ``mpiexec`` (oversubscribing the allocation). The
   driver inside an online job only knows when *it* submitted the coupled
   program, so the time from the ``sbatch`` call to the job script's first
   command (the scheduler's wait and the job launch) is added to that cycle's
   queuing and total; the driver's own start inside the job (Python, the
   idempotent ``workflow.setup``) is left out, as the offline driver's is
   (it runs before its jobs are submitted), and reported as ``pre_launch``.
   ``scontrol show job`` gives the scheduler's SubmitTime/StartTime (whole
   seconds) as a cross-check (``scheduler_wait``).

Output: a table per mode × setting (mean ± standard deviation over cycles,
and for the model over cycles × draws; percentages of the mean total), the
offline/online ratio of the mean time to solution per setting, the JSON of
all numbers (``--json``) and a stacked bar chart (``--plot``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EnsioError
from ..workflow.records import cycle_summaries, mean_std, read_records
from .queueing import LOADS, QueueModel, replay_offline, replay_online, sample_waits

__all__ = [
    "PARTS",
    "OfflineCycle",
    "add_arguments",
    "bench_modes",
    "cycle_argv",
    "measured_rows",
    "model_cycles",
    "offline_inputs",
    "online_script",
    "parse_scontrol",
    "plot_result",
    "result_table",
    "run_cli",
    "stats",
]

PARTS = ("total", "queuing", "running", "io")
MODES = ("offline", "online")

#: ``(argv, log file) -> None``: runs one command, raises :class:`EnsioError` on failure.
Runner = Callable[[Sequence[str], Path], None]
#: ``(label, done, total) -> None``: progress of the driver.
OnStep = Callable[[str, int, int], None]


# --------------------------------------------------------------------------- #
# records → numbers (pure)
# --------------------------------------------------------------------------- #


def measured_rows(records: Iterable[Mapping[str, Any]],
                  queued: Mapping[int, float] | None = None) -> list[dict[str, float]]:
    """Per cycle: total, queuing, running and I/O seconds (``ensio report``'s meaning).

    Parameters
    ----------
    records : iterable of dict
        Records of one run directory.
    queued : mapping cycle → seconds, optional
        Time the cycle's job spent before the records' submission time (the
        online jobs under SLURM, whose driver only starts once the job runs):
        added to queuing and total.

    Returns
    -------
    list of dict
        ``{"cycle", "total", "queuing", "running", "io"}`` sorted by cycle;
        queuing is clipped at 0 (the online mode's process start times have a
        resolution of 10 ms); ``running = total − queuing − io`` (clipped at 0).
    """
    rows = []
    for s in cycle_summaries(records):
        sub = s.submitted if s.submitted is not None else s.first_start
        extra = 0.0 if queued is None else float(queued.get(s.cycle, 0.0))
        queuing = max(0.0, s.first_start - sub) + extra
        total = s.last_finish - sub + extra
        rows.append({"cycle": s.cycle, "total": total, "queuing": queuing,
                     "running": max(0.0, total - queuing - s.io), "io": s.io})
    return rows


@dataclass(frozen=True)
class OfflineCycle:
    """Replay inputs of one measured offline cycle (seconds).

    Attributes
    ----------
    cycle : int
    members : tuple of float
        Per member, in to-do list order: command time + the cycle's median
        worker gap (the time it occupies a job).
    analysis : float
        The analysis task from its start to its commit.
    lag : float
        From the end of the last member's slot to the start of the analysis.
    startup : float
        Median over the cycle's jobs of submission → first task start.
    io : float
        I/O seconds the tasks reported.
    gap : float
        The median worker gap included in ``members``.
    measured_total : float
        The cycle's measured time to solution.
    """

    cycle: int
    members: tuple[float, ...]
    analysis: float
    lag: float
    startup: float
    io: float
    gap: float
    measured_total: float


def _f(rec: Mapping[str, Any], key: str) -> float | None:
    v = rec.get(key)
    return None if v is None else float(v)


def offline_inputs(records: Iterable[Mapping[str, Any]]) -> list[OfflineCycle]:
    """Replay inputs of every complete offline cycle of a run directory's records.

    A cycle is used when it has at least one successful member and a
    successful analysis. Raises nothing for odd records: tasks without times
    are ignored.
    """
    recs = [r for r in records if r.get("kind") in ("member", "analysis")]
    totals = {r["cycle"]: r["total"] for r in measured_rows(recs)}
    by_cycle: dict[int, list[Mapping[str, Any]]] = {}
    for r in recs:
        if r.get("cycle") is not None and r.get("started") is not None:
            by_cycle.setdefault(int(r["cycle"]), []).append(r)
    out = []
    for c in sorted(by_cycle):
        rs = by_cycle[c]
        done = [r for r in rs if r.get("status") == "done" and r.get("ended") is not None]
        members = sorted((r for r in done if r["kind"] == "member"),
                         key=lambda r: (r.get("member") or 0, r["started"]))
        analyses = [r for r in done if r["kind"] == "analysis" and r.get("finished") is not None]
        if not members or not analyses:
            continue
        gaps: list[float] = []
        by_job: dict[str, list[Mapping[str, Any]]] = {}
        for r in rs:
            if r.get("ended") is not None:
                by_job.setdefault(str(r.get("job")), []).append(r)
        for jrs in by_job.values():
            jrs.sort(key=lambda r: float(r["started"]))
            gaps += [float(b["started"]) - float(a["ended"])
                     for a, b in zip(jrs, jrs[1:], strict=False)]
        gap = max(0.0, statistics.median(gaps)) if gaps else 0.0
        startups = []
        for jrs in by_job.values():
            sub = _f(jrs[0], "submitted")
            if sub is not None:
                startups.append(min(float(r["started"]) for r in jrs) - sub)
        startup = max(0.0, statistics.median(startups)) if startups else 0.0
        a = max(analyses, key=lambda r: float(r["finished"]))
        last_member_end = max(float(r["ended"]) for r in members)
        io = math.fsum(float(r["io_seconds"]) for r in done if r.get("io_seconds") is not None)
        out.append(OfflineCycle(
            cycle=c,
            members=tuple(float(r["ended"]) - float(r["started"]) + gap for r in members),
            analysis=float(a["finished"]) - float(a["started"]),
            lag=max(0.0, float(a["started"]) - last_member_end - gap),
            startup=startup, io=io, gap=gap, measured_total=totals.get(c, math.nan)))
    return out


def model_cycles(offline: Sequence[OfflineCycle], online: Sequence[Mapping[str, float]],
                 model: QueueModel, rho: float, *, jobs: int, nodes_per_member: float,
                 members: int, draws: int, seed: int, stream: int = 0
                 ) -> dict[str, list[dict[str, float]]]:
    """Replay every measured cycle ``draws`` times at load ``rho``.

    Parameters
    ----------
    offline : sequence of OfflineCycle
        Offline replay inputs (:func:`offline_inputs`).
    online : sequence of dict
        Measured online cycles (:func:`measured_rows`): ``cycle``, ``total``, ``io``.
    model : QueueModel
    rho : float
        Machine load.
    jobs : int
        N_j, offline worker jobs per cycle, each of ``nodes_per_member`` nodes.
    nodes_per_member : float
        Nodes one member needs; the coupled job asks for ``members`` times as many.
    members : int
        N_e.
    draws : int
        Replays per measured cycle.
    seed, stream : int
        The waits of mode m come from ``numpy.random.default_rng([seed, stream, m])``
        (m = 0 offline, 1 online), cycle by cycle, draw by draw.

    Returns
    -------
    dict
        ``{"offline": [...], "online": [...]}``: one dict per cycle and draw
        (``cycle``, ``draw``, ``total``, ``queuing``, ``running``, ``io``).
    """
    if jobs < 1 or draws < 1:
        raise ValueError("model_cycles: jobs and draws must be >= 1")
    rng_off = np.random.default_rng([seed, stream, 0])
    rng_on = np.random.default_rng([seed, stream, 1])
    out: dict[str, list[dict[str, float]]] = {"offline": [], "online": []}
    for oc in offline:
        for d in range(draws):
            waits = sample_waits(model, [nodes_per_member] * jobs, rho, rng_off)
            r = replay_offline(oc.members, oc.analysis, waits, startup=oc.startup,
                               analysis_lag=oc.lag, io=oc.io)
            out["offline"].append({"cycle": oc.cycle, "draw": d, **r.as_dict()})
    for row in online:
        for d in range(draws):
            w = float(sample_waits(model, [members * nodes_per_member], rho, rng_on)[0])
            r = replay_online(row["total"], w, io=row["io"])
            out["online"].append({"cycle": int(row["cycle"]), "draw": d, **r.as_dict()})
    return out


def stats(rows: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Mean, sample standard deviation and per cent of the mean total, per part."""
    out: dict[str, dict[str, float]] = {}
    tot = mean_std(r["total"] for r in rows)[0] if rows else math.nan
    for p in PARTS:
        m, sd = mean_std(r[p] for r in rows)
        pct = 100.0 * m / tot if tot and math.isfinite(tot) and tot > 0 else math.nan
        out[p] = {"mean": m, "std": sd, "percent": pct}
    return out


def _ratio(st: Mapping[str, Any]) -> float:
    off, on = st["offline"]["stats"]["total"]["mean"], st["online"]["stats"]["total"]["mean"]
    return off / on if on > 0 else math.nan


# --------------------------------------------------------------------------- #
# running the experiment
# --------------------------------------------------------------------------- #


def _ensio() -> list[str]:
    return [sys.executable, "-m", "ensio"]


def cycle_argv(config: str | Path, mode: str, workdir: str | Path, cycles: int,
               overrides: Sequence[str] = ()) -> list[str]:
    """``ensio cycle CONFIG --mode MODE --workdir DIR --cycles K [--set …]`` (this Python)."""
    argv = [*_ensio(), "cycle", str(config), "--mode", mode, "--workdir", str(workdir),
            "--cycles", str(cycles)]
    for o in overrides:
        argv += ["--set", o]
    return argv


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _last_line(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "(no output)"
    return lines[-1] if lines else "(no output)"


def run_command(argv: Sequence[str], log: Path) -> None:
    """Run ``argv`` (no shell) with its output appended to ``log``; raise on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"$ {shlex.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, env=_env())
    if proc.returncode != 0:
        raise EnsioError(f"bench modes: `{shlex.join(argv[2:])}` failed (exit "
                         f"{proc.returncode}): {_last_line(log)} (log: {log})")


def _per_cycle_command(config: Path, mode: str, workdir: Path, overrides: Sequence[str]) -> str:
    """The command line of cycle c, for the JSON: ``ensio cycle … --cycles c`` (c = 1..K)."""
    argv = cycle_argv(config, mode, workdir, 0, overrides)[2:]
    argv[argv.index("--cycles") + 1] = "c"
    return shlex.join(argv) + "  # c = 1..K, one submission each"


def _run_mode(config: Path, mode: str, workdir: Path, cycles: int, overrides: Sequence[str],
              runner: Runner, log: Path, step: Callable[[str], None]) -> dict[int, float]:
    """c = 1..K: one ``ensio cycle`` per cycle; returns the time each was started."""
    started = {}
    for c in range(1, cycles + 1):
        step(f"{mode}, cycle {c}/{cycles}")
        started[c] = time.time()
        runner(cycle_argv(config, mode, workdir, c, overrides), log)
    return started


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


def _mode_result(rows: list[dict[str, float]]) -> dict[str, Any]:
    return {"cycles": rows, "stats": stats(rows)}


def bench_modes(config: str | Path, workdir: str | Path | None = None, *, cycles: int = 4,
                overrides: Sequence[str] = (), model: QueueModel | None = None,
                loads: Mapping[str, float] | None = None, unit: float | None = None,
                nodes_per_member: float | None = None, draws: int = 200, seed: int = 1,
                slurm: str = "auto", keep: bool = False, runner: Runner = run_command,
                on_step: OnStep | None = None) -> dict[str, Any]:
    """Run the experiment in both modes, replay it under the queue model; a JSON-ready dict.

    Parameters
    ----------
    config : path
        An ``ensio cycle`` config that can run in both modes (``workflow.online.command``).
    workdir : path, optional
        Parent of the run directories (``offline``, ``online``, ``slurm-offline``,
        ``slurm-online``, ``logs``); must not hold them already. Default: a
        temporary directory, removed unless ``keep``.
    cycles : int
        K, cycles per mode (one submission each).
    overrides : sequence of str
        ``--set`` values for both modes (``workflow.start_delay=0`` is appended).
    model : QueueModel, optional
        Queue-model parameters; its ``unit`` is replaced by ``unit`` or, by
        default, the measured mean time to solution of an online cycle.
    loads : mapping name → ρ, optional
        Load presets (default :data:`ensio.bench.queueing.LOADS`).
    unit : float, optional
        Seconds per model time unit.
    nodes_per_member : float, optional
        Nodes of one member (default ``workflow.online.tasks_per_member``).
    draws : int
        Replays of every measured cycle per load.
    seed : int
        Seed of the waits.
    slurm : {"auto", "yes", "no"}
        Run the SLURM part when SLURM answers (auto), always (yes: an error if
        it does not), or never.
    runner : callable
        Runs one command (tests replace it).
    on_step : callable, optional
        ``(label, done, total)`` before each submission.
    """
    from ..config import load_config
    from ..workflow.backends.slurm import slurm_unavailable_reason
    from .machine import describe_machine

    if cycles < 1:
        raise EnsioError(f"bench modes: --cycles must be at least 1, got {cycles}")
    config = Path(config).resolve()
    overrides = [*overrides, "workflow.start_delay=0"]
    cfg = load_config(config, overrides)
    wf = cfg.workflow
    if wf is None:
        raise EnsioError(f"{config}: bench modes needs a workflow section")
    if wf.online.command is None:
        raise EnsioError(f"{config}: bench modes needs workflow.online.command (the coupled "
                         "program of --mode online)")
    n_e, p = cfg.ensemble.size, wf.online.tasks_per_member
    npm = float(p if nodes_per_member is None else nodes_per_member)
    loads = dict(LOADS if loads is None else loads)
    model = model or QueueModel()

    slurm_reason: str | None = None
    if slurm == "no":
        slurm_reason = "not asked for (--slurm no)"
    else:
        slurm_reason = slurm_unavailable_reason()
        if slurm_reason is not None and slurm == "yes":
            raise EnsioError(f"bench modes: --slurm yes: {slurm_reason}")
    steps_total = cycles * (2 if slurm_reason else 4)
    done = 0

    def step(label: str) -> None:
        nonlocal done
        if on_step is not None:
            on_step(label, done, steps_total)
        done += 1

    made = workdir is None
    root = Path(tempfile.mkdtemp(prefix="ensio-bench-modes-")) if made else Path(workdir)
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("offline", "online", "slurm-offline", "slurm-online"):
        d = root / sub
        if d.exists() and any(d.iterdir()):
            raise EnsioError(f"bench modes: {d} is not empty; use a fresh --workdir")
    log = root / "logs" / "bench-modes.log"
    res: dict[str, Any] = {
        "config": str(config), "overrides": list(overrides), "cycles": cycles,
        "members": n_e, "jobs": wf.jobs, "tasks_per_member": p,
        "analysis_ranks": wf.analysis_ranks, "machine": describe_machine(root),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commands": {m: _per_cycle_command(config, m, root / m, overrides) for m in MODES},
    }
    try:
        local: dict[str, Any] = {}
        for mode in MODES:
            _run_mode(config, mode, root / mode, cycles, overrides, runner, log, step)
            local[mode] = _mode_result(measured_rows(read_records(root / mode
                                                                  / "records.jsonl")))
            if len(local[mode]["cycles"]) != cycles:
                raise EnsioError(f"bench modes: {root / mode}/records.jsonl has "
                                 f"{len(local[mode]['cycles'])} complete cycles, not {cycles}")
        local["ratio"] = _ratio(local)
        res["measured"] = {"local": local}

        # ---- the queue model
        inputs = offline_inputs(read_records(root / "offline" / "records.jsonl"))
        online_rows = local["online"]["cycles"]
        u = unit if unit is not None else mean_std(r["total"] for r in online_rows)[0]
        if not (u > 0 and math.isfinite(u)):
            raise EnsioError(f"bench modes: model unit must be > 0 s, got {u}")
        model = QueueModel(base=model.base, per_node=model.per_node, alpha=model.alpha,
                           shape=model.shape, unit=u)
        res["replay_check"] = [{"cycle": oc.cycle, "measured_total": oc.measured_total,
                                "replay_total": replay_offline(
                                    oc.members, oc.analysis, [0.0] * wf.jobs,
                                    startup=oc.startup, analysis_lag=oc.lag, io=oc.io).total}
                               for oc in inputs]
        res["offline_inputs"] = [asdict(oc) for oc in inputs]
        modelled: dict[str, Any] = {}
        for k, (name, rho) in enumerate(loads.items()):
            reps = model_cycles(inputs, online_rows, model, rho, jobs=wf.jobs,
                                nodes_per_member=npm, members=n_e, draws=draws, seed=seed,
                                stream=k)
            entry: dict[str, Any] = {"rho": rho}
            for mode in MODES:
                entry[mode] = {"stats": stats(reps[mode]),
                               "cycles": _per_cycle_means(reps[mode])}
            entry["ratio"] = _ratio(entry)
            modelled[name] = entry
        res["model"] = {"params": asdict(model), "unit_source": "--unit" if unit is not None
                        else "mean measured online time to solution per cycle",
                        "nodes": {"offline_job": npm, "online_job": n_e * npm},
                        "jobs": wf.jobs, "draws": draws, "seed": seed, "loads": modelled}

        # ---- SLURM
        if slurm_reason is None:
            so = [*overrides, "workflow.backend=slurm"]
            others: dict[str, list[int | None]] = {"offline": [], "online": []}

            def slurm_step(mode: str) -> Callable[[str], None]:
                def f(label: str) -> None:
                    others[mode].append(_queue_length())
                    step(label if label.startswith("SLURM") else f"SLURM {label}")
                return f

            _run_mode(config, "offline", root / "slurm-offline", cycles, so, runner, log,
                      slurm_step("offline"))
            queued, jobs = _slurm_online(config, root / "slurm-online", cycles, overrides,
                                         cfg, log, slurm_step("online"))
            sl: dict[str, Any] = {
                "offline": _mode_result(measured_rows(read_records(
                    root / "slurm-offline" / "records.jsonl"))),
                "online": _mode_result(measured_rows(read_records(
                    root / "slurm-online" / "records.jsonl"), queued=queued)),
                "online_jobs": jobs,
                "queue_length_before": others,
                "commands": {"offline": _per_cycle_command(config, "offline",
                                                           root / "slurm-offline", so),
                             "online": "sbatch --parsable --wait SCRIPT (--ntasks=1 "
                                       f"--cpus-per-task={wf.analysis_ranks}; SCRIPT runs "
                                       + _per_cycle_command(config, "online",
                                                            root / "slurm-online", overrides)
                                       + ")"},
            }
            sl["ratio"] = _ratio(sl)
            res["measured"]["slurm"] = sl
        else:
            res["measured"]["slurm"] = {"skipped": slurm_reason}
    finally:
        if made and not keep:
            shutil.rmtree(root, ignore_errors=True)
    res["workdir"] = str(root) if keep or not made else None
    return res


def _per_cycle_means(rows: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
    by: dict[int, list[Mapping[str, float]]] = {}
    for r in rows:
        by.setdefault(int(r["cycle"]), []).append(r)
    return [{"cycle": c, **{p: statistics.fmean(r[p] for r in rs) for p in PARTS}}
            for c, rs in sorted(by.items())]


# --------------------------------------------------------------------------- #
# output
# --------------------------------------------------------------------------- #


def _settings(res: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(key, label, entry with "offline"/"online"/"ratio") in table order."""
    out: list[tuple[str, str, Mapping[str, Any]]] = [
        ("local", "measured: local", res["measured"]["local"])]
    sl = res["measured"].get("slurm", {})
    if "skipped" not in sl and sl:
        out.append(("slurm", "measured: SLURM", sl))
    for name, entry in res.get("model", {}).get("loads", {}).items():
        out.append((name, f"model: {name} load, ρ = {entry['rho']:g}", entry))
    return out


def result_table(res: Mapping[str, Any]) -> Any:
    """A rich table: per setting × mode, mean ± sd and % of total; ratio per setting."""
    from rich.table import Table

    m = res.get("model", {})
    cap = [f"{res['cycles']} cycles per mode, one submission per cycle; N_e = {res['members']},"
           f" N_j = {res['jobs']}; running = total − queuing − I/O; mean ± sd over cycles "
           "(model: cycles × draws); % of the mean total",
           "queuing: measured = first task start − submission (locally: job start-up); "
           "model = scheduler wait until the first job starts"]
    if m:
        p = m["params"]
        cap.append(f"model: unit {p['unit']:.3g} s, base {p['base']:g}, per_node "
                   f"{p['per_node']:g}, alpha {p['alpha']:g}, shape {p['shape']:g}; nodes "
                   f"offline job {m['nodes']['offline_job']:g}, online job "
                   f"{m['nodes']['online_job']:g}; {m['draws']} draws per cycle")
    sl = res["measured"].get("slurm", {})
    if "skipped" in sl:
        cap.append(f"SLURM: skipped ({sl['skipped']})")
    t = Table(title="ensio bench modes: time to solution per cycle, offline vs online",
              caption="\n".join(cap))
    for col in ("setting", "mode", "total s", "queuing s", "%", "running s", "%", "I/O s", "%",
                "off/on"):
        t.add_column(col, justify="left" if col in ("setting", "mode") else "right")
    for _key, label, entry in _settings(res):
        for i, mode in enumerate(MODES):
            st = entry[mode]["stats"]
            cells = [label if i == 0 else "", mode]
            for part in PARTS:
                cells.append(f"{st[part]['mean']:.2f} ± {st[part]['std']:.2f}")
                if part != "total":
                    pct = st[part]["percent"]
                    cells.append("—" if not math.isfinite(pct) else f"{pct:.0f}")
            cells.append(f"{entry['ratio']:.2f}" if i == 1 else "")
            t.add_row(*cells, end_section=i == 1)
    return t


def markdown_table(res: Mapping[str, Any]) -> str:
    """The table of :func:`result_table` as Markdown (for docs/benchmarks.md)."""
    lines = ["| setting | mode | total s | queuing s (%) | running s (%) | I/O s (%) "
             "| offline / online |", "|---|---|---|---|---|---|---|"]
    for _key, label, entry in _settings(res):
        for i, mode in enumerate(MODES):
            st = entry[mode]["stats"]
            cells = [label if i == 0 else "", mode,
                     f"{st['total']['mean']:.2f} ± {st['total']['std']:.2f}"]
            for part in PARTS[1:]:
                pct = st[part]["percent"]
                cells.append(f"{st[part]['mean']:.2f} ± {st[part]['std']:.2f} ("
                             + ("—" if not math.isfinite(pct) else f"{pct:.0f}") + ")")
            cells.append(f"**{entry['ratio']:.2f}**" if i == 1 else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_result(res: Mapping[str, Any], path: str | Path) -> None:
    """Stacked bars (queuing, running, I/O; mean per cycle) per setting and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = _settings(res)
    fig, ax = plt.subplots(figsize=(1.9 * len(settings) + 2.5, 4.0))
    width = 0.38
    colours = {"queuing": "#bbbbbb", "running": "#4477aa", "io": "#ee6677"}
    for s, (_key, _label, entry) in enumerate(settings):
        for i, mode in enumerate(MODES):
            x = s + (i - 0.5) * width
            bottom = 0.0
            for part in ("queuing", "running", "io"):
                v = entry[mode]["stats"][part]["mean"]
                ax.bar(x, v, width * 0.95, bottom=bottom, color=colours[part],
                       label=part if s == 0 and i == 0 else None,
                       edgecolor="black" if mode == "online" else "white",
                       hatch="//" if mode == "online" else None)
                bottom += v
            ax.text(x, bottom, mode, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(settings)))
    ax.set_xticklabels([label.replace(" (", "\n(").replace(", ", "\n", 1)
                        for _k, label, _e in settings], fontsize=8)
    ax.set_ylabel("seconds per cycle (mean)")
    ax.set_title("time to solution per cycle: offline (plain) vs online (hatched)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- #
# command line
# --------------------------------------------------------------------------- #


def _loads_arg(text: str) -> dict[str, float]:
    out = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise argparse.ArgumentTypeError(f"expected NAME=RHO[,NAME=RHO…], got {text!r}")
        try:
            rho = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: ρ must be a number, got {value!r}") \
                from None
        if not 0 <= rho < 1:
            raise argparse.ArgumentTypeError(f"{name}: ρ must be in [0, 1), got {rho}")
        out[name.strip()] = rho
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``ensio bench modes``."""
    d = QueueModel()
    p.add_argument("config", type=Path, metavar="CONFIG",
                   help="ensio cycle config with workflow.online.command "
                        "(e.g. examples/lorenz96/cycle.yaml)")
    p.add_argument("--cycles", type=int, default=4, metavar="K",
                   help="cycles per mode, one submission each (default 4)")
    p.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                   help="parent of the run directories (default: a temporary directory)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="write all numbers as JSON")
    p.add_argument("--plot", type=Path, default=None, metavar="PNG",
                   help="stacked bar chart (queuing, running, I/O) per mode and setting")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in both modes (repeatable)")
    p.add_argument("--loads", type=_loads_arg, default=dict(LOADS), metavar="NAME=RHO,…",
                   help="load presets of the queue model (default "
                        + ",".join(f"{k}={v:g}" for k, v in LOADS.items()) + ")")
    p.add_argument("--base", type=float, default=d.base,
                   help=f"model: size-independent wait in cycle units (default {d.base:g})")
    p.add_argument("--per-node", type=float, default=d.per_node,
                   help=f"model: wait per node**alpha in cycle units (default {d.per_node:g})")
    p.add_argument("--alpha", type=float, default=d.alpha,
                   help=f"model: growth exponent with the node count (default {d.alpha:g})")
    p.add_argument("--shape", type=float, default=d.shape,
                   help=f"model: Gamma shape of the random factor, 1 = exponential "
                        f"(default {d.shape:g})")
    p.add_argument("--unit", type=float, default=None, metavar="SECONDS",
                   help="model time unit (default: measured mean online cycle time)")
    p.add_argument("--nodes-per-member", type=float, default=None, metavar="N",
                   help="nodes of one member (default workflow.online.tasks_per_member)")
    p.add_argument("--draws", type=int, default=200, metavar="N",
                   help="replays of every measured cycle per load (default 200)")
    p.add_argument("--seed", type=int, default=1, help="seed of the queue waits (default 1)")
    p.add_argument("--slurm", choices=("auto", "yes", "no"), default="auto",
                   help="also run both modes through SLURM (auto: when sinfo answers)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary run directories")


def run_cli(args: argparse.Namespace) -> int:
    """``ensio bench modes``: run, print the table, write JSON and plot."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    try:
        model = QueueModel(base=args.base, per_node=args.per_node, alpha=args.alpha,
                           shape=args.shape)
    except ValueError as exc:
        raise EnsioError(f"bench modes: {exc}") from None
    with Progress(TextColumn("ensio bench modes: {task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=err, transient=False, disable=not err.is_terminal) as progress:
        task = progress.add_task("starting", total=None)

        def on_step(label: str, done: int, total: int) -> None:
            progress.update(task, description=label, completed=done, total=total)
            if not err.is_terminal:
                err.print(f"ensio bench modes: {label}")

        res = bench_modes(args.config, args.workdir, cycles=args.cycles,
                          overrides=args.overrides, model=model, loads=args.loads,
                          unit=args.unit, nodes_per_member=args.nodes_per_member,
                          draws=args.draws, seed=args.seed, slurm=args.slurm, keep=args.keep,
                          on_step=on_step)
        progress.update(task, description="done", completed=progress.tasks[0].total or 0)
    out = Console()
    if not out.is_terminal:
        out = Console(width=150)
    out.print(result_table(res))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    if args.plot is not None:
        plot_result(res, args.plot)
    return 0
