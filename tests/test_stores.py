"""Member-file backends: format-specific cases beyond the generic contract.

The tests every format must pass (metadata, raw byte ranges, library path,
sniffing, closing, capability flags) live in ``ensio.testing`` (its
store_contract.py) and run from ``test_store_contract_*.py``, one module per
format. Here: plain HDF5 files, bad and truncated files, the classic header
parser, ``flat_boxes``.

Every expected value comes from an independent reader (netCDF4-python, or
h5py for the plain-HDF5 case), never from the code under test. Files are
written with the netCDF4 library in every format ensio supports: netCDF-4
(contiguous, default storage, chunked + zlib), CDF-1, CDF-2 and CDF-5.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pytest

from ensio.errors import InputError
from ensio.io import open_member
from ensio.io.formats.classic import ClassicStore
from ensio.io.formats.hdf5 import HDF5Store
from ensio.io.formats.library import flat_boxes
from ensio.io.formats.netcdf4 import NetCDF4Store
from ensio.io.formats.raw import raw_read
from ensio.testing import DIMS, NRECS, make_member, random_ranges

# --------------------------------------------------------------------------- metadata


def test_classic_open_reads_only_the_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF3_64BIT_OFFSET") as ds:
        ds.createDimension("x", 200_000)
        ds.createVariable("a", "f8", ("x",))[:] = 1.0
    seen: list[int] = []
    real = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        seen.append(n)
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting)
    store = ClassicStore(path)
    assert store.variables()["a"].raw_offset < 4096
    assert sum(seen) <= 4096


# --------------------------------------------------------------------------- plain HDF5


def test_plain_hdf5_with_user_block(tmp_path: Path, rng: np.random.Generator) -> None:
    """Phony dimensions and a user block (superblock at 1024) as netCDF sees them."""
    path = tmp_path / "plain.h5"
    a = rng.standard_normal((4, 6))
    b = rng.integers(-50, 50, (6, 6)).astype(">i4")
    with h5py.File(path, "w", userblock_size=1024) as f:
        f.create_dataset("a", data=a)
        f.create_dataset("b", data=b)
        f.create_dataset("scalar", data=2.5)
    head = path.read_bytes()[:4096]
    assert HDF5Store.sniff(head) and not NetCDF4Store.sniff(head) and not ClassicStore.sniff(head)
    with netCDF4.Dataset(path) as ds, open_member(path) as store:
        assert type(store) is HDF5Store
        table = store.variables()
        for name, var in ds.variables.items():
            assert table[name].dims == var.dimensions
            assert table[name].shape == var.shape
    fd = os.open(path, os.O_RDONLY)
    try:
        np.testing.assert_array_equal(raw_read(fd, table["a"], 0, 24), a.reshape(-1))
        got = raw_read(fd, table["b"], 5, 31)
        assert got.dtype == np.dtype(">i4")
        np.testing.assert_array_equal(got, b.reshape(-1)[5:31])
        np.testing.assert_array_equal(raw_read(fd, table["scalar"], 0, 1), [2.5])
    finally:
        os.close(fd)


def test_hdf5_dimension_scales_without_netcdf_attributes(tmp_path: Path) -> None:
    """Dimensions from ``DIMENSION_LIST`` when ``_Netcdf4Coordinates`` is absent (h5py-made)."""
    path = tmp_path / "scales.h5"
    with h5py.File(path, "w") as f:
        f["y"] = np.arange(3.0)
        f["x"] = np.arange(3.0)  # same length: only DIMENSION_LIST tells them apart
        f["y"].make_scale("y")
        f["x"].make_scale("x")
        f["field"] = np.ones((3, 3))
        f["field"].dims[0].attach_scale(f["y"])
        f["field"].dims[1].attach_scale(f["x"])
        f["swapped"] = np.ones((3, 3))
        f["swapped"].dims[0].attach_scale(f["x"])
        f["swapped"].dims[1].attach_scale(f["y"])
    with netCDF4.Dataset(path) as ds, open_member(path) as store:
        table = store.variables()
        assert list(table) == list(ds.variables)
        for name, var in ds.variables.items():
            assert table[name].dims == var.dimensions, name
        assert table["swapped"].dims == ("x", "y")


# --------------------------------------------------------------------------- bad files


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.nc"
    with pytest.raises(InputError, match="member file not found") as err:
        open_member(path)
    assert str(err.value) == f"{path}: member file not found"


@pytest.mark.parametrize("nbytes", [0, 3, 100, 5000])
def test_random_bytes_are_not_netcdf(tmp_path: Path, rng: np.random.Generator, nbytes: int) -> None:
    path = tmp_path / "junk.nc"
    path.write_bytes(b"XY" + rng.integers(0, 256, nbytes, np.uint8).tobytes())
    with pytest.raises(InputError) as err:
        open_member(path)
    assert str(err.value) == f"{path}: not a netCDF file"


@pytest.mark.parametrize("magic", [b"CDF\x01", b"CDF\x02", b"CDF\x05", b"\x89HDF\r\n\x1a\n"])
def test_signature_then_garbage(tmp_path: Path, rng: np.random.Generator, magic: bytes) -> None:
    path = tmp_path / "garbage.nc"
    for n in (0, 4, 40, 3000):
        path.write_bytes(magic + rng.integers(0, 256, n, np.uint8).tobytes())
        with pytest.raises(InputError) as err:
            open_member(path).close()
        assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("case", ["cdf1", "cdf2", "cdf5"])
def test_truncated_classic_header(tmp_path: Path, rng: np.random.Generator, case: str) -> None:
    full = make_member(tmp_path / "full.nc", case, rng)
    with open_member(full) as store:
        header_end = min(i.raw_offset for i in store.variables().values() if i.raw_offset)
    raw = full.read_bytes()
    path = tmp_path / "cut.nc"
    for n in sorted({4, 5, 8, 12, 20, header_end // 2, 3 * header_end // 4}):
        path.write_bytes(raw[:n])
        with pytest.raises(InputError, match="corrupt netCDF classic header") as err:
            open_member(path)
        assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


@pytest.mark.parametrize("case", ["cdf1", "cdf5"])
def test_classic_streaming_numrecs(tmp_path: Path, rng: np.random.Generator, case: str) -> None:
    """numrecs = STREAMING (all bits set): the record count comes from the file size."""
    path = make_member(tmp_path / "s.nc", case, rng)
    with netCDF4.Dataset(path) as ds:
        want = ds["rec"].shape
    raw = bytearray(path.read_bytes())
    width = 8 if case == "cdf5" else 4
    raw[4 : 4 + width] = b"\xff" * width
    path.write_bytes(bytes(raw))
    with open_member(path) as store:
        assert store.variables()["rec"].shape == want == (NRECS, DIMS["lat"], DIMS["lon"])


def test_corrupt_classic_tag(tmp_path: Path, rng: np.random.Generator) -> None:
    raw = bytearray(make_member(tmp_path / "ok.nc", "cdf1", rng).read_bytes())
    assert raw[8:12] == b"\x00\x00\x00\x0a"  # NC_DIMENSION after magic + numrecs
    raw[11] = 0x0B
    path = tmp_path / "bad.nc"
    path.write_bytes(bytes(raw))
    with pytest.raises(InputError, match="bad dimension list tag") as err:
        open_member(path)
    assert str(path) in str(err.value)


def test_truncated_hdf5(tmp_path: Path, rng: np.random.Generator) -> None:
    full = make_member(tmp_path / "full.nc", "nc4-contiguous", rng)
    path = tmp_path / "cut.nc"
    path.write_bytes(full.read_bytes()[:600])
    with pytest.raises(InputError) as err:
        open_member(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


# --------------------------------------------------------------------------- flat_boxes


@pytest.mark.parametrize("shape", [(), (9,), (4, 5), (3, 4, 5), (2, 3, 1, 4)])
def test_flat_boxes_cover_range_in_order(shape: tuple[int, ...], rng: np.random.Generator) -> None:
    size = math.prod(shape)
    grid = np.arange(size).reshape(shape)
    for lo, hi in random_ranges(rng, size, k=20):
        boxes = list(flat_boxes(shape, lo, hi))
        assert len(boxes) <= max(1, 2 * len(shape) - 1)
        parts = [grid[sel if sel else ...].reshape(-1) for sel, _ in boxes]
        assert [p.size for p in parts] == [count for _, count in boxes]
        got = np.concatenate(parts) if parts else np.empty(0, int)
        np.testing.assert_array_equal(got, np.arange(size)[lo:hi])


def test_quantized_variable_takes_the_library_path(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """The library quantizes on write; a raw write would bypass it."""
    path = tmp_path / "q.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", 50)
        v = ds.createVariable("q", "f8", ("x",), contiguous=True, significant_digits=3)
        v[:] = rng.standard_normal(50)
        p = ds.createVariable("p", "f8", ("x",), contiguous=True)
        p[:] = 1.0
    with open_member(path) as store:
        infos = store.variables()
    assert infos["q"].raw_offset is None
    assert infos["p"].raw_offset is not None
