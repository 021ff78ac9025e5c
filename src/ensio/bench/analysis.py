"""``ensio bench analysis``: the batched local analysis against the pointwise reference.

Why both kernels in one run: a speed-up only means something when both sides
see the same machine at the same moment (the benchmark machines are shared),
the same ensemble and the same observations. The members are therefore read
once (:func:`ensio.io.modes.ensemble.read_ensemble`, not timed), the observations
loaded once, and then :func:`ensio.analysis.pipeline.analyse_rows` runs with
the configured kernel and with ``kernel: pointwise`` on the very same rows,
alternating per repeat so that drift hits both alike.

What is timed: the whole ``analyse_rows`` call (H, HX exchange, quality
control, observation selection, the local analyses, relaxation, posterior
HX), between a barrier and the slowest rank's return — file I/O is not in
it. Per phase, the result's ``timings`` (seconds; maximum over ranks):
``obs`` (H, exchange, QC, per-rank selection), ``select`` (tiles and
candidate observations), ``weights`` (distances and taper), ``basis`` (the
tile's anomaly basis, :mod:`ensio.analysis.basis`), ``gemm`` (the
products ``W·Z``; one small product per point for pointwise), ``transform``
(eigendecomposition and transforms), ``update`` (the rows), ``relax``
(inflation relaxation, rotation), ``posterior`` (posterior HX). GFLOP/s of
the GEMM part is the kernel's ``gemm_flops`` (summed over ranks) over the
slowest rank's ``gemm`` seconds.

Reference rates, measured in the same run: ``dgemm_gflops`` is the DGEMM
rate of the ranks running at once (a square :data:`DGEMM_SIZE` product on
each rank with one BLAS thread, as the analysis has, best of three, summed
over ranks); ``gemm_fraction_of_peak`` is the kernel's GEMM rate over it.
Both are per core: with ``analysis.threads`` > 1 the phase seconds are
summed over the threads, so ``gflops`` is the rate of one thread.
``transform_us_per_point`` is the slowest rank's ``transform`` seconds ×
N_mpi / points: the cost of one grid point's eigendecomposition and
transform on one core.

Correctness: the two analyses must agree to ``max|a−b| / max|b| ≤ 1e-10``
(over all ranks); the figure is in the JSON as ``max_rel_diff``.
"""

from __future__ import annotations

import dataclasses
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI
from rich.table import Table

from ..config.analysis import AnalysisSection
from ..config.schema import Config, ConfigError
from ..layout.block import EnsembleBlock
from ..obs import ObsBatch
from ..stopwatch import Stopwatch
from .machine import describe_machine

__all__ = ["DGEMM_SIZE", "PHASES", "TOLERANCE", "bench_analysis", "dgemm_rate", "result_table"]

#: Phases of the ``timings`` dict, in the order of the table.
PHASES = (
    "obs",
    "select",
    "weights",
    "basis",
    "gemm",
    "transform",
    "update",
    "relax",
    "perturb",
    "posterior",
)
_NOT_SECONDS = ("_flops", "_count", "_bytes")
#: Largest accepted ``max|batched − pointwise| / max|pointwise|``.
TOLERANCE = 1e-10
#: Order of the square DGEMM that measures the machine's rate.
DGEMM_SIZE = 1024


def dgemm_rate(comm: MPI.Comm, threads: int = 1, n: int = DGEMM_SIZE) -> float:
    """Collective: GFLOP/s of an ``n``-square DGEMM on every rank at once, summed over ranks.

    Each rank uses ``threads`` BLAS threads (the analysis uses one); best of
    three after a warm-up, so it is the rate the machine gives the kernel's
    GEMM at that moment.
    """
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(comm.rank)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    best = np.inf
    with threadpool_limits(limits=threads, user_api="blas"):
        np.matmul(a, b)
        for _ in range(3):
            comm.Barrier()
            t0 = time.perf_counter()
            np.matmul(a, b)
            best = min(best, time.perf_counter() - t0)
    return float(comm.allreduce(2.0 * n**3 / best / 1e9, op=MPI.SUM))


def _timed_analysis(
    block: EnsembleBlock, obs: ObsBatch, analysis: AnalysisSection, comm: MPI.Comm
) -> tuple[float, dict[str, float], Any]:
    """Collective: one ``analyse_rows``; (slowest rank's seconds, this rank's timings, result)."""
    from ..analysis.pipeline import AnalysisSettings, analyse_rows

    sw = Stopwatch()
    comm.Barrier()
    with sw("analysis"):
        res = analyse_rows(block, obs, AnalysisSettings(analysis, cycle=0), comm)
    seconds = comm.allreduce(sw["analysis"], op=MPI.MAX)
    return float(seconds), res.timings, res


def _reduce_timings(comm: MPI.Comm, timings: dict[str, float]) -> dict[str, float]:
    """Per phase (and ``*_bytes``), the maximum over ranks; flops and counts summed."""
    names = sorted(set().union(*comm.allgather(sorted(timings))))
    out: dict[str, float] = {}
    for name in names:
        op = MPI.SUM if name.endswith(("_flops", "_count")) else MPI.MAX
        out[name] = float(comm.allreduce(timings.get(name, 0.0), op=op))
    return out


def _phases(t: dict[str, float]) -> dict[str, float]:
    """Seconds of every phase in :data:`PHASES` (0 when the kernel has none), then any other."""
    out = {p: t.get(p, 0.0) for p in PHASES}
    out.update({p: v for p, v in t.items() if p not in out and not p.endswith(_NOT_SECONDS)})
    return out


def _gflops(t: dict[str, float]) -> float | None:
    flops, sec = t.get("gemm_flops", 0.0), t.get("gemm", 0.0)
    return flops / sec / 1e9 if flops > 0 and sec > 0 else None


def _measure(
    kernels: dict[str, AnalysisSection],
    block: EnsembleBlock,
    obs: ObsBatch,
    comm: MPI.Comm,
    repeat: int,
    step: Callable[[str], None],
) -> tuple[dict[str, list[float]], dict[str, dict[str, float]], dict[str, Any]]:
    """Collective: the kernels alternately, ``repeat`` times each.

    Returns the seconds of every repeat, the timings (reduced over ranks) of
    the best repeat and the result of the first, per kernel.
    """
    samples: dict[str, list[float]] = {name: [] for name in kernels}
    best: dict[str, dict[str, float]] = {}
    first: dict[str, Any] = {}
    for r in range(1, repeat + 1):
        for name, analysis in kernels.items():
            step(f"repeat {r}/{repeat}: {analysis.kernel} kernel")
            seconds, timings, res = _timed_analysis(block, obs, analysis, comm)
            timings = _reduce_timings(comm, timings)
            if not samples[name] or seconds < min(samples[name]):
                best[name] = timings
            samples[name].append(seconds)
            first.setdefault(name, res)
    return samples, best, first


def _obs_bytes(obs: ObsBatch, members: int, n_local: int) -> int:
    """Bytes of a rank's observations: the batch's arrays and the observed ensemble."""
    arrays = (getattr(obs, f.name) for f in dataclasses.fields(obs))
    return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray)) + 8 * members * n_local


def _peak_memory(
    kernels: dict[str, AnalysisSection], block: EnsembleBlock, obs: ObsBatch, comm: MPI.Comm
) -> dict[str, Any]:
    """Collective: peak memory per rank of one untimed ``analyse_rows`` per kernel.

    Why a separate run: tracemalloc slows allocation-heavy code, so it stays
    out of the timed repeats. The peak counts what the call allocates (numpy
    reports its buffers to tracemalloc), not the block and observations that
    exist before it; the budget is the issue's "ensemble block + observations
    + one tile's work arrays" (the kernel's largest tile, ``tile_work_bytes``).
    Per kernel, the maximum over ranks of the peak, the budget and their ratio.
    """
    out: dict[str, Any] = {}
    for name, analysis in kernels.items():
        comm.Barrier()
        tracemalloc.start()
        _, timings, res = _timed_analysis(block, obs, analysis, comm)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        work = int(timings.get("tile_work_bytes", 0))
        budget = block.data.nbytes + _obs_bytes(obs, block.data.shape[0], res.n_local_obs) + work
        out[name] = {
            "peak_bytes_per_rank": int(comm.allreduce(peak, op=MPI.MAX)),
            "budget_bytes": int(comm.allreduce(budget, op=MPI.MAX)),
            "tile_work_bytes": int(comm.allreduce(work, op=MPI.MAX)),
            "block_bytes": int(comm.allreduce(block.data.nbytes, op=MPI.MAX)),
            "peak_to_budget": float(comm.allreduce(peak / budget, op=MPI.MAX)),
        }
    return out


def _kernel_figures(ours: dict[str, float], ref: dict[str, float]) -> dict[str, Any]:
    """Phases, GEMM figures and reduced-basis counts of both kernels' best repeats."""
    reduced = ours.get("reduced_tiles_count", 0)
    return {
        "phases": _phases(ours),
        "pointwise_phases": _phases(ref),
        "gemm_flops": ours.get("gemm_flops", 0.0),
        "tiles": int(ours.get("tiles_count", 0)),
        "reduced_tiles": int(reduced),
        "mean_basis_rank": ours.get("basis_rank_count", 0.0) / reduced if reduced else None,
        "pointwise_gemm_flops": ref.get("gemm_flops", 0.0),
        "gflops": _gflops(ours),
        "pointwise_gflops": _gflops(ref),
    }


def _rate_figures(ours: dict[str, float], dgemm: float, n_mpi: int, points: int) -> dict:
    """Transform cost per point and the GEMM rate against the machine's DGEMM rate."""
    gf = _gflops(ours)
    return {
        "transform_us_per_point": ours.get("transform", 0.0) * n_mpi / points * 1e6
        if points
        else None,
        "dgemm_gflops": dgemm,
        "gemm_fraction_of_peak": gf / dgemm if gf is not None and dgemm > 0 else None,
    }


def bench_analysis(
    config: Config,
    comm: MPI.Comm,
    repeat: int = 1,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Collective: time the configured analysis kernel and the pointwise reference.

    Parameters
    ----------
    config : Config
        Needs ``observations`` and an ``analysis`` section (a local filter for
        a meaningful comparison; a global filter has no kernel choice and
        gives a speed-up of about 1).
    comm : MPI.Comm
        Filter communicator (``MPI.COMM_SELF`` for a serial run).
    repeat : int
        Repeats of each kernel (alternating); the best (minimum) time is used.
    on_step : callable, optional
        Called on rank 0 with a label before each measurement.

    Returns
    -------
    dict
        JSON-serialisable, identical on every rank: ``seconds`` (configured
        kernel), ``pointwise_seconds``, ``speedup``, ``phases`` and
        ``pointwise_phases`` (seconds per phase of the best repeat),
        ``gflops`` / ``pointwise_gflops`` (GEMM part), ``dgemm_gflops``,
        ``gemm_fraction_of_peak``, ``transform_us_per_point``, ``max_rel_diff``,
        ``peak_bytes_per_rank``, ``budget_bytes``, ``tile_work_bytes``,
        ``block_bytes`` and ``peak_to_budget`` (configured kernel; the same
        for the reference in ``pointwise_memory``),
        ``agree``, the case (``n_mpi``, ``points``, ``observations``,
        ``members``, …) and ``machine``.
    """
    # Over ~80 lines only through its docstring (every parameter documented); the body is
    # about 64 lines, kept whole so it reads top to bottom.
    from ..analysis.eigensolver import warm_up
    from ..analysis.inputs import load_observations, observation_sources
    from ..io.modes.ensemble import read_ensemble

    if repeat < 1:
        raise ValueError(f"--repeat must be at least 1, got {repeat}")
    if config.analysis is None:
        raise ConfigError("analysis: section required (at least analysis.filter)")
    step = on_step if (on_step is not None and comm.rank == 0) else (lambda _label: None)
    step("reading members (not timed)")
    block = read_ensemble(config, comm)
    layout = block.layout
    if not config.observations:
        raise ConfigError("observations: at least one observation file is needed for an analysis")
    obs_files = observation_sources(config.observations, config.resolve)
    obs = load_observations(obs_files, config.analysis, block, comm)
    step("loading the compiled eigensolver (not timed)")
    warm_up()
    kernels = {
        "configured": config.analysis,
        "pointwise": dataclasses.replace(config.analysis, kernel="pointwise"),
    }
    samples, best, first = _measure(kernels, block, obs, comm, repeat, step)
    step("peak memory, one untimed run per kernel (tracemalloc)")
    memory = _peak_memory(kernels, block, obs, comm)
    step("DGEMM rate of the machine")
    dgemm = dgemm_rate(comm)
    a, b = first["configured"].ensemble, first["pointwise"].ensemble
    diff = float(comm.allreduce(float(np.abs(a - b).max(initial=0.0)), op=MPI.MAX))
    scale = float(comm.allreduce(float(np.abs(b).max(initial=0.0)), op=MPI.MAX))
    max_rel = diff / scale if scale > 0 else diff
    seconds, pw_seconds = min(samples["configured"]), min(samples["pointwise"])
    cfg = config.analysis
    loc = cfg.localization
    labels = {
        "configured": "configured" if cfg.kernel == "pointwise" else cfg.kernel,
        "pointwise": "pointwise",
    }
    machine, stamp = comm.bcast(
        (describe_machine(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        if comm.rank == 0
        else None,
        root=0,
    )
    return {
        "benchmark": "analysis",
        "seconds": seconds,
        "pointwise_seconds": pw_seconds,
        "speedup": pw_seconds / seconds if seconds > 0 else None,
        "kernel": cfg.kernel,
        **_kernel_figures(best["configured"], best["pointwise"]),
        **_rate_figures(best["configured"], dgemm, comm.size, int(layout.n_rows)),
        **memory["configured"],
        "pointwise_memory": memory["pointwise"],
        "max_rel_diff": max_rel,
        "tolerance": TOLERANCE,
        "agree": bool(max_rel <= TOLERANCE),
        "n_mpi": comm.size,
        "points": int(layout.n_rows),
        "observations": int(first["configured"].qc.total),
        "accepted_observations": int(first["configured"].qc.accepted),
        "local_observations_max": int(comm.allreduce(first["configured"].n_local_obs, op=MPI.MAX)),
        "members": int(block.data.shape[0]),
        "variables": [v.name for v in config.ensemble.variables],
        "filter": cfg.filter,
        "localization": dataclasses.asdict(loc) if loc is not None else None,
        "tile_points": cfg.tile_points,
        "threads": cfg.threads,
        "repeat": repeat,
        "statistic": "best (minimum time) of the repeats, per kernel; seconds = slowest rank",
        "samples_seconds": {labels[n]: s for n, s in samples.items()},
        "machine": machine,
        "timestamp": stamp,
    }


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def result_table(res: dict[str, Any]) -> Table:
    """A rich table of a :func:`bench_analysis` result: seconds per phase, both kernels."""
    title = (
        f"ensio bench analysis: {res['filter']}, {res['points']} points, "
        f"{res['observations']} observations, {res['members']} members, "
        f"N_mpi = {res['n_mpi']}"
    )
    table = Table(title=title)
    table.add_column("phase")
    table.add_column(f"{res['kernel']} s", justify="right")
    table.add_column("pointwise s", justify="right")
    table.add_column("ratio", justify="right")
    ours, ref = res["phases"], res["pointwise_phases"]
    for p in PHASES:
        if not (ours.get(p) or ref.get(p)):
            continue
        a, b = ours.get(p, 0.0), ref.get(p, 0.0)
        table.add_row(p, _fmt(a), _fmt(b), _fmt(b / a if a > 0 and b > 0 else None, ".1f"))
    table.add_row(
        "GEMM GFLOP/s", _fmt(res["gflops"], ".2f"), _fmt(res["pointwise_gflops"], ".2f"), ""
    )
    frac = res.get("gemm_fraction_of_peak")
    table.add_row("DGEMM GFLOP/s (machine)", _fmt(res.get("dgemm_gflops"), ".2f"), "", "")
    table.add_row("GEMM / DGEMM", "–" if frac is None else f"{100 * frac:.0f} %", "", "")
    table.add_row("transform µs/point", _fmt(res.get("transform_us_per_point"), ".1f"), "", "")
    if "peak_bytes_per_rank" in res:
        mib, ref = 2.0**20, res.get("pointwise_memory", {})
        table.add_row(
            "peak MiB/rank",
            _fmt(res["peak_bytes_per_rank"] / mib, ".1f"),
            _fmt(ref["peak_bytes_per_rank"] / mib if ref else None, ".1f"),
            "",
        )
        table.add_row(
            "budget MiB (block+obs+tile)",
            _fmt(res["budget_bytes"] / mib, ".1f"),
            _fmt(ref["budget_bytes"] / mib if ref else None, ".1f"),
            "",
        )
        table.add_row(
            "peak / budget",
            _fmt(res["peak_to_budget"], ".2f"),
            _fmt(ref.get("peak_to_budget"), ".2f"),
            "",
        )
    table.add_row(
        "[bold]total[/]",
        f"[bold]{res['seconds']:.3f}[/]",
        f"[bold]{res['pointwise_seconds']:.3f}[/]",
        f"[bold]{_fmt(res['speedup'], '.2f')}×[/]",
    )
    agree = "[green]yes[/]" if res["agree"] else "[bold red]NO[/]"
    basis = ""
    if res.get("tiles"):
        basis = f"{res['reduced_tiles']} of {res['tiles']} tiles in a reduced anomaly basis"
        if res.get("mean_basis_rank") is not None:
            basis += f" (mean size {res['mean_basis_rank']:.1f})"
        basis += "; "
    table.caption = (
        basis + f"max relative difference {res['max_rel_diff']:.2e} "
        f"(≤ {res['tolerance']:.0e}: {agree}); best of {res['repeat']}; "
        "seconds = slowest rank, file I/O excluded"
    )
    return table
