"""Synthetic observations of the truth, written as ensio observation files.

Per cycle c, from the truth restart at the analysis time (interior, time level ``tau``):

* ``sst_CCC.nc``: SST — ``core/temp`` at the top level — on a thinned grid (every
  ``stride``-th point in x and y), error ``err_sst``;
* ``prof_temp_CCC.nc`` / ``prof_salt_CCC.nc``: ``profiles`` Argo-like T and S profiles
  at random ocean columns (new ones every cycle), every model level, errors
  ``err_temp`` / ``err_salt``.

Each observation sits exactly on a T point (lon = xt, lat = yt, level = zt) so that H
is the model value there and the truth's error is the stated noise alone. Points whose
bilinear cell (i..i+1, j..j+1) is not all ocean, or that lie on the last x column (the
cyclic edge ensio's lon/lat interpolation does not wrap), are not used. The files follow
ensio's convention: dimension ``obs``; ``lon``, ``lat``, ``value``, ``error``, ``level``;
the global attribute ``variable`` names the state variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...durable import replacing
from .prepare import interior

__all__ = ["ObsPlan", "read_state", "write_cycle_obs"]


@dataclass(frozen=True)
class ObsPlan:
    """What is observed each cycle, and how well (errors are standard deviations)."""

    stride: int = 3
    profiles: int = 30
    err_sst: float = 0.2
    err_temp: float = 0.1
    err_salt: float = 0.02


def read_state(path: Path, names: tuple[str, ...] = ("temp", "salt")) -> dict[str, np.ndarray]:
    """Interior (x, y, z) arrays of ``core/NAME`` at the restart's level ``core/tau``."""
    import h5py

    with h5py.File(path, "r") as f:
        tau = int(f["core/tau"][()])
        return {n: interior(f[f"core/{n}"][..., tau]) for n in names}


def _usable(ocean: np.ndarray) -> np.ndarray:
    """(x, y) columns whose bilinear cell is ocean at every level (see the module docstring)."""
    col = ocean.all(axis=2)
    ok = np.zeros_like(col)
    ok[:-1, :-1] = col[:-1, :-1] & col[1:, :-1] & col[:-1, 1:] & col[1:, 1:]
    return ok


def _write(path: Path, variable: str, lon: np.ndarray, lat: np.ndarray, level: np.ndarray,
           value: np.ndarray, error: float, what: str) -> None:
    import netCDF4

    with replacing(path) as tmp, netCDF4.Dataset(tmp, "w", format="NETCDF4") as ds:
        ds.createDimension("obs", value.size)
        for name, data, attrs in (
            ("lon", lon, {"units": "degrees_east"}),
            ("lat", lat, {"units": "degrees_north"}),
            ("level", level, {"units": "m", "positive": "up",
                              "long_name": "depth coordinate zt of the observation"}),
            ("value", value, {"long_name": what}),
            ("error", np.full(value.size, error), {"long_name": "error standard deviation"}),
        ):
            v = ds.createVariable(name, "f8", ("obs",))
            v[:] = data
            v.setncatts(attrs)
        ds.variable = variable
        ds.title = f"synthetic {what} from the truth run (OSSE)"


def write_cycle_obs(truth: Path, out_dir: Path, cycle: int, plan: ObsPlan, seed: int,
                    xt: np.ndarray, yt: np.ndarray, zt: np.ndarray,
                    ocean: np.ndarray) -> dict[str, int]:
    """Write the cycle's three observation files; returns the count of each.

    ``ocean`` is (x, y, z); the noise is seeded by (seed, cycle), so a rerun writes the
    same files.
    """
    state = read_state(truth)
    rng = np.random.default_rng([seed, 1000 + cycle])
    usable = _usable(ocean)
    nz = zt.size
    ix, iy = np.meshgrid(np.arange(0, xt.size, plan.stride), np.arange(0, yt.size, plan.stride),
                         indexing="ij")
    keep = usable[ix, iy]
    ix, iy = ix[keep], iy[keep]
    sst = state["temp"][ix, iy, nz - 1] + plan.err_sst * rng.standard_normal(ix.size)
    _write(out_dir / f"sst_{cycle:03d}.nc", "core/temp", xt[ix], yt[iy],
           np.full(ix.size, zt[nz - 1]), sst, plan.err_sst, "sea surface temperature")
    cols = np.flatnonzero(usable.ravel())
    pick = np.sort(rng.choice(cols, size=min(plan.profiles, cols.size), replace=False))
    px, py = np.unravel_index(pick, usable.shape)
    lon = np.repeat(xt[px], nz)
    lat = np.repeat(yt[py], nz)
    lev = np.tile(zt, px.size)
    counts = {"sst": int(ix.size)}
    for name, err in (("temp", plan.err_temp), ("salt", plan.err_salt)):
        truth_values = state[name][px, py, :].ravel()  # (profile, level), level fastest
        value = truth_values + err * rng.standard_normal(truth_values.size)
        _write(out_dir / f"prof_{name}_{cycle:03d}.nc", f"core/{name}", lon, lat, lev, value,
               err, f"{name} profiles")
        counts[f"prof_{name}"] = int(value.size)
    return counts
