"""Output of ``ensio bench modes``: the result as a rich table, Markdown and a bar chart.

Kept apart from :mod:`ensio.bench.modes` because it only reads the JSON-ready
result of :func:`ensio.bench.modes.bench_modes` (or its ``--json`` file, as
``benchmarks/modes.sh`` does) and never runs anything; rich and matplotlib are
imported only when a function here is called.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .modes_numbers import MODES, PARTS

__all__ = ["markdown_table", "plot_result", "result_table"]


def _settings(res: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(key, label, entry with "offline"/"online"/"ratio") in table order."""
    out: list[tuple[str, str, Mapping[str, Any]]] = [
        ("local", "measured: local", res["measured"]["local"])]
    sl = res["measured"].get("slurm", {})
    if "skipped" not in sl and sl:
        out.append(("slurm", "measured: SLURM", sl))
    for name, entry in res.get("model", {}).get("loads", {}).items():
        out.append((name, f"model: {name} load, ρ = {entry['rho']:g}", entry))
    return out


def result_table(res: Mapping[str, Any]) -> Any:
    """A rich table: per setting × mode, mean ± sd and % of total; ratio per setting."""
    from rich.table import Table

    m = res.get("model", {})
    cap = [f"{res['cycles']} cycles per mode, one submission per cycle; N_e = {res['members']},"
           f" N_j = {res['jobs']}; running = total − queuing − I/O; mean ± sd over cycles "
           "(model: cycles × draws); % of the mean total",
           "queuing: measured = first task start − submission (locally: job start-up); "
           "model = scheduler wait until the first job starts"]
    if m:
        p = m["params"]
        cap.append(f"model: unit {p['unit']:.3g} s, base {p['base']:g}, per_node "
                   f"{p['per_node']:g}, alpha {p['alpha']:g}, shape {p['shape']:g}; nodes "
                   f"offline job {m['nodes']['offline_job']:g}, online job "
                   f"{m['nodes']['online_job']:g}; {m['draws']} draws per cycle")
    sl = res["measured"].get("slurm", {})
    if "skipped" in sl:
        cap.append(f"SLURM: skipped ({sl['skipped']})")
    t = Table(title="ensio bench modes: time to solution per cycle, offline vs online",
              caption="\n".join(cap))
    for col in ("setting", "mode", "total s", "queuing s", "%", "running s", "%", "I/O s", "%",
                "off/on"):
        t.add_column(col, justify="left" if col in ("setting", "mode") else "right")
    for _key, label, entry in _settings(res):
        for i, mode in enumerate(MODES):
            st = entry[mode]["stats"]
            cells = [label if i == 0 else "", mode]
            for part in PARTS:
                cells.append(f"{st[part]['mean']:.2f} ± {st[part]['std']:.2f}")
                if part != "total":
                    pct = st[part]["percent"]
                    cells.append("—" if not math.isfinite(pct) else f"{pct:.0f}")
            cells.append(f"{entry['ratio']:.2f}" if i == 1 else "")
            t.add_row(*cells, end_section=i == 1)
    return t


def markdown_table(res: Mapping[str, Any]) -> str:
    """The table of :func:`result_table` as Markdown (for docs/benchmarks.md)."""
    lines = ["| setting | mode | total s | queuing s (%) | running s (%) | I/O s (%) "
             "| offline / online |", "|---|---|---|---|---|---|---|"]
    for _key, label, entry in _settings(res):
        for i, mode in enumerate(MODES):
            st = entry[mode]["stats"]
            cells = [label if i == 0 else "", mode,
                     f"{st['total']['mean']:.2f} ± {st['total']['std']:.2f}"]
            for part in PARTS[1:]:
                pct = st[part]["percent"]
                cells.append(f"{st[part]['mean']:.2f} ± {st[part]['std']:.2f} ("
                             + ("—" if not math.isfinite(pct) else f"{pct:.0f}") + ")")
            cells.append(f"**{entry['ratio']:.2f}**" if i == 1 else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_result(res: Mapping[str, Any], path: str | Path) -> None:
    """Stacked bars (queuing, running, I/O; mean per cycle) per setting and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = _settings(res)
    fig, ax = plt.subplots(figsize=(1.9 * len(settings) + 2.5, 4.0))
    width = 0.38
    colours = {"queuing": "#bbbbbb", "running": "#4477aa", "io": "#ee6677"}
    for s, (_key, _label, entry) in enumerate(settings):
        for i, mode in enumerate(MODES):
            x = s + (i - 0.5) * width
            bottom = 0.0
            for part in ("queuing", "running", "io"):
                v = entry[mode]["stats"][part]["mean"]
                ax.bar(x, v, width * 0.95, bottom=bottom, color=colours[part],
                       label=part if s == 0 and i == 0 else None,
                       edgecolor="black" if mode == "online" else "white",
                       hatch="//" if mode == "online" else None)
                bottom += v
            ax.text(x, bottom, mode, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(settings)))
    ax.set_xticklabels([label.replace(" (", "\n(").replace(", ", "\n", 1)
                        for _k, label, _e in settings], fontsize=8)
    ax.set_ylabel("seconds per cycle (mean)")
    ax.set_title("time to solution per cycle: offline (plain) vs online (hatched)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
