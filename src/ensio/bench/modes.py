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
   both modes with ``--set workflow.backend=slurm``: the offline pool submits
   N_j worker jobs per cycle, the online driver one batch job of
   ``--ntasks=N_e*P`` per cycle (``--overcommit`` added when the partition
   has fewer CPUs than that, as on a one-node test machine). The records
   carry each job's submission time, so queuing is measured the same way in
   both modes; ``queue_length_before`` in the JSON is the length of the
   queue (all users) before each cycle's submission.

Output: a table per mode × setting (mean ± standard deviation over cycles,
and for the model over cycles × draws; percentages of the mean total), the
offline/online ratio of the mean time to solution per setting, the JSON of
all numbers (``--json``) and a stacked bar chart (``--plot``).

The scheduler queries live in :mod:`ensio.bench.modes_slurm` and the table,
Markdown and plot in :mod:`ensio.bench.modes_output`.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import EnsioError
from ..workflow.records import mean_std, read_records
from .modes_numbers import (
    MODES,
    PARTS,
    OfflineCycle,
    _ratio,
    measured_rows,
    model_cycles,
    offline_inputs,
    stats,
)
from .queueing import LOADS, QueueModel, replay_offline

__all__ = [
    "PARTS",
    "OfflineCycle",
    "add_arguments",
    "bench_modes",
    "cycle_argv",
    "measured_rows",
    "model_cycles",
    "offline_inputs",
    "run_cli",
    "stats",
]

#: ``(argv, log file) -> None``: runs one command, raises :class:`EnsioError` on failure.
Runner = Callable[[Sequence[str], Path], None]
#: ``(label, done, total) -> None``: progress of the driver.
OnStep = Callable[[str, int, int], None]


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
    from .modes_slurm import overcommit_needed, queue_length

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
            ntasks = n_e * wf.online.tasks_per_member
            so_online = list(so)
            if overcommit_needed(ntasks, wf.slurm.partition):
                so_online.append(
                    "workflow.slurm.extra=" + json.dumps([*wf.slurm.extra, "--overcommit"]))
            others: dict[str, list[int | None]] = {"offline": [], "online": []}

            def slurm_step(mode: str) -> Callable[[str], None]:
                def f(label: str) -> None:
                    others[mode].append(queue_length())
                    step(f"SLURM {label}")
                return f

            _run_mode(config, "offline", root / "slurm-offline", cycles, so, runner, log,
                      slurm_step("offline"))
            _run_mode(config, "online", root / "slurm-online", cycles, so_online, runner, log,
                      slurm_step("online"))
            sl: dict[str, Any] = {
                mode: _mode_result(measured_rows(read_records(
                    root / f"slurm-{mode}" / "records.jsonl")))
                for mode in MODES
            }
            sl["queue_length_before"] = others
            sl["commands"] = {
                "offline": _per_cycle_command(config, "offline", root / "slurm-offline", so),
                "online": _per_cycle_command(config, "online", root / "slurm-online",
                                             so_online),
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

    from .modes_output import plot_result, result_table

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

