"""Peak observation memory per rank: replicated against regional distribution.

Measures, on every rank, the peak of Python-traced memory (numpy arrays
included, via :mod:`tracemalloc`) while the observations are loaded
(:func:`ensio.analysis.inputs.load_observations`), and how many observations
the rank holds afterwards. Three ways:

* ``replicated``: the default for files up to ``PARTIAL_READ_BYTES``: rank 0
  reads the file and broadcasts it; every rank then keeps its selection;
* ``replicated-partial``: every rank reads all locations, then the values of
  its selection (what larger files get);
* ``regional``: every rank reads a slice and receives the observations near
  its rows.

The analysis itself is not run (its memory does not depend on the mode: the
same observations reach it). Collective; no argument parsing (the script
``benchmarks/obs_memory.sh`` passes the numbers).
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import netCDF4
import numpy as np
from mpi4py import MPI

import ensio.analysis.inputs as inputs
from ensio.config import config_from_dict
from ensio.io.modes.ensemble import read_ensemble
from ensio.models.synthetic import SyntheticSpec, write_synthetic
from ensio.obs import ObsSource

__all__ = ["measure", "write_scatter_obs"]

MODES = ("replicated", "replicated-partial", "regional")


def write_scatter_obs(path: Path, n: int, seed: int = 0) -> None:
    """``n`` observations uniform on the sphere (no index: bilinear H), value, error."""
    rng = np.random.default_rng(seed)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", n)
        ds.createVariable("lon", "f8", ("obs",))[:] = rng.uniform(0.0, 360.0, n)
        ds.createVariable("lat", "f8", ("obs",))[:] = np.degrees(np.arcsin(rng.uniform(-1, 1, n)))
        ds.createVariable("value", "f8", ("obs",))[:] = rng.normal(0.0, 1.0, n)
        ds.createVariable("error", "f8", ("obs",))[:] = np.full(n, 0.5)


def measure(
    workdir: Path, n_obs: int, nx: int, ny: int, radius_km: float, comm: MPI.Comm
) -> dict[str, object]:
    """Collective: per mode, every rank's peak traced MB and observations held.

    Returns (on every rank) ``{"n_obs", "ranks", "grid", "radius_km", "modes":
    {mode: {"peak_mb": [per rank], "held": [per rank], "seconds": [per rank]}}}``.
    """
    workdir = Path(workdir)
    if comm.rank == 0:
        workdir.mkdir(parents=True, exist_ok=True)
        write_synthetic(workdir, SyntheticSpec(nx=nx, ny=ny, members=2, seed=1))
        write_scatter_obs(workdir / "scatter.nc", n_obs)
    comm.Barrier()
    out: dict[str, object] = {"n_obs": n_obs, "ranks": comm.size, "grid": [nx, ny],
                              "radius_km": radius_km, "modes": {}}
    saved = inputs.PARTIAL_READ_BYTES
    try:
        for mode in MODES:
            dist = "regional" if mode == "regional" else "replicated"
            cfg = config_from_dict({
                "ensemble": {"members": str(workdir / "mem{member:03d}.nc"), "size": 2,
                             "variables": ["state"]},
                "analysis": {"filter": "letkf", "localization": {"radius_km": radius_km},
                             "observations": {"distribution": dist}},
            })
            block = read_ensemble(cfg, comm)
            inputs.PARTIAL_READ_BYTES = 0 if mode == "replicated-partial" else saved
            comm.Barrier()
            tracemalloc.start()
            t0 = MPI.Wtime()
            obs = inputs.load_observations(
                [ObsSource(workdir / "scatter.nc")], cfg.analysis, block, comm
            )
            seconds = MPI.Wtime() - t0
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            out["modes"][mode] = {  # type: ignore[index]
                "peak_mb": comm.allgather(round(peak / 2**20, 1)),
                "held": comm.allgather(len(obs)),
                "seconds": comm.allgather(round(seconds, 2)),
            }
            del obs, block
    finally:
        inputs.PARTIAL_READ_BYTES = saved
    return out
