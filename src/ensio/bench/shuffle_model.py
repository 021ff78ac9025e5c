"""The cost model of ``ensio bench shuffle``: both read paths projected to many nodes.

A model, not a measurement: it is fed with per-byte and per-message costs
measured on this machine (:mod:`ensio.bench.shuffle`) and shows the trend
the seed reports (the global scatter stops scaling; the group shuffle keeps
shrinking). One direction (the read) is modelled; the write is its mirror.

With N ranks (n nodes × R ranks per node), N_e members of S bytes of state:

* ``files``: N_io readers on the global file system (the default
  min(N, N_e), and N_io = N: every rank reads its own rows, no scatter),
  each opening every member and reading its rows of it (B = N_e · S / N_io
  bytes) at the slower of its own measured rate ``c_fs`` and its share of
  the aggregate bandwidth (``N_io / BW_fs``), then scattering them to the
  N / N_io − 1 other ranks of its group::

      T_files = N_e · c_open + B · max(c_fs, N_io / BW_fs)
                + B · (1 − N_io / N) · β + (N / N_io − 1) · α

* ``shuffle``: P = N / N_e tiles; every rank reads its tile (S / P bytes)
  from the node-local disk at the measured per-rank rate ``c_local`` and
  exchanges all but 1/N_e of it with the N_e − 1 other ranks of its group::

      T_shuffle = c_open + (S / P) · c_local + (S / P) · (1 − 1 / N_e) · β + (N_e − 1) · α

α (seconds per message partner), β (seconds per byte sent over MPI), c_fs,
c_local (seconds per byte read) and c_open (seconds per file open) are the
medians over the measured runs that were not oversubscribed (all runs if every
one was: an oversubscribed run times the scheduler's slices, not the network).
Overlap of reading and sending (the ``files`` reader's double buffering) is
ignored: both are charged in full.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["measured_costs", "plot_result", "projection", "t_files", "t_shuffle"]


def measured_costs(res: Mapping[str, Any]) -> dict[str, float]:
    """α, β, c_fs, c_local, c_open (seconds) from the runs (medians over N_mpi)."""
    s = float(res["state_bytes_per_member"])
    alpha, beta, c_fs, c_local, c_open = [], [], [], [], []
    over = set(res.get("oversubscribed", ()))
    runs = [r for r in res["runs"] if r["n_mpi"] not in over] or list(res["runs"])
    for r in runs:
        n_e, f, sh = r["members"], r["files"], r["shuffle"]
        part = float(sh["part_bytes"])
        alpha.append(r["alpha_seconds"])
        c_open.append(r["open_seconds"])
        c_fs.append(f["phases"]["read"] / (n_e * s / f["n_io"]))
        c_local.append(sh["phases"]["read"] / part)
        sent = part * (1 - 1 / n_e)
        b = (sh["phases"]["shuffle"] - (n_e - 1) * r["alpha_seconds"]) / sent
        beta.append(b if b > 0 else sh["phases"]["shuffle"] / sent)
    return {k: float(np.median(v)) for k, v in (("alpha", alpha), ("beta", beta),
                                                ("c_fs", c_fs), ("c_local", c_local),
                                                ("c_open", c_open))}  # fmt: skip


def t_files(n: np.ndarray, n_e: int, s: float, fs_bytes_per_s: float,
            c: Mapping[str, float], every_rank: bool = False) -> np.ndarray:
    """Modelled seconds of the ``files`` read at N = ``n`` ranks (see the module docstring).

    N_io = min(N, N_e), or N with ``every_rank``.
    """
    n = np.asarray(n, dtype=float)
    n_io = n if every_rank else np.minimum(n, n_e)
    b = n_e * s / n_io
    return (n_e * c["c_open"] + b * np.maximum(c["c_fs"], n_io / fs_bytes_per_s)
            + b * (1 - n_io / n) * c["beta"] + (n / n_io - 1) * c["alpha"])


def t_shuffle(n: np.ndarray, n_e: int, s: float, c: Mapping[str, float]) -> np.ndarray:
    """Modelled seconds of the shuffle read at N = ``n`` ranks (N ≥ N_e)."""
    p = np.asarray(n, dtype=float) / n_e
    tile = s / p
    return c["c_open"] + tile * c["c_local"] + tile * (1 - 1 / n_e) * c["beta"] \
        + (n_e - 1) * c["alpha"]


def projection(res: Mapping[str, Any], st: Any) -> dict[str, Any]:
    """Both modes over 1 … ``proj_max_nodes`` nodes; from which node count the shuffle is
    faster than the better of the two ``files`` variants (``cross_nodes``)."""
    c = measured_costs(res)
    n_e, r = st.proj_members, st.proj_ranks_per_node
    s = st.proj_member_gb * 1e9
    first = int(np.ceil(n_e / r))  # the shuffle needs N >= N_e
    nodes = np.unique(np.geomspace(first, st.proj_max_nodes, 40).round().astype(int))
    tf = t_files(nodes * r, n_e, s, st.proj_fs_gbs * 1e9, c)
    tf_all = t_files(nodes * r, n_e, s, st.proj_fs_gbs * 1e9, c, every_rank=True)
    ts = t_shuffle(nodes * r, n_e, s, c)
    faster = np.flatnonzero(ts < np.minimum(tf, tf_all))
    return {
        "costs": c,
        "members": n_e, "member_gb": st.proj_member_gb, "ranks_per_node": r,
        "fs_gbs": st.proj_fs_gbs,
        "nodes": nodes.tolist(), "seconds_files": tf.tolist(),
        "seconds_files_every_rank": tf_all.tolist(), "seconds_shuffle": ts.tolist(),
        "cross_nodes": int(nodes[faster[0]]) if faster.size else None,
        "ratio_at_max": float(min(tf[-1], tf_all[-1]) / ts[-1]),
    }  # fmt: skip


def plot_result(res: Mapping[str, Any], path: str | Path) -> None:
    """Measured seconds per phase (left) and the projection (right), one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    runs = res["runs"]
    over = set(res["oversubscribed"])
    x = np.arange(len(runs))
    for k, (mode, color) in enumerate((("files", "tab:orange"), ("shuffle", "tab:blue"))):
        bottom = np.zeros(len(runs))
        phases = list(runs[0][mode]["phases"])
        for j, ph in enumerate(phases):
            v = np.array([r[mode]["phases"][ph] for r in runs])
            a.bar(x + (k - 0.5) * 0.38, v, 0.36, bottom=bottom, color=color,
                  alpha=1 - 0.17 * j, edgecolor="k", lw=0.3, label=f"{mode}: {ph}")
            bottom += v
    a.set_xticks(x, [f"N_mpi={r['n_mpi']}\nP={r['tiles']}" + ("\n(oversub.)"
                     if r["n_mpi"] in over else "") for r in runs])  # fmt: skip
    a.set_ylabel("seconds (slowest rank), read + write")
    a.set_title("measured (left bar files, right bar shuffle)")
    a.legend(fontsize=6, ncol=2)
    p = res["projection"]
    b.loglog(p["nodes"], p["seconds_files"], color="tab:orange",
             label="files (N_io = N_e readers + scatter)")
    b.loglog(p["nodes"], p["seconds_files_every_rank"], color="tab:orange", ls=":",
             label="files (N_io = N_mpi, no scatter)")
    b.loglog(p["nodes"], p["seconds_shuffle"], color="tab:blue", label="shuffle (local tiles)")
    if p["cross_nodes"] is not None:
        b.axvline(p["cross_nodes"], color="k", ls="--", lw=0.8,
                  label=f"cross at {p['cross_nodes']} nodes")
    b.set_xlabel(f"nodes ({p['ranks_per_node']} ranks each)")
    b.set_ylabel("modelled read seconds")
    b.set_title(f"model: {p['members']} members x {p['member_gb']} GB, FS {p['fs_gbs']} GB/s")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
