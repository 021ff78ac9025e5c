"""A moving synthetic field with observations spread over the window: the 4-D case.

Why: a 4-D analysis (``analysis.time_slots``) is worth its history files only
when the state moves during the assimilation window, so that an observation
taken three hours before the analysis time says something about where the
field *was*. This case makes that visible with the synthetic field of
:mod:`ensio.models.synthetic`, moved eastward at a constant speed: the state
of a member with phase shift ``φ`` at time ``t`` (hours, relative to the
analysis time) is ``field(φ + speed · t)``, the truth has ``φ = 0`` and the
members the seeded shifts of :func:`~ensio.models.synthetic.member_shifts`.

Files written by :func:`write_moving` into ``OUT``:

* ``memNNN.nc`` — each member at the analysis time (``t = 0``, the state the
  analysis updates);
* ``fc/memNNN_slotS.nc`` — each member at the centre of time slot S (1-based,
  ``slots`` equal slots over ``window``), the model's history files;
* ``truth.nc`` — the truth at the analysis time;
* ``obs.nc`` — observations of the truth at random grid points and random
  times uniform over the window: ``lon``, ``lat``, ``index``, ``value`` (truth
  at that time + N(0, σ²)), ``error`` = σ and ``time`` (hours relative to the
  analysis time, the unit of ``analysis.window``).

The config of the run is left to the caller (:func:`config_text` gives one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np

from .synthetic import LOCALIZATION_CELLS, OBS_ERROR, field, grid, member_shifts, spacing_km

__all__ = ["MovingCase", "config_text", "slot_times", "write_moving", "write_state"]


@dataclass(frozen=True)
class MovingCase:
    """What :func:`write_moving` produced (paths and the parameters it used)."""

    directory: Path
    nx: int
    ny: int
    members: int
    slots: int
    window: tuple[float, float]
    speed: float
    n_obs: int


def slot_times(window: tuple[float, float], slots: int) -> np.ndarray:
    """Centre of each of ``slots`` equal slots over ``window`` (the history files' times)."""
    a, b = window
    return a + (np.arange(slots) + 0.5) * (b - a) / slots


def write_state(path: Path, nx: int, ny: int, state: np.ndarray, time: float = 0.0) -> None:
    """One member (or truth) file: ``lon``, ``lat`` of :func:`~ensio.models.synthetic.grid`,
    ``state(lat, lon)`` float64 and the global attribute ``time_hours``."""
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("lon", nx)
        ds.createDimension("lat", ny)
        lon, lat = grid(nx, ny)
        ds.createVariable("lon", "f8", ("lon",))[:] = lon
        ds.createVariable("lat", "f8", ("lat",))[:] = lat
        ds["lon"].units, ds["lat"].units = "degrees_east", "degrees_north"
        ds.createVariable("state", "f8", ("lat", "lon"), contiguous=True)[:] = state
        ds.time_hours = time


def write_moving(
    out: str | Path,
    *,
    nx: int = 72,
    ny: int = 36,
    members: int = 16,
    slots: int = 6,
    window: tuple[float, float] = (-3.0, 3.0),
    speed: float = 0.1,
    n_obs: int = 400,
    seed: int = 1,
) -> MovingCase:
    """Write the moving-field case into ``out`` (see the module docstring).

    Parameters
    ----------
    speed : float
        Phase speed of the field, argument units per hour (0.1: about 9° of
        longitude per hour on the synthetic field).
    n_obs : int
        Observations, at distinct grid points, times uniform over the window.
    seed : int
        Seeds the member shifts (as ``ensio synth``) and the observations.
    """
    out = Path(out)
    (out / "fc").mkdir(parents=True, exist_ok=True)
    shifts = member_shifts(seed, members)
    times = slot_times(window, slots)
    for k in range(1, members + 1):
        phase = float(shifts[k - 1])
        write_state(out / f"mem{k:03d}.nc", nx, ny, field(nx, ny, phase), 0.0)
        for s, t in enumerate(times, start=1):
            path = out / "fc" / f"mem{k:03d}_slot{s}.nc"
            write_state(path, nx, ny, field(nx, ny, phase + speed * t), float(t))
    write_state(out / "truth.nc", nx, ny, field(nx, ny, 0.0), 0.0)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 4]))
    index = np.sort(rng.choice(nx * ny, size=n_obs, replace=False)).astype(np.int64)
    t_obs = rng.uniform(window[0], window[1], size=n_obs)
    truth = np.stack([field(nx, ny, speed * t).ravel()[i] for t, i in zip(t_obs, index,
                                                                           strict=True)])
    lon, lat = grid(nx, ny)
    with netCDF4.Dataset(out / "obs.nc", "w", format="NETCDF4") as ds:
        ds.createDimension("obs", n_obs)
        values = {
            "lon": lon[index % nx], "lat": lat[index // nx], "index": index,
            "value": truth + rng.normal(0.0, OBS_ERROR, size=n_obs),
            "error": np.full(n_obs, OBS_ERROR), "time": t_obs,
        }  # fmt: skip
        for name, v in values.items():
            ds.createVariable(name, "i8" if v.dtype.kind == "i" else "f8", ("obs",))[:] = v
        ds["time"].units = "hours relative to the analysis time"
    return MovingCase(out, nx, ny, members, slots, window, speed, n_obs)


def config_text(case: MovingCase, four_d: bool, out: str = "an") -> str:
    """An LETKF config for the case: 3-D (no slots) or 4-D, writing copies into ``out/``."""
    radius = np.ceil(LOCALIZATION_CELLS * spacing_km(case.nx, case.ny))
    slots = (
        f"  time_slots: {case.slots}\n  window: [{case.window[0]}, {case.window[1]}]\n"
        if four_d else ""
    )
    return (
        "ensemble:\n"
        '  members: "mem{member:03d}.nc"\n'
        f"  size: {case.members}\n"
        "  variables: [state]\n"
        + ('  slots: "fc/mem{member:03d}_slot{slot}.nc"\n' if four_d else "")
        + "io: {in_place: false}\n"
        "observations: [obs.nc]\n"
        "analysis:\n"
        "  filter: letkf\n"
        f"  localization: {{radius_km: {radius:.0f}}}\n"
        + slots
        + "output:\n"
        f'  members: "{out}/mem{{member:03d}}.nc"\n'
        f"  mean: {out}/mean.nc\n"
    )

