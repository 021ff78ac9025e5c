"""The OSSE's figures (PNG, matplotlib's Agg back-end: no display needed).

* ``rmse_spread.png``: RMSE of the ensemble mean against the truth and ensemble spread of
  T and S per cycle, for the analysis (forecast and analysis of each cycle) and the free
  ensemble;
* ``sst_increment.png``: the analysis increment of SST (analysis mean − forecast mean at
  the top level) of one cycle, with the cycle's SST and profile positions;
* ``omb_oma.png``: histograms of O−B and O−A over all cycles, per observation kind,
  normalised by the stated observation error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_increment", "plot_innovations", "plot_rmse"]

UNITS = {"temp": "°C", "salt": "g/kg"}
TITLES = {"temp": "temperature", "salt": "salinity"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_rmse(cycles: Sequence[Mapping[str, Any]], out: Path) -> None:
    """``rmse_spread.png`` from the JSON's per-cycle entries."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    c = np.array([e["cycle"] for e in cycles])
    for ax, v in zip(axes, ("temp", "salt"), strict=True):
        for run, color in (("forecast", "tab:orange"), ("analysis", "tab:blue"),
                           ("free", "tab:gray")):
            rmse = np.array([e[run][v]["rmse"] for e in cycles])
            spread = np.array([e[run][v]["spread"] for e in cycles])
            ax.plot(c, rmse, "-o", ms=3, color=color, label=f"{run} RMSE")
            ax.plot(c, spread, "--", color=color, label=f"{run} spread")
        ax.set_xlabel("cycle")
        ax.set_ylabel(f"{TITLES[v]} ({UNITS[v]})")
        ax.set_title(f"{TITLES[v]}: RMSE against the truth and ensemble spread")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_increment(xt: np.ndarray, yt: np.ndarray, increment: np.ndarray,
                   sst_pos: tuple[np.ndarray, np.ndarray], prof_pos: tuple[np.ndarray, np.ndarray],
                   cycle: int, out: Path) -> None:
    """``sst_increment.png``: ``increment`` (x, y), land NaN; observation positions on top."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 6.5), constrained_layout=True)
    lim = float(np.nanmax(np.abs(increment))) or 1.0
    mesh = ax.pcolormesh(xt, yt, increment.T, cmap="RdBu_r", vmin=-lim, vmax=lim,
                         shading="nearest")
    ax.plot(*sst_pos, "k.", ms=2, label="SST")
    ax.plot(*prof_pos, "g^", ms=5, mfc="none", label="T/S profiles")
    fig.colorbar(mesh, ax=ax, label="SST increment (°C)")
    ax.set_xlabel("longitude (°E)")
    ax.set_ylabel("latitude (°N)")
    ax.set_title(f"SST analysis increment, cycle {cycle}")
    ax.legend(loc="lower right", fontsize=8)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_innovations(samples: Mapping[str, Mapping[str, np.ndarray]], out: Path) -> None:
    """``omb_oma.png``: ``samples[kind]["omb"/"oma"]`` normalised values, one panel per kind."""
    plt = _pyplot()
    kinds = [k for k in samples if samples[k]["omb"].size]
    fig, axes = plt.subplots(1, max(len(kinds), 1), figsize=(4 * max(len(kinds), 1), 3.5),
                             constrained_layout=True, squeeze=False)
    for ax, k in zip(axes[0], kinds, strict=False):
        omb, oma = samples[k]["omb"], samples[k]["oma"]
        hi = float(np.nanpercentile(np.abs(np.concatenate([omb, oma])), 99.5)) or 1.0
        bins = np.linspace(-hi, hi, 41)
        ax.hist(omb, bins=bins, alpha=0.6, label=f"O−B (rms {np.sqrt(np.mean(omb**2)):.2f})")
        ax.hist(oma, bins=bins, alpha=0.6, label=f"O−A (rms {np.sqrt(np.mean(oma**2)):.2f})")
        ax.set_title(k)
        ax.set_xlabel("innovation / observation error")
        ax.legend(fontsize=8)
    fig.savefig(out, dpi=110)
    plt.close(fig)
