"""``ensio example veros``: the whole OSSE with the unmodified Veros ``acc`` setup.

Under ``DIR``::

    setup/acc.py                 veros copy-setup acc (unmodified)
    spinup/                      spin-up runs, their logs and restarts, acc.snapshot.nc
    grid.nc                      xt, yt, zt, maskT of the model (ensemble.grid)
    init/memMMM.h5               the initial ensemble (Veros restarts)
    truth/truth_CCC.h5           the truth at every analysis time (000: initial)
    obs/{sst,prof_temp,prof_salt}_CCC.nc   synthetic observations of cycle C
    cycle.yaml                   the ensio config (examples/veros/cycle.yaml filled in)
    assim/                       ensio cycle's run directory (cycle_CCC/forecast, analysis,
                                 diag files, records.jsonl, logs/)
    free/cycle_CCC/memMMM.h5     the free ensemble: the same members, no analysis
    plots/*.png                  figures (:mod:`.plots`)
    osse.json                    the numbers (or --json FILE)

Every step is skipped when its results exist, and ``ensio cycle`` resumes by itself, so
the same command continues an interrupted experiment. The analysis run is ``ensio cycle``
started as a command (as a user would), each member a job ``python -m
ensio.models.veros.run acc.py {analysis} {forecast} --days D`` (:mod:`.run`); the free
ensemble runs the same command from the same initial members, ``jobs`` at a time.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ...durable import atomic_write
from ...errors import ConfigError, EnsioError
from .observe import ObsPlan, read_state, write_cycle_obs
from .plots import plot_increment, plot_innovations, plot_rmse
from .prepare import copy_setup, make_ensemble, run_truth, spin_up, write_grid
from .run import VerosFailed
from .verify import diag_stats, ensemble_stats, second_half, timing_split

__all__ = ["OsseOptions", "default_template", "run_osse"]

Log = Callable[[str], None]
KINDS = ("sst", "prof_temp", "prof_salt")


@dataclass(frozen=True)
class OsseOptions:
    """The experiment's size and its fixed choices (see ``ensio example veros --help``)."""

    members: int = 16
    cycles: int = 20
    days: float = 5.0
    spinup_days: float = 360.0
    spacing_days: float = 6.0
    seed: int = 1
    jobs: int = 2
    amp_temp: float = 0.5
    amp_salt: float = 0.1
    smooth: tuple[float, float, float] = (2.5, 2.5, 1.5)
    obs: ObsPlan = field(default_factory=ObsPlan)
    template: Path | None = None
    free: bool = True

    def __post_init__(self) -> None:
        for key, value, low in (("--members", self.members, 2), ("--cycles", self.cycles, 1),
                                ("--jobs", self.jobs, 1)):
            if value < low:
                raise ConfigError(f"{key}: must be at least {low}, got {value}")
        for key, value in (("--days", self.days), ("--spacing-days", self.spacing_days)):
            if not value > 0 or not math.isfinite(value) or (value * 2) % 1:
                raise ConfigError(f"{key}: a positive multiple of half a day (acc's time "
                                  f"step), got {value}")
        if (self.spacing_days * 2) % 3:
            raise ConfigError(f"--spacing-days: a multiple of 1.5 days (3 time steps), so every "
                              f"member is at the same time level core/tau (Veros rotates its 3 "
                              f"levels every step), got {self.spacing_days}")
        if self.spinup_days < 10:
            raise ConfigError(f"--spinup-days: at least 10 (acc writes its first snapshot, "
                              f"which gives the grid, at day 10), got {self.spinup_days}")


def default_template() -> Path:
    """``examples/veros/cycle.yaml`` of the source tree this package runs from."""
    return Path(__file__).resolve().parents[4] / "examples" / "veros" / "cycle.yaml"


def _write_config(root: Path, opts: OsseOptions, setup: Path) -> Path:
    """``DIR/cycle.yaml``: the template with this experiment's paths and sizes."""
    template = opts.template or default_template()
    if not template.exists():
        raise ConfigError(f"--template: {template} not found (the example's config template; "
                          "give --template when ensio is not run from its source tree)")
    raw = yaml.safe_load(template.read_text()) or {}
    if not isinstance(raw, dict) or not {"ensemble", "analysis", "workflow"} <= raw.keys():
        raise ConfigError(f"--template: {template}: needs ensemble, analysis and workflow")
    raw["ensemble"]["size"] = opts.members
    raw["ensemble"]["grid"] = str(root / "grid.nc")
    raw["observations"] = [{"file": str(root / "obs" / f"{k}_{{cycle:03d}}.nc")} for k in KINDS]
    wf = raw["workflow"]
    wf["initial"] = str(root / "init" / "mem{member:03d}.h5")
    wf["jobs"] = opts.jobs
    wf["member_command"] = (f"{sys.executable} -m ensio.models.veros.run {setup} {{analysis}} "
                            f"{{forecast}} --days {opts.days:g}")
    path = root / "cycle.yaml"
    atomic_write(path, "# written by ensio example veros from " + str(template) + "\n"
                 + yaml.safe_dump(raw, sort_keys=False))
    return path


def _run_cycle(config: Path, workdir: Path, cycles: int, log: Log) -> None:
    """``ensio cycle CONFIG --workdir W --cycles K``, its output passed on line by line."""
    argv = [sys.executable, "-m", "ensio", "cycle", str(config), "--workdir", str(workdir),
            "--cycles", str(cycles)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip())
            log(f"  ensio cycle: {line.rstrip()}")
    if proc.returncode != 0:
        last = next((ln for ln in reversed(lines) if ln.strip()), "(no output)")
        raise EnsioError(f"ensio cycle {config} failed (exit {proc.returncode}): {last}")


def _free_member(setup: Path, init: Path, root: Path, m: int, opts: OsseOptions) -> None:
    """Member ``m`` of the free ensemble: ``cycles`` chained forecasts, no analysis."""
    prev = init
    for c in range(1, opts.cycles + 1):
        out = root / "free" / f"cycle_{c:03d}" / f"mem{m:03d}.h5"
        if not out.exists():
            work = root / "free" / "work" / f"mem{m:03d}"
            work.mkdir(parents=True, exist_ok=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(f".{out.name}.tmp")  # a killed run leaves no output behind
            proc = subprocess.run([sys.executable, "-m", "ensio.models.veros.run", str(setup),
                                   str(prev), str(tmp), "--days", f"{opts.days:g}"],
                                  cwd=work, capture_output=True, text=True)
            if proc.returncode != 0:
                raise VerosFailed((proc.stderr.strip().splitlines() or ["failed"])[-1])
            tmp.replace(out)
        prev = out


def _run_free(setup: Path, inits: tuple[Path, ...], root: Path, opts: OsseOptions,
              log: Log) -> None:
    log(f"free ensemble: {opts.members} members × {opts.cycles} cycles, {opts.jobs} at a time")
    with ThreadPoolExecutor(opts.jobs) as pool:
        futures = [pool.submit(_free_member, setup, init, root, m, opts)
                   for m, init in enumerate(inits, start=1)]
        for m, f in enumerate(futures, start=1):
            f.result()
            log(f"  free member {m} done")


def _obs_counts(root: Path, c: int) -> list[tuple[str, int]]:
    import netCDF4

    out = []
    for k in KINDS:
        with netCDF4.Dataset(root / "obs" / f"{k}_{c:03d}.nc") as ds:
            out.append((k, len(ds.dimensions["obs"])))
    return out


def _members(pattern: Path, n: int) -> list[Path]:
    return [Path(str(pattern).format(member=m)) for m in range(1, n + 1)]


def _mean_sst(paths: list[Path]) -> np.ndarray:
    return np.mean([read_state(p, ("temp",))["temp"][..., -1] for p in paths], axis=0)


def run_osse(root: Path, opts: OsseOptions, json_path: Path | None, log: Log = print,
             ) -> dict[str, Any]:
    """Run (or continue) the whole experiment under ``root``; returns the JSON report."""
    import netCDF4

    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    setup = copy_setup(root)
    states, snapshot = spin_up(setup, root, opts.spinup_days, opts.members + 1,
                               opts.spacing_days, log)
    ocean = write_grid(snapshot, root / "grid.nc")
    with netCDF4.Dataset(root / "grid.nc") as g:
        xt, yt, zt = (np.asarray(g[n][:], float) for n in ("xt", "yt", "zt"))
    amp = {"temp": opts.amp_temp, "salt": opts.amp_salt}
    truth0, inits = make_ensemble(states, root, opts.members, opts.seed, amp, opts.smooth,
                                  ocean, log)
    truths = run_truth(setup, truth0, root, opts.cycles, opts.days, log)
    (root / "obs").mkdir(exist_ok=True)
    for c, truth in enumerate(truths, start=1):
        write_cycle_obs(truth, root / "obs", c, opts.obs, opts.seed, xt, yt, zt, ocean)
    config = _write_config(root, opts, setup)
    log(f"analysis: ensio cycle {config} --workdir {root / 'assim'} --cycles {opts.cycles}")
    _run_cycle(config, root / "assim", opts.cycles, log)
    if opts.free:
        _run_free(setup, inits, root, opts, log)
    report = _report(root, opts, truths, ocean, xt, yt, zt)
    text = json.dumps(report, indent=1, allow_nan=True)
    target = json_path or root / "osse.json"
    atomic_write(target, text + "\n")
    log(f"report: {target}; plots: {root / 'plots'}")
    return report


def _report(root: Path, opts: OsseOptions, truths: list[Path], ocean: np.ndarray,
            xt: np.ndarray, yt: np.ndarray, zt: np.ndarray) -> dict[str, Any]:
    """The JSON report and the plots, from the files of a finished experiment."""
    assim = root / "assim"
    timing = timing_split(assim / "records.jsonl")
    cycles: list[dict[str, Any]] = []
    samples: dict[str, dict[str, list[np.ndarray]]] = {}
    for c, truth in enumerate(truths, start=1):
        cdir = assim / f"cycle_{c:03d}"
        entry: dict[str, Any] = {"cycle": c, "day": c * opts.days}
        entry["forecast"] = ensemble_stats(_members(cdir / "forecast" / "mem{member:03d}.nc",
                                                    opts.members), truth, ocean)
        entry["analysis"] = ensemble_stats(_members(cdir / "analysis" / "mem{member:03d}.nc",
                                                    opts.members), truth, ocean)
        if opts.free:
            entry["free"] = ensemble_stats(_members(root / "free" / f"cycle_{c:03d}" /
                                                    "mem{member:03d}.h5", opts.members),
                                           truth, ocean)
        kinds = _obs_counts(root, c)
        entry["observations"] = dict(kinds)
        entry["innovations"], values = diag_stats(cdir, kinds)
        errors = {"sst": opts.obs.err_sst, "prof_temp": opts.obs.err_temp,
                  "prof_salt": opts.obs.err_salt}
        for k, (label, _) in enumerate(kinds):
            if values:
                sel = values["kind"] == k
                s = samples.setdefault(label, {"omb": [], "oma": []})
                s["omb"].append(values["omb"][sel] / errors[label])
                s["oma"].append(values["oma"][sel] / errors[label])
        entry["timing"] = timing.get(c, {})
        cycles.append(entry)
    half = list(second_half(opts.cycles))
    out: dict[str, Any] = {}
    for v in ("temp", "salt"):
        def mean(run: str, what: str, v: str = v) -> float:
            return float(np.mean([cycles[c - 1][run][v][what] for c in half]))
        out[f"rmse_analysis_{v}"] = mean("analysis", "rmse")
        out[f"rmse_forecast_{v}"] = mean("forecast", "rmse")
        if opts.free:
            out[f"rmse_free_{v}"] = mean("free", "rmse")
            out[f"rmse_ratio_{v}"] = out[f"rmse_analysis_{v}"] / out[f"rmse_free_{v}"]
        out[f"spread_ratio_{v}"] = mean("analysis", "spread") / out[f"rmse_analysis_{v}"]
        out[f"spread_ratio_forecast_{v}"] = mean("forecast", "spread") / out[f"rmse_forecast_{v}"]
    out["members"] = opts.members
    config = yaml.safe_load((root / "cycle.yaml").read_text()) or {}
    out["analysis"] = config.get("analysis")  # the settings these numbers belong to
    out["averaged_cycles"] = [half[0], half[-1]]
    tot = {k: math.fsum(e["timing"].get(k, 0.0) for e in cycles)
           for k in ("cycle", "members", "queue_wait", "io", "analysis")}
    out["timing_total"] = tot
    out["io_analysis_fraction"] = ((tot["io"] + tot["analysis"]) / tot["cycle"]
                                   if tot["cycle"] else math.nan)
    out["options"] = {k: (str(v) if isinstance(v, Path) else v)
                      for k, v in asdict(opts).items()}
    out["cycles"] = cycles
    plots = root / "plots"
    plots.mkdir(exist_ok=True)
    if opts.free:
        plot_rmse(cycles, plots / "rmse_spread.png")
    last = assim / f"cycle_{opts.cycles:03d}"
    inc = (_mean_sst(_members(last / "analysis" / "mem{member:03d}.nc", opts.members))
           - _mean_sst(_members(last / "forecast" / "mem{member:03d}.nc", opts.members)))
    inc = np.where(ocean[..., -1], inc, np.nan)
    import netCDF4

    pos = {}
    for k in ("sst", "prof_temp"):
        with netCDF4.Dataset(root / "obs" / f"{k}_{opts.cycles:03d}.nc") as ds:
            pos[k] = (np.asarray(ds["lon"][:]), np.asarray(ds["lat"][:]))
    plot_increment(xt, yt, inc, pos["sst"], pos["prof_temp"], opts.cycles,
                   plots / "sst_increment.png")
    if samples:
        plot_innovations({k: {w: np.concatenate(v[w]) for w in v} for k, v in samples.items()},
                         plots / "omb_oma.png")
    return out
