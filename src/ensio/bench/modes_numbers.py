"""Records → numbers for ``ensio bench modes`` (pure functions, no I/O).

Separate from :mod:`ensio.bench.modes` (which runs the experiments) so the
arithmetic of the comparison — per-cycle rows from the records, the inputs of
the offline replay, the modelled cycles and their statistics — can be tested
on hand-built records and imported by the output module without cycles.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..workflow.records import cycle_summaries, mean_std
from .queueing import QueueModel, replay_offline, replay_online, sample_waits

__all__ = [
    "MODES",
    "PARTS",
    "OfflineCycle",
    "measured_rows",
    "model_cycles",
    "offline_inputs",
    "stats",
]

PARTS = ("total", "queuing", "running", "io")
MODES = ("offline", "online")



# --------------------------------------------------------------------------- #
# records → numbers (pure)
# --------------------------------------------------------------------------- #


def measured_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Per cycle: total, queuing, running and I/O seconds (``ensio report``'s meaning).

    Parameters
    ----------
    records : iterable of dict
        Records of one run directory.

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
        queuing = max(0.0, s.first_start - sub)
        total = s.last_finish - sub
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
