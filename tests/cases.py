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
from seeds import draw_seed

#: The synthetic example's cycle, and its overrides for a fast test run in both ``ensio
#: cycle`` modes (4 members, 2 jobs, one analysis rank, the forecasts shifted by 3 points).
SYNTHETIC = Path(__file__).parents[1] / "examples" / "synthetic" / "cycle.yaml"
SYNTHETIC_FAST = (
    "--set", "ensemble.size=4", "--set", "workflow.jobs=2",
    "--set", "workflow.analysis_ranks=1",
    "--set", "workflow.member_command=ensio model synthrun --init {analysis} "
             "--out {forecast} --shift 3",
    "--set", "workflow.online.command=ensio model synthetic-coupled --workdir {workdir} "
             "--first {first} --cycles {cycles} --initial {initial} "
             "--tasks-per-member {tasks_per_member} --shift 3",
    "--set", "workflow.online.tasks_per_member=2",
)  # fmt: skip


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
        seed = self.seed
        if seed is None:  # ENSIO_TEST_SEED or a fresh draw; printed, shown on failure
            seed = draw_seed(f"EnsembleCase.write({root})")
        rng = np.random.default_rng(seed)
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


def content_digest(path: Path) -> str:
    """sha256 of a netCDF file's content except the time stamps of its ``history``.

    Analysis members of a rerun are byte-identical; the mean and spread files
    carry a UTC time stamp in ``history`` (CF), so two runs differ there and
    only there. This digest covers the format, every dimension, every
    variable's raw values (no masking or unpacking), dtype and attributes, and
    the global attributes, with ``history`` left out; a member file without a
    ``history`` line from ensio hashes exactly like its bytes would compare.
    """
    h = hashlib.sha256()
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        h.update(ds.data_model.encode())
        for name, dim in ds.dimensions.items():
            h.update(f"{name}={len(dim)}{'*' if dim.isunlimited() else ''};".encode())
        for a in sorted(ds.ncattrs()):
            if a != "history":
                h.update(f"{a}={ds.getncattr(a)!r};".encode())
        for name, var in ds.variables.items():
            h.update(f"{name}{var.dimensions}{var.dtype};".encode())
            for a in var.ncattrs():
                h.update(f"{a}={var.getncattr(a)!r};".encode())
            h.update(np.ascontiguousarray(var[...]).tobytes())
    return h.hexdigest()


def variable_bytes(path: Path, name: str) -> bytes:
    """Raw stored values of a variable (for 'untouched' checks)."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return np.asarray(ds[name][:]).tobytes()


# --- observations and geometry for the analysis tests (netCDF4 + numpy only) ---


def write_observations(
    path: Path,
    lon: np.ndarray,
    lat: np.ndarray,
    value: np.ndarray,
    error: np.ndarray,
    index: np.ndarray | None = None,
    *,
    omit: tuple[str, ...] = (),
) -> Path:
    """An observation file in DESIGN.md's format (dimension ``obs``).

    ``index`` entries < -1 are written as missing (``_FillValue``), -1 as -1:
    both mean "no index, bilinear H". Variables named in ``omit`` are left out.
    """
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("obs", len(value))
        for name, data, units in (
            ("lon", lon, "degrees_east"),
            ("lat", lat, "degrees_north"),
            ("value", value, "1"),
            ("error", error, "1"),
        ):
            if name in omit:
                continue
            var = ds.createVariable(name, "f8", ("obs",))
            var.set_auto_maskandscale(False)
            var[:] = np.asarray(data, dtype=np.float64)
            var.units = units
        if index is not None and "index" not in omit:
            var = ds.createVariable("index", "i4", ("obs",), fill_value=np.int32(-999))
            idx = np.asarray(index, dtype=np.int64)
            var[:] = np.ma.masked_array(idx.astype("i4"), mask=idx < -1)
    return path


def row_lonlat(path: Path, variables: list[VarCase]) -> np.ndarray:
    """(lon, lat) in degrees of every state row (unmasked variables with 1-D lon/lat)."""
    parts = []
    with netCDF4.Dataset(path) as ds:
        lon = np.asarray(ds["lon"][:], dtype=np.float64)
        lat = np.asarray(ds["lat"][:], dtype=np.float64)
        for v in variables:
            assert v.mask is None, "row_lonlat: masked variables not supported"
            shape = tuple(ds.dimensions[d].size for d in v.dims)
            lon_b = np.broadcast_to(lon.reshape([-1 if d == "lon" else 1 for d in v.dims]), shape)
            lat_b = np.broadcast_to(lat.reshape([-1 if d == "lat" else 1 for d in v.dims]), shape)
            parts.append(np.stack([lon_b.ravel(), lat_b.ravel()], axis=1))
    return np.concatenate(parts)


def bilinear_matrix(
    lon: np.ndarray, lat: np.ndarray, olon: np.ndarray, olat: np.ndarray, n_rows: int
) -> np.ndarray:
    """Dense H (m, n_rows) of bilinear interpolation on a lat-major grid at row offset 0.

    Written from scratch for the tests: longitudes equally spaced around the
    whole circle starting at ``lon[0]``, latitudes ascending; every location
    must lie inside the latitude range.
    """
    nlon = lon.size
    step = 360.0 / nlon
    assert np.allclose(np.diff(lon), step) and np.all(np.diff(lat) > 0)
    H = np.zeros((olon.size, n_rows))
    for o, (x, y) in enumerate(zip(olon, olat, strict=True)):
        assert lat[0] <= y <= lat[-1]
        fx = ((x - lon[0]) % 360.0) / step
        i0 = min(int(np.floor(fx)), nlon - 1)
        tx = fx - i0
        i1 = (i0 + 1) % nlon
        j0 = min(int(np.searchsorted(lat, y, side="right")) - 1, lat.size - 2)
        ty = (y - lat[j0]) / (lat[j0 + 1] - lat[j0])
        for j, wy in ((j0, 1 - ty), (j0 + 1, ty)):
            for i, wx in ((i0, 1 - tx), (i1, tx)):
                H[o, j * nlon + i] += wx * wy
    return H


@dataclass
class ObsCase:
    """Observations on an ``EnsembleCase`` grid, split into two files.

    File A (the first ``n_a``) has an ``index`` variable: rows observed
    directly, plus some entries -1 and some missing (bilinear H); file B has
    no ``index`` variable at all (bilinear H). ``index`` here is -1 wherever H
    is bilinear; ``H`` is the dense operator built with :func:`bilinear_matrix`.
    """

    lon: np.ndarray
    lat: np.ndarray
    value: np.ndarray
    error: np.ndarray
    index: np.ndarray
    missing: np.ndarray  # bool: index written as _FillValue instead of -1
    H: np.ndarray
    n_a: int

    def write(self, root: Path, names: tuple[str, str] = ("obs_a.nc", "obs_b.nc")) -> list[Path]:
        a, b = slice(0, self.n_a), slice(self.n_a, None)
        idx = np.where(self.missing, -999, self.index)
        pa = write_observations(
            root / names[0], self.lon[a], self.lat[a], self.value[a], self.error[a], idx[a]
        )
        pb = write_observations(
            root / names[1], self.lon[b], self.lat[b], self.value[b], self.error[b]
        )
        return [pa, pb]


def make_obs_case(
    X: np.ndarray,
    coords: np.ndarray,
    grid_lon: np.ndarray,
    grid_lat: np.ndarray,
    rng: np.random.Generator,
    *,
    n_index: int = 16,
    n_bilinear_a: int = 8,
    n_b: int = 16,
) -> ObsCase:
    """Observations of the prior mean plus noise of their error (see :class:`ObsCase`).

    ``X`` is the prior (N_e, N_x) and ``coords`` the (lon, lat) of its rows;
    bilinear observations lie on the first variable's grid (rows 0 ..
    nlat*nlon-1), within 5° of the outer latitudes.
    """
    n_x = X.shape[1]
    n_bil = n_bilinear_a + n_b
    rows = rng.choice(n_x, n_index, replace=False)
    index = np.concatenate([rows, np.full(n_bilinear_a, -1), np.full(n_b, -1)])
    missing = np.zeros(index.size, dtype=bool)
    missing[n_index : n_index + n_bilinear_a // 2] = True
    lon = np.concatenate([coords[rows, 0], rng.uniform(0.0, 360.0, n_bil)])
    lat = np.concatenate(
        [coords[rows, 1], rng.uniform(grid_lat.min() + 5, grid_lat.max() - 5, n_bil)]
    )
    H = np.zeros((index.size, n_x))
    H[np.arange(n_index), rows] = 1.0
    H[n_index:] = bilinear_matrix(grid_lon, grid_lat, lon[n_index:], lat[n_index:], n_x)
    error = rng.uniform(0.5, 1.5, index.size)
    value = H @ X.mean(axis=0) + error * rng.standard_normal(index.size)
    return ObsCase(lon, lat, value, error, index, missing, H, n_index + n_bilinear_a)
