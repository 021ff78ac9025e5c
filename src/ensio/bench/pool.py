"""``ensio bench pool``: overhead and efficiency of the dynamic job pool.

Two cases, both with N_j local worker jobs (:class:`LocalBackend`, no start
delay) draining a to-do list on the file system of ``--workdir``, each task a
real process started without a shell:

(a) **overhead**: ``--noop-tasks`` (1000) tasks running ``true``. Per task,
    the *overhead* is the time a worker spends between two commands: from
    one command's exit to the start (``Popen``) of the next one, from the
    records (``started`` of a task − ``ended`` of the same worker's previous
    task). With leasing ahead, the commit of a task (one locked, fsynced
    rewrite of the list that also leases the task after next) runs while the
    next command runs; its duration is reported as ``commit_ms`` (``finished
    - ended``, including the record). The command's own time (``ended -
    started``: fork/exec/exit of ``true``) is reported apart. Throughput is
    tasks per second from the first task start to the last commit; with
    tasks this short it is bounded by the commits, which the lock serialises.
(b) **efficiency**: ``--sleep-tasks`` (100) tasks of ``sleep 0.2``. The
    makespan (first task start to last commit) is compared with the ideal
    ``tasks * seconds / N_j``; the issue's goal is makespan / ideal ≤ 1.05.
    Run ``--repeat`` (3) times; the run with the median ratio is reported.
    ``ratio_measured`` divides by the *measured* task durations instead (a
    ``sleep 0.2`` process lives a few ms longer than 0.2 s), isolating the
    pool's own cost.
    Workers start at slightly different times (each is a new Python
    process); ``ratio_from_worker_start`` credits that spread, i.e. it divides
    by ``(tasks * seconds + Σ start offsets) / N_j``, which is what a pool whose
    workers join late could at best achieve.

Why these: the per-task overhead bounds how short a member may be before the
pool costs more than it saves, and the makespan ratio shows whether N_j jobs
stay busy (tail effects, lock contention) on a realistic task length.

The command line is :mod:`ensio.cli.bench_pool`.
"""

from __future__ import annotations

import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["bench_pool", "result_table"]

GOAL = 1.05


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    v = sorted(values)
    if not v:
        return {"median": math.nan, "p99": math.nan, "mean": math.nan, "max": math.nan}
    p99 = v[min(len(v) - 1, math.ceil(0.99 * len(v)) - 1)]
    return {"median": statistics.median(v), "p99": p99, "mean": statistics.fmean(v),
            "max": v[-1]}


def _run_case(root: Path, name: str, command: str, tasks: int, jobs: int,
              lock: str) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Drain one list of ``tasks`` identical tasks with ``jobs`` local workers."""
    from ..workflow.backends.base import JobSpec
    from ..workflow.backends.local import LocalBackend
    from ..workflow.pool import drain
    from ..workflow.records import read_records
    from ..workflow.spec import WorkerSpec, create_todo, worker_argv

    ctl = root / name
    spec = WorkerSpec(member_command=command, records=str(ctl / "records.jsonl"),
                      task_estimate=1.0)
    todo = create_todo(ctl / "todo.json", spec, range(1, tasks + 1), cycle=1, lock=lock)
    backend = LocalBackend()
    job = JobSpec(f"bench-{name}", worker_argv(todo.path, time_limit=3600.0), 3600.0,
                  str(ctl / "logs"))
    t0 = time.time()
    try:
        result = drain(todo, backend, job, jobs, poll=0.05, settle=30.0)
    finally:
        backend.close()
    t1 = time.time()
    if not result.summary.finished:
        raise RuntimeError(f"bench pool: list {todo.path} did not finish: {result.error}")
    recs = [r for r in read_records(ctl / "records.jsonl") if r.get("kind") == "member"]
    return recs, {"submitted": t0, "finished": t1, "lock": todo.lock_kind}


def _span(recs: list[dict[str, Any]]) -> tuple[float, float]:
    return min(r["started"] for r in recs), max(r["finished"] for r in recs)


def _gaps_ms(recs: list[dict[str, Any]]) -> list[float]:
    """Per worker, milliseconds from a command's exit to the start of the next."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_job.setdefault(r["job"], []).append(r)
    out = []
    for rs in by_job.values():
        rs.sort(key=lambda r: r["started"])
        out += [1e3 * (b["started"] - a["ended"]) for a, b in zip(rs, rs[1:], strict=False)]
    return out


def _commit_ms(recs: list[dict[str, Any]]) -> list[float]:
    return [1e3 * (r["finished"] - r["ended"]) for r in recs]


def _efficiency(recs: list[dict[str, Any]], info: dict[str, Any], tasks: int,
                seconds: float, jobs: int) -> dict[str, Any]:
    """Makespan against the ideal for one run of case (b)."""
    first, last = _span(recs)
    starts = sorted(min(r["started"] for r in recs if r["job"] == j)
                    for j in {r["job"] for r in recs})
    offsets = sum(s - first for s in starts) + (jobs - len(starts)) * (last - first)
    makespan = last - first
    ideal = tasks * seconds / jobs
    measured = math.fsum(r["ended"] - r["started"] for r in recs)
    return {
        "tasks": len(recs), "task_seconds": seconds, "lock": info["lock"],
        "makespan": makespan, "ideal": ideal, "ratio": makespan / ideal,
        "goal": GOAL, "ok": makespan / ideal <= GOAL,
        "mean_task_seconds": measured / len(recs),
        "ratio_measured": makespan / (measured / jobs),
        "worker_start_spread": starts[-1] - starts[0] if starts else math.nan,
        "ratio_from_worker_start": makespan / ((tasks * seconds + offsets) / jobs),
        "overhead_ms": _quantiles(_gaps_ms(recs)),
        "commit_ms": _quantiles(_commit_ms(recs)),
        "end_to_end_seconds": info["finished"] - info["submitted"],
    }


def bench_pool(workdir: str | Path | None = None, *, noop_tasks: int = 1000,
               sleep_tasks: int = 100, sleep_seconds: float = 0.2, repeat: int = 3,
               jobs: int = 4,
               lock: str = "auto", keep: bool = False,
               on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run both cases; return a JSON-ready result (see the module docstring).

    Parameters
    ----------
    workdir : path, optional
        Where the lists live (their file system is what is measured); a
        temporary directory by default.
    noop_tasks, sleep_tasks : int
        Task counts of cases (a) and (b); 0 skips a case.
    sleep_seconds : float
        Duration of each task of case (b).
    repeat : int
        Runs of case (b); the run with the median ratio is reported (a shared
        machine's noise moves single runs by several per cent), all ratios too.
    jobs : int
        N_j.
    lock : {"auto", "flock", "lockf", "mkdir"}
        Lock kind of the lists.
    keep : bool
        Keep the lists, records and job logs.
    """
    from .machine import describe_machine

    made = workdir is None
    root = Path(tempfile.mkdtemp(prefix="ensio-bench-pool-")) if made else Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    true, sleep = shutil.which("true") or "/bin/true", shutil.which("sleep") or "/bin/sleep"
    res: dict[str, Any] = {"jobs": jobs, "machine": describe_machine(root),
                           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        if noop_tasks:
            if on_step:
                on_step(f"(a) {noop_tasks} no-op tasks on {jobs} workers")
            recs, info = _run_case(root, "noop", true, noop_tasks, jobs, lock)
            first, last = _span(recs)
            cmd = [1e3 * (r["ended"] - r["started"]) for r in recs]
            res["noop"] = {
                "tasks": len(recs), "lock": info["lock"], "overhead_ms": _quantiles(_gaps_ms(recs)),
                "commit_ms": _quantiles(_commit_ms(recs)),
                "command_ms": _quantiles(cmd), "seconds": last - first,
                "tasks_per_second": len(recs) / (last - first),
                "end_to_end_seconds": info["finished"] - info["submitted"],
                "tasks_per_second_end_to_end": len(recs) / (info["finished"]
                                                             - info["submitted"]),
            }
        if sleep_tasks:
            runs = []
            for k in range(repeat):
                if on_step:
                    on_step(f"(b) {sleep_tasks} tasks of {sleep_seconds} s on {jobs} workers "
                            f"({k + 1}/{repeat})")
                recs, info = _run_case(root, f"sleep{k + 1}", f"{sleep} {sleep_seconds!r}",
                                       sleep_tasks, jobs, lock)
                runs.append(_efficiency(recs, info, sleep_tasks, sleep_seconds, jobs))
            best = sorted(runs, key=lambda r: r["ratio"])[(len(runs) - 1) // 2]  # median
            res["sleep"] = {**best, "repeat": repeat,
                            "ratios": [r["ratio"] for r in runs]}
    finally:
        if made and not keep:
            shutil.rmtree(root, ignore_errors=True)
    res["workdir"] = str(root) if keep or not made else None
    return res


def result_table(res: dict[str, Any]) -> Any:
    """A rich table of a :func:`bench_pool` result."""
    from rich.table import Table

    t = Table(title=f"ensio bench pool: N_j = {res['jobs']} local workers",
              caption="overhead: a worker's time from one command's exit to the next "
                      "command's start; commit: the fsynced list rewrite (overlapped)")
    t.add_column("")
    t.add_column("value", justify="right")
    a, b = res.get("noop"), res.get("sleep")
    if a:
        t.add_row(f"(a) {a['tasks']} no-op tasks", f"lock {a['lock']}", style="bold")
        t.add_row("  overhead median / p99 ms",
                  f"{a['overhead_ms']['median']:.2f} / {a['overhead_ms']['p99']:.2f}")
        t.add_row("  commit median / p99 ms",
                  f"{a['commit_ms']['median']:.2f} / {a['commit_ms']['p99']:.2f}")
        t.add_row("  command (true) median ms", f"{a['command_ms']['median']:.2f}")
        t.add_row("  tasks/s", f"{a['tasks_per_second']:.1f}")
        t.add_row("  tasks/s incl. worker start", f"{a['tasks_per_second_end_to_end']:.1f}")
    if b:
        t.add_row(f"(b) {b['tasks']} tasks of {b['task_seconds']} s, median of {b['repeat']}",
                  f"lock {b['lock']}", style="bold")
        t.add_row("  makespan / ideal s", f"{b['makespan']:.3f} / {b['ideal']:.3f}")
        mark = "ok" if b["ok"] else "above goal"
        t.add_row(f"  ratio (goal <= {b['goal']})", f"{b['ratio']:.3f} ({mark})")
        t.add_row("  all runs", " ".join(f"{x:.3f}" for x in b["ratios"]))
        t.add_row("  ratio over measured durations", f"{b['ratio_measured']:.3f}")
        t.add_row("  ratio from worker start", f"{b['ratio_from_worker_start']:.3f}")
        t.add_row("  worker start spread s", f"{b['worker_start_spread']:.3f}")
        t.add_row("  overhead median / p99 ms",
                  f"{b['overhead_ms']['median']:.2f} / {b['overhead_ms']['p99']:.2f}")
    return t
