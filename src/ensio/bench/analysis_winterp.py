"""``ensio bench analysis --weight-stride K``: weight interpolation against the exact analysis.

Why in one run: as for the kernel comparison (:mod:`ensio.bench.analysis`),
a speed-up means something only when both sides see the same machine at the
same moment, the same rows and the same observations. The members are read
once, the observations loaded once (with the selection radius of the
largest stride, so every run has what it needs), and
:func:`~ensio.analysis.pipeline.analyse_rows` runs with
``weight_interpolation.stride: 1`` (the exact analysis, the configured
kernel) and with every requested stride, alternating per repeat.

Reported per stride: the seconds (slowest rank) and the speed-up over
stride 1, in total and per phase (``update`` is the bilinear
interpolation of the coarse transforms and their application), and
``increment_rel_rms`` — the RMS over all rows and members of the difference
of the analysis increments to the exact ones, relative to the RMS of the
exact increments.

Speed is measured on locally full-rank members
(``ensio synth --perturbation 0.1``): the synthetic members otherwise differ
by a phase shift only and the exact kernel's reduced basis makes them cheap.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI
from rich.table import Table

from ..config.analysis import WeightInterpolationSection
from ..config.schema import Config, ConfigError
from .analysis import PHASES, _measure, _peak_memory, _phases
from .machine import describe_machine

__all__ = ["bench_weight_interpolation", "winterp_table"]

def bench_weight_interpolation(
    config: Config,
    comm: MPI.Comm,
    strides: Sequence[int],
    repeat: int = 1,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Collective: time the exact analysis and its weight-interpolated versions.

    Returns
    -------
    dict
        JSON-serialisable, identical on every rank: ``seconds`` and ``phases``
        (stride 1), ``strides`` (per stride: ``seconds``, ``speedup``,
        ``phases``, ``phase_speedup``, ``increment_rel_rms``, ``memory``: peak
        bytes per rank of one untimed run against the issue's budget, as
        :func:`~ensio.bench.analysis.bench_analysis` reports them),
        ``increment_rel_rms`` and ``speedup`` (stride → value), the case and
        ``machine``.
    """
    from ..analysis.eigensolver import warm_up
    from ..analysis.inputs import load_observations, observation_sources
    from ..analysis.winterp import warm_up as warm_up_winterp
    from ..io.modes.ensemble import read_ensemble

    strides = sorted({int(k) for k in strides} - {1})
    if not strides or strides[0] < 1:
        raise ValueError(f"--weight-stride: give integers >= 2, got {list(strides)}")
    if config.analysis is None or config.analysis.localization is None:
        raise ConfigError("analysis.localization: weight interpolation needs a local filter")
    if not config.observations:
        raise ConfigError("observations: at least one observation file is needed for an analysis")
    step = on_step if (on_step is not None and comm.rank == 0) else (lambda _label: None)
    step("reading members (not timed)")
    block = read_ensemble(config, comm)
    runs = {
        str(k): dataclasses.replace(
            config.analysis, weight_interpolation=WeightInterpolationSection(k)
        )
        for k in [1, *strides]
    }
    files = observation_sources(config.observations, config.resolve)
    obs = load_observations(files, runs[str(strides[-1])], block, comm)
    step("loading the compiled eigensolver (not timed)")
    warm_up()
    warm_up_winterp()
    samples, best, first = _measure(runs, block, obs, comm, repeat, step)
    step("peak memory, one untimed run per stride (tracemalloc)")
    memory = _peak_memory({str(k): runs[str(k)] for k in strides}, block, obs, comm)
    prior = np.asarray(block.data, dtype=np.float64)
    exact_inc = first["1"].ensemble - prior
    norm = comm.allreduce(float(np.nansum(exact_inc**2)), op=MPI.SUM)
    t1 = min(samples["1"])
    per: dict[str, dict[str, Any]] = {}
    for k in map(str, strides):
        diff = comm.allreduce(float(np.nansum((first[k].ensemble - prior - exact_inc) ** 2)),
                              op=MPI.SUM)  # fmt: skip
        ph, ph1 = _phases(best[k]), _phases(best["1"])
        per[k] = {
            "seconds": min(samples[k]),
            "speedup": t1 / min(samples[k]),
            "phases": ph,
            "phase_speedup": {p: ph1.get(p, 0.0) / v if v > 0 else None for p, v in ph.items()},
            "increment_rel_rms": float(np.sqrt(diff / norm)) if norm > 0 else None,
            "memory": memory[k],
        }
    machine, stamp = comm.bcast(
        (describe_machine(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        if comm.rank == 0 else None, root=0,
    )  # fmt: skip
    cfg = config.analysis
    return {
        "benchmark": "analysis-weight-interpolation",
        "seconds": t1,
        "phases": _phases(best["1"]),
        "strides": per,
        "speedup": {k: v["speedup"] for k, v in per.items()},
        "increment_rel_rms": {k: v["increment_rel_rms"] for k, v in per.items()},
        "kernel": cfg.kernel,
        "filter": cfg.filter,
        "localization": dataclasses.asdict(cfg.localization),
        "n_mpi": comm.size,
        "points": int(block.layout.n_rows),
        "members": int(block.data.shape[0]),
        "observations": int(first["1"].qc.total),
        "repeat": repeat,
        "samples_seconds": {k: s for k, s in samples.items()},
        "statistic": "best (minimum time) of the repeats, per stride; seconds = slowest rank",
        "machine": machine,
        "timestamp": stamp,
    }


def winterp_table(res: dict[str, Any]) -> Table:
    """A rich table of :func:`bench_weight_interpolation`: seconds per phase per stride."""
    strides = list(res["strides"])
    table = Table(
        title=f"ensio bench analysis, weight interpolation: {res['filter']}, {res['points']} "
        f"points, {res['observations']} observations, {res['members']} members, "
        f"N_mpi = {res['n_mpi']}"
    )
    table.add_column("phase")
    table.add_column("exact s", justify="right")
    for k in strides:
        table.add_column(f"k={k} s", justify="right")
        table.add_column(f"k={k} ×", justify="right")
    names = [p for p in PHASES if res["phases"].get(p)
             or any(res["strides"][k]["phases"].get(p) for k in strides)]  # fmt: skip
    for p in names:
        row = [p, f"{res['phases'].get(p, 0.0):.3f}"]
        for k in strides:
            s = res["strides"][k]
            sp = s["phase_speedup"].get(p)
            row += [f"{s['phases'].get(p, 0.0):.3f}", "–" if not sp else f"{sp:.1f}"]
        table.add_row(*row)
    total = ["[bold]total[/]", f"[bold]{res['seconds']:.3f}[/]"]
    rms = ["increment rel. RMS", ""]
    for k in strides:
        s = res["strides"][k]
        total += [f"[bold]{s['seconds']:.3f}[/]", f"[bold]{s['speedup']:.2f}×[/]"]
        r = s["increment_rel_rms"]
        rms += ["–" if r is None else f"{r:.2e}", ""]
    table.add_row(*total)
    table.add_row(*rms)
    mem = ["peak / budget (MiB)", ""]
    for k in strides:
        m, mib = res["strides"][k].get("memory"), 2.0**20
        text = "–" if not m else (f"{m['peak_to_budget']:.2f} ({m['peak_bytes_per_rank'] / mib:.0f}"
                                  f" / {m['budget_bytes'] / mib:.0f})")  # fmt: skip
        mem += [text, ""]
    table.add_row(*mem)
    table.caption = f"best of {res['repeat']}; seconds = slowest rank, file I/O excluded"
    return table
