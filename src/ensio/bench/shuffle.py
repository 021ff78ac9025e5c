"""``ensio bench shuffle``: ``files`` mode (N_io readers + scatter) against the group shuffle.

One synthetic case (``ensio synth``, CDF-5, N_e members of nx × ny × levels
float64) is run at each N_mpi of ``ranks`` (2, 4, 8), each in its own
``mpiexec`` job (oversubscribed when N_mpi exceeds the cores, and said so):

* ``files``: the single-file members through :class:`~ensio.io.modes.files.FileEnsembleIO`,
  N_io = min(N_mpi, N_e) readers, each scattering its rows to its group (the
  write is the mirror: gather, then in place, journaled);
* ``shuffle``: the same members cut into P = N_mpi / N_e tiles (lon blocks,
  halo 1), each rank's tile copied to its own local directory, through
  :class:`~ensio.io.modes.shuffle.ShuffleEnsembleIO`: read the tile, one
  ``Alltoallv`` in the group; reverse ``Alltoallv``, write in place, journaled;
* ``files (tiles)``: the tiles read by every rank from the shared directory
  (:class:`~ensio.io.modes.tiledio.TiledEnsembleIO`, no MPI traffic), for reference.

Per mode: seconds per phase (slowest rank, best of ``repeat`` identity
read + write cycles), bytes moved over MPI (sum over ranks, read and write)
and partners per rank (the most any rank exchanges with). From the measured
per-byte costs a small model (:mod:`ensio.bench.shuffle_model`) projects both
modes to thousands of nodes with node-local disks and finds where they cross.

The command line is :mod:`ensio.cli.bench_shuffle`; it also runs the worker
(:func:`measure`) inside each ``mpiexec`` job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .childenv import child_env
from .machine import describe_machine

__all__ = ["ShuffleBenchSettings", "bench_shuffle", "markdown_rows", "measure", "result_table"]

TILES = "tiles/mem{member:03d}_{tile:04d}.nc"
LABELS = {"files": "files", "shuffle": "shuffle", "files_tiles": "files (tiles)"}


@dataclass(frozen=True)
class ShuffleBenchSettings:
    """The measured case and the setting the model projects to.

    ``proj_*``: N_e, bytes of state per member, ranks per node, the largest
    node count, and the aggregate bandwidth of the global file system (GB/s)
    that the ``files`` readers share; node-local disks are assumed to give
    every rank the per-byte read cost measured here.
    """

    nx: int = 720
    ny: int = 360
    levels: int = 4
    members: int = 2
    ranks: tuple[int, ...] = (2, 4, 8)
    repeat: int = 3
    proj_members: int = 64
    proj_member_gb: float = 2.0
    proj_ranks_per_node: int = 40
    proj_max_nodes: int = 4096
    proj_fs_gbs: float = 100.0


def _case(root: Path, st: ShuffleBenchSettings) -> Path:
    from ..models.synthetic import SyntheticSpec, write_synthetic

    case = root / "case"
    spec = SyntheticSpec(nx=st.nx, ny=st.ny, members=st.members, seed=1, format="cdf5",
                         levels=st.levels or None)  # fmt: skip
    write_synthetic(case, spec)
    return case


def _tiles(case: Path, run: Path, st: ShuffleBenchSettings, n_mpi: int) -> int:
    """Cut the members into P = n_mpi / N_e tiles; copy each rank's tile to its local dir."""
    from ..io.tiles.tilecut import cut_member
    from ..layout.tiles import declared_geometry

    if n_mpi % st.members:
        raise ValueError(f"N_mpi = {n_mpi} is not a multiple of N_e = {st.members}")
    p = n_mpi // st.members
    geo = declared_geometry((st.ny, st.nx), p, (p, 1), 1)
    for m in range(1, st.members + 1):
        cut_member(case / f"mem{m:03d}.nc", str(run / TILES), m, geo)
    for r in range(n_mpi):
        local = run / "local" / f"r{r}"
        local.mkdir(parents=True, exist_ok=True)
        src = run / TILES.format(member=r // p + 1, tile=r % p)
        shutil.copy(src, local / src.name)
        (local / src.name).read_bytes()  # in the page cache, as the members of files mode
    return p


def _run(case: Path, root: Path, st: ShuffleBenchSettings, n_mpi: int) -> dict[str, Any]:
    """One ``mpiexec -n n_mpi`` job of the worker; its JSON result."""
    run = root / f"n{n_mpi}"
    p = _tiles(case, run, st, n_mpi)
    spec = {"case": str(case), "run": str(run), "tiles": p, "repeat": st.repeat}
    (run / "spec.json").write_text(json.dumps(spec))
    mpiexec = str(Path(sys.executable).with_name("mpiexec"))
    if not Path(mpiexec).exists():
        mpiexec = shutil.which("mpiexec") or "mpiexec"
    argv = [mpiexec, "-n", str(n_mpi), sys.executable, "-m", "ensio", "bench", "shuffle",
            "--worker", str(run / "spec.json")]  # fmt: skip
    log = run / "log.txt"
    with log.open("w") as out:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, env=child_env(), cwd=run)  # fmt: skip
    if proc.returncode != 0:
        tail = log.read_text().strip().splitlines()[-3:]
        raise RuntimeError(f"N_mpi = {n_mpi} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return json.loads((run / "result.json").read_text())


def bench_shuffle(st: ShuffleBenchSettings, workdir: str | Path | None = None,
                  on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every N_mpi of ``st.ranks``: measure both modes; then the projection."""
    from .shuffle_model import projection

    step = on_step or (lambda _: None)
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ensio-shuf-"))
    root.mkdir(parents=True, exist_ok=True)
    step("writing the synthetic case")
    case = _case(root, st)
    runs = []
    for n in st.ranks:
        step(f"N_mpi = {n}")
        runs.append(_run(case, root, st, n))
    cores = os.cpu_count() or 1
    res: dict[str, Any] = {
        "settings": asdict(st),
        "machine": describe_machine(root),
        "cores": cores,
        "oversubscribed": [n for n in st.ranks if n > cores],
        "state_bytes_per_member": 8 * st.nx * st.ny * max(st.levels, 1),
        "runs": runs,
    }
    for key, mode in (("seconds", "total"), ("mpi_bytes", "mpi_bytes"), ("partners", "partners")):
        for name in ("files", "shuffle"):
            res[f"{key}_{name}"] = {str(r["n_mpi"]): r[name][mode] for r in runs}
    res["projection"] = projection(res, st)
    if workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return res


# ---------------------------------------------------------------------------- the worker
def _best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return min(rows, key=lambda r: r["total"])


def _files_mode(cfg: Any, comm: Any) -> dict[str, Any]:
    """One identity read + write through N_io readers + scatter; seconds, bytes, partners."""
    from ..io.modes.ensemble import open_ensemble

    t0 = time.perf_counter()
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, comm) as ens:
        opened = time.perf_counter() - t0
        block = ens.read()
        r = ens.stats
        w = ens.write(block)
        g = ens.groups.group_comm
        sent = 8 * ens.n_members * (ens.group_rows.n_rows - ens.rows.count) if ens.groups.is_io \
            else 0
        partners = g.size - 1 if ens.groups.is_io else min(g.size - 1, 1)
    assert r is not None
    mine = 2 * sent  # the write gathers the same bytes back
    return {
        "open_seconds": float(comm.allreduce(opened, op=_max())),
        "phases": {"read": r.read_seconds, "scatter": r.comm_seconds + r.wait_seconds,
                   "gather": w.comm_seconds + w.wait_seconds, "write": w.write_seconds,
                   "journal": w.journal_seconds},
        "total": r.total_seconds + w.total_seconds,
        "mpi_bytes": int(comm.allreduce(mine)),
        "partners": int(comm.allreduce(partners, op=_max())),
        "n_io": ens.n_io,
    }


def _max() -> Any:
    from mpi4py import MPI

    return MPI.MAX


def _shuffle_mode(cfg: Any, comm: Any) -> dict[str, Any]:
    from ..io.modes.shuffle import ShuffleEnsembleIO

    t0 = time.perf_counter()
    with ShuffleEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, comm) as io:
        opened = time.perf_counter() - t0
        block = io.read()
        r, rs = io.stats, dict(io.seconds)
        w = io.write(block)
        ws = dict(io.seconds)
        traffic = io.traffic
        part_bytes = 8 * io.plan.part_rows
    assert r is not None and traffic is not None
    mx = _max()
    phases = {"read": rs["read"], "shuffle": rs["shuffle"], "reverse shuffle": ws["shuffle"],
              "write": ws["write"], "journal": ws["journal"]}
    return {
        "open_seconds": float(comm.allreduce(opened, op=mx)),
        "phases": {k: float(comm.allreduce(v, op=mx)) for k, v in phases.items()},
        "total": r.total_seconds + w.total_seconds,
        "mpi_bytes": 2 * traffic.bytes,
        "partners": traffic.partners,
        "part_bytes": int(comm.allreduce(part_bytes, op=mx)),
    }


def _tiles_files_mode(cfg: Any, comm: Any) -> dict[str, Any]:
    from ..io.modes.tiledio import TiledEnsembleIO

    t0 = time.perf_counter()
    with TiledEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, comm) as io:
        opened = time.perf_counter() - t0
        block = io.read()
        r = io.stats
        w = io.write(block)
    assert r is not None
    return {"open_seconds": float(comm.allreduce(opened, op=_max())),
            "phases": {"read": r.total_seconds, "write": w.total_seconds},
            "total": r.total_seconds + w.total_seconds, "mpi_bytes": 0, "partners": 0}


def _latency(comm: Any, repeat: int = 50) -> float:
    """Seconds per partner of a one-value ``Alltoall`` (median): the per-message cost α."""
    send = np.zeros(comm.size)
    recv = np.empty(comm.size)
    times = []
    for _ in range(repeat):
        comm.Barrier()
        t = time.perf_counter()
        comm.Alltoall(send, recv)
        times.append(time.perf_counter() - t)
    return float(comm.allreduce(float(np.median(times)), op=_max())) / max(comm.size - 1, 1)


def _open_seconds(path: Path, repeat: int = 20) -> float:
    """Median seconds to open a tile file and read its metadata (the per-file cost)."""
    from ..io.formats.open import open_member

    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        with open_member(path) as store:
            store.variables()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def measure(spec: Mapping[str, Any], comm: Any) -> dict[str, Any]:
    """Collective, in the ``mpiexec`` job: every mode ``repeat`` times; the best of each."""
    from ..config.load import load_config

    case, run, p = Path(spec["case"]), Path(spec["run"]), int(spec["tiles"])
    off = ["output.mean=null", "output.spread=null"]
    files = load_config(case / "ensio.yaml", off)
    tiles = [f"ensemble.members={run / TILES}",
             f"ensemble.tiles={{count: {p}, layout: [{p}, 1], halo: 1}}"]  # fmt: skip
    tiled = load_config(case / "ensio.yaml", off + tiles)
    shuffled = load_config(case / "ensio.yaml", off + tiles + [
        "io.mode=shuffle", f"io.local_dir={run}/local/r{{rank}}"])  # fmt: skip
    out: dict[str, Any] = {"n_mpi": comm.size, "tiles": p, "members": files.ensemble.size}
    for name, fn, cfg in (("files", _files_mode, files), ("shuffle", _shuffle_mode, shuffled),
                          ("files_tiles", _tiles_files_mode, tiled)):
        out[name] = _best([fn(cfg, comm) for _ in range(int(spec["repeat"]))])
    out["alpha_seconds"] = _latency(comm)
    local = run / "local" / f"r{comm.rank}"
    mine = _open_seconds(next(local.glob("*.nc")))
    out["open_seconds"] = float(np.median(comm.allgather(mine)))
    return out


def result_table(res: Mapping[str, Any]) -> Any:
    """A rich table: per N_mpi and mode, seconds per phase, MPI bytes, partners."""
    from rich.table import Table

    st = res["settings"]
    over = res["oversubscribed"]
    t = Table(title=f"ensio bench shuffle: N_e = {st['members']}, {st['nx']}x{st['ny']}"
                    f"x{st['levels']} float64 ({res['state_bytes_per_member'] / 1e6:.1f} MB "
                    f"per member); {res['cores']} cores"
                    + (f", N_mpi {over} oversubscribed" if over else ""))
    for c in ("N_mpi", "P", "mode", "open s", "phases (s, slowest rank)", "read+write s",
              "MPI MB", "partners"):
        t.add_column(c, justify="right")
    for r in res["runs"]:
        for mode in ("files", "shuffle", "files_tiles"):
            m = r[mode]
            phases = "\n".join(f"{k} {v:.4f}" for k, v in m["phases"].items())
            t.add_row(str(r["n_mpi"]), str(r["tiles"]), LABELS[mode], f"{m['open_seconds']:.3f}",
                      phases,
                      f"{m['total']:.3f}", f"{m['mpi_bytes'] / 1e6:.1f}", str(m["partners"]))
    p = res["projection"]
    cross = p["cross_nodes"]
    t.caption = (f"model ({p['members']} members of {p['member_gb']} GB, {p['ranks_per_node']} "
                 f"ranks/node, global FS {p['fs_gbs']} GB/s): "
                 + (f"shuffle faster from {cross} nodes on" if cross is not None
                    else "no crossing in the range"))
    return t


def markdown_rows(res: Mapping[str, Any]) -> list[str]:
    """Rows of the docs/benchmarks.md table (one per N_mpi and mode) and the model's line."""
    over = set(res["oversubscribed"])
    out = ["| N_mpi | P | mode | open s | phases s (slowest rank) | read+write s | MPI MB "
           "| partners |", "|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        n = f"{r['n_mpi']}" + (" (oversubscribed)" if r["n_mpi"] in over else "")
        for mode in ("files", "shuffle", "files_tiles"):
            m = r[mode]
            phases = ", ".join(f"{k} {v:.4f}" for k, v in m["phases"].items())
            out.append(f"| {n} | {r['tiles']} | {LABELS[mode]} | {m['open_seconds']:.3f} | "
                       f"{phases} | {m['total']:.4f} | {m['mpi_bytes'] / 1e6:.2f} | "
                       f"{m['partners']} |")
    p, c = res["projection"], res["projection"]["costs"]
    cross = p["cross_nodes"]
    out.append("")
    out.append(f"Model ({p['members']} members of {p['member_gb']} GB, {p['ranks_per_node']} "
               f"ranks per node, global FS {p['fs_gbs']} GB/s; measured α "
               f"{1e6 * c['alpha']:.1f} µs, β {1e9 * c['beta']:.2f} ns/B, c_fs "
               f"{1e9 * c['c_fs']:.2f} ns/B, c_local {1e9 * c['c_local']:.2f} ns/B, c_open "
               f"{1e6 * c['c_open']:.0f} µs): "
               + (f"the shuffle is faster than the better files variant (N_io = N_e with "
                  f"scatter, or N_io = N_mpi) from {cross} nodes on" if cross is not None
                  else "no crossing in the range")
               + f"; files (better variant) / shuffle at {p['nodes'][-1]} nodes: "
               f"{p['ratio_at_max']:.0f}x.")
    return out
