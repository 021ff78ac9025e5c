"""netCDF-4 variables in groups, named by path (``core/temp``): metadata, raw path, writes.

The files are written and read back with the netCDF library (the reference); the
store under test must name every variable by its group path with the dimensions
netCDF-C gives it (a dimension of a parent group included), keep the raw byte-range
path for contiguous variables in groups, and write chunked ones through the library.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from mpi4py import MPI

from ensio.config import config_from_dict
from ensio.errors import InputError
from ensio.io import open_member
from ensio.io.formats.netcdf4 import NetCDF4Store
from ensio.io.formats.raw import raw_read, raw_write
from ensio.io.modes.ensemble import open_ensemble

NZ, NY, NX = 3, 4, 5


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_grouped(path: Path, rng: np.random.Generator, storage: str) -> Path:
    """Root dims z, y, x; group core (own dim level) with temp(level, z, y, x), salt(z, y, x);
    nested core/ice/thick(y, x); averages/temp(z, y, x)."""
    kw = {"contiguous": {"contiguous": True},
          "zlib": {"zlib": True, "chunksizes": None}}[storage]  # fmt: skip
    with netCDF4.Dataset(path, "w") as ds:
        for name, n in (("z", NZ), ("y", NY), ("x", NX)):
            ds.createDimension(name, n)
        ds.createVariable("x", "f8", ("x",))[:] = np.arange(NX, dtype=float)
        core = ds.createGroup("core")
        core.createDimension("level", 3)
        specs = [(core, "temp", ("level", "z", "y", "x")), (core, "salt", ("z", "y", "x")),
                 (core.createGroup("ice"), "thick", ("y", "x")),
                 (ds.createGroup("averages"), "temp", ("z", "y", "x"))]  # fmt: skip
        for grp, name, dims in specs:
            shape = tuple({"level": 3, "z": NZ, "y": NY, "x": NX}[d] for d in dims)
            extra = dict(kw)
            if extra.get("chunksizes", 0) is None:
                extra["chunksizes"] = tuple(max(1, n // 2) for n in shape)
            grp.createVariable(name, "f8", dims, **extra)[:] = rng.normal(size=shape)
        ds.createVariable("time", "f8", ())[...] = 3.0
    return path


def reference(path: Path) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """Every variable by path: (dimensions, values), read with the netCDF library."""
    out: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}

    def walk(grp: netCDF4.Dataset | netCDF4.Group, prefix: str) -> None:
        for name, var in grp.variables.items():
            out[prefix + name] = (var.dimensions, np.asarray(var[...]))
        for name, sub in grp.groups.items():
            walk(sub, f"{prefix}{name}/")

    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        walk(ds, "")
    return out


@pytest.mark.parametrize("storage", ["contiguous", "zlib"])
def test_group_variables_named_by_path(tmp_path, rng, storage):
    path = write_grouped(tmp_path / "g.nc", rng, storage)
    ref = reference(path)
    with open_member(path) as store:
        assert type(store) is NetCDF4Store
        table = store.variables()
        assert set(table) == set(ref)
        for name, (dims, values) in ref.items():
            assert table[name].dims == dims, name
            got = store.read_elements(name, 0, table[name].size)
            np.testing.assert_array_equal(got, values.reshape(-1), err_msg=name)
        assert table["core/ice/thick"].dims == ("y", "x")  # dims of two groups up
        assert table["core/temp"].dims == ("level", "z", "y", "x")
        grouped = [n for n in table if "/" in n]
        if storage == "contiguous":
            assert all(table[n].raw_offset is not None for n in grouped)
        else:
            assert all(table[n].raw_offset is None for n in grouped)


def test_raw_path_of_group_variables(tmp_path, rng):
    """Contiguous variables in (nested) groups: raw reads and confined raw writes."""
    path = write_grouped(tmp_path / "g.nc", rng, "contiguous")
    ref = reference(path)
    with open_member(path) as store:
        infos = {n: i for n, i in store.variables().items() if "/" in n}
    fd = os.open(path, os.O_RDWR)
    try:
        for name, info in infos.items():
            np.testing.assert_array_equal(raw_read(fd, info, 0, info.size),
                                          ref[name][1].reshape(-1))  # fmt: skip
        info = infos["core/ice/thick"]
        before = path.read_bytes()
        raw_write(fd, info, 2, np.array([7.5, 8.5]), path=path)
    finally:
        os.close(fd)
    after = path.read_bytes()
    lo, hi = info.raw_offset + 2 * 8, info.raw_offset + 4 * 8
    assert after[:lo] == before[:lo] and after[hi:] == before[hi:]
    assert reference(path)["core/ice/thick"][1].reshape(-1)[2:4].tolist() == [7.5, 8.5]


def test_library_writes_in_groups(tmp_path, rng):
    """Chunked + zlib variables in groups through the netCDF library: unchanged values keep
    the file byte-identical; new values land where written and nowhere else."""
    path = write_grouped(tmp_path / "g.nc", rng, "zlib")
    ref = reference(path)
    digest = sha(path)
    with open_member(path, writable=True) as store:
        for name, (_dims, values) in ref.items():
            store.write_elements(name, 0, values.reshape(-1))
    assert sha(path) == digest
    with open_member(path, writable=True) as store:
        store.write_elements("core/ice/thick", 3, np.array([1.25, 2.5]))
    after = reference(path)
    want = ref["core/ice/thick"][1].reshape(-1).copy()
    want[3:5] = [1.25, 2.5]
    np.testing.assert_array_equal(after["core/ice/thick"][1].reshape(-1), want)
    for name, (_dims, values) in ref.items():
        if name != "core/ice/thick":
            np.testing.assert_array_equal(after[name][1], values, err_msg=name)


@pytest.mark.parametrize("storage", ["contiguous", "zlib"])
def test_ensemble_of_group_variables(tmp_path, rng, storage):
    """files mode with state variables named by path: read = netCDF library's, a write of the
    read matrix keeps every member byte-identical, a change lands in its element."""
    n = 3
    paths = [write_grouped(tmp_path / f"m{m}.nc", rng, storage) for m in range(1, n + 1)]
    names = ["core/salt", "averages/temp"]
    cfg = config_from_dict({"ensemble": {"members": str(tmp_path / "m{member}.nc"), "size": n,
                                         "variables": names}})  # fmt: skip
    want = np.array([np.concatenate([reference(p)[v][1].reshape(-1) for v in names])
                     for p in paths])  # fmt: skip
    digests = [sha(p) for p in paths]
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, MPI.COMM_SELF) as ens:
        block = ens.read()
        np.testing.assert_array_equal(block.data, want)
        if storage == "contiguous":  # the raw path, not the library
            assert all(m.raw_byte_ranges and m.infos["core/salt"].raw_offset is not None
                       for m in ens.scan.metas)  # fmt: skip
        ens.write(block)
    assert [sha(p) for p in paths] == digests
    row = int(rng.integers(want.shape[1]))
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, MPI.COMM_SELF) as ens:
        block = ens.read()
        block.data[:, row] -= 2.0
        ens.write(block)
    for m, p in enumerate(paths):
        got = np.concatenate([reference(p)[v][1].reshape(-1) for v in names])
        expect = want[m].copy()
        expect[row] -= 2.0
        np.testing.assert_array_equal(got, expect)


def test_quick_check_of_compressed_group_variables(tmp_path, rng):
    """Members of one structure take the quick look (variables in groups, dimensions of
    parent groups); a member whose group variable uses another dimension of the same
    length is not passed by it: the full check names the file and the variable."""
    n = 3
    paths = [write_grouped(tmp_path / f"m{m}.nc", rng, "zlib") for m in range(1, n + 1)]
    names = ["core/temp", "core/ice/thick"]
    cfg = config_from_dict({"ensemble": {"members": str(tmp_path / "m{member}.nc"), "size": n,
                                         "variables": names}})  # fmt: skip
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, MPI.COMM_SELF) as ens:
        block = ens.read()
        assert [m.quick for m in ens.scan.metas] == [False] + [True] * (n - 1)
    want = np.array([np.concatenate([reference(p)[v][1].reshape(-1) for v in names])
                     for p in paths])  # fmt: skip
    np.testing.assert_array_equal(block.data, want)
    with netCDF4.Dataset(paths[1], "w") as ds:  # same shapes, thick on a dimension of core
        for name, size in (("z", NZ), ("y", NY), ("x", NX)):
            ds.createDimension(name, size)
        core = ds.createGroup("core")
        core.createDimension("level", 3)
        core.createDimension("yc", NY)
        core.createVariable("temp", "f8", ("level", "z", "y", "x"), zlib=True)[:] = 1.0
        core.createGroup("ice").createVariable("thick", "f8", ("yc", "x"), zlib=True)[:] = 2.0
    with pytest.raises(InputError) as err:
        with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, MPI.COMM_SELF) as ens:
            ens.read()
    msg = str(err.value)
    assert str(paths[1]) in msg and "core/ice/thick" in msg and "\n" not in msg
