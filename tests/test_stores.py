"""Member-file backends: metadata, raw byte-range I/O and the netCDF-library path.

Every expected value comes from an independent reader (netCDF4-python, or
h5py for the plain-HDF5 case), never from the code under test. Files are
written with the netCDF4 library in every format ensio supports: netCDF-4
(contiguous, default storage, chunked + zlib), CDF-1, CDF-2 and CDF-5.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pytest

from ensio.errors import InputError
from ensio.io import MemberStore, VarInfo, open_member
from ensio.io.classic import ClassicStore
from ensio.io.library import flat_boxes
from ensio.io.netcdf4 import NetCDF4Store
from ensio.io.raw import raw_read, raw_write

# name: (netCDF4 format, storage keywords for the fixed-size variables)
CASES: dict[str, tuple[str, str]] = {
    "nc4-contiguous": ("NETCDF4", "contiguous"),
    "nc4-default": ("NETCDF4", "default"),
    "nc4-zlib": ("NETCDF4", "zlib"),
    "cdf1": ("NETCDF3_CLASSIC", "default"),
    "cdf2": ("NETCDF3_64BIT_OFFSET", "default"),
    "cdf5": ("NETCDF3_64BIT_DATA", "default"),
}
DIMS = {"time": None, "lev": 3, "lat": 5, "lon": 7, "nv": 2}
NRECS = 4


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def rng() -> np.random.Generator:
    seed = np.random.SeedSequence().entropy
    print(f"rng seed {seed}")  # shown by pytest on failure, to reproduce
    return np.random.default_rng(seed)


def _storage(kind: str, shape: tuple[int, ...]) -> dict[str, object]:
    if kind == "contiguous":
        return {"contiguous": True}
    if kind == "zlib":  # several chunks, with partial edge chunks
        return {"zlib": True, "shuffle": True, "chunksizes": tuple(max(1, n // 2) for n in shape)}
    return {}


def make_member(path: Path, case: str, rng: np.random.Generator) -> Path:
    """A member file with 2-D/3-D, big/little-endian, integer, record and coordinate variables."""
    fmt, kind = CASES[case]
    nc4 = fmt == "NETCDF4"
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        for name, n in DIMS.items():
            ds.createDimension(name, n)
        ds.title = "ensio store test"
        ds.history = np.arange(3, dtype="i4")
        specs: list[tuple[str, str, tuple[str, ...], dict[str, object]]] = [
            ("t3", "f8", ("lev", "lat", "lon"), {}),
            ("s2", "f4", ("lat", "lon"), {"fill_value": np.float32(-999.0)}),
            ("big3", "f8", ("lev", "lat", "lon"), {"endian": "big"}),
            ("big2", "f4", ("lat", "lon"), {"endian": "big"}),
            ("mask", "i2", ("lat", "lon"), {}),
        ]
        if fmt == "NETCDF3_64BIT_DATA":
            specs += [("i64", "i8", ("lat", "lon"), {}), ("u16", "u2", ("lev", "lat"), {})]
        if nc4:
            specs += [("nv", "f8", ("lat",), {})]  # non-coordinate variable named like a dim
        lat = ds.createVariable("lat", "f8", ("lat",), **_storage(kind, (DIMS["lat"],)))
        lat.units = "degrees_north"
        lat[:] = np.linspace(-60, 60, DIMS["lat"])
        for name, typ, dims, extra in specs:
            shape = tuple(DIMS[d] for d in dims)
            kw = dict(extra)
            if not nc4:
                kw.pop("endian", None)
            elif kw.get("endian") == "big":
                typ = ">" + typ
            var = ds.createVariable(name, typ, dims, **_storage(kind, shape), **kw)
            var.long_name = f"variable {name}"
            if np.dtype(typ).kind == "f":
                var[:] = rng.standard_normal(shape)
            else:
                var[:] = rng.integers(0, 1000, shape)
        label = ds.createVariable("label", "S1", ("lat", "nv"), **_storage(kind, (5, 2)))
        label[:] = rng.choice(np.array(list(b"abcxyz"), dtype="u1"), (5, 2)).view("S1")
        rec = ds.createVariable("rec", "f8", ("time", "lat", "lon"))
        rec.units = "K"
        rec[0:NRECS] = rng.standard_normal((NRECS, DIMS["lat"], DIMS["lon"]))
        if nc4:
            grp = ds.createGroup("ocean")
            sst = grp.createVariable("sst", "f4", ("lat", "lon"), **_storage(kind, (5, 7)))
            sst[:] = rng.standard_normal((5, 7))
    return path


@pytest.fixture(params=list(CASES))
def member(request: pytest.FixtureRequest, tmp_path: Path, rng: np.random.Generator) -> Path:
    return make_member(tmp_path / f"{request.param}.nc", request.param, rng)


def nc_vars(path: Path) -> dict[str, np.ndarray]:
    """Every variable's values as the netCDF library sees them (the reference)."""
    out: dict[str, np.ndarray] = {}
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        groups = [("", ds)] + [(f"{k}/", g) for k, g in ds.groups.items()]
        for prefix, grp in groups:
            for name, var in grp.variables.items():
                out[prefix + name] = np.asarray(var[...])
    return out


def nc_attrs(path: Path) -> dict[str, object]:
    with netCDF4.Dataset(path) as ds:

        def attrs(obj: netCDF4.Dataset | netCDF4.Variable) -> dict[str, object]:
            return {k: np.asarray(obj.getncattr(k)).tolist() for k in obj.ncattrs()}

        got: dict[str, object] = {"": attrs(ds)}
        for name, var in ds.variables.items():
            got[name] = attrs(var)
    return got


def random_ranges(rng: np.random.Generator, size: int, k: int = 6) -> list[tuple[int, int]]:
    """Whole, empty, single-element and random ``[lo, hi)`` ranges of ``[0, size)``."""
    out = [(0, size), (0, 0), (size - 1, size), (size // 2, size // 2 + 1)]
    for _ in range(k):
        lo, hi = sorted(int(x) for x in rng.integers(0, size + 1, 2))
        out.append((lo, hi))
    return out


def outside(raw: bytes, lo: int, hi: int) -> bytes:
    return raw[:lo] + raw[hi:]


# --------------------------------------------------------------------------- metadata


def test_open_member_picks_backend(member: Path) -> None:
    with open_member(member) as store:
        assert isinstance(store, MemberStore)
        expected = NetCDF4Store if member.stem.startswith("nc4") else ClassicStore
        assert type(store) is expected
        assert store.path == member


def test_variables_match_netcdf4(member: Path) -> None:
    kind = CASES[member.stem][1]
    with netCDF4.Dataset(member) as ds, open_member(member) as store:
        table = store.variables()
        groups = [("", ds)] + [(f"{k}/", g) for k, g in ds.groups.items()]
        reference = {p + n: v for p, g in groups for n, v in g.variables.items()}
        assert list(table) == list(reference)
        for name, var in reference.items():
            info = table[name]
            assert isinstance(info, VarInfo)
            assert info.name == name
            assert info.dims == var.dimensions, name
            assert info.shape == var.shape, name
            assert info.dtype.newbyteorder("=") == var.dtype.newbyteorder("="), name
            if info.dtype.itemsize > 1:
                big = isinstance(store, ClassicStore) or var.endian() == "big"
                assert info.dtype.str[0] == (">" if big else "<"), name
            assert info.fill_value == getattr(var, "_FillValue", None), name
            fixed = "time" not in var.dimensions
            if fixed and kind in ("contiguous", "default"):
                assert info.raw_offset is not None, name  # both are contiguous
            if not fixed or kind == "zlib":
                assert info.raw_offset is None, name


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


# --------------------------------------------------------------------------- raw path


def test_raw_read_matches_netcdf4(member: Path, rng: np.random.Generator) -> None:
    ref = nc_vars(member)
    with open_member(member) as store:
        infos = [i for i in store.variables().values() if i.raw_offset is not None]
    if CASES[member.stem][1] != "zlib":
        assert len(infos) >= 6
    fd = os.open(member, os.O_RDONLY)
    try:
        for info in infos:
            flat = ref[info.name].reshape(-1)
            for lo, hi in random_ranges(rng, info.size):
                got = raw_read(fd, info, lo, hi)
                assert got.dtype == info.dtype
                np.testing.assert_array_equal(got, flat[lo:hi], err_msg=info.name)
            out = np.empty(info.size, dtype=info.dtype)
            assert raw_read(fd, info, 0, info.size, out=out) is out
            np.testing.assert_array_equal(out.astype(flat.dtype), flat)
    finally:
        os.close(fd)


def test_raw_write_visible_and_confined(member: Path, rng: np.random.Generator) -> None:
    with open_member(member) as store:
        infos = [i for i in store.variables().values() if i.raw_offset is not None]
    for info in infos:
        if info.dtype.kind not in "iuf":
            continue
        before_vals = nc_vars(member)
        before = member.read_bytes()
        lo, hi = sorted(int(x) for x in rng.integers(0, info.size + 1, 2))
        hi = max(hi, lo + 1) if lo < info.size else hi
        if info.dtype.kind == "f":  # float64 either way: raw_write casts to the on-disk dtype
            new = rng.standard_normal(hi - lo) * 100
        else:
            new = rng.integers(0, 1000, hi - lo).astype(np.float64)
        fd = os.open(member, os.O_RDWR)
        try:
            raw_write(fd, info, lo, new, path=member)
        finally:
            os.close(fd)
        after = member.read_bytes()
        start = info.raw_offset + lo * info.dtype.itemsize
        stop = info.raw_offset + hi * info.dtype.itemsize
        assert len(after) == len(before)
        assert outside(after, start, stop) == outside(before, start, stop), info.name
        vals = nc_vars(member)
        want = before_vals[info.name].reshape(-1).copy()
        want[lo:hi] = new.astype(info.dtype)
        np.testing.assert_array_equal(vals[info.name].reshape(-1), want, err_msg=info.name)
        for other, v in before_vals.items():
            if other != info.name:
                np.testing.assert_array_equal(vals[other], v, err_msg=other)


def test_raw_read_of_truncated_file_names_it(member: Path) -> None:
    with open_member(member) as store:
        info = max(
            (i for i in store.variables().values() if i.raw_offset is not None),
            key=lambda i: i.raw_offset,
            default=None,
        )
    if info is None:
        pytest.skip("no raw variable in this storage kind")
    os.truncate(member, info.raw_offset + info.nbytes // 2)
    fd = os.open(member, os.O_RDONLY)
    try:
        with pytest.raises(InputError, match="truncated") as err:
            raw_read(fd, info, 0, info.size)
        assert str(member) in str(err.value)
    finally:
        os.close(fd)


def test_raw_rejects_bad_requests(member: Path) -> None:
    with open_member(member) as store:
        table = store.variables()
    fd = os.open(member, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="raw offset"):
            raw_read(fd, table["rec"], 0, 1)
        info = table["t3"]
        if info.raw_offset is None:
            return
        with pytest.raises(ValueError, match="outside"):
            raw_read(fd, info, 0, info.size + 1)
        with pytest.raises(ValueError, match="out must be"):
            raw_read(fd, info, 0, 4, out=np.empty(4, dtype=np.float32))
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- library path


def test_library_read_matches_netcdf4(member: Path, rng: np.random.Generator) -> None:
    ref = nc_vars(member)
    with open_member(member) as store:
        for name, info in store.variables().items():
            flat = ref[name].reshape(-1)
            for lo, hi in random_ranges(rng, info.size, k=3):
                got = store.read_elements(name, lo, hi)
                assert got.dtype.isnative and got.shape == (hi - lo,)
                np.testing.assert_array_equal(got, flat[lo:hi], err_msg=name)


def test_library_write_of_same_values_is_byte_identical(
    member: Path, rng: np.random.Generator
) -> None:
    """Holds for every storage kind, chunked + zlib included (deterministic deflate)."""
    digest = sha(member)
    ref = nc_vars(member)
    with open_member(member, writable=True) as store:
        for name, info in store.variables().items():
            flat = ref[name].reshape(-1)
            for lo, hi in random_ranges(rng, info.size, k=2):
                store.write_elements(name, lo, flat[lo:hi])
    assert sha(member) == digest


def test_library_write_new_values(member: Path, rng: np.random.Generator) -> None:
    before_vals = nc_vars(member)
    before_attrs = nc_attrs(member)
    before = member.read_bytes()
    with open_member(member) as store:
        table = dict(store.variables())
    targets = ["rec", "s2", "big3"]
    with open_member(member, writable=True) as store:
        for name in targets:
            info = table[name]
            lo = int(rng.integers(0, info.size // 2))
            new = rng.standard_normal(info.size - lo - 1)
            store.write_elements(name, lo, new)
            want = before_vals[name].reshape(-1).copy()
            want[lo : lo + new.size] = new.astype(info.dtype)
            before_vals[name] = want.reshape(info.shape)
    after_vals = nc_vars(member)
    for name, want in before_vals.items():
        np.testing.assert_array_equal(after_vals[name], want, err_msg=name)
    assert nc_attrs(member) == before_attrs
    after = member.read_bytes()
    for name, info in table.items():  # raw bytes of untouched contiguous variables
        if name not in targets and info.raw_offset is not None:
            sl = slice(info.raw_offset, info.raw_offset + info.nbytes)
            assert after[sl] == before[sl], name


def test_read_only_store_refuses_writes(member: Path) -> None:
    with open_member(member) as store, pytest.raises(io.UnsupportedOperation):
        store.write_elements("t3", 0, np.zeros(3))


def test_unknown_variable_names_file(member: Path) -> None:
    with open_member(member) as store, pytest.raises(InputError, match="nosuch") as err:
        store.read_elements("nosuch", 0, 1)
    assert str(member) in str(err.value)


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
    assert NetCDF4Store.sniff(head) and not ClassicStore.sniff(head)
    with netCDF4.Dataset(path) as ds, open_member(path) as store:
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


def test_quantized_variable_takes_the_library_path(tmp_path: Path) -> None:
    """The library quantizes on write; a raw write would bypass it."""
    path = tmp_path / "q.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", 50)
        v = ds.createVariable("q", "f8", ("x",), contiguous=True, significant_digits=3)
        v[:] = np.random.default_rng().standard_normal(50)
        p = ds.createVariable("p", "f8", ("x",), contiguous=True)
        p[:] = 1.0
    with open_member(path) as store:
        infos = store.variables()
    assert infos["q"].raw_offset is None
    assert infos["p"].raw_offset is not None
