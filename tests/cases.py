"""Member-file ensembles for tests, written with the netCDF4 library directly.

Independent of ``ensio synth`` on purpose: the I/O tests must not trust the
code they test. ``reference_matrix`` is the expected ensemble matrix, built with
the plain netCDF4 library and numpy only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import netCDF4
import numpy as np


@dataclass
class VarCase:
    name: str
    dims: tuple[str, ...]
    dtype: str = "f8"
    endian: str = "native"  # native | big | little
    chunked: bool = False  # chunked + zlib: the library path
    mask: str | None = None  # name of a mask variable over the trailing (lat, lon) dims


@dataclass
class EnsembleCase:
    members: int = 5
    fmt: str = "NETCDF4"  # NETCDF4 | NETCDF3_64BIT_DATA | NETCDF3_CLASSIC | NETCDF3_64BIT_OFFSET
    nlat: int = 7
    nlon: int = 11
    nlev: int = 3
    variables: list[VarCase] = field(default_factory=lambda: [VarCase("state", ("lat", "lon"))])
    seed: int | None = None

    def config(self, root: Path, **io: object) -> dict:
        vars_ = [{"name": v.name, "mask": v.mask} if v.mask else v.name for v in self.variables]
        cfg = {
            "ensemble": {
                "members": str(root / "mem{member:03d}.nc"),
                "size": self.members,
                "variables": vars_,
                "coordinates": {"lon": "lon", "lat": "lat"},
            },
            "io": {"journal": True, **io},
        }
        return cfg

    def write(self, root: Path) -> list[Path]:
        rng = np.random.default_rng(self.seed)
        root.mkdir(parents=True, exist_ok=True)
        land = rng.random((self.nlat, self.nlon)) < 0.4
        land[0, 0] = True
        paths = []
        for m in range(1, self.members + 1):
            p = root / f"mem{m:03d}.nc"
            with netCDF4.Dataset(p, "w", format=self.fmt) as ds:
                ds.setncattr("title", f"member {m}")
                ds.createDimension("lev", self.nlev)
                ds.createDimension("lat", self.nlat)
                ds.createDimension("lon", self.nlon)
                lat = ds.createVariable("lat", "f8", ("lat",))
                lat[:] = np.linspace(-80, 80, self.nlat)
                lat.units = "degrees_north"
                lon = ds.createVariable("lon", "f8", ("lon",))
                lon[:] = np.arange(self.nlon) * 360.0 / self.nlon
                lon.units = "degrees_east"
                lm = ds.createVariable("landmask", "i1", ("lat", "lon"))
                lm[:] = land.astype("i1")
                aux = ds.createVariable("aux", "f4", ("lat", "lon"))
                aux[:] = rng.standard_normal((self.nlat, self.nlon)).astype("f4")
                for v in self.variables:
                    kw: dict = {}
                    if self.fmt == "NETCDF4":
                        if v.chunked:
                            kw.update(zlib=True, complevel=4, chunksizes=_chunks(v.dims, self))
                        else:
                            kw.update(contiguous=True)
                        if v.endian != "native":
                            kw["endian"] = v.endian
                    order = {"big": ">", "little": "<"}.get(v.endian, "=")
                    dt = np.dtype(v.dtype).newbyteorder(order) if self.fmt == "NETCDF4" else v.dtype
                    var = ds.createVariable(v.name, dt, v.dims, **kw)
                    var.set_auto_maskandscale(False)
                    shape = tuple(ds.dimensions[d].size for d in v.dims)
                    var[:] = (m + rng.standard_normal(shape)).astype(v.dtype)
                    var.long_name = f"state variable {v.name}"
            paths.append(p)
        return paths


def _chunks(dims: tuple[str, ...], case: EnsembleCase) -> list[int]:
    sizes = {"lev": 1, "lat": max(1, case.nlat // 2), "lon": max(1, case.nlon // 3)}
    return [sizes[d] for d in dims]


def read_rows(path: Path, variables: list[VarCase]) -> np.ndarray:
    """The state vector of one file, by the plain netCDF4 library."""
    parts = []
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        for v in variables:
            a = np.asarray(ds[v.name][:], dtype=np.float64)
            if v.mask:
                m = np.broadcast_to(np.asarray(ds[v.mask][:]) != 0, a.shape)
                parts.append(a[m])
            else:
                parts.append(a.ravel())
    return np.concatenate(parts)


def reference_matrix(paths: list[Path], variables: list[VarCase]) -> np.ndarray:
    """(N_e, N_x) ensemble matrix read with netCDF4."""
    return np.stack([read_rows(p, variables) for p in paths])


def write_rows(path: Path, variables: list[VarCase], rows: np.ndarray) -> None:
    """Inverse of ``read_rows`` (used to build expected files)."""
    off = 0
    with netCDF4.Dataset(path, "a") as ds:
        ds.set_auto_maskandscale(False)
        for v in variables:
            var = ds[v.name]
            a = np.asarray(var[:])
            if v.mask:
                m = np.broadcast_to(np.asarray(ds[v.mask][:]) != 0, a.shape)
                n = int(m.sum())
                a = a.copy()
                a[m] = rows[off : off + n]
            else:
                n = a.size
                a = rows[off : off + n].reshape(a.shape)
            var[:] = a.astype(var.dtype)
            off += n


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def variable_bytes(path: Path, name: str) -> bytes:
    """Raw stored values of a variable (for 'untouched' checks)."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return np.asarray(ds[name][:]).tobytes()
