"""The Lorenz-96 cycling example as a real model with netCDF restarts.

Four commands of ``ensio model l96`` (parsed in :mod:`ensio.cli.model`), each a
plain process as a user's own model would be:

``ensio model l96 setup --workdir DIR --members N --cycles K --seed S``
    The whole seeded set-up: truth run (after a spin-up), initial ensemble,
    synthetic observations of every variable at every cycle (R = σ² I). Run by
    ``ensio cycle`` (``workflow.setup``) on the first cycle into a fresh DIR,
    and again (idempotently, extending) when more cycles are asked for. The
    same seed gives the same files bit for bit.
``ensio model l96 run --init IN --out OUT [--steps S]``
    One member forecast: read ``x`` from IN, integrate S RK4 steps, write OUT
    (atomically: temporary name, then rename — a task only succeeds if OUT
    exists, so a killed forecast leaves nothing behind).
``ensio model l96 rmse --workdir DIR``
    Prior (forecast mean) and analysis RMSE against the truth, per cycle.
``ensio model l96 compare --workdir DIR --other DIR2``
    Largest relative difference of the analysis members of two runs, per
    cycle (e.g. the offline and the online mode of the same experiment).

Restart files: dimension ``i`` (40), ``x(i)`` float64 (the state), ``time``
(model time, an auxiliary variable the analysis never touches) and the
forcing as an attribute.
"""

from __future__ import annotations

import time as _time
from pathlib import Path

import netCDF4
import numpy as np

from ..durable import replacing
from .lorenz96 import DT, FORCING, integrate

__all__ = ["compare", "read_state", "rmse_table", "run", "setup", "write_state"]

N_VARS = 40
SPINUP_TIME = 20.0


def write_state(path: Path, x: np.ndarray, model_time: float, forcing: float = FORCING) -> None:
    """Write a restart atomically (temporary file in the same directory, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp, netCDF4.Dataset(tmp, "w", format="NETCDF4") as ds:
        ds.title = "Lorenz-96 restart (ensio example)"
        ds.forcing = float(forcing)
        ds.createDimension("i", x.size)
        v = ds.createVariable("x", "f8", ("i",), contiguous=True)
        v.long_name = "Lorenz-96 state"
        v[:] = x
        t = ds.createVariable("time", "f8", ())
        t.units = "model time units"
        t[...] = model_time


def read_state(path: Path) -> tuple[np.ndarray, float]:
    """``x`` and the model time of a restart."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        return np.asarray(ds["x"][:], dtype=float), float(ds["time"][...])


def _obs_path(workdir: Path, cycle: int) -> Path:
    return workdir / "obs" / f"obs_{cycle:03d}.nc"


def _truth_path(workdir: Path, cycle: int) -> Path:
    return workdir / "truth" / f"truth_{cycle:03d}.nc"


def _write_obs(path: Path, values: np.ndarray, sigma: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = values.size
    with replacing(path) as tmp, netCDF4.Dataset(tmp, "w", format="NETCDF4") as ds:
        ds.createDimension("obs", n)
        for name, data in (
            ("lon", np.zeros(n)),
            ("lat", np.zeros(n)),
            ("value", values),
            ("error", np.full(n, sigma)),
        ):
            ds.createVariable(name, "f8", ("obs",))[:] = data
        ds.createVariable("index", "i8", ("obs",))[:] = np.arange(n)


def setup(
    workdir: Path,
    members: int,
    cycles: int,
    seed: int,
    steps: int = 1,
    sigma: float = 1.0,
) -> None:
    """Create (or extend to ``cycles``) the truth, observations and initial ensemble.

    Deterministic: the truth is integrated from one seeded state, the
    observation noise of cycle c comes from its own stream keyed by (seed, c),
    and the initial ensemble from the stream (seed, 0), so extending a run
    never changes what already exists.
    """
    workdir = Path(workdir)
    rng0 = np.random.default_rng([seed, 0])
    if not _truth_path(workdir, 0).exists():
        x0 = integrate(FORCING + rng0.standard_normal(N_VARS), round(SPINUP_TIME / DT))
        write_state(_truth_path(workdir, 0), x0, 0.0)
    init = workdir / "init"
    if not (init / f"mem{members:03d}.nc").exists():
        # A climatological initial ensemble: snapshots of an independent free
        # run, one every 2 time units, so the first prior is honestly uninformed.
        rng1 = np.random.default_rng([seed, 0, 1])
        x = integrate(FORCING + rng1.standard_normal(N_VARS), round(SPINUP_TIME / DT))
        for m in range(members):
            x = integrate(x, round(2.0 / DT))
            write_state(init / f"mem{m + 1:03d}.nc", x, 0.0)
    for c in range(1, cycles + 1):
        if _obs_path(workdir, c).exists() and _truth_path(workdir, c).exists():
            continue
        prev, t = read_state(_truth_path(workdir, c - 1))
        x = integrate(prev, steps)
        noise = np.random.default_rng([seed, c]).standard_normal(N_VARS)
        _write_obs(_obs_path(workdir, c), x + sigma * noise, sigma)
        write_state(_truth_path(workdir, c), x, t + steps * DT)


def run(init: Path, out: Path, steps: int, sleep: float = 0.0) -> None:
    """One member forecast (see the module docstring)."""
    x, t = read_state(init)
    if sleep > 0:
        _time.sleep(sleep)  # imitates a longer model run
    write_state(out, integrate(x, steps), t + steps * DT)


def rmse_table(workdir: Path) -> list[tuple[int, float, float | None]]:
    """Per cycle: (cycle, forecast-mean RMSE, analysis-mean RMSE or None)."""
    workdir = Path(workdir)
    rows = []
    c = 1
    while (workdir / f"cycle_{c:03d}" / "forecast").is_dir():
        truth, _ = read_state(_truth_path(workdir, c))
        fc = sorted((workdir / f"cycle_{c:03d}" / "forecast").glob("mem*.nc"))
        an = sorted((workdir / f"cycle_{c:03d}" / "analysis").glob("mem*.nc"))
        prior = np.mean([read_state(p)[0] for p in fc], axis=0) if fc else None
        post = np.mean([read_state(p)[0] for p in an], axis=0) if an else None
        if prior is None:
            break
        rows.append(
            (
                c,
                float(np.sqrt(np.mean((prior - truth) ** 2))),
                None if post is None else float(np.sqrt(np.mean((post - truth) ** 2))),
            )
        )
        c += 1
    return rows


def compare(workdir: Path, other: Path) -> list[tuple[int, float]]:
    """Per cycle present in both runs: max |a − b| / max |b| over the analysis members."""
    rows = []
    c = 1
    while True:
        a_dir = Path(workdir) / f"cycle_{c:03d}" / "analysis"
        b_dir = Path(other) / f"cycle_{c:03d}" / "analysis"
        names = sorted(p.name for p in b_dir.glob("mem*.nc"))
        if not names or not a_dir.is_dir():
            return rows
        diff = scale = 0.0
        for name in names:
            a, b = read_state(a_dir / name)[0], read_state(b_dir / name)[0]
            diff = max(diff, float(np.max(np.abs(a - b))))
            scale = max(scale, float(np.max(np.abs(b))))
        rows.append((c, diff / scale))
        c += 1

