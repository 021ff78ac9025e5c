"""``ensio report DIR``: the seed paper's Table 2 and the observation statistics of a run.

Reads ``DIR/records.jsonl`` and prints, in a table that fits 80 columns, per
cycle and as mean and standard deviation (``sd``) over cycles: total time to
solution, queuing (first task start − first job submission), I/O (seconds the
tasks reported reading and writing ensemble files), and running (total −
queuing − I/O), with percentages of the total (I/O is summed over parallel
tasks and may exceed 100 %; beyond 999 % the table says ``>999``). Writes
``DIR/report.csv`` and a stacked bar chart ``DIR/report.png``.

Then, for every cycle that has observation-space diagnostics
(``DIR/cycle_CCC/diag.nc``, written by each analysis), a table per cycle and
per observation type: accepted/total observations, O−B and O−A mean and RMS,
background and analysis spread, and the consistency ratio
mean((O−B)²) / mean(σ_o² + spread_b²). ``--json FILE`` writes both as JSON.
A run directory with either part is reported; one with neither is an error.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from ..analysis.obsdiag import TYPE_FIELDS
from ..errors import EnsioError, InputError
from ..io.products.obsdiag import read_type_statistics
from ..numfmt import fitted, fixed, unsigned_zero
from ..workflow.records import cycle_summaries, mean_std, read_records
from ..workflow.rundir import diagnostics_path

__all__ = [
    "SECONDS_WIDTH",
    "add_parser",
    "build_diag_table",
    "build_table",
    "diag_summaries",
    "run",
    "table_rows",
]

PARTS = ("total", "queuing", "running", "io")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``report`` sub-command."""
    p = subparsers.add_parser("report", help="time-to-solution table of a cycled experiment")
    p.add_argument("dir", type=Path, metavar="DIR", help="the --workdir of ensio cycle")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="also write the timing rows and the per-cycle observation "
                        "statistics to FILE as JSON")  # fmt: skip
    p.set_defaults(func=run)


def table_rows(records: list[dict]) -> list[dict[str, float]]:
    """Per cycle: total, queuing, running, io seconds (running excludes queuing and I/O)."""
    rows = []
    for s in cycle_summaries(records):
        queuing = s.queuing or 0.0
        rows.append(
            {
                "cycle": s.cycle,
                "total": s.total,
                "queuing": queuing,
                "io": s.io,
                "running": max(0.0, s.total - queuing - s.io),
            }
        )
    return rows


#: Widest number of a seconds column; the table then fits 80 columns.
SECONDS_WIDTH = 10


def _seconds(x: float) -> str:
    return fitted(x, SECONDS_WIDTH)


def _percent(part: float, total: float) -> str:
    if not total > 0:
        return "—"
    pct = 100 * part / total
    return ">999" if pct >= 999.5 else "<-999" if pct <= -999.5 else fixed(pct, 0)


def build_table(rows: list[dict[str, float]]) -> Table:
    """The report table: one row per cycle, then ``mean`` and ``sd`` rows over the cycles.

    Columns: cycle, total, queuing, %, running, %, io, % (seconds, and
    percentages of the total). Numbers are at most :data:`SECONDS_WIDTH`
    characters and never ``-0``, so the table fits 80 columns.
    """
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("cycle", justify="right")
    for p in PARTS:
        table.add_column(f"{p} s", justify="right")
        if p != "total":
            table.add_column("%", justify="right")
    for i, r in enumerate(rows):
        cells = [str(r["cycle"])]
        for p in PARTS:
            cells.append(_seconds(r[p]))
            if p != "total":
                cells.append(_percent(r[p], r["total"]))
        table.add_row(*cells, end_section=i == len(rows) - 1)
    stats = {p: mean_std(r[p] for r in rows) for p in PARTS}
    mean = ["mean"]
    sd = ["sd"]
    for p in PARTS:
        m, dev = stats[p]
        mean.append(_seconds(m))
        sd.append(_seconds(dev))
        if p != "total":
            mean.append(_percent(m, stats["total"][0]))
            sd.append("")
    table.add_row(*mean, style="bold")
    table.add_row(*sd, style="bold")
    return table


def diag_summaries(workdir: Path) -> list[dict[str, Any]]:
    """Per cycle with a diagnostics file (cycle order): ``cycle``, ``path``, ``types``
    (the file's per-type rows, :func:`~ensio.io.products.obsdiag.read_type_statistics`)."""
    out = []
    for d in sorted(Path(workdir).glob("cycle_*")):
        m = re.fullmatch(r"cycle_(\d+)", d.name)
        if m is None:
            continue
        path = diagnostics_path(workdir, int(m.group(1)))
        if not path.exists():
            continue
        types = read_type_statistics(path)
        lost = [f for f in TYPE_FIELDS if any(f not in t for t in types)]
        if lost or not types:
            raise InputError(f"{path}: not an ensio diagnostics file (variable "
                             f"'{lost[0] if lost else 'type_name'}' missing or empty)")
        out.append({"cycle": int(m.group(1)), "path": str(path), "types": types})
    return sorted(out, key=lambda c: c["cycle"])


def _g(x: float) -> str:
    """3 significant digits, never ``-0``; NaN (no accepted observation) ``—``."""
    return "—" if math.isnan(x) else unsigned_zero(f"{x:.3g}")


#: Columns of the per-cycle diagnostics table: heading, statistic.
_DIAG_COLUMNS = (("O-B\nmean", "omb_mean"), ("O-B\nrms", "omb_rms"),
                 ("O-A\nmean", "oma_mean"), ("O-A\nrms", "oma_rms"),
                 ("spread\nb", "spread_b_rms"), ("spread\na", "spread_a_rms"),
                 ("ratio", "consistency"))  # fmt: skip


def build_diag_table(cycle: dict[str, Any]) -> Table:
    """One cycle's table: a row per type (``all`` last, bold): used/total observations,
    O−B and O−A mean and RMS, spreads (RMS over the observations), consistency ratio."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  title=f"cycle {cycle['cycle']}", title_justify="left")
    table.add_column("type", overflow="fold")
    table.add_column("used/n", justify="right", no_wrap=True)
    for head, _ in _DIAG_COLUMNS:  # numbers of at most 9 characters (-1.23e+05), mostly 7
        table.add_column(head, justify="right", no_wrap=True)
    for t in cycle["types"]:
        table.add_row(t["type"], f"{t['n_used']}/{t['n_obs']}",
                      *(_g(t[k]) for _, k in _DIAG_COLUMNS),
                      style="bold" if t["type"] == "all" else None)  # fmt: skip
    return table


def _finite(x: Any) -> Any:
    """NaN as JSON null (JSON has no NaN)."""
    return None if isinstance(x, float) and math.isnan(x) else x


def run(args: argparse.Namespace) -> int:
    path = args.dir / "records.jsonl"
    rows = table_rows(read_records(path)) if path.exists() else []
    diags = diag_summaries(args.dir)
    if not rows and not diags:
        if path.exists():
            raise EnsioError(f"{path}: no finished task records yet")
        raise EnsioError(f"{path}: no records and no {diagnostics_path(args.dir, 1).name} "
                         f"in any cycle (is {args.dir} the --workdir of ensio cycle?)")
    console = Console()
    if rows:
        _timing(rows, args.dir, console)
    if diags:
        console.print("observations: statistics over the accepted ones; spread: RMS over them; "
                      "ratio: mean (O-B)^2 / mean(sigma_o^2 + spread_b^2)",
                      highlight=False)  # fmt: skip
        for c in diags:
            console.print(build_diag_table(c))
    if args.json is not None:
        doc = {"timing": rows, "diagnostics": [
            {**c, "types": [{k: _finite(v) for k, v in t.items()} for t in c["types"]]}
            for c in diags]}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


def _timing(rows: list[dict[str, float]], workdir: Path, console: Console) -> None:
    """The time-to-solution table, ``report.csv`` and ``report.png``."""
    n = len(rows)
    console.print(f"ensio report: {workdir} ({n} cycle{'' if n == 1 else 's'})",
                  highlight=False, soft_wrap=True)
    console.print(build_table(rows))
    with open(workdir / "report.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["cycle", *PARTS])
        w.writeheader()
        w.writerows(rows)
    _plot(rows, workdir / "report.png")
    print(f"wrote {workdir / 'report.csv'} and {workdir / 'report.png'}")


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cycles = [r["cycle"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bottom = [0.0] * len(rows)
    for part, colour in (("queuing", "#bbbbbb"), ("running", "#4477aa"), ("io", "#ee6677")):
        vals = [r[part] for r in rows]
        ax.bar(cycles, vals, bottom=bottom, label=part, color=colour)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(cycles)
    ax.set_xlabel("cycle")
    ax.set_ylabel("seconds")
    ax.set_title("time to solution per cycle")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
