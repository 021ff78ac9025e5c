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

The scheduler queries live in :mod:`ensio.bench.modes_slurm`, the table,
Markdown and plot in :mod:`ensio.bench.modes_output`, the command line in
:mod:`ensio.cli.bench_modes`. What to run is one frozen :class:`ModesSettings`.
"""

from __future__ import annotations

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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

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

if TYPE_CHECKING:
    from ..config.workflow import WorkflowSection

__all__ = [
    "PARTS",
    "ModesSettings",
    "OfflineCycle",
    "bench_modes",
    "cycle_argv",
    "measured_rows",
    "model_cycles",
    "offline_inputs",
    "run_command",
    "stats",
]

#: ``(argv, log file) -> None``: runs one command, raises :class:`EnsioError` on failure.
Runner = Callable[[Sequence[str], Path], None]
#: ``(label, done, total) -> None``: progress of the driver.
OnStep = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ModesSettings:
    """What ``ensio bench modes`` runs (all but the config, the directory and the hooks).

    Attributes
    ----------
    cycles : int
        K, cycles per mode (one submission each).
    overrides : tuple of str
        ``--set`` values for both modes (``workflow.start_delay=0`` is appended).
    model : QueueModel
        Queue-model parameters; its ``unit`` is replaced by ``unit`` or, by
        default, the measured mean time to solution of an online cycle.
    loads : mapping name → ρ
        Load presets (default :data:`ensio.bench.queueing.LOADS`).
    unit : float or None
        Seconds per model time unit.
    nodes_per_member : float or None
        Nodes of one member (default ``workflow.online.tasks_per_member``).
    draws : int
        Replays of every measured cycle per load.
    seed : int
        Seed of the waits.
    slurm : {"auto", "yes", "no"}
        Run the SLURM part when SLURM answers (auto), always (yes: an error if
        it does not), or never.
    keep : bool
        Keep the temporary run directories.
    """

    cycles: int = 4
    overrides: tuple[str, ...] = ()
    model: QueueModel = field(default_factory=QueueModel)
    loads: Mapping[str, float] = field(default_factory=lambda: dict(LOADS))
    unit: float | None = None
    nodes_per_member: float | None = None
    draws: int = 200
    seed: int = 1
    slurm: Literal["auto", "yes", "no"] = "auto"
    keep: bool = False

    def __post_init__(self) -> None:
        if self.cycles < 1:
            raise EnsioError(f"bench modes: --cycles must be at least 1, got {self.cycles}")
        if self.slurm not in _SLURM_PART:
            raise EnsioError(f"bench modes: --slurm must be one of {sorted(_SLURM_PART)}, "
                             f"got {self.slurm!r}")
        object.__setattr__(self, "overrides", tuple(self.overrides))


def _slurm_no() -> str | None:
    return "not asked for (--slurm no)"


def _slurm_auto() -> str | None:
    from ..workflow.backends.slurm import slurm_unavailable_reason

    return slurm_unavailable_reason()


def _slurm_yes() -> str | None:
    reason = _slurm_auto()
    if reason is not None:
        raise EnsioError(f"bench modes: --slurm yes: {reason}")
    return None


#: ``--slurm`` → why the SLURM part is skipped (``None``: it runs).
_SLURM_PART: dict[str, Callable[[], str | None]] = {
    "no": _slurm_no, "auto": _slurm_auto, "yes": _slurm_yes}


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


def bench_modes(config: str | Path, workdir: str | Path | None = None,
                settings: ModesSettings | None = None, *, runner: Runner = run_command,
                on_step: OnStep | None = None) -> dict[str, Any]:
    """Run the experiment in both modes, replay it under the queue model; a JSON-ready dict.

    Parameters
    ----------
    config : path
        An ``ensio cycle`` config that can run in both modes (``workflow.online.command``).
    workdir : path, optional
        Parent of the run directories (``offline``, ``online``, ``slurm-offline``,
        ``slurm-online``, ``logs``); must not hold them already. Default: a
        temporary directory, removed unless ``settings.keep``.
    settings : ModesSettings, optional
        Cycles, overrides, queue model, draws, seed, SLURM part (defaults).
    runner : callable
        Runs one command (tests replace it).
    on_step : callable, optional
        ``(label, done, total)`` before each submission.
    """
    from ..config import load_config
    from .machine import describe_machine

    st = settings or ModesSettings()
    config = Path(config).resolve()
    st = replace(st, overrides=(*st.overrides, "workflow.start_delay=0"))
    cfg = load_config(config, list(st.overrides))
    wf = cfg.workflow
    if wf is None:
        raise EnsioError(f"{config}: bench modes needs a workflow section")
    if wf.online.command is None:
        raise EnsioError(f"{config}: bench modes needs workflow.online.command (the coupled "
                         "program of --mode online)")
    slurm_reason = _SLURM_PART[st.slurm]()
    step = _Steps(on_step, st.cycles * (2 if slurm_reason else 4))
    made = workdir is None
    root = Path(tempfile.mkdtemp(prefix="ensio-bench-modes-")) if made else Path(workdir)
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("offline", "online", "slurm-offline", "slurm-online"):
        d = root / sub
        if d.exists() and any(d.iterdir()):
            raise EnsioError(f"bench modes: {d} is not empty; use a fresh --workdir")
    run = _Experiment(config, root, st, runner, step)
    res: dict[str, Any] = {
        "config": str(config), "overrides": list(st.overrides), "cycles": st.cycles,
        "members": cfg.ensemble.size, "jobs": wf.jobs,
        "tasks_per_member": wf.online.tasks_per_member,
        "analysis_ranks": wf.analysis_ranks, "machine": describe_machine(root),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commands": {m: _per_cycle_command(config, m, root / m, st.overrides) for m in MODES},
    }
    try:
        res["measured"] = {"local": run.local()}
        res.update(_modelled(root, res["measured"]["local"], st, wf.jobs, cfg.ensemble.size,
                             wf.online.tasks_per_member))
        res["measured"]["slurm"] = ({"skipped": slurm_reason} if slurm_reason is not None
                                    else run.slurm(wf, cfg.ensemble.size
                                                   * wf.online.tasks_per_member))
    finally:
        if made and not st.keep:
            shutil.rmtree(root, ignore_errors=True)
    res["workdir"] = str(root) if st.keep or not made else None
    return res


class _Steps:
    """Progress: ``on_step(label, done, total)`` before each submission."""

    def __init__(self, on_step: OnStep | None, total: int) -> None:
        self.on_step, self.total, self.done = on_step, total, 0

    def __call__(self, label: str) -> None:
        if self.on_step is not None:
            self.on_step(label, self.done, self.total)
        self.done += 1


class _Experiment:
    """The measured parts: both modes locally, then through SLURM."""

    def __init__(self, config: Path, root: Path, st: ModesSettings, runner: Runner,
                 step: _Steps) -> None:
        self.config, self.root, self.st, self.runner, self.step = config, root, st, runner, step
        self.log = root / "logs" / "bench-modes.log"

    def _mode(self, mode: str, sub: str, overrides: Sequence[str],
              step: Callable[[str], None]) -> dict[str, Any]:
        _run_mode(self.config, mode, self.root / sub, self.st.cycles, overrides, self.runner,
                  self.log, step)
        return _mode_result(measured_rows(read_records(self.root / sub / "records.jsonl")))

    def local(self) -> dict[str, Any]:
        """Both modes here, one submission per cycle; their rows, statistics and ratio."""
        local: dict[str, Any] = {}
        for mode in MODES:
            local[mode] = self._mode(mode, mode, self.st.overrides, self.step)
            if len(local[mode]["cycles"]) != self.st.cycles:
                raise EnsioError(f"bench modes: {self.root / mode}/records.jsonl has "
                                 f"{len(local[mode]['cycles'])} complete cycles, "
                                 f"not {self.st.cycles}")
        local["ratio"] = _ratio(local)
        return local

    def slurm(self, wf: WorkflowSection, ntasks: int) -> dict[str, Any]:
        """Both modes through SLURM (the coupled job: ``ntasks`` = N_e × P ranks);
        the queue length before each submission."""
        from .modes_slurm import overcommit_needed, queue_length

        so = [*self.st.overrides, "workflow.backend=slurm"]
        so_online = list(so)
        if overcommit_needed(ntasks, wf.slurm.partition):
            so_online.append(
                "workflow.slurm.extra=" + json.dumps([*wf.slurm.extra, "--overcommit"]))
        others: dict[str, list[int | None]] = {"offline": [], "online": []}

        def slurm_step(mode: str) -> Callable[[str], None]:
            def f(label: str) -> None:
                others[mode].append(queue_length())
                self.step(f"SLURM {label}")
            return f

        sl: dict[str, Any] = {
            "offline": self._mode("offline", "slurm-offline", so, slurm_step("offline")),
            "online": self._mode("online", "slurm-online", so_online, slurm_step("online")),
        }
        sl["queue_length_before"] = others
        sl["commands"] = {
            "offline": _per_cycle_command(self.config, "offline", self.root / "slurm-offline",
                                          so),
            "online": _per_cycle_command(self.config, "online", self.root / "slurm-online",
                                         so_online),
        }
        sl["ratio"] = _ratio(sl)
        return sl


def _modelled(root: Path, local: Mapping[str, Any], st: ModesSettings, jobs: int,
              members: int, tasks_per_member: int) -> dict[str, Any]:
    """The queue model: replay check, inputs, and every load's statistics."""
    inputs = offline_inputs(read_records(root / "offline" / "records.jsonl"))
    online_rows = local["online"]["cycles"]
    u = st.unit if st.unit is not None else mean_std(r["total"] for r in online_rows)[0]
    if not (u > 0 and math.isfinite(u)):
        raise EnsioError(f"bench modes: model unit must be > 0 s, got {u}")
    model = replace(st.model, unit=u)
    npm = float(tasks_per_member if st.nodes_per_member is None else st.nodes_per_member)
    out: dict[str, Any] = {}
    out["replay_check"] = [{"cycle": oc.cycle, "measured_total": oc.measured_total,
                            "replay_total": replay_offline(
                                oc.members, oc.analysis, [0.0] * jobs,
                                startup=oc.startup, analysis_lag=oc.lag, io=oc.io).total}
                           for oc in inputs]
    out["offline_inputs"] = [asdict(oc) for oc in inputs]
    modelled: dict[str, Any] = {}
    for k, (name, rho) in enumerate(st.loads.items()):
        reps = model_cycles(inputs, online_rows, model, rho, jobs=jobs,
                            nodes_per_member=npm, members=members, draws=st.draws,
                            seed=st.seed, stream=k)
        entry: dict[str, Any] = {"rho": rho}
        for mode in MODES:
            entry[mode] = {"stats": stats(reps[mode]), "cycles": _per_cycle_means(reps[mode])}
        entry["ratio"] = _ratio(entry)
        modelled[name] = entry
    out["model"] = {"params": asdict(model), "unit_source": "--unit" if st.unit is not None
                    else "mean measured online time to solution per cycle",
                    "nodes": {"offline_job": npm, "online_job": members * npm},
                    "jobs": jobs, "draws": st.draws, "seed": st.seed, "loads": modelled}
    return out


def _per_cycle_means(rows: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
    by: dict[int, list[Mapping[str, float]]] = {}
    for r in rows:
        by.setdefault(int(r["cycle"]), []).append(r)
    return [{"cycle": c, **{p: statistics.fmean(r[p] for r in rs) for p in PARTS}}
            for c, rs in sorted(by.items())]
