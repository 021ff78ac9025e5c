"""The Veros OSSE as a benchmark: the report of ``ensio example veros`` as tables.

``python -m ensio.bench.veros FILE.json`` prints (Markdown) the headline numbers against
the issue's targets (analysis RMSE ≤ 0.5 × free over the second half of the cycles,
spread/RMSE 0.7–1.3) and, per cycle, the timing split of seed 000's Table 2: member runs
(first member start to last member end), queue wait (first submission to first start),
ensemble I/O (the analysis's read, write and products) and the rest of the analysis task,
with the share of I/O + analysis in the cycle (goal ≤ 5 %). ``benchmarks/veros.sh`` runs
the experiment and then this.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["markdown", "main"]


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown(rep: Mapping[str, Any]) -> str:
    """The Markdown tables of a report (see the module docstring)."""
    a, b = rep.get("averaged_cycles", ["?", "?"])
    out = [f"Members {rep['members']}, cycles {len(rep['cycles'])}; means over cycles {a}–{b}.",
           "", _row(["variable", "RMSE analysis", "RMSE free", "ratio (≤ 0.5)",
                     "spread/RMSE analysis (0.7–1.3)", "spread/RMSE forecast"]),
           _row(["---"] * 6)]
    for v in ("temp", "salt"):
        free = rep.get(f"rmse_free_{v}")
        ana = rep[f"rmse_analysis_{v}"]
        out.append(_row([v, f"{ana:.4f}", "—" if free is None else f"{free:.4f}",
                         "—" if free is None else f"{ana / free:.2f}",
                         f"{rep[f'spread_ratio_{v}']:.2f}",
                         f"{rep[f'spread_ratio_forecast_{v}']:.2f}"]))
    out += ["", "Analysis = the analysis task minus its I/O; of it, *filter* = observations, "
                "LETKF and diagnostics (ensio analyse's own timing line), the rest the task's "
                "start (interpreter and imports; with workflow.resident only its client), "
                "the run record and the exit.", "",
            _row(["cycle", "members (s)", "queue wait (s)", "ensemble I/O (s)", "analysis (s)",
                  "of it filter (s)", "cycle (s)", "I/O + analysis"]), _row(["---"] * 8)]
    filt = []
    for c in rep["cycles"]:
        t = c.get("timing") or {}
        if not t:
            continue
        ph = t.get("analysis_phases", {})
        f = sum(ph.get(k, 0.0) for k in ("obs", "analysis", "diagnostics"))
        filt.append(f)
        share = (t["io"] + t["analysis"]) / t["cycle"] if t["cycle"] else float("nan")
        out.append(_row([str(c["cycle"]), f"{t['members']:.1f}", f"{t['queue_wait']:.1f}",
                         f"{t['io']:.2f}", f"{t['analysis']:.2f}", f"{f:.2f}",
                         f"{t['cycle']:.1f}", f"{100 * share:.1f} %"]))
    tot = rep.get("timing_total", {})
    if tot.get("cycle"):
        out.append(_row(["all", f"{tot['members']:.1f}", f"{tot['queue_wait']:.1f}",
                         f"{tot['io']:.2f}", f"{tot['analysis']:.2f}", f"{sum(filt):.2f}",
                         f"{tot['cycle']:.1f}", f"{100 * rep['io_analysis_fraction']:.1f} %"]))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m ensio.bench.veros REPORT.json", file=sys.stderr)
        return 2
    print(markdown(json.loads(Path(args[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
