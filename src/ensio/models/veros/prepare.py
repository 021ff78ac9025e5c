"""The OSSE's model side before any assimilation: set-up, spin-up, grid, ensemble, truth.

Everything is the unmodified ``acc`` setup of Veros (``veros copy-setup acc``) run with
``veros run`` and settings given on the command line; ensio only reads and writes its
restarts (plain HDF5 by h5py: ``core/temp`` … of shape (x + 4, y + 4, z, 3), halo 2,
three time levels, ``core/tau`` the current one).

How the initial states are made, and why:

* **Spin-up.** From the setup's initial conditions (at rest, T linear in depth, S = 35)
  for ``spinup_days``, then on for (N_e + 1) · ``spacing_days`` days with a restart every
  ``spacing_days``: N_e + 1 states of one trajectory on different days. The middle one
  becomes the truth's initial state, the others the members' (so the truth lies inside
  the ensemble's spread of the slow spin-up drift, not at its end).
* **Perturbations.** ``acc`` has no salinity forcing: S stays 35 everywhere, so there would
  be nothing to assimilate in S. Truth and every member therefore get their own smooth
  random anomaly of T and S (white noise smoothed by a Gaussian of a few grid cells in x,
  y and z, scaled to ``amp_temp`` / ``amp_salt`` standard deviation over the ocean) on
  every time level: the same distribution for truth and members, so the initial ensemble
  spread matches its error. Land stays 0; the cyclic x-halo is refilled from the
  interior as Veros does. All members take the truth's model time (``core/time``), so
  the ensemble is valid at one time.
* **Grid.** ``xt``, ``yt``, ``zt`` and ``maskT`` (land where the snapshot's ``temp`` is its
  ``_FillValue``) from the spin-up's own ``acc.snapshot.nc``, written as ``grid.nc``, the
  file ``ensemble.grid`` of the config names.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...durable import replacing
from .run import VerosFailed, check_restart, run_veros, veros_argv, veros_executable

__all__ = ["HALO", "Prepared", "copy_setup", "interior", "make_ensemble", "run_truth",
           "spin_up", "write_grid"]

#: Ghost cells on each side of x and y in a Veros restart.
HALO = 2
#: Seconds per model day; the ``acc`` tracer step (dt_tracer) is half a day.
DAY = 86400.0
#: acc writes its snapshot every 10 days: the spin-up must reach one for the grid.
SNAPSHOT_DAYS = 10.0

Log = Callable[[str], None]


def interior(a: np.ndarray) -> np.ndarray:
    """The interior (halo cut) of a restart array (x, y, ...) -> (x - 4, y - 4, ...)."""
    return a[HALO:-HALO, HALO:-HALO]


def copy_setup(root: Path) -> Path:
    """``veros copy-setup acc --to ROOT/setup`` once; the path of ``acc.py``."""
    setup = root / "setup" / "acc.py"
    if not setup.exists():
        shutil.rmtree(root / "setup", ignore_errors=True)
        proc = subprocess.run([veros_executable(), "copy-setup", "acc", "--to",
                               str(root / "setup")], capture_output=True, text=True)
        if proc.returncode != 0 or not setup.exists():
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise VerosFailed(f"veros copy-setup acc failed (exit {proc.returncode}): {last}")
    return setup


def _chain(setup: Path, start: Path, outs: list[Path], days: float, work: Path) -> None:
    """``len(outs)`` runs of ``days`` each, run k from run k−1's restart (``start`` first).

    Chained runs rather than one run with ``restart_frequency``: Veros writes periodic
    restarts at multiples of the frequency in *model time*, not from the run's start, so
    they would not fall on the analysis times. Runs whose restart exists are skipped.
    """
    prev = start
    for out in outs:
        if not out.exists():
            tmp = out.with_name(f".{out.name}.tmp")
            run_veros(veros_argv(setup, restart_in=prev, restart_out=tmp, seconds=days * DAY),
                      work / "run", work / f"{out.stem}.log")
            check_restart(tmp)
            tmp.replace(out)
        prev = out


def spin_up(setup: Path, root: Path, days: float, states: int, spacing: float,
            log: Log) -> tuple[list[Path], Path]:
    """Spin up, then ``states`` restarts ``spacing`` days apart; (their paths, the snapshot).

    In ``ROOT/spinup``: one run from the initial conditions for ``days`` (its snapshot
    gives the grid), then ``states`` chained runs of ``spacing`` days. Skipped when their
    results exist.
    """
    if days < SNAPSHOT_DAYS:
        raise ValueError(f"--spinup-days: at least {SNAPSHOT_DAYS:g} (acc writes its first "
                         f"snapshot, which gives the grid, at day {SNAPSHOT_DAYS:g})")
    base = root / "spinup"
    spun, snapshot = base / "spun.h5", base / "acc.snapshot.nc"
    if not (spun.exists() and snapshot.exists()):
        log(f"spin-up: acc from rest for {days:g} days")
        base.mkdir(exist_ok=True)
        run_veros(veros_argv(setup, restart_in=None, restart_out=base / "a.h5",
                             seconds=days * DAY), base / "a", base / "a.log")
        check_restart(base / "a.h5")
        shutil.copyfile(base / "a" / "acc.snapshot.nc", snapshot)
        (base / "a.h5").replace(spun)
    out = [base / "states" / f"state_{k:03d}.h5" for k in range(1, states + 1)]
    if not all(p.exists() for p in out):
        log(f"spin-up: {states} states {spacing:g} days apart")
        (base / "states").mkdir(exist_ok=True)
        _chain(setup, spun, out, spacing, base / "states")
    return out, snapshot


def write_grid(snapshot: Path, out: Path) -> np.ndarray:
    """``grid.nc`` from the model's snapshot; returns maskT as (x, y, z) booleans.

    Land is where the snapshot's ``temp`` (Time, zt, yt, xt) holds its ``_FillValue``.
    ``maskT`` is stored (zt, yt, xt) as Veros's own output is, int8 1 = ocean.
    """
    import netCDF4

    with netCDF4.Dataset(snapshot) as src:
        temp = src["temp"]
        temp.set_auto_mask(True)
        ocean = ~np.ma.getmaskarray(temp[0])  # (zt, yt, xt)
        coords = {n: (np.asarray(src[n][:], float), dict(
            (a, src[n].getncattr(a)) for a in ("long_name", "units", "positive")
            if a in src[n].ncattrs())) for n in ("xt", "yt", "zt")}
    with replacing(out) as tmp, netCDF4.Dataset(tmp, "w", format="NETCDF4") as ds:
        for n, (v, attrs) in coords.items():
            ds.createDimension(n, v.size)
            var = ds.createVariable(n, "f8", (n,))
            var[:] = v
            var.setncatts(attrs)
        m = ds.createVariable("maskT", "i1", ("zt", "yt", "xt"))
        m[:] = ocean.astype(np.int8)
        m.long_name = "ocean mask of T points (1 ocean, 0 land)"
        ds.title = f"grid of the Veros acc setup, from {snapshot.name}"
    return np.transpose(ocean, (2, 1, 0))


def _anomaly(rng: np.random.Generator, ocean: np.ndarray, smooth: tuple[float, float, float],
             ) -> np.ndarray:
    """A smooth anomaly (x, y, z) of unit standard deviation over ``ocean``, 0 on land."""
    from scipy.ndimage import gaussian_filter

    noise = gaussian_filter(rng.standard_normal(ocean.shape), smooth,
                            mode=("wrap", "nearest", "nearest"))
    noise = np.where(ocean, noise, 0.0)
    return noise / np.sqrt(np.mean(noise[ocean] ** 2))


def _perturb(src: Path, dst: Path, rng: np.random.Generator, ocean: np.ndarray,
             amp: dict[str, float], smooth: tuple[float, float, float], time: float) -> None:
    """Copy ``src`` to ``dst`` with anomalies added to ``core/temp``/``core/salt``."""
    import h5py

    with replacing(dst) as tmp:
        shutil.copyfile(src, tmp)
        with h5py.File(tmp, "r+") as f:
            for name, a in amp.items():
                ds = f[f"core/{name}"]
                data = ds[...]
                add = a * _anomaly(rng, ocean, smooth)
                data[HALO:-HALO, HALO:-HALO] += add[..., None]  # every time level
                data[:HALO] = data[-2 * HALO:-HALO]             # cyclic x-halo, as Veros
                data[-HALO:] = data[HALO:2 * HALO]
                ds[...] = data
            f["core/time"][()] = time


@dataclass(frozen=True)
class Prepared:
    """Where the prepared experiment's files are."""

    setup: Path
    grid: Path
    ocean: np.ndarray          # (x, y, z) bool
    members: tuple[Path, ...]  # initial member restarts, member 1 first
    truth0: Path               # the truth's initial restart


def make_ensemble(states: list[Path], root: Path, members: int, seed: int,
                  amp: dict[str, float], smooth: tuple[float, float, float],
                  ocean: np.ndarray, log: Log) -> tuple[Path, tuple[Path, ...]]:
    """Truth and member initial restarts from the spin-up states (see the module docstring)."""
    import h5py

    mid = len(states) // 2
    truth_state, member_states = states[mid], states[:mid] + states[mid + 1:]
    assert len(member_states) == members
    truth0 = root / "truth" / "truth_000.h5"
    inits = tuple(root / "init" / f"mem{m:03d}.h5" for m in range(1, members + 1))
    if truth0.exists() and all(p.exists() for p in inits):
        return truth0, inits
    log(f"initial ensemble: truth and {members} members from spin-up days, perturbed")
    truth0.parent.mkdir(exist_ok=True)
    inits[0].parent.mkdir(exist_ok=True)
    with h5py.File(truth_state, "r") as f:
        time = float(f["core/time"][()])
    rng = np.random.default_rng([seed, 0])
    _perturb(truth_state, truth0, rng, ocean, amp, smooth, time)
    for m, (src, dst) in enumerate(zip(member_states, inits, strict=True), start=1):
        _perturb(src, dst, np.random.default_rng([seed, m]), ocean, amp, smooth, time)
    return truth0, inits


def run_truth(setup: Path, truth0: Path, root: Path, cycles: int, days: float,
              log: Log) -> list[Path]:
    """The truth: ``cycles`` chained runs of ``days``, as the members are run.

    Returns ``ROOT/truth/truth_CCC.h5`` for c = 1..cycles (c = 0 is the initial state).
    """
    base = root / "truth"
    want = [base / f"truth_{c:03d}.h5" for c in range(1, cycles + 1)]
    if not all(p.exists() for p in want):
        log(f"truth: {cycles} × {days:g} days")
        _chain(setup, truth0, want, days, base)
    return want
