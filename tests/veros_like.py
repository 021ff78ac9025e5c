"""Files shaped exactly as Veros 1.7 writes them: a restart (plain HDF5 by h5py) and a grid.

Why a writer of our own: tests must not need Veros (a heavy install running a model
for minutes), yet ensio's plain-HDF5 path must meet the bytes Veros really leaves.
This module repeats what ``veros/restart.py`` (``write_to_h5``) does for a run on one
process, checked against a real restart (``acc_0020.h5`` of the ``acc`` set-up):

* ``h5py.File(path, "w")`` with the default file-creation properties (no creation-order
  tracking, libver earliest), no attributes anywhere, no dimension scales and no
  ``_NCProperties``: netCDF-C shows ``phony_dim_N`` dimensions;
* groups ``core``, ``averages``, ``energy``, ``overturning``, ``tracer_monitor`` and an
  empty ``snapshot`` (``require_group`` per diagnostic), each dataset made by
  ``require_dataset(key, global_shape, dtype, exact=True, chunks=..., compression="gzip",
  compression_opts=1)`` then written as one slab;
* arrays in Veros order (x, y, z, time level) with 2 ghost cells on each side of x and y:
  (nx+4, ny+4, nz, 3), float64, chunked per MPI subdomain **without** ghosts
  ((nx, ny, nz, 3) on one process, gzip level 1; several processes write uncompressed);
* scalars ``core/tau``, ``taum1``, ``taup1`` (int32) and ``core/time`` (float64);
* land = 0 at every level; ``enable_cyclic_x``: the x halo holds copies of the opposite
  interior columns (x index i < halo copies i + nx, i >= nx + halo copies i - nx); the y
  halo is 0.

``write_grid_file`` writes the grid as the model's netCDF output has it: ``xt(xt)``,
``yt(yt)``, ``zt(zt)`` (metres, negative down, ``positive: up``) and ``maskT(zt, yt, xt)``
(int8, 1 ocean, 0 land).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: Veros's core restart variables of shape (x, y, z, level), in the order Veros writes them.
CORE_4D = ("temp", "salt", "u", "v", "w", "Hd", "dHd", "Nsqr", "rho", "int_drhodT",
           "int_drhodS", "dtemp", "dsalt", "du", "dv", "tke", "dtke", "eke", "deke")
#: Veros's diagnostics' restart content: group -> {name: kind}; kinds are shapes in words.
DIAGNOSTICS = {
    "averages": {"average_nitts": "scalar", "psi": "xy", "salt": "xyz", "surface_taux": "xy",
                 "surface_tauy": "xy", "temp": "xyz", "u": "xyz", "v": "xyz", "w": "xyz"},
    "energy": {name: "scalar" for name in ("nitts", "k_m", "eke_m", "tke_m", "wind_m",
                                            "dE_tot_m", "Hd_m", "dHd_m")},
    "overturning": {"nitts": "scalar", "sigma": "sigma", "trans": "y_sigma",
                    "vsf_depth": "yz", "vsf_iso": "yz", "bolus_depth": "yz", "bolus_iso": "yz",
                    "zarea": "yz"},
    "tracer_monitor": {name: "scalar" for name in ("tempm1", "saltm1", "vtemp1", "vsalt1")},
    "snapshot": {},
}
N_SIGMA = 60
N_ISLE = 2


def default_land(nx: int, ny: int, nz: int) -> np.ndarray:
    """bool (nx, ny, nz): the ACC set-up's wall (first x column north of the channel), a
    seamount and a shelf (land in the deeper levels, index 0 = the deepest, as Veros)."""
    land = np.zeros((nx, ny, nz), dtype=bool)
    land[0, ny // 2:, :] = True
    land[nx // 3: nx // 3 + 2, ny // 4: ny // 4 + 3, : max(1, nz // 2)] = True
    land[nx - 3:, : max(1, ny // 6), : max(1, nz // 3)] = True
    return land


def with_halo(interior: np.ndarray, halo: int, cyclic_x: bool = True) -> np.ndarray:
    """(nx, ny, ...) -> (nx + 2 halo, ny + 2 halo, ...): y halo 0, x halo cyclic copies."""
    nx, ny = interior.shape[:2]
    out = np.zeros((nx + 2 * halo, ny + 2 * halo) + interior.shape[2:], dtype=interior.dtype)
    out[halo:halo + nx, halo:halo + ny] = interior
    if cyclic_x and halo:
        out[:halo] = out[nx:nx + halo]
        out[nx + halo:] = out[halo:2 * halo]
    return out


def _interior(kind: str, rng: np.random.Generator, nx: int, ny: int, nz: int,
              ocean: np.ndarray) -> np.ndarray:
    """Random values of one variable's interior, 0 on land (ocean: bool (nx, ny, nz))."""
    shapes = {"xyz": (nx, ny, nz), "xyzl": (nx, ny, nz, 3), "xy": (nx, ny),
              "xyl": (nx, ny, 3)}
    values = rng.normal(10.0, 4.0, shapes[kind])
    if kind.startswith("xyz"):
        mask = ocean if kind == "xyz" else ocean[..., None]
    else:
        mask = ocean[:, :, -1] if kind == "xy" else ocean[:, :, -1, None]
    return np.where(mask, values, 0.0)


def _put(group, key: str, data: np.ndarray, chunks, compress: bool) -> None:
    """Veros's write_to_h5 for one variable: require_dataset(exact=True, ...) then one slab."""
    kwargs: dict = {"exact": True}
    if data.ndim and chunks is not None:
        kwargs["chunks"] = chunks
        if compress:
            kwargs.update(compression="gzip", compression_opts=1)
    group.require_dataset(key, data.shape, data.dtype, **kwargs)
    group[key][...] = data


def write_veros_like(path, *, nx: int = 30, ny: int = 42, nz: int = 15, halo: int = 2,
                     tau: int = 1, seed: int = 0, chunks=None, land=None,
                     time: float = 864000.0) -> dict[str, np.ndarray]:
    """Write a Veros 1.7 restart at ``path``; returns {path in file: array written}.

    ``chunks``: ``None`` = one process (chunks (nx, ny, ...), gzip 1, as Veros);
    ``(px, py)`` = px*py processes (chunks (nx//px, ny//py, ...), uncompressed, as Veros
    under MPI); ``"contiguous"`` = no chunking, no compression (not what Veros writes, but
    the raw byte-range path's case). ``land``: bool (nx, ny, nz), default
    :func:`default_land`. ``tau``: the current time level (taum1, taup1 follow, mod 3).
    """
    import h5py

    rng = np.random.default_rng(seed)
    land = default_land(nx, ny, nz) if land is None else np.asarray(land, dtype=bool)
    if land.shape != (nx, ny, nz):
        raise ValueError(f"land has shape {land.shape}, expected {(nx, ny, nz)}")
    ocean = ~land
    if chunks == "contiguous":
        sub, compress = None, False
    elif chunks is None:
        sub, compress = (nx, ny), True
    else:
        px, py = chunks
        sub, compress = (nx // px, ny // py), False

    def chunk_of(kind: str):
        if sub is None:
            return None
        extra = {"xyz": (nz,), "xyzl": (nz, 3), "xy": (), "xyl": (3,), "yz": (nz,)}
        if kind == "yz":
            return (sub[1], nz)
        if kind == "y_sigma":
            return (sub[1], N_SIGMA)
        if kind == "sigma":
            return (N_SIGMA,)
        if kind == "isle":
            return (N_ISLE, 3)
        return sub + extra[kind]

    written: dict[str, np.ndarray] = {}
    with h5py.File(path, "w") as f:
        core = f.require_group("core")
        for name in CORE_4D:
            data = with_halo(_interior("xyzl", rng, nx, ny, nz, ocean), halo)
            _put(core, name, data, chunk_of("xyzl"), compress)
            written[f"core/{name}"] = data
        for name, kind in (("K_diss_v", "xyz"), ("psi", "xyl"), ("dpsi", "xyl")):
            data = with_halo(_interior(kind, rng, nx, ny, nz, ocean), halo)
            _put(core, name, data, chunk_of(kind), compress)
            written[f"core/{name}"] = data
        dpsin = rng.normal(size=(N_ISLE, 3))
        _put(core, "dpsin", dpsin, chunk_of("isle"), compress)
        written["core/dpsin"] = dpsin
        for name, value in (("tau", tau % 3), ("taum1", (tau - 1) % 3), ("taup1", (tau + 1) % 3)):
            data = np.array(value, dtype=np.int32)
            _put(core, name, data, None, False)
            written[f"core/{name}"] = data
        data = np.array(time, dtype=np.float64)
        _put(core, "time", data, None, False)
        written["core/time"] = data
        for group_name, members in DIAGNOSTICS.items():
            group = f.require_group(group_name)
            for name, kind in members.items():
                data = _diagnostic(kind, rng, nx, ny, nz, halo, ocean)
                _put(group, name, data, chunk_of(kind) if data.ndim else None, compress)
                written[f"{group_name}/{name}"] = data
    return written


def _diagnostic(kind: str, rng, nx: int, ny: int, nz: int, halo: int,
                ocean: np.ndarray) -> np.ndarray:
    """One diagnostic's restart array (Veros shapes: y-z overturning arrays carry the y halo)."""
    if kind == "scalar":
        return np.array(rng.normal(), dtype=np.float64)
    if kind in ("xy", "xyz"):
        return with_halo(_interior(kind, rng, nx, ny, nz, ocean), halo)
    if kind == "yz":
        return rng.normal(size=(ny + 2 * halo, nz))
    if kind == "y_sigma":
        return rng.normal(size=(ny + 2 * halo, N_SIGMA))
    if kind == "sigma":
        return np.linspace(20.0, 30.0, N_SIGMA)
    raise ValueError(kind)


def grid_axes(nx: int, ny: int, nz: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ACC set-up's axes: xt, yt in degrees (2 degree spacing from 0 E, -40 N), zt in metres
    (negative, deepest first, as Veros stores z)."""
    xt = 1.0 + 2.0 * np.arange(nx)
    yt = -39.0 + 2.0 * np.arange(ny)
    dz_top_first = np.linspace(50.0, 690.0, nz) / 2.5
    zt_top_first = -(np.cumsum(dz_top_first) - 0.5 * dz_top_first)
    return xt, yt, np.ascontiguousarray(zt_top_first[::-1])


def write_grid_file(path, *, nx: int = 30, ny: int = 42, nz: int = 15, land=None,
                    fmt: str = "NETCDF4") -> dict[str, np.ndarray]:
    """Write the grid netCDF: xt(xt), yt(yt), zt(zt), maskT(zt, yt, xt) int8 (1 ocean).

    ``land``: bool (nx, ny, nz) in Veros order, default :func:`default_land` (the same
    land a :func:`write_veros_like` file of the same sizes has). Returns the arrays.
    """
    import netCDF4

    land = default_land(nx, ny, nz) if land is None else np.asarray(land, dtype=bool)
    xt, yt, zt = grid_axes(nx, ny, nz)
    mask = np.transpose(~land, (2, 1, 0)).astype(np.int8)
    with netCDF4.Dataset(Path(path), "w", format=fmt) as ds:
        for name, values, units in (("xt", xt, "degrees_east"), ("yt", yt, "degrees_north"),
                                    ("zt", zt, "m")):
            ds.createDimension(name, len(values))
            var = ds.createVariable(name, "f8", (name,))
            var.units = units
            var[:] = values
        ds["zt"].positive = "up"
        var = ds.createVariable("maskT", "i1", ("zt", "yt", "xt"))
        var.long_name = "Mask for tracer points"
        var[:] = mask
    return {"xt": xt, "yt": yt, "zt": zt, "maskT": mask}
