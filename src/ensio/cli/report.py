"""``ensio report DIR``: the seed paper's Table 2 for a cycled experiment.

Reads ``DIR/records.jsonl`` and prints, per cycle and as mean ± standard
deviation over cycles: total time to solution, queuing (first task start −
first job submission), I/O (seconds the tasks reported reading and writing
ensemble files), and running (total − queuing − I/O), with percentages of the
total. Writes ``DIR/report.csv`` and a stacked bar chart ``DIR/report.png``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import EnsioError
from ..workflow.records import cycle_summaries, mean_std, read_records

__all__ = ["add_parser", "run", "table_rows"]

PARTS = ("total", "queuing", "running", "io")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``report`` sub-command."""
    p = subparsers.add_parser("report", help="time-to-solution table of a cycled experiment")
    p.add_argument("dir", type=Path, metavar="DIR", help="the --workdir of ensio cycle")
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


def run(args: argparse.Namespace) -> int:
    path = args.dir / "records.jsonl"
    if not path.exists():
        raise EnsioError(f"{path}: no records (is {args.dir} the --workdir of ensio cycle?)")
    rows = table_rows(read_records(path))
    if not rows:
        raise EnsioError(f"{path}: no finished task records yet")
    table = Table(title=f"ensio report: {args.dir} ({len(rows)} cycles)")
    table.add_column("cycle", justify="right")
    for p in PARTS:
        table.add_column(f"{p} s", justify="right")
        if p != "total":
            table.add_column("%", justify="right")
    for r in rows:
        cells = [str(r["cycle"])]
        for p in PARTS:
            cells.append(f"{r[p]:.2f}")
            if p != "total":
                cells.append(f"{100 * r[p] / r['total']:.0f}" if r["total"] > 0 else "—")
        table.add_row(*cells)
    stats = {p: mean_std(r[p] for r in rows) for p in PARTS}
    cells = ["mean ± sd"]
    for p in PARTS:
        m, sd = stats[p]
        cells.append(f"{m:.2f} ± {sd:.2f}")
        if p != "total":
            tot = stats["total"][0]
            cells.append(f"{100 * m / tot:.0f}" if tot > 0 else "—")
    table.add_row(*cells, style="bold")
    Console().print(table)
    with open(args.dir / "report.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["cycle", *PARTS])
        w.writeheader()
        w.writerows(rows)
    _plot(rows, args.dir / "report.png")
    print(f"wrote {args.dir / 'report.csv'} and {args.dir / 'report.png'}")
    return 0


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
