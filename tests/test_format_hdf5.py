"""Plain HDF5 members as Veros 1.7 writes them (tests/veros_like.py): names, values, writes.

Expected values come from h5py and the netCDF library (netCDF-C reads plain HDF5 and
names its phony dimensions), never from the store under test; "nothing else changed"
is a byte-for-byte comparison of the files (or of each other dataset's stored chunks
when a compressed chunk had to move).
"""

from __future__ import annotations

import hashlib
import itertools
import os
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pytest
from mpi4py import MPI
from veros_like import write_veros_like

from ensio.config import config_from_dict
from ensio.errors import InputError
from ensio.io import open_member
from ensio.io.formats.classic import ClassicStore
from ensio.io.formats.hdf5 import HDF5Store, write_units
from ensio.io.formats.netcdf4 import NetCDF4Store
from ensio.io.formats.open import HEAD_BYTES, backend_of, detect_backend
from ensio.io.modes.ensemble import open_ensemble

#: A small Veros-like restart (the real shape is 30 x 42 x 15: tested once, below).
SMALL = {"nx": 8, "ny": 10, "nz": 4}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def h5_values(path: Path) -> dict[str, np.ndarray]:
    """Every dataset's values, by path, as h5py reads them."""
    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset)
                     else None)  # fmt: skip
    return out


def netcdf_dims(path: Path) -> dict[str, tuple[str, ...]]:
    """Every variable's dimension names as netCDF-C shows them (what ncdump -h prints)."""
    out: dict[str, tuple[str, ...]] = {}

    def walk(grp: netCDF4.Dataset | netCDF4.Group, prefix: str) -> None:
        for name, var in grp.variables.items():
            out[prefix + name] = var.dimensions
        for name, sub in grp.groups.items():
            walk(sub, f"{prefix}{name}/")

    with netCDF4.Dataset(path) as ds:
        walk(ds, "")
    return out


def stored_chunks(path: Path) -> dict[str, list[tuple[tuple[int, ...], int, bytes]]]:
    """Per chunked dataset: (chunk offset in the array, file offset, stored bytes) of each chunk."""
    raw = path.read_bytes()
    out: dict[str, list[tuple[tuple[int, ...], int, bytes]]] = {}
    with h5py.File(path, "r") as f:

        def visit(name: str, obj: object) -> None:
            if isinstance(obj, h5py.Dataset) and obj.chunks is not None:
                infos = [obj.id.get_chunk_info(i) for i in range(obj.id.get_num_chunks())]
                out[name] = [(tuple(i.chunk_offset), i.byte_offset,
                              raw[i.byte_offset : i.byte_offset + i.size]) for i in infos]

        f.visititems(visit)
    return out


@pytest.fixture
def veros(tmp_path: Path, rng: np.random.Generator) -> Path:
    path = tmp_path / "restart.h5"
    write_veros_like(path, seed=int(rng.integers(1 << 31)), tau=int(rng.integers(3)), **SMALL)
    return path


# ----------------------------------------------------------------------------- metadata


def test_real_shaped_restart_reads_as_h5py_with_netcdf_c_names(tmp_path, rng):
    """Veros's ACC shape: HDF5Store; names and phony dims as netCDF-C; every value as h5py."""
    path = tmp_path / "acc_0020.h5"
    write_veros_like(path, seed=int(rng.integers(1 << 31)))
    want = h5_values(path)
    dims = netcdf_dims(path)
    with open_member(path) as store:
        assert type(store) is HDF5Store
        table = store.variables()
        assert sorted(table) == sorted(dims) == sorted(want)
        for name, info in table.items():
            assert info.dims == dims[name], name
            assert info.shape == want[name].shape, name
            got = store.read_elements(name, 0, info.size)
            np.testing.assert_array_equal(got, want[name].reshape(-1), err_msg=name)
        temp = table["core/temp"]
        assert temp.shape == (34, 46, 15, 3) and temp.raw_offset is None  # chunked + gzip
        assert table["core/tau"].raw_offset is not None  # scalars are contiguous
        flat = want["core/temp"].reshape(-1)
        for _ in range(5):
            lo, hi = sorted(int(x) for x in rng.integers(0, temp.size + 1, 2))
            np.testing.assert_array_equal(store.read_elements("core/temp", lo, hi), flat[lo:hi])


@pytest.mark.parametrize("chunks", ["contiguous", (2, 2)])
def test_raw_offsets_of_contiguous_datasets(tmp_path, rng, chunks):
    """Contiguous datasets take the raw path: their bytes at raw_offset are h5py's values."""
    path = tmp_path / "restart.h5"
    write_veros_like(path, seed=int(rng.integers(1 << 31)), chunks=chunks, **SMALL)
    want = h5_values(path)
    data = path.read_bytes()
    with open_member(path) as store:
        table = store.variables()
    for name, info in table.items():
        if want[name].ndim and chunks != "contiguous":
            assert info.raw_offset is None, name
            continue
        assert info.raw_offset is not None, name
        stored = data[info.raw_offset : info.raw_offset + info.nbytes]
        assert stored == np.ascontiguousarray(want[name], dtype=info.dtype).tobytes(), name


def test_missing_group_or_variable_names_file_and_key(veros):
    with open_member(veros) as store:
        with pytest.raises(InputError) as err:
            store.read_elements("tracer/temp", 0, 1)
        assert str(err.value) == f"{veros}: no group 'tracer' (variable 'tracer/temp')"
        with pytest.raises(InputError) as err:
            store.read_elements("core/nosuch", 0, 1)
        assert str(err.value) == f"{veros}: no variable 'core/nosuch'"


def test_missing_group_in_an_ensemble_is_one_line(tmp_path, rng):
    """A configured group the members lack: one line naming the file and the variable."""
    for m in (1, 2):
        write_veros_like(tmp_path / f"m{m}.h5", seed=int(rng.integers(1 << 31)), **SMALL)
    cfg = config_from_dict({"ensemble": {"members": str(tmp_path / "m{member}.h5"), "size": 2,
                                         "variables": ["tracer/temp"]}})  # fmt: skip
    with pytest.raises(InputError) as err:
        with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, MPI.COMM_SELF) as ens:
            ens.read()
    msg = str(err.value)
    assert str(tmp_path / "m1.h5") in msg and "tracer/temp" in msg and "\n" not in msg


# ----------------------------------------------------------------------------- detection


def test_plain_hdf5_and_netcdf4_are_told_apart(tmp_path, veros):
    """Same signature; netCDF-C's marks decide, in the first bytes or further in."""
    head = veros.read_bytes()[:HEAD_BYTES]
    assert HDF5Store.sniff(head) and not NetCDF4Store.sniff(head)
    assert not ClassicStore.sniff(head)
    assert backend_of(veros, head) is HDF5Store
    # netCDF-4 whose marks lie beyond the first bytes (a long history, many attributes)
    nc = tmp_path / "long_history.nc"
    with netCDF4.Dataset(nc, "w") as ds:
        for i in range(60):
            ds.setncattr(f"history{i}", "x" * 200)
        ds.createDimension("x", 3)
        ds.createVariable("v", "f8", ("x",))[:] = 1.0
    head = nc.read_bytes()[:HEAD_BYTES]
    assert detect_backend(head) is HDF5Store  # by the first bytes alone...
    assert backend_of(nc, head) is NetCDF4Store  # ...handed on by content
    with open_member(nc) as store:
        assert type(store) is NetCDF4Store
    # plain HDF5 with a dimension scale beyond the first bytes: netCDF-4's (dimensions named)
    scales = tmp_path / "scales.h5"
    with h5py.File(scales, "w") as f:
        f.attrs["notes"] = np.bytes_("y" * 8000)
        f["x"] = np.arange(3.0)
        f["x"].make_scale("x")
        f["v"] = np.ones(3)
        f["v"].dims[0].attach_scale(f["x"])
    head = scales.read_bytes()[:HEAD_BYTES]
    assert not NetCDF4Store.sniff(head)
    with open_member(scales) as store:
        assert type(store) is NetCDF4Store and store.variables()["v"].dims == ("x",)


# ----------------------------------------------------------------------------- writes


def _brute_units(shape, chunks, lo, hi):
    """Chunk index boxes holding any flat element in [lo, hi), by unravelling every element."""
    idx = np.array(np.unravel_index(np.arange(lo, hi), shape)).T
    return {tuple(row) for row in (idx // np.array(chunks))}


def test_write_units_are_the_chunks_of_the_range(rng):
    for _ in range(200):
        ndim = int(rng.integers(1, 5))
        shape = tuple(int(n) for n in rng.integers(1, 7, ndim))
        chunks = tuple(int(rng.integers(1, n + 1)) for n in shape)
        size = int(np.prod(shape))
        lo, hi = sorted(int(x) for x in rng.integers(0, size + 1, 2))
        got = list(write_units(shape, chunks, lo, hi))
        as_index = [tuple(s.start // c for s, c in zip(sel, chunks, strict=True)) for sel in got]
        assert len(as_index) == len(set(as_index)) and as_index == sorted(as_index)
        assert set(as_index) == _brute_units(shape, chunks, lo, hi), (shape, chunks, lo, hi)
        for sel in got:  # clipped to the array
            assert all(0 <= s.start < s.stop <= n for s, n in zip(sel, shape, strict=True))
    assert list(write_units((), None, 0, 1)) == [()]
    assert list(write_units((4, 5), None, 3, 3)) == []


@pytest.mark.parametrize("chunks", [None, (2, 2), "contiguous"])
def test_write_of_unchanged_values_is_byte_identical(tmp_path, rng, chunks):
    path = tmp_path / "restart.h5"
    write_veros_like(path, seed=int(rng.integers(1 << 31)), chunks=chunks, **SMALL)
    digest = sha(path)
    want = h5_values(path)
    with open_member(path, writable=True) as store:
        for name, info in store.variables().items():
            flat = want[name].reshape(-1)
            store.write_elements(name, 0, flat)
            lo, hi = sorted(int(x) for x in rng.integers(0, info.size + 1, 2))
            store.write_elements(name, lo, flat[lo:hi])
    assert sha(path) == digest


@pytest.mark.parametrize("chunks", [None, (2, 2)])
def test_write_changes_only_the_written_elements(tmp_path, rng, chunks):
    """New values in part of core/temp: its other elements, every other dataset and the
    chunks of core/temp the range does not meet keep their stored bytes."""
    path = tmp_path / "restart.h5"
    write_veros_like(path, seed=int(rng.integers(1 << 31)), chunks=chunks, **SMALL)
    before = h5_values(path)
    before_chunks = stored_chunks(path)
    shape = before["core/temp"].shape
    size = before["core/temp"].size
    lo = int(rng.integers(0, size // 3))
    new = rng.normal(20.0, 1.0, int(rng.integers(1, size // 3)))
    with open_member(path, writable=True) as store:
        store.write_elements("core/temp", lo, new)
    after = h5_values(path)
    want = before["core/temp"].reshape(-1).copy()
    want[lo : lo + new.size] = new
    np.testing.assert_array_equal(after["core/temp"].reshape(-1), want)
    for name, values in before.items():
        if name != "core/temp":
            np.testing.assert_array_equal(after[name], values, err_msg=name)
    after_chunks = stored_chunks(path)
    for name, chunks_before in before_chunks.items():
        if name != "core/temp":
            assert after_chunks[name] == chunks_before, name
    chunk = h5py.File(path, "r")["core/temp"].chunks
    met = _brute_units(shape, chunk, lo, lo + new.size)
    moved = 0
    for (offset, at, data), (offset2, at2, data2) in zip(before_chunks["core/temp"],
                                                          after_chunks["core/temp"], strict=True):
        assert offset == offset2
        index = tuple(o // c for o, c in zip(offset, chunk, strict=True))
        if index not in met:
            assert (at, data) == (at2, data2), offset
        moved += (at, data) != (at2, data2)
    assert moved == len(met)


def test_uncompressed_chunk_is_rewritten_in_place(tmp_path, rng):
    """Uncompressed chunks (Veros under MPI): a change is confined to the chunks it meets."""
    path = tmp_path / "restart.h5"
    write_veros_like(path, seed=int(rng.integers(1 << 31)), chunks=(2, 2), **SMALL)
    before = path.read_bytes()
    with h5py.File(path, "r") as f:
        ds = f["core/salt"]
        info = ds.id.get_chunk_info_by_coord((0, 0, 0, 0))
        start, stop = info.byte_offset, info.byte_offset + info.size
        element = int(np.ravel_multi_index((1, 2, 3, 1), ds.shape))
        old = float(ds[1, 2, 3, 1])
    with open_member(path, writable=True) as store:
        store.write_elements("core/salt", element, np.array([old + 1.5]))
    after = path.read_bytes()
    assert len(after) == len(before)
    assert after[:start] == before[:start] and after[stop:] == before[stop:]
    assert h5py.File(path, "r")["core/salt"][1, 2, 3, 1] == old + 1.5


def test_scalar_and_big_endian_writes(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["tau"] = np.int32(1)
        f.create_dataset("big", data=np.arange(12.0).reshape(3, 4), dtype=">f4", chunks=(2, 2),
                         compression="gzip")  # fmt: skip
    digest = sha(path)
    with open_member(path, writable=True) as store:
        store.write_elements("tau", 0, np.array([1]))
        store.write_elements("big", 0, np.arange(12.0))
    assert sha(path) == digest
    with open_member(path, writable=True) as store:
        store.write_elements("tau", 0, np.array([2]))
        store.write_elements("big", 5, np.array([-1.0, -2.0]))
        assert store.read_elements("big", 4, 8).tolist() == [4.0, -1.0, -2.0, 7.0]
    with h5py.File(path, "r") as f:
        assert f["tau"][()] == 2 and f["big"].dtype == np.dtype(">f4")
        want = np.arange(12.0)
        want[5:7] = [-1.0, -2.0]
        np.testing.assert_array_equal(f["big"][...].reshape(-1), want)


def test_read_only_store_refuses_writes_and_keeps_the_file(veros):
    import io

    digest = sha(veros)
    with open_member(veros) as store, pytest.raises(io.UnsupportedOperation):
        store.write_elements("core/temp", 0, np.zeros(3))
    assert sha(veros) == digest


# ----------------------------------------------------------------------------- ensemble


@pytest.mark.parametrize("chunks", [None, (2, 2), "contiguous"])
def test_ensemble_round_trip_leaves_members_byte_identical(tmp_path, rng, chunks):
    """files mode: read equals h5py; writing the read matrix back changes no byte; a change
    lands in exactly the written element of each member."""
    n = 3
    paths = [tmp_path / f"m{m:02d}.h5" for m in range(1, n + 1)]
    for p in paths:
        write_veros_like(p, seed=int(rng.integers(1 << 31)), chunks=chunks, **SMALL)
    names = ["core/K_diss_v", "averages/temp"]
    cfg = config_from_dict({"ensemble": {"members": str(tmp_path / "m{member:02d}.h5"),
                                         "size": n, "variables": names},
                            "io": {"journal": True}})  # fmt: skip
    digests = [sha(p) for p in paths]
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, MPI.COMM_SELF) as ens:
        block = ens.read()
        want = np.array([np.concatenate([h5_values(p)[v].reshape(-1) for v in names])
                         for p in paths])  # fmt: skip
        np.testing.assert_array_equal(block.data, want)
        ens.write(block)
    assert [sha(p) for p in paths] == digests
    row = int(rng.integers(want.shape[1]))
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, MPI.COMM_SELF) as ens:
        block = ens.read()
        block.data[:, row] += 1.0
        ens.write(block)
    for m, p in enumerate(paths):
        got = np.concatenate([h5_values(p)[v].reshape(-1) for v in names])
        expect = want[m].copy()
        expect[row] += 1.0
        np.testing.assert_array_equal(got, expect)
    assert not [f for f in os.listdir(tmp_path) if ".ensio-" in f]  # no copy left behind


def test_same_structure_members_pass_the_quick_check(tmp_path, rng):
    """Uncompressed members of one structure: accepted by the byte comparison."""
    n = 3
    for m in range(1, n + 1):
        write_veros_like(tmp_path / f"m{m}.h5", seed=int(rng.integers(1 << 31)), chunks=(2, 2),
                         **SMALL)  # fmt: skip
    cfg = config_from_dict({"ensemble": {"members": str(tmp_path / "m{member}.h5"), "size": n,
                                         "variables": ["core/K_diss_v"]}})  # fmt: skip
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, MPI.COMM_SELF) as ens:
        ens.read()
        assert [m.quick for m in ens.scan.metas] == [False] + [True] * (n - 1)


def test_phony_dims_of_every_group_as_netcdf_c(tmp_path, rng):
    """Random nesting and shapes: the phony names (numbered over the file) are netCDF-C's."""
    path = tmp_path / "nested.h5"
    with h5py.File(path, "w") as f:
        groups = [f]
        for i in range(int(rng.integers(2, 6))):
            groups.append(groups[int(rng.integers(len(groups)))].create_group(f"g{i}"))
        for i, grp in itertools.product(range(3), groups):
            shape = tuple(int(n) for n in rng.integers(1, 4, int(rng.integers(0, 4))))
            grp.create_dataset(f"v{i}", data=rng.normal(size=shape))
    dims = netcdf_dims(path)
    with open_member(path) as store:
        assert {n: i.dims for n, i in store.variables().items()} == dims
