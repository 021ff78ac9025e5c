"""Verification of the OSSE against its truth, and the numbers of its JSON report.

* :func:`ensemble_stats`: RMSE of the ensemble mean against the truth and the ensemble
  spread (square root of the mean ensemble variance, ddof 1), over the interior ocean
  points, all levels, per variable — what the plots show and ``rmse_*``/``spread_*`` of the
  JSON are made of.
* :func:`diag_stats`: count, mean and RMS of O−B and O−A per observation kind of a cycle
  from the analysis's observation-space diagnostics (a netCDF file with ``diag`` in its name
  in the cycle's directory, variables ``omb``, ``oma``, ``qc`` and ``ids`` per observation).
* :func:`timing_split`: each cycle's wall time split into member runs, queue wait,
  ensemble I/O and analysis, from ``ensio cycle``'s ``records.jsonl`` (one JSON object per
  line: member and analysis task records with ``submitted``, ``started``, ``ended``,
  ``finished``, and the analysis's reported ``io_seconds``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .observe import read_state

__all__ = ["diag_stats", "ensemble_stats", "second_half", "timing_split"]

VARIABLES = ("temp", "salt")


def ensemble_stats(members: Sequence[Path], truth: Path,
                   ocean: np.ndarray) -> dict[str, dict[str, float]]:
    """``{var: {"rmse", "spread"}}`` of ``members`` against ``truth`` (see the module doc)."""
    t = read_state(truth, VARIABLES)
    fields = [read_state(p, VARIABLES) for p in members]
    out = {}
    for v in VARIABLES:
        ens = np.stack([f[v][ocean] for f in fields])  # (members, ocean points)
        err = ens.mean(axis=0) - t[v][ocean]
        out[v] = {"rmse": float(np.sqrt(np.mean(err**2))),
                  "spread": float(np.sqrt(np.mean(ens.var(axis=0, ddof=1))))}
    return out


def second_half(cycles: int) -> range:
    """The cycles averaged over for the headline numbers: the second half (11–20 of 20)."""
    return range(cycles // 2 + 1, cycles + 1)


def _stats(x: np.ndarray) -> dict[str, float | int]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"count": 0, "mean": math.nan, "rms": math.nan}
    return {"count": int(x.size), "mean": float(x.mean()), "rms": float(np.sqrt(np.mean(x**2)))}


def diag_stats(cycle_dir: Path, kinds: Sequence[tuple[str, int]],
               ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """O−B/O−A statistics of the cycle's diag file, per observation kind and overall.

    ``kinds`` is (label, count) of the cycle's observation files in config order: the
    analysis numbers observations file after file, so the diag file's ``ids`` (else the
    position) tells the kind. Only accepted observations count (``qc`` 0). Returns also
    the accepted O−B and O−A values (for the histograms); ``({}, {})`` when the cycle has no
    diag file.
    """
    import netCDF4

    files = sorted(p for p in cycle_dir.rglob("*diag*.nc"))
    if not files:
        return {}, {}
    with netCDF4.Dataset(files[0]) as ds:
        ds.set_auto_mask(True)
        if "omb" not in ds.variables or "oma" not in ds.variables:
            return {}, {}
        omb = np.ma.filled(np.ma.asarray(ds["omb"][:], dtype=float), np.nan).ravel()
        oma = np.ma.filled(np.ma.asarray(ds["oma"][:], dtype=float), np.nan).ravel()
        ids = (np.ma.filled(ds["ids"][:], -1).astype(np.int64).ravel() if "ids" in ds.variables
               else np.arange(omb.size))
        ok = (np.ma.filled(ds["qc"][:], 1).ravel() == 0 if "qc" in ds.variables
              else np.ones(omb.size, bool))
    edges = np.cumsum([0] + [n for _, n in kinds])
    kind = np.searchsorted(edges, ids, side="right") - 1
    ok &= np.isfinite(omb) & np.isfinite(oma)
    out: dict[str, Any] = {"all": {"omb": _stats(omb[ok]), "oma": _stats(oma[ok])}}
    for k, (label, _) in enumerate(kinds):
        sel = ok & (kind == k)
        out[label] = {"omb": _stats(omb[sel]), "oma": _stats(oma[sel])}
    return out, {"omb": omb[ok], "oma": oma[ok], "kind": kind[ok]}


def _analysis_phases(logs: Path, cycle: int) -> dict[str, float]:
    """The last ``timing:`` line ``ensio analyse`` printed into the cycle's job logs."""
    found: dict[str, float] = {}
    for log in sorted(logs.glob(f"ensio-c{cycle:03d}*")):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("timing: "):
                words = line[len("timing: "):].split()
                found = {words[i]: float(words[i + 1]) for i in range(0, len(words) - 2, 3)}
    return found


def timing_split(records: Path) -> dict[int, dict[str, float]]:
    """Per cycle: ``cycle``, ``members``, ``queue_wait``, ``io``, ``analysis`` seconds.

    ``cycle`` = last task finished − first job submitted; ``members`` = wall time from the
    first member start to the last member end; ``queue_wait`` = first task start − first
    submission; ``io`` = the analysis task's reported ensemble I/O seconds (read, write,
    products); ``analysis`` = the analysis task's run time minus ``io`` (start-up, observation
    reading, the filter). Tasks that did not finish as ``done`` are left out. From the
    analysis's own ``timing:`` line in the job logs (``logs/`` beside ``records``), also
    ``analysis_phases`` (its read, obs, analysis, diagnostics, write, products, record, total)
    and ``analysis_startup`` (task run time − its total: interpreter and imports).
    """
    by_cycle: dict[int, list[Mapping[str, Any]]] = {}
    if not records.exists():
        return {}
    for line in records.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") in ("member", "analysis") and r.get("cycle") is not None:
            by_cycle.setdefault(int(r["cycle"]), []).append(r)
    out = {}
    for c, recs in sorted(by_cycle.items()):
        done = [r for r in recs if r.get("status") == "done" and r.get("started") is not None
                and r.get("ended") is not None]
        members = [r for r in done if r["kind"] == "member"]
        analysis = [r for r in done if r["kind"] == "analysis"]
        if not members or not analysis:
            continue
        subs = [float(r["submitted"]) for r in recs if r.get("submitted") is not None]
        first = min(float(r["started"]) for r in recs if r.get("started") is not None)
        last = max(float(r.get("finished") or r["ended"]) for r in done)
        sub = min(subs) if subs else first
        a = analysis[-1]
        io = float(a.get("io_seconds") or 0.0)
        run = float(a["ended"]) - float(a["started"])
        out[c] = {
            "cycle": last - sub,
            "members": max(float(r["ended"]) for r in members)
            - min(float(r["started"]) for r in members),
            "member_task_seconds": math.fsum(float(r["ended"]) - float(r["started"])
                                             for r in members),
            "queue_wait": first - sub,
            "io": io,
            "analysis": max(run - io, 0.0),
        }
        phases = _analysis_phases(records.parent / "logs", c)
        if phases:
            out[c]["analysis_phases"] = phases
            out[c]["analysis_startup"] = max(run - phases.get("total", run), 0.0)
    return out
