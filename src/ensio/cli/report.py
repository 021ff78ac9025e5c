"""``ensio report DIR``: the seed paper's Table 2 for a cycled experiment.

Reads ``DIR/records.jsonl`` and prints, in a table that fits 80 columns, per
cycle and as mean and standard deviation (``sd``) over cycles: total time to
solution, queuing (first task start − first job submission), I/O (seconds the
tasks reported reading and writing ensemble files), and running (total −
queuing − I/O), with percentages of the total (I/O is summed over parallel
tasks and may exceed 100 %; beyond 999 % the table says ``>999``). Writes
``DIR/report.csv`` and a stacked bar chart ``DIR/report.png``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from ..errors import EnsioError
from ..numfmt import fitted, fixed
from ..workflow.records import cycle_summaries, mean_std, read_records

__all__ = ["SECONDS_WIDTH", "add_parser", "build_table", "run", "table_rows"]

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


def run(args: argparse.Namespace) -> int:
    path = args.dir / "records.jsonl"
    if not path.exists():
        raise EnsioError(f"{path}: no records (is {args.dir} the --workdir of ensio cycle?)")
    rows = table_rows(read_records(path))
    if not rows:
        raise EnsioError(f"{path}: no finished task records yet")
    console = Console()
    n = len(rows)
    console.print(f"ensio report: {args.dir} ({n} cycle{'' if n == 1 else 's'})",
                  highlight=False, soft_wrap=True)
    console.print(build_table(rows))
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
