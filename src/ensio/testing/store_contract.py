"""``MemberStoreContract``: what every member-file format must do, tested the same way.

Like zarr-python's ``StoreTests``: a base class of generic tests plus hooks.
A format's test module subclasses it and sets the hooks; every test then runs
on every storage kind the subclass lists. Files are created and read back
WITHOUT the store under test (the netCDF4 library and plain file reads), so
the expected values never come from the code being tested.

It ships in the package (``ensio.testing``) so that a format written outside
ensio runs the same tests as ensio's own; only test code imports it (it
imports pytest).

Hooks (class attributes, overridable methods):

* ``store_class`` — the :class:`~ensio.io.MemberStore` subclass under test
  (registered in :data:`ensio.io.formats.open.BACKENDS`);
* ``kinds`` — names of storage kinds (keys of :data:`CASES`): the files made;
* ``always_big_endian`` — the format stores every multi-byte value big-endian;
* :meth:`create` — write a member file of a kind (default: :func:`make_member`);
* :meth:`reference` — every variable's values, read independently (default:
  :func:`nc_vars`, the netCDF4 library).

A module using it imports :func:`pytest_generate_tests` too (it feeds
``kinds`` to the ``kind`` argument). The tests draw random cases from a
fixture ``rng`` (a numpy ``Generator``): ensio's test suite has its own in
``tests/conftest.py``; a suite without one imports :func:`rng` from here.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
from pathlib import Path
from typing import ClassVar

import netCDF4
import numpy as np
import pytest

from ..errors import InputError
from ..io import MemberStore, VarInfo, open_member
from ..io.formats.open import BACKENDS, HEAD_BYTES, detect_backend
from ..io.formats.raw import raw_read, raw_write
from .h5member import make_hdf5_member
from .shape import DIMS, NRECS

__all__ = [
    "CASES",
    "DIMS",
    "NRECS",
    "MemberStoreContract",
    "make_member",
    "nc_attrs",
    "nc_vars",
    "pytest_generate_tests",
    "random_ranges",
    "rng",
]

# name: (netCDF4 format, storage keywords for the fixed-size variables)
CASES: dict[str, tuple[str, str]] = {
    "nc4-contiguous": ("NETCDF4", "contiguous"),
    "nc4-default": ("NETCDF4", "default"),
    "nc4-zlib": ("NETCDF4", "zlib"),
    "cdf1": ("NETCDF3_CLASSIC", "default"),
    "cdf2": ("NETCDF3_64BIT_OFFSET", "default"),
    "cdf5": ("NETCDF3_64BIT_DATA", "default"),
    # plain HDF5 as h5py writes it (no _NCProperties, no dimension scales): the same
    # variables, made by make_hdf5_member; netCDF-C reads them with phony dimensions
    "h5-contiguous": ("HDF5", "contiguous"),
    "h5-default": ("HDF5", "default"),
    "h5-zlib": ("HDF5", "zlib"),
}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _storage(kind: str, shape: tuple[int, ...]) -> dict[str, object]:
    if kind == "contiguous":
        return {"contiguous": True}
    if kind == "zlib":  # several chunks, with partial edge chunks
        return {"zlib": True, "shuffle": True, "chunksizes": tuple(max(1, n // 2) for n in shape)}
    return {}


def make_member(path: Path, case: str, rng: np.random.Generator) -> Path:
    """A member file with 2-D/3-D, big/little-endian, integer, record and coordinate variables."""
    fmt, kind = CASES[case]
    if fmt == "HDF5":
        return make_hdf5_member(path, kind, rng)
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


#: Set to an integer to replay the random draws of a failed run (as ensio's own tests).
SEED_ENV = "ENSIO_TEST_SEED"


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A random generator seeded by ``ENSIO_TEST_SEED``, else fresh; the seed is printed."""
    env = os.environ.get(SEED_ENV)
    seed = int(env) if env else secrets.randbits(63)
    print(f"{request.node.nodeid}: {SEED_ENV}={seed}")
    return np.random.default_rng(seed)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``kind`` with the storage kinds of the contract subclass."""
    kinds = getattr(metafunc.cls, "kinds", None)
    if "kind" in metafunc.fixturenames and kinds:
        metafunc.parametrize("kind", list(kinds))


class MemberStoreContract:
    """Generic tests of a :class:`~ensio.io.MemberStore`; subclass and set the hooks."""

    store_class: ClassVar[type[MemberStore]]
    kinds: ClassVar[tuple[str, ...]]
    always_big_endian: ClassVar[bool] = False

    # ------------------------------------------------------------------ hooks

    def create(self, path: Path, kind: str, rng: np.random.Generator) -> Path:
        """Write a member file of storage ``kind`` without the store under test."""
        return make_member(path, kind, rng)

    def reference(self, path: Path) -> dict[str, np.ndarray]:
        """Every variable's values, read without the store under test."""
        return nc_vars(path)

    # --------------------------------------------------------------- fixtures

    @pytest.fixture
    def member(self, kind: str, tmp_path: Path, rng: np.random.Generator) -> Path:
        return self.create(tmp_path / f"{kind}.nc", kind, rng)

    # ------------------------------------------------------------ capabilities

    def test_capability_flags_are_declared(self) -> None:
        cls = self.store_class
        assert isinstance(cls.format_name, str) and cls.format_name
        assert BACKENDS[cls.format_name] is cls
        assert type(cls.raw_byte_ranges) is bool and type(cls.library_writes) is bool

    def test_sniff_recognises_the_format(self, member: Path) -> None:
        head = member.read_bytes()[:HEAD_BYTES]
        assert self.store_class.sniff(head)
        for other in BACKENDS.values():
            if other is not self.store_class:
                assert not other.sniff(head), other.format_name
        assert detect_backend(head) is self.store_class
        assert not self.store_class.sniff(b"XYZW" + head[4:])

    def test_raw_offsets_hold_the_values(self, member: Path) -> None:
        """The bytes at ``raw_offset`` are the variable's values (plain file read)."""
        ref = self.reference(member)
        with open_member(member) as store:
            infos = [i for i in store.variables().values() if i.raw_offset is not None]
        data = member.read_bytes()
        for info in infos:
            stored = data[info.raw_offset : info.raw_offset + info.nbytes]
            want = np.ascontiguousarray(ref[info.name], dtype=info.dtype).tobytes()
            assert stored == want, info.name

    def test_library_writes_flag_is_honoured(self, member: Path) -> None:
        with open_member(member) as store:
            table = dict(store.variables())
        name = "rec"  # a record variable: never a raw byte range
        assert table[name].raw_offset is None
        new = np.arange(3, dtype=np.float64) + 0.5
        with open_member(member, writable=True) as store:
            if not self.store_class.library_writes:
                with pytest.raises((io.UnsupportedOperation, NotImplementedError)):
                    store.write_elements(name, 0, new)
                return
            store.write_elements(name, 0, new)
        np.testing.assert_array_equal(self.reference(member)[name].reshape(-1)[:3], new)

    def test_close_releases_and_flushes(self, member: Path) -> None:
        """Closed stores keep nothing open: a second writer works; close twice is fine."""
        if not self.store_class.library_writes:  # the format's, not the machine's: same in CI
            pytest.skip("no library writes in this format")
        for value in (1.25, 2.5):
            store = open_member(member, writable=True)
            store.write_elements("rec", 0, np.array([value]))
            store.close()
            store.close()
            assert self.reference(member)["rec"].reshape(-1)[0] == value

    def test_open_member_picks_backend(self, member: Path) -> None:
        with open_member(member) as store:
            assert isinstance(store, MemberStore)
            assert type(store) is self.store_class
            assert store.path == member


    def test_variables_match_reference(self, member: Path) -> None:
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
                    big = self.always_big_endian or var.endian() == "big"
                    assert info.dtype.str[0] == (">" if big else "<"), name
                assert info.fill_value == getattr(var, "_FillValue", None), name
                fixed = not any(d.isunlimited() for d in var.get_dims())  # phony dims too
                if fixed and kind in ("contiguous", "default"):
                    assert info.raw_offset is not None, name  # both are contiguous
                if not fixed or kind == "zlib":
                    assert info.raw_offset is None, name

    def test_raw_read_matches_reference(self, member: Path, rng: np.random.Generator) -> None:
        ref = nc_vars(member)
        with open_member(member) as store:
            infos = [i for i in store.variables().values() if i.raw_offset is not None]
        if CASES[member.stem][1] != "zlib":
            assert len(infos) >= 6 if self.store_class.raw_byte_ranges else not infos
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


    def test_raw_write_visible_and_confined(self, member: Path, rng: np.random.Generator) -> None:
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


    def test_raw_read_of_truncated_file_names_it(self, member: Path) -> None:
        with open_member(member) as store:
            info = max(
                (i for i in store.variables().values() if i.raw_offset is not None),
                key=lambda i: i.raw_offset,
                default=None,
            )
        if info is None:  # the storage kind's, not the machine's: same in CI
            pytest.skip("no raw variable in this storage kind")
        os.truncate(member, info.raw_offset + info.nbytes // 2)
        fd = os.open(member, os.O_RDONLY)
        try:
            with pytest.raises(InputError, match="truncated") as err:
                raw_read(fd, info, 0, info.size)
            assert str(member) in str(err.value)
        finally:
            os.close(fd)


    def test_raw_rejects_bad_requests(self, member: Path) -> None:
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

    def test_library_read_matches_reference(self, member: Path, rng: np.random.Generator) -> None:
        ref = nc_vars(member)
        with open_member(member) as store:
            for name, info in store.variables().items():
                flat = ref[name].reshape(-1)
                for lo, hi in random_ranges(rng, info.size, k=3):
                    got = store.read_elements(name, lo, hi)
                    assert got.dtype.isnative and got.shape == (hi - lo,)
                    np.testing.assert_array_equal(got, flat[lo:hi], err_msg=name)


    def test_library_write_of_same_values_is_byte_identical(
        self, member: Path, rng: np.random.Generator
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


    def test_library_write_new_values(self, member: Path, rng: np.random.Generator) -> None:
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


    def test_read_only_store_refuses_writes(self, member: Path) -> None:
        with open_member(member) as store, pytest.raises(io.UnsupportedOperation):
            store.write_elements("t3", 0, np.zeros(3))


    def test_unknown_variable_names_file(self, member: Path) -> None:
        with open_member(member) as store, pytest.raises(InputError, match="nosuch") as err:
            store.read_elements("nosuch", 0, 1)
        assert str(member) in str(err.value)
