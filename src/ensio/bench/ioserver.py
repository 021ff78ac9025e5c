"""``ensio bench ioserver``: the output cost of a computing model in each I/O mode.

Seed 002 measures the output cost of IFS as ``(t − t_no_output) / t_no_output``:
23 % for sequential output, 2 % with the XIOS server. This driver runs the
stencil model of :mod:`ensio.models.stencil` (``ensio model stencil``: P model
ranks, F 3-D fields every k steps) without output and with ``sync``,
``attached`` and ``server`` (S = 1 and 2) output, each as its own ``mpiexec``
job, best of ``repeat`` runs, all in the same invocation so the ratios compare
like with like.

``model = "fortran"`` runs the Fortran twin of the same model
(:mod:`ensio.models.stencilf`, built once per invocation with ``ensio ioclient
build``'s library): the mode comes from the iodef, server mode is an MPMD job
``mpiexec -n P model : -n S ensio ioserver iodef.yaml``. A compiled model computes a
step several times faster than numpy, so the same output is a larger share of its time.

Honesty about this machine: with P model ranks and S servers on fewer than P+S
cores the servers steal the model's cores, so the measured server cost
includes that competition. :func:`projection` then models a node with
dedicated server cores from costs measured here: the client's per-byte copy
cost and per-message overhead (both paid by the model even with dedicated
servers) and the server's busy time per output (which hides behind the model
as long as it is shorter than the model time between outputs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..errors import ConfigError
from ..models.stencil import iodef
from .childenv import child_env

#: The stencil model in Python (``ensio model stencil``) or its Fortran twin.
MODELS = ("python", "fortran")

__all__ = ["MODELS", "IOServerBenchSettings", "bench_ioserver", "projection", "result_table",
           "plot_result", "copy_seconds_per_byte"]


@dataclass(frozen=True)
class IOServerBenchSettings:
    """Sizes of the benchmark; a time step is 15 model minutes (``every = 24``: 6-hourly).

    ``sweeps`` sets the model's arithmetic per point and step. 32 sweeps cost about
    0.3 µs per point-level and step on one core here. A real atmosphere model (IFS)
    spends several µs, so this model is still the harder case for the I/O: less compute
    to hide the output behind.
    """

    ranks: int = 1
    nx: int = 256
    ny: int = 128
    nz: int = 16
    fields: int = 4
    every: int = 24
    steps: int = 96
    sweeps: int = 32
    repeat: int = 3
    servers: tuple[int, ...] = (1, 2)
    compression: int = 1
    model: str = "python"

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"model: expected one of {', '.join(MODELS)}, got {self.model!r}")

    @property
    def bytes_per_output(self) -> int:
        """Bytes the model sends per output step (float64 3-D fields and one 2-D field)."""
        return 8 * self.nx * self.ny * (self.nz * self.fields + 1)


def _mpiexec() -> str:
    return str(Path(sys.executable).with_name("mpiexec"))


def _ensio_command() -> list[str]:
    """The ``ensio`` command of this interpreter: works in a venv without ``ensio`` on PATH."""
    return [sys.executable, "-m", "ensio"]


def _python_argv(st: IOServerBenchSettings, mode: str, servers: int, run_dir: Path,
                 config: Path | None) -> list[str]:
    """``mpiexec -n P+S ensio model stencil ...`` (the last S ranks serve)."""
    nprocs = st.ranks + (servers if mode == "server" else 0)
    argv = [_mpiexec(), "-n", str(nprocs), *_ensio_command(), "model", "stencil",
            "--nx", str(st.nx), "--ny", str(st.ny), "--nz", str(st.nz),
            "--fields", str(st.fields), "--steps", str(st.steps), "--sweeps", str(st.sweeps),
            "--json", str(run_dir / "result.json")]
    return argv + (["--mode", "none"] if config is None else
                   ["--iodef", str(config), "--mode", mode])


def _fortran_argv(st: IOServerBenchSettings, exe: Path, mode: str, servers: int,
                  run_dir: Path, config: Path | None) -> list[str]:
    """``mpiexec -n P stencil-f ...`` and, in server mode, ``: -n S ensio ioserver CONFIG``."""
    from ..models.stencilf import stencil_argv

    argv = [_mpiexec(), "-n", str(st.ranks), *stencil_argv(
        exe, config, nx=st.nx, ny=st.ny, nz=st.nz, fields=st.fields, steps=st.steps,
        sweeps=st.sweeps, json_path=run_dir / "result.json")]
    if mode == "server":
        argv += [":", "-n", str(servers), *_ensio_command(), "ioserver", str(config)]
    return argv


def _run(st: IOServerBenchSettings, mode: str, servers: int, root: Path,
         rep: int, exe: Path | None = None) -> dict[str, Any]:
    """One ``mpiexec`` run of the stencil model (the Fortran ``exe`` if given); its result."""
    name = "none" if mode == "none" else (f"server{servers}" if mode == "server" else mode)
    run_dir = root / f"{name}-{rep}"
    run_dir.mkdir(parents=True, exist_ok=True)
    config = None
    if mode != "none":
        cfg = {"ioserver": iodef(st.nx, st.ny, st.nz, st.fields, st.every, mode,
                                 max(servers, 1), "output", compression=st.compression)}
        config = run_dir / "iodef.yaml"
        config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    argv = (_python_argv(st, mode, servers, run_dir, config) if exe is None
            else _fortran_argv(st, exe, mode, servers, run_dir, config))
    log = run_dir / "log.txt"
    with log.open("w") as out:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, env=child_env(), cwd=run_dir)
    if proc.returncode != 0:
        tail = log.read_text().strip().splitlines()[-3:]
        raise RuntimeError(f"{name} run failed (exit {proc.returncode}): {' | '.join(tail)}")
    res = json.loads((run_dir / "result.json").read_text())
    if exe is not None:  # the Fortran model does not know the config's mode: the label
        res["mode"] = mode
    res["run_dir"] = str(run_dir)
    return res


def copy_seconds_per_byte(nbytes: int = 32 << 20, repeat: int = 5) -> float:
    """Seconds per byte of copying a model array into a send buffer (best of ``repeat``)."""
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return best / nbytes


def projection(st: IOServerBenchSettings, t0: float, server_run: Mapping[str, Any],
               c_byte: float) -> dict[str, float]:
    """Output cost on a node where the servers have their own cores (a model, not a measurement).

    The model pays per output ``bytes × c_byte + messages × c_msg`` (copy into the
    client buffer, post the sends); it waits only if the server's busy time per
    output exceeds the model time between two outputs. ``c_msg`` is what remains of
    the measured non-blocked client time after the copies, per message.
    """
    rep = server_run["report"]
    n_out = max(st.steps // st.every, 1)
    msgs = float(rep.get("messages", n_out * (st.fields + 1)))
    # the model's own time in send/update_timestep (close() waits for the last output:
    # the end of a run, amortised over a long one, and not a per-message cost)
    calls = (float(server_run["seconds_in_output_calls"]) - float(server_run["seconds_in_close"])
             - float(rep["blocked_seconds"]))
    copy = c_byte * st.bytes_per_output * n_out
    c_msg = max(calls - copy, 0.0) / max(msgs, 1.0)
    busy = float(rep["server_busy_fraction"]) * float(server_run["seconds"])
    per_out_server = busy / n_out
    interval = t0 / n_out
    wait = max(0.0, per_out_server - interval) * n_out
    client = copy + c_msg * msgs
    return {"c_byte_ns": c_byte * 1e9, "c_msg_us": c_msg * 1e6,
            "server_seconds_per_output": per_out_server, "model_seconds_per_output": interval,
            "projected_client_seconds": client, "projected_wait_seconds": wait,
            "cost_server_projected": (client + wait) / t0}


def bench_ioserver(st: IOServerBenchSettings, workdir: str | Path | None = None,
                   on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every mode ``st.repeat`` times; costs relative to the no-output run (best times)."""
    from .machine import describe_machine

    root = Path(workdir).resolve() if workdir is not None else Path(tempfile.mkdtemp(
        prefix="ensio-bench-ioserver-"))
    root.mkdir(parents=True, exist_ok=True)
    exe = None
    if st.model == "fortran":
        from ..models.stencilf import build_stencil

        if on_step is not None:
            on_step("building the Fortran model (ensio ioclient build)")
        exe = build_stencil(root / "fortran")
    modes: list[tuple[str, int]] = [("none", 0), ("sync", 0), ("attached", 0)]
    modes += [("server", s) for s in st.servers]
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(st.repeat):  # interleaved so slow drifts hit every mode alike
        for mode, s in modes:
            label = f"server{s}" if mode == "server" else mode
            if on_step is not None:
                on_step(f"{label} (repeat {rep + 1}/{st.repeat})")
            runs.setdefault(label, []).append(_run(st, mode, s, root, rep, exe))
    best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items()}
    t0 = best["none"]["seconds"]
    rows = []
    for label, r in best.items():
        rep = r.get("report") or {}
        rows.append({
            "mode": label, "processes": st.ranks + (int(label[6:]) if label.startswith(
                "server") else 0),
            "seconds": r["seconds"], "cost": (r["seconds"] - t0) / t0,
            "cost_loop": (r["seconds"] - r.get("seconds_in_close", 0.0) - t0) / t0,
            "client_seconds": r["seconds_in_output_calls"],
            "close_seconds": r.get("seconds_in_close", 0.0),
            "blocked_seconds": rep.get("blocked_seconds", 0.0),
            "bytes_written": rep.get("bytes_written", 0),
            "server_busy_fraction": rep.get("server_busy_fraction"),
            "server_memory_hwm_bytes": rep.get("server_memory_hwm_bytes"),
            "all_seconds": [x["seconds"] for x in runs[label]],
        })
    s1 = best[f"server{st.servers[0]}"]
    proj = projection(st, t0, s1, copy_seconds_per_byte())
    by = {r["mode"]: r for r in rows}
    cost_server = by[f"server{st.servers[0]}"]["cost"]
    return {
        "settings": asdict(st), "model": st.model, "machine": describe_machine(root),
        "workdir": str(root),
        "cores": os.cpu_count(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows, "t_no_output": t0,
        "cost_sync": by["sync"]["cost"], "cost_attached": by["attached"]["cost"],
        "cost_server": cost_server,
        "cost_server_loop": by[f"server{st.servers[0]}"]["cost_loop"],
        "cost_sync_loop": by["sync"]["cost_loop"],
        "cost_server_by_servers": {str(s): by[f"server{s}"]["cost"] for s in st.servers},
        "cost_server_projected": proj["cost_server_projected"],
        "client_wait_fraction": s1["report"]["blocked_seconds"] / s1["seconds"],
        "sync_over_server_projected": by["sync"]["cost"] / max(
            proj["cost_server_projected"], 1e-12),
        "projection": proj,
    }


def result_table(res: Mapping[str, Any]) -> Any:
    """A rich table of :func:`bench_ioserver`: seconds, cost and client time per mode."""
    from rich.table import Table

    st = res["settings"]
    t = Table(title=f"ensio bench ioserver: {st.get('model', 'python')} model, "
                    f"{st['ranks']} model rank(s), {st['fields']} 3-D "
                    f"fields {st['nx']}x{st['ny']}x{st['nz']} every {st['every']} of "
                    f"{st['steps']} steps; {res['cores']} cores")
    for c in ("mode", "procs", "seconds", "cost", "cost in loop", "client s", "close s",
              "blocked s", "busy"):
        t.add_column(c, justify="right")
    for r in res["rows"]:
        busy = r["server_busy_fraction"]
        t.add_row(r["mode"], str(r["processes"]), f"{r['seconds']:.3f}",
                  f"{100 * r['cost']:+.1f}%", f"{100 * r['cost_loop']:+.1f}%",
                  f"{r['client_seconds']:.3f}", f"{r['close_seconds']:.3f}",
                  f"{r['blocked_seconds']:.3f}", "" if busy is None else f"{100 * busy:.0f}%")
    p = res["projection"]
    t.caption = (f"server cost projected to dedicated cores: "
                 f"{100 * res['cost_server_projected']:.2f} % (copy {p['c_byte_ns']:.2f} ns/B, "
                 f"{p['c_msg_us']:.0f} µs/message, server {p['server_seconds_per_output']:.3f} s "
                 f"per output vs model {p['model_seconds_per_output']:.3f} s); client wait "
                 f"fraction {100 * res['client_wait_fraction']:.2f} %")
    return t


def plot_result(res: Mapping[str, Any], path: str | Path) -> None:
    """Bar chart of the output cost per mode, with the projection beside the measurement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in res["rows"] if r["mode"] != "none"]
    cores = res.get("cores") or 0
    labels = [r["mode"] + (f"\n({r['processes']} procs on\n{cores} cores)"
                           if cores and r["processes"] > cores else "") for r in rows]
    labels.append("server\n(projected)")
    values = [100 * r["cost"] for r in rows] + [100 * res["cost_server_projected"]]
    colors = ["tab:red", "tab:orange"] + ["tab:blue"] * (len(rows) - 2) + ["tab:cyan"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(labels, values, color=colors)
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="goal 1 %")
    ax.set_ylabel("output cost (t − t_no_output) / t_no_output  [%]")
    ax.set_title(f"ensio bench ioserver, {res.get('model', 'python')} model "
                 "(measured; last bar modelled)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown_rows(res: Mapping[str, Any]) -> Sequence[str]:
    """Rows of the docs/benchmarks.md table."""
    out = ["| mode | processes | seconds (best) | output cost | cost in the loop | client s "
           "| close s | blocked s |", "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        out.append(f"| {r['mode']} | {r['processes']} | {r['seconds']:.3f} | "
                   f"{100 * r['cost']:+.2f} % | {100 * r['cost_loop']:+.2f} % | "
                   f"{r['client_seconds']:.3f} | {r['close_seconds']:.3f} | "
                   f"{r['blocked_seconds']:.3f} |")
    return out
