"""Small restart-like members with halo and time levels, and the write-back computed by hand.

The members hold ``temp`` (x with a cyclic halo of ``H`` cells on each side, y with
one non-cyclic ghost row on each side, 3 time levels; float64), its ``also``
companion ``tb`` (same shape), ``salt`` (float32, cyclic halo, only the state level
changes) and ``other`` (never written). The layout is built here from the geometry
(rows: interior, state level, ocean), with the companions of
:func:`ensio.layout.companions.build_companions`; :func:`expected` computes what the
files must hold after a write with plain numpy periodic indexing, independent of the
companion maps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np

from ensio.layout.companions import build_companions
from ensio.layout.state import StateLayout, VariableLayout

N, M, H, LEVELS, TAU = 7, 4, 2, 3, 1  # interior x, interior y, x halo, levels, state level
NX, NY = N + 2 * H, M + 2
SHAPE = (NX, NY, LEVELS)
DIMS = ("x", "y", "level")


@dataclass(frozen=True)
class Members:
    paths: list[Path]
    ocean: np.ndarray  # bool (N, M): interior points that are rows


def ocean_mask(rng: np.random.Generator) -> np.ndarray:
    ocean = rng.random((N, M)) > 0.25
    ocean[0, 0] = ocean[N - 1, M - 1] = True
    return ocean


def _periodic(a: np.ndarray) -> np.ndarray:
    """(N, NY, ...) interior columns -> (NX, NY, ...) with the cyclic x halo filled."""
    src = H + (np.arange(NX) - H) % N
    full = np.zeros((NX, *a.shape[1:]), dtype=a.dtype)
    full[H:H + N] = a
    return full[src]


def write_members(tmp: Path, n_members: int, rng: np.random.Generator, *,
                  chunked: bool = False, consistent: bool = True) -> Members:
    """netCDF-4 members (contiguous: byte-range path; chunked + zlib: library path).

    ``consistent``: the halo holds copies of the opposite interior (as a model
    leaves it); else random values, so a copy that should not happen shows.
    """
    ocean = ocean_mask(rng)
    paths = []
    for m in range(n_members):
        path = tmp / f"mem{m + 1:02d}.nc"
        with netCDF4.Dataset(path, "w") as ds:
            for d, n in zip(DIMS, SHAPE, strict=True):
                ds.createDimension(d, n)
            kw = {"zlib": True, "complevel": 1, "chunksizes": (4, NY, LEVELS)} if chunked \
                else {"contiguous": True}
            for name, dtype in (("temp", "f8"), ("tb", "f8"), ("salt", "f4"), ("other", "f8")):
                v = ds.createVariable(name, dtype, DIMS, **kw)
                vals = rng.normal(10.0, 3.0, (N, NY, LEVELS))
                full = _periodic(vals) if consistent else rng.normal(10.0, 3.0, SHAPE)
                v[:] = full.astype(dtype)
        paths.append(path)
    return Members(paths, ocean)


def row_mask(ocean: np.ndarray) -> np.ndarray:
    """bool SHAPE: the elements that are state rows."""
    rows = np.zeros(SHAPE, dtype=bool)
    rows[H:H + N, 1:1 + M, TAU] = ocean
    return rows


def make_layout(ocean: np.ndarray, *, increment: str = "all", also: bool = True
                ) -> StateLayout:
    """temp (cyclic x, levels by ``increment``, also tb) then salt (cyclic x, current)."""
    active = np.flatnonzero(row_mask(ocean)).astype(np.int64)
    variables, offset = [], 0
    for name, dtype, inc, al in (("temp", "f8", increment, ("tb",) if also else ()),
                                 ("salt", "f4", "current", ())):
        v = VariableLayout(name, DIMS, SHAPE, np.dtype(dtype), offset, active.size, active)
        comps = build_companions(v, halo={"x": H, "y": 1}, cyclic=("x",), level_dim="level",
                                 increment=inc, also=al)
        variables.append(VariableLayout(name, DIMS, SHAPE, np.dtype(dtype), offset,
                                        active.size, active, companions=comps))
        offset += active.size
    return StateLayout(tuple(variables), offset)


def read_all(path: Path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return {n: np.array(ds[n][:]) for n in ("temp", "tb", "salt", "other")}


def expected(prior: dict[str, np.ndarray], rows: dict[str, np.ndarray], ocean: np.ndarray,
             *, increment: str = "all", also: bool = True) -> dict[str, np.ndarray]:
    """The files after writing ``rows[name]`` (float64 per state row, NaN: keep).

    Written from the rule, with periodic indexing: the state level's x halo is a
    copy of the opposite interior column (where that row changed); with
    ``increment: all`` every other level, interior and halo, gets old + the
    increment of the same (wrapped) position; ``tb`` gets old + the increment
    wherever ``temp`` changes.
    """
    out = {k: v.copy() for k, v in prior.items()}
    mask = row_mask(ocean)
    src = H + (np.arange(NX) - H) % N  # stored x -> its interior source column
    for name in ("temp", "salt"):
        dtype = prior[name].dtype
        new = prior[name].copy()
        full = np.full(SHAPE, np.nan)
        full[mask] = rows[name]
        stored = np.where(np.isnan(full), prior[name], full.astype(dtype))
        new[mask] = stored[mask]
        changed = np.zeros(SHAPE, dtype=bool)
        changed[mask] = new[mask].view(f"u{dtype.itemsize}") != \
            prior[name][mask].view(f"u{dtype.itemsize}")
        inc = np.zeros(SHAPE)
        inc[mask] = new[mask].astype(np.float64) - prior[name][mask].astype(np.float64)
        # the state level: the halo columns copy their source column where it changed
        moved = changed[src][:, :, TAU] & (np.arange(NX) != src)[:, None]
        lev = new[:, :, TAU]
        lev[moved] = new[src][:, :, TAU][moved]
        wrapped_changed = changed[src][:, :, TAU]  # (NX, NY) source changed
        wrapped_inc = inc[src][:, :, TAU]
        if name == "temp":
            if increment == "all":
                for lv in range(LEVELS):
                    if lv != TAU:
                        layer = new[:, :, lv]
                        layer[wrapped_changed] = (prior[name][:, :, lv][wrapped_changed]
                                                  + wrapped_inc[wrapped_changed])
            if also:
                tb = out["tb"]
                for lv in range(LEVELS):
                    if lv != TAU and increment != "all":
                        continue
                    layer = tb[:, :, lv]
                    layer[wrapped_changed] = (prior["tb"][:, :, lv][wrapped_changed]
                                              + wrapped_inc[wrapped_changed])
        out[name] = new
    return out
