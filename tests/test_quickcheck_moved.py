"""netCDF-4 members whose global attributes differ in length: checked without the HDF5 look.

A model that stamps each restart with its own ``history`` (a time of another
length, a title per member) writes files whose variables sit at the same
offsets but whose root-group object header has other chunks: the plain byte
comparison with member 1 fails, and each member took the HDF5 quick look
(~0.6 ms, issue 25). The format's ``movable_bytes`` hook
(:func:`ensio.io.formats.hdf5quick.hdf5_root_header`) lets the comparison
skip those chunks while their non-attribute messages must still be equal.

Members are written here by netCDF4-python, global attributes after the
variables, as a model's restart writer does; the reference matrix is read
with netCDF4-python, and the full check is the same ensemble-I/O object with
the quick check switched off.

Written *before* the variables, such attributes move every offset: there the
header keys (:mod:`ensio.io.formats.hdf5headers`) compare each variable's
object header wherever it lies.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from mpi4py import MPI

from ensio.config import config_from_dict
from ensio.errors import InputError
from ensio.io.formats.hdf5headers import hdf5_header_keys
from ensio.io.formats.hdf5quick import hdf5_root_header
from ensio.io.formats.netcdf4 import NetCDF4Store
from ensio.io.modes.ensemble import open_ensemble
from ensio.io.scan import members as members_mod
from ensio.io.scan import quickcheck as quickcheck_mod
from ensio.io.scan.bytecheck import same_bytes
from ensio.io.scan.quickcheck import quick_check

SELF = MPI.COMM_SELF
NLAT, NLON = 6, 8
LAT = np.linspace(-75.0, 75.0, NLAT)


def _member(path: Path, rng: np.random.Generator, member: int, history: int,
            name: str = "state", lat: np.ndarray = LAT, units: str = "K",
            first: bool = False, aux: bool = False, aux_first: bool = False) -> None:  # fmt: skip
    """One member; its ``history`` holds a stamp and ``history`` more characters.

    ``first``: the global attributes are written before the variables (as
    netCDF-C in define mode does): every offset then moves with their length.
    ``aux``: a variable ``aux`` with ``state``'s header follows it (``aux_first``: precedes it).
    """
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        stamp = {"history": "2026-11-28T17:30:00.123456 model run " + "x" * history,
                 "title": f"member {member}", "member": member}  # fmt: skip
        if first:
            ds.setncatts(stamp)
        ds.createDimension("lat", NLAT)
        ds.createDimension("lon", NLON)
        la = ds.createVariable("lat", "f8", ("lat",))
        la.units = "degrees_north"
        lo = ds.createVariable("lon", "f8", ("lon",))
        lo.units = "degrees_east"
        order = ["aux", name] if aux_first else [name, "aux"] if aux else [name]
        made = {v: ds.createVariable(v, "f8", ("lat", "lon")) for v in order}
        for v in made.values():
            v.units = units
        la[:] = lat
        lo[:] = np.arange(NLON) * 45.0
        made[name][:] = rng.normal(size=(NLAT, NLON))
        if "aux" in made:
            made["aux"][:] = rng.normal(size=(NLAT, NLON))
        if not first:
            ds.setncatts(stamp)


def _ensemble(tmp: Path, rng: np.random.Generator, n: int = 5, first: bool = False,
              aux: bool = False) -> list[Path]:  # fmt: skip
    """``n`` members whose ``history`` lengths all differ: 0, one of 200-399 and the rest
    1-199 more characters, in random order. With ``first`` their data offsets then
    differ for sure: HDF5 moves them in steps (0-15 more characters gave one offset,
    16-150 the next), so lengths drawn from 0-29 alone had all members in one step in
    about 1 run of 20."""
    rest = rng.choice(np.arange(1, 200), size=max(0, n - 2), replace=False)
    lengths = rng.permutation([0, int(rng.integers(200, 400)), *rest.tolist()])[:n]
    paths = [tmp / f"mem{m:03d}.nc" for m in range(1, n + 1)]
    for m, (p, k) in enumerate(zip(paths, lengths, strict=True), start=1):
        _member(p, rng, m, int(k), first=first, aux=aux)
    return paths


def _config(tmp: Path, n: int) -> object:
    return config_from_dict({
        "ensemble": {"members": str(tmp / "mem{member:03d}.nc"), "size": n,
                     "variables": ["state"], "coordinates": {"lon": "lon", "lat": "lat"}},
        "io": {"journal": False},
    })  # fmt: skip


def _read(cfg: object, quick: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, list]:
    """The matrix and the member metadata, with or without the quick check."""
    with monkeypatch.context() as mp:
        if not quick:
            mp.setattr(members_mod, "make_template", lambda *a, **k: None)
        with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, SELF) as ens:
            block = ens.read()
            return block.data.copy(), list(ens.scan.metas)


def _template(tmp: Path, paths: list[Path]):
    cfg = _config(tmp, len(paths))
    layout = members_mod.layout_from_member(cfg.ensemble, paths[0])
    _, tmpl = members_mod.member_template(paths[0], layout)
    assert tmpl is not None and tmpl.bytes is not None
    return tmpl


def _reference(paths: list[Path]) -> np.ndarray:
    rows = []
    for p in paths:
        with netCDF4.Dataset(p) as ds:
            ds.set_auto_maskandscale(False)
            rows.append(np.asarray(ds["state"][:], dtype=np.float64).ravel())
    return np.array(rows)


def _header(path: Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return hdf5_root_header(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def test_members_with_global_attributes_of_other_lengths_pass_the_byte_check(
    tmp_path, rng, monkeypatch
):
    paths = _ensemble(tmp_path, rng)
    tmpl = _template(tmp_path, paths)
    # the case: same size, but the plain comparison fails (the root header's chunks moved)
    assert len({p.stat().st_size for p in paths}) == 1
    plain = dataclasses.replace(tmpl.bytes, movable=None)
    assert not all(same_bytes(p, plain) for p in paths[1:])
    assert tmpl.bytes.movable is NetCDF4Store
    assert all(same_bytes(p, tmpl.bytes) for p in paths)

    fast, metas = _read(_config(tmp_path, len(paths)), True, monkeypatch)
    slow, full_metas = _read(_config(tmp_path, len(paths)), False, monkeypatch)
    assert [m.quick for m in metas] == [False] + [True] * (len(paths) - 1)
    assert fast.tobytes() == slow.tobytes()
    np.testing.assert_array_equal(fast, _reference(paths))
    for a, b in zip(metas, full_metas, strict=True):
        assert a.infos["state"].raw_offset == b.infos["state"].raw_offset


def test_the_root_header_ranges_hold_the_global_attributes_and_the_key_its_links(tmp_path, rng):
    paths = _ensemble(tmp_path, rng, n=3)
    heads = [_header(p) for p in paths]
    for p, head in zip(paths, heads, strict=True):
        blob = p.read_bytes()
        at = blob.find(b"model run")
        assert at > 0 and any(lo <= at < hi for lo, hi in head.ranges)
        # no data byte of state lies in them
        with NetCDF4Store(p) as store:
            info = store.variables()["state"]
        start, stop = info.raw_offset, info.raw_offset + info.nbytes
        assert not any(lo < stop and start < hi for lo, hi in head.ranges)
    assert heads[0].key == heads[1].key == heads[2].key
    _member(paths[2], rng, 3, 5, name="statf")  # the root's links differ
    assert _header(paths[2]).key != heads[0].key


def test_a_renamed_variable_is_still_refused_by_name(tmp_path, rng, monkeypatch):
    """Its root header differs in a link: not by bytes, and the full check names it."""
    paths = _ensemble(tmp_path, rng, n=3)
    tmpl = _template(tmp_path, paths)
    _member(paths[1], rng, 2, 3, name="statf")
    assert paths[1].stat().st_size == paths[0].stat().st_size
    assert not same_bytes(paths[1], tmpl.bytes)
    with pytest.raises(InputError) as err:
        _read(_config(tmp_path, len(paths)), True, monkeypatch)
    msg = str(err.value)
    assert str(paths[1]) in msg and "'state'" in msg and "\n" not in msg


def test_a_variable_attribute_outside_the_root_header_is_still_compared(tmp_path, rng):
    paths = _ensemble(tmp_path, rng, n=3)
    tmpl = _template(tmp_path, paths)
    _member(paths[1], rng, 2, 11, units="J")  # as long as "K": other bytes in state's header
    assert paths[1].stat().st_size == paths[0].stat().st_size
    assert not same_bytes(paths[1], tmpl.bytes)


def test_coordinates_are_compared_on_the_moved_path_too(tmp_path, rng, monkeypatch):
    paths = _ensemble(tmp_path, rng, n=3)
    tmpl = _template(tmp_path, paths)
    _member(paths[2], rng, 3, 17, lat=LAT + 1.0)
    assert same_bytes(paths[2], tmpl.bytes)  # data bytes are not compared
    with pytest.raises(InputError) as err:
        _read(_config(tmp_path, len(paths)), True, monkeypatch)
    msg = str(err.value)
    assert msg.startswith(f"{paths[2]}: coordinate 'lat' differs") and "\n" not in msg


def _never(*args, **kwargs):
    raise AssertionError("coordinates decoded and compared again")


def _keys(path: Path, names=("lat", "lon", "state")):
    fd = os.open(path, os.O_RDONLY)
    try:
        return hdf5_header_keys(fd, os.fstat(fd).st_size, names)
    finally:
        os.close(fd)


def _no_look(monkeypatch: pytest.MonkeyPatch, template: Path) -> list[Path]:
    """The paths the HDF5 quick look is asked about but the template's (made with it)."""
    asked: list[Path] = []
    look = NetCDF4Store.quick_look.__func__

    def counted(cls, path, *args, **kwargs):
        if Path(path) != template:
            asked.append(Path(path))
        return look(cls, path, *args, **kwargs)

    monkeypatch.setattr(NetCDF4Store, "quick_look", classmethod(counted))
    return asked


def test_members_whose_offsets_moved_are_checked_by_header_keys(tmp_path, rng, monkeypatch):
    paths = _ensemble(tmp_path, rng, first=True)
    slow, full_metas = _read(_config(tmp_path, len(paths)), False, monkeypatch)
    offsets = [m.infos["state"].raw_offset for m in full_metas]
    assert len(set(offsets)) > 1  # the case: the data moved with the attributes' length
    asked = _no_look(monkeypatch, paths[0])
    fast, metas = _read(_config(tmp_path, len(paths)), True, monkeypatch)
    assert [m.quick for m in metas] == [False] + [True] * (len(paths) - 1)
    assert asked == []
    assert fast.tobytes() == slow.tobytes()
    np.testing.assert_array_equal(fast, _reference(paths))
    assert [m.infos["state"].raw_offset for m in metas] == offsets


def test_header_keys_name_each_variable_by_its_link(tmp_path, rng, monkeypatch):
    """``aux``, with ``state``'s very header, defined first: equal keys, the right bytes read."""
    paths = _ensemble(tmp_path, rng, n=3, first=True, aux=True)
    _member(paths[1], rng, 2, 4, first=True, aux_first=True)
    keys = [_keys(p) for p in paths]
    assert keys[0].variables["state"][0] == keys[1].variables["state"][0]
    asked = _no_look(monkeypatch, paths[0])
    fast, metas = _read(_config(tmp_path, len(paths)), True, monkeypatch)
    assert all(m.quick for m in metas[1:]) and asked == []
    np.testing.assert_array_equal(fast, _reference(paths))
    with NetCDF4Store(paths[1]) as store:
        assert metas[1].infos["state"].raw_offset == store.variables()["state"].raw_offset


def test_header_keys_keep_what_describes_a_variable(tmp_path, rng):
    paths = _ensemble(tmp_path, rng, n=2, first=True)
    base = _keys(paths[0])
    assert base is not None and _keys(paths[1]).variables == {
        n: (k, _keys(paths[1]).variables[n][1]) for n, (k, _) in base.variables.items()
    }
    _member(paths[1], rng, 2, 3, first=True, units="J")  # an attribute value
    assert _keys(paths[1]).variables["state"][0] != base.variables["state"][0]
    assert _keys(paths[1]).variables["lat"][0] == base.variables["lat"][0]
    _member(paths[1], rng, 2, 3, first=True, name="statf")  # a link name
    assert _keys(paths[1], ("lat", "lon")).names != base.names
    assert _keys(paths[1]) is None  # no dataset 'state'


def test_a_renamed_variable_among_moved_members_is_refused_by_name(tmp_path, rng, monkeypatch):
    paths = _ensemble(tmp_path, rng, n=3, first=True)
    _member(paths[2], rng, 3, 9, first=True, name="statf")
    with pytest.raises(InputError) as err:
        _read(_config(tmp_path, len(paths)), True, monkeypatch)
    msg = str(err.value)
    assert str(paths[2]) in msg and "'state'" in msg and "\n" not in msg


def test_coordinates_are_compared_among_moved_members(tmp_path, rng, monkeypatch):
    paths = _ensemble(tmp_path, rng, n=3, first=True)
    _member(paths[1], rng, 2, 21, first=True, lat=LAT[::-1].copy())
    asked = _no_look(monkeypatch, paths[0])
    with pytest.raises(InputError) as err:
        _read(_config(tmp_path, len(paths)), True, monkeypatch)
    msg = str(err.value)
    assert msg.startswith(f"{paths[1]}: coordinate 'lat' differs") and "\n" not in msg
    assert asked == []


@pytest.mark.parametrize("first", [False, True])
def test_coordinates_stored_as_the_template_are_its_values_for_its_layout_only(
    tmp_path, rng, monkeypatch, first
):
    """The bytes shortcut stands for the template's check against *its* layout."""
    paths = _ensemble(tmp_path, rng, n=3, first=first)
    cfg = _config(tmp_path, len(paths))
    layout = members_mod.layout_from_member(cfg.ensemble, paths[0])
    _, tmpl = members_mod.member_template(paths[0], layout)
    assert tmpl.coordinates is not None
    assert quick_check(paths[1], layout, tmpl) is not None
    # the scan's other ranks get the template pickled: the shortcut holds there too
    sent = pickle.loads(pickle.dumps(tmpl))
    with monkeypatch.context() as mp:
        mp.setattr(quickcheck_mod, "check_coordinates", _never)
        assert quick_check(paths[1], layout, sent) is not None
    other = tmp_path / "other.nc"
    _member(other, rng, 9, 0, lat=LAT + 2.0, first=first)
    moved = members_mod.layout_from_member(cfg.ensemble, other)
    with pytest.raises(InputError) as err:
        quick_check(paths[1], moved, tmpl)
    assert str(err.value).startswith(f"{paths[1]}: coordinate 'lat' differs")
