"""What ``ensio bench transfer`` shows of a result: the table, the headline, the chart,
the markdown rows of docs/benchmarks.md.

Kept apart from :mod:`.transfer`, which runs the cases and computes the result (a dict
of plain values, also the ``--json`` file): showing it needs only that dict, so
``benchmarks/transfer.sh`` formats a stored result without the machinery of a run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["headline", "markdown_rows", "plot_result", "result_table"]


def _fmt(x: float | None, spec: str, none: str = "—") -> str:
    return none if x is None else format(x, spec)


def result_table(res: Mapping[str, Any]) -> Any:
    """A rich table of :func:`bench_transfer`: one row per case, the ratios as caption."""
    from rich.table import Table

    st = res["settings"]
    t = Table(title=f"ensio bench transfer: {st['files']} netCDF-4 files × "
                    f"{st['bytes_per_file'] / 2**20:.1f} MiB, best of {st['repeat']}; "
                    f"{res['cores']} cores, load {res['load_average'][0]:.2f}")
    for c in ("case", "seconds", "producer s", "after close s", "GB/s", "of memcpy",
              "direct ×"):
        t.add_column(c, justify="left" if c == "case" else "right")
    for r in res["rows"]:
        if not r["measured"]:
            t.add_row(r["case"], "not measured", "", "", "", "", "")
            continue
        t.add_row(r["case"], f"{r['seconds']:.3f}", f"{r['producer_seconds']:.3f}",
                  f"{r['after_close_seconds']:.3f}", f"{r['gb_per_s']:.2f}",
                  f"{100 * r['memcpy_fraction']:.0f} %", _fmt(r["direct_speedup"], ".1f"))
    t.caption = (f"memcpy {res['memcpy_gb_per_s']:.2f} GB/s (write into fresh memory "
                 f"{res['fresh_memory_write_gb_per_s']:.2f} GB/s, into pre-faulted memory "
                 f"{_fmt(res.get('prefaulted_memory_write_gb_per_s'), '.2f')} GB/s); "
                 f"speedup_fsync "
                 f"{_fmt(res['speedup_fsync'], '.2f')}, speedup_pagecache "
                 f"{_fmt(res['speedup_pagecache'], '.2f')}, memcpy_fraction "
                 f"{_fmt(res['memcpy_fraction'], '.3f')}, async_after_close_ratio "
                 f"{_fmt(res['async_after_close_ratio'], '.3f', 'not measured')}; "
                 f"verified {res['verified']}")
    t.caption += "\n" + headline(res)
    for r in res["rows"]:
        if not r["measured"]:
            t.caption += f"\n{r['case']} not measured: {r['reason']}"
    return t


def headline(res: Mapping[str, Any]) -> str:
    """Issue 28's acceptance numbers (medians) in one line."""
    return (f"medians: speedup_pagecache {_fmt(res.get('speedup_pagecache'), '.2f')} "
            f"(huge pages: {_fmt(res.get('huge_pages'), '', 'not measured')}), limit_ratio "
            f"{_fmt(res.get('limit_ratio'), '.2f')}, launch_ms "
            f"{_fmt(res.get('launch_ms'), '.0f', 'not measured')}, tcp_fraction "
            f"{_fmt(res.get('tcp_fraction'), '.2f', 'not measured')} (the stream alone "
            f"{_fmt(res.get('stream_fraction'), '.2f', 'not measured')}); memory: "
            f"{res.get('memory') or 'unknown'}")


def plot_result(res: Mapping[str, Any], path: str | Path) -> None:
    """Bar chart of the bandwidth of every case (measured ones), memcpy as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    colors = {"file": "tab:orange", "direct": "tab:blue"}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ys = range(len(rows))
    ax.barh(ys, [r.get("gb_per_s", 0.0) for r in rows],
            color=[colors[r["exchange"]] for r in rows])
    for y, r in zip(ys, rows, strict=True):
        if not r["measured"]:
            ax.text(0.02, y, "not measured", va="center", color="0.4",
                    transform=ax.get_yaxis_transform())
    ax.axvline(res["memcpy_gb_per_s"], color="k", ls="--", lw=0.8,
               label=f"memcpy {res['memcpy_gb_per_s']:.1f} GB/s")
    ax.axvline(0.5 * res["memcpy_gb_per_s"], color="tab:green", ls=":", lw=0.8,
               label="goal: 50 % of memcpy")
    ax.axvline(res["fresh_memory_write_gb_per_s"], color="0.5", ls="-.", lw=0.8,
               label=f"write into fresh memory {res['fresh_memory_write_gb_per_s']:.1f} GB/s")
    ax.set_yticks(list(ys), [r["case"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("N·S bytes / (consumer's last byte − producer's first write)  [GB/s]")
    st = res["settings"]
    ax.set_title(f"ensio bench transfer: {st['files']} × {st['bytes_per_file'] / 2**20:.0f} MiB "
                 f"netCDF-4 files")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown_rows(res: Mapping[str, Any]) -> Sequence[str]:
    """Rows of the docs/benchmarks.md table."""
    out = ["| case | how | seconds (best) | median | producer s | after close s | GB/s "
           "| of memcpy | direct × |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if not r["measured"]:
            out.append(f"| {r['case']} | {r['label']} | not measured: {r['reason']} "
                       "| | | | | | |")
            continue
        out.append(f"| {r['case']} | {r['label']} | {r['seconds']:.3f} | "
                   f"{r['median_seconds']:.3f} | {r['producer_seconds']:.3f} | "
                   f"{r['after_close_seconds']:.3f} | "
                   f"{r['gb_per_s']:.2f} | {100 * r['memcpy_fraction']:.0f} % | "
                   f"{_fmt(r['direct_speedup'], '.1f')} |")
    return out
