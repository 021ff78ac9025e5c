"""Quick member checks (many small files): same matrix as the full check, same errors.

Members are written by the netCDF tools themselves (ncgen, nccopy, cdo), not
by ensio, from CDL text with random data and per-member global attributes
(as ensemble generators write them). The reference matrix is read with
netCDF4-python; the generic path is the same ensemble-I/O object with the
quick check switched off.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
from mpi4py import MPI

from ensio.config import config_from_dict
from ensio.errors import InputError
from ensio.io.formats.classic import ClassicStore
from ensio.io.formats.open import BACKENDS, open_member
from ensio.io.formats.store import MemberStore
from ensio.io.modes.ensemble import open_ensemble
from ensio.io.scan import members as members_mod
from ensio.io.scan.bytecheck import _subtract, same_bytes

SELF = MPI.COMM_SELF
NLAT, NLON = 4, 6
LAT = [-45.0, -15.0, 15.0, 45.0]

needs_tools = needs.tools_mark("ncgen", "nccopy")


def _cdl(rng: np.random.Generator, member: int, lat: list[float] = LAT,
         state_attrs: str = "") -> str:  # fmt: skip
    """One member as CDL: a fixed variable, a record variable, per-member global attributes."""
    state = ", ".join(f"{x:.17g}" for x in rng.normal(size=NLAT * NLON).astype(np.float32))
    rec = ", ".join(f"{x:.17g}" for x in rng.normal(size=NLAT * NLON))
    lons = ", ".join(str(60 * i) for i in range(NLON))
    return f"""netcdf m {{
dimensions:
  lat = {NLAT} ;
  lon = {NLON} ;
  time = UNLIMITED ;
variables:
  double lat(lat) ;
    lat:units = "degrees_north" ;
  double lon(lon) ;
    lon:units = "degrees_east" ;
  double time(time) ;
    time:units = "hours since 2000-01-01" ;
  float state(lat, lon) ;
    state:long_name = "x" ;{state_attrs}
  double rec(time, lat, lon) ;
  :member = {member} ;
  :shift = {rng.normal():.17g} ;
data:
  lat = {", ".join(str(v) for v in lat)} ;
  lon = {lons} ;
  time = 6 ;
  state = {state} ;
  rec = {rec} ;
}}
"""


def _run(*cmd: str | Path) -> None:
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True)


def _write(kind: str, cdl: str, dst: Path) -> None:
    """One member file of ``kind`` from CDL, through the netCDF tools."""
    src = dst.with_suffix(".cdl")
    src.write_text(cdl)
    if kind == "nc4":
        _run("ncgen", "-k", "nc4", "-o", dst, src)
    elif kind == "nc4-chunked":
        tmp = dst.with_suffix(".tmp.nc")
        _run("ncgen", "-k", "nc4", "-o", tmp, src)
        _run("nccopy", "-c", "lat/2,lon/3", "-d1", tmp, dst)
        tmp.unlink()
    elif kind == "cdf5":
        _run("ncgen", "-k", "cdf5", "-o", dst, src)
    elif kind == "classic":
        _run("ncgen", "-k", "classic", "-o", dst, src)
    elif kind == "cdo-nc4":
        tmp = dst.with_suffix(".tmp.nc")
        _run("ncgen", "-k", "classic", "-o", tmp, src)
        _run("cdo", "-s", "-f", "nc4", "copy", tmp, dst)
        tmp.unlink()
    else:  # pragma: no cover - test parameter typo
        raise ValueError(kind)
    src.unlink()


def _ensemble(tmp: Path, kind: str, rng: np.random.Generator, n: int = 4) -> list[Path]:
    paths = [tmp / f"mem{m:03d}.nc" for m in range(1, n + 1)]
    for m, p in enumerate(paths, start=1):
        _write(kind, _cdl(rng, m), p)
    return paths


def _config(tmp: Path, n: int) -> object:
    return config_from_dict({
        "ensemble": {"members": str(tmp / "mem{member:03d}.nc"), "size": n,
                     "variables": ["state", "rec"], "coordinates": {"lon": "lon", "lat": "lat"}},
        "io": {"journal": False},
    })  # fmt: skip


def _reference(paths: list[Path]) -> np.ndarray:
    """The matrix read independently (netCDF4-python, values as stored)."""
    rows = []
    for p in paths:
        with netCDF4.Dataset(p) as ds:
            ds.set_auto_maskandscale(False)
            rows.append(np.concatenate([np.asarray(ds[v][:], dtype=np.float64).ravel()
                                        for v in ("state", "rec")]))  # fmt: skip
    return np.array(rows)


def _read(cfg: object, quick: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, list]:
    """The matrix and the member metadata, with or without the quick check."""
    with monkeypatch.context() as mp:
        if not quick:
            mp.setattr(members_mod, "make_template", lambda *a, **k: None)
        with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, SELF) as ens:
            block = ens.read()
            return block.data.copy(), list(ens.scan.metas)


KINDS = ["nc4", "nc4-chunked", "cdf5", "classic"]


@needs_tools
@pytest.mark.parametrize("kind", [*KINDS, "cdo-nc4"])
def test_quick_and_full_check_read_the_same_matrix(tmp_path, rng, monkeypatch, kind):
    if kind.startswith("cdo"):
        needs.tool("cdo")
    paths = _ensemble(tmp_path, kind, rng)
    cfg = _config(tmp_path, len(paths))
    fast, metas = _read(cfg, True, monkeypatch)
    slow, full_metas = _read(cfg, False, monkeypatch)
    assert fast.tobytes() == slow.tobytes()
    np.testing.assert_array_equal(fast, _reference(paths))
    assert [m.quick for m in metas] == [False] + [True] * (len(paths) - 1)
    assert not any(m.quick for m in full_metas)
    for a, b in zip(metas, full_metas, strict=True):  # what the data path uses
        for name in ("state", "rec"):
            assert a.infos[name].raw_offset == b.infos[name].raw_offset
            assert a.infos[name].dtype == b.infos[name].dtype


@needs_tools
@pytest.mark.parametrize("kind", ["nc4", "cdf5", "classic"])
def test_members_differing_only_in_global_attribute_values_pass_the_byte_check(
    tmp_path, rng, kind
):
    """Same structure, other data and global attribute values: accepted by bytes alone."""
    paths = _ensemble(tmp_path, kind, rng, n=2)
    cfg = _config(tmp_path, 2)
    layout = members_mod.layout_from_member(cfg.ensemble, paths[0])
    _, tmpl = members_mod.member_template(paths[0], layout)
    assert tmpl is not None and tmpl.bytes is not None
    assert same_bytes(paths[1], tmpl.bytes)
    # an attribute of a state variable is structure: not accepted by bytes
    other = tmp_path / "other.nc"
    _write(kind, _cdl(rng, 2, state_attrs='\n    state:units = "K" ;'), other)
    assert not same_bytes(other, tmpl.bytes)
    # nor a global attribute of another type (the value has another size)
    _write(kind, _cdl(rng, 2).replace(":member = 2 ;", ":member = 2.5 ;"), other)
    assert not same_bytes(other, tmpl.bytes)


@pytest.mark.parametrize("same_globals", [True, False])
def test_many_global_attributes_need_equal_bytes(tmp_path, rng, monkeypatch, same_globals):
    """Dense attribute storage (20 globals) is not parsed: all metadata bytes must be equal."""
    n = 3
    for m in range(1, n + 1):
        with netCDF4.Dataset(tmp_path / f"mem{m:03d}.nc", "w") as ds:
            for dim, size in (("lat", NLAT), ("lon", NLON), ("time", None)):
                ds.createDimension(dim, size)
            ds.createVariable("lat", "f8", ("lat",))[:] = LAT
            ds.createVariable("lon", "f8", ("lon",))[:] = 60.0 * np.arange(NLON)
            ds.createVariable("state", "f4", ("lat", "lon"))[:] = rng.normal(size=(NLAT, NLON))
            ds.createVariable("rec", "f8", ("time", "lat", "lon"))[:] = rng.normal(
                size=(1, NLAT, NLON))
            for i in range(20):
                ds.setncattr(f"a{i}", float(i if same_globals else m * i))
    paths = [tmp_path / f"mem{m:03d}.nc" for m in range(1, n + 1)]
    cfg = _config(tmp_path, n)
    layout = members_mod.layout_from_member(cfg.ensemble, paths[0])
    _, tmpl = members_mod.member_template(paths[0], layout)
    assert tmpl is not None and tmpl.bytes is not None and tmpl.bytes.attributes == 0
    assert same_bytes(paths[1], tmpl.bytes) is same_globals
    fast, metas = _read(cfg, True, monkeypatch)
    assert all(m.quick for m in metas[1:])  # by bytes, or by the HDF5 look
    np.testing.assert_array_equal(fast, _reference(paths))


@needs_tools
def test_a_member_of_other_layout_takes_its_own_offsets(tmp_path, rng, monkeypatch):
    """Member 3 chunked and compressed among contiguous ones: no byte match, own layout."""
    paths = _ensemble(tmp_path, "nc4", rng)
    _write("nc4-chunked", _cdl(rng, 3), paths[2])
    cfg = _config(tmp_path, len(paths))
    fast, metas = _read(cfg, True, monkeypatch)
    slow, _ = _read(cfg, False, monkeypatch)
    assert fast.tobytes() == slow.tobytes()
    np.testing.assert_array_equal(fast, _reference(paths))
    assert metas[2].infos["state"].raw_offset is None  # the library path for this one
    assert metas[1].infos["state"].raw_offset is not None


@needs_tools
def test_a_member_with_other_attributes_falls_back_to_the_full_check(tmp_path, rng, monkeypatch):
    paths = _ensemble(tmp_path, "nc4", rng)
    _write("nc4", _cdl(rng, 3, state_attrs="\n    state:scale_factor = 2.f ;"), paths[2])
    cfg = _config(tmp_path, len(paths))
    fast, metas = _read(cfg, True, monkeypatch)
    assert [m.quick for m in metas] == [False, True, False, True]
    assert metas[2].infos["state"].encoding.scale == 2.0
    np.testing.assert_array_equal(fast[2], _reference(paths)[2] * np.r_[[2.0] * 24, [1.0] * 24])


def _error(cfg: object) -> str:
    """The one-line error of opening and reading the ensemble."""
    with pytest.raises(InputError) as err, \
            open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, SELF) as ens:  # fmt: skip
        ens.read()
    return str(err.value)


@needs_tools
@pytest.mark.parametrize("kind", ["nc4", "cdf5"])
def test_bad_members_give_the_full_checks_message(tmp_path, rng, monkeypatch, kind):
    """Same structure, other latitudes; then a corrupt header; then a truncated file."""
    paths = _ensemble(tmp_path, kind, rng)
    cfg = _config(tmp_path, len(paths))
    _write(kind, _cdl(rng, 3, lat=[-50.0, -15.0, 15.0, 45.0]), paths[2])
    msg = _error(cfg)
    assert msg.startswith(f"{paths[2]}: coordinate 'lat' differs") and "\n" not in msg
    with monkeypatch.context() as mp:
        mp.setattr(members_mod, "make_template", lambda *a, **k: None)
        assert _error(cfg) == msg

    _write(kind, _cdl(rng, 3), paths[2])
    blob = bytearray(paths[2].read_bytes())
    start = 48 if kind == "nc4" else 8  # past the superblock / magic and numrecs
    blob[start : start + 64] = b"\xff" * 64
    paths[2].write_bytes(bytes(blob))
    msg = _error(cfg)
    assert msg.startswith(f"{paths[2]}:") and "\n" not in msg
    assert "corrupt" in msg or "not a readable" in msg

    _write(kind, _cdl(rng, 3), paths[2])
    with open_member(paths[2]) as store:  # cut inside the state variable's bytes
        cut = store.variables()["state"].raw_offset + 8
    paths[2].write_bytes(paths[2].read_bytes()[:cut])
    msg = _error(cfg)
    assert msg.startswith(f"{paths[2]}:") and "\n" not in msg
    with monkeypatch.context() as mp:  # the same as without the quick check
        mp.setattr(members_mod, "make_template", lambda *a, **k: None)
        assert _error(cfg) == msg


def test_subtract_ranges():
    assert _subtract([(0, 100)], [(10, 20), (15, 30), (90, 120)]) == [(0, 10), (30, 90)]
    assert _subtract([(0, 10)], []) == [(0, 10)]
    assert _subtract([(0, 10)], [(0, 10)]) == []


class _ClassicWithoutHooks(ClassicStore):
    """netCDF classic through a store that does not override the optional quick-check hooks."""

    metadata_bytes = MemberStore.__dict__["metadata_bytes"]
    byte_pieces = MemberStore.__dict__["byte_pieces"]
    quick_look = MemberStore.__dict__["quick_look"]


@needs_tools
def test_a_format_without_the_optional_hooks_takes_the_full_check(tmp_path, rng, monkeypatch):
    """The hooks are optional: without them every member is checked fully, same matrix."""
    paths = _ensemble(tmp_path, "cdf5", rng)
    cfg = _config(tmp_path, len(paths))
    fast, metas = _read(cfg, True, monkeypatch)
    assert [m.quick for m in metas] == [False] + [True] * (len(paths) - 1)
    monkeypatch.setitem(BACKENDS, ClassicStore.format_name, _ClassicWithoutHooks)
    with open_member(paths[0]) as store:
        assert type(store) is _ClassicWithoutHooks
    layout = members_mod.layout_from_member(cfg.ensemble, paths[0])
    assert members_mod.member_template(paths[0], layout)[1] is None
    bare, bare_metas = _read(cfg, True, monkeypatch)
    assert not any(m.quick for m in bare_metas)
    assert bare.tobytes() == fast.tobytes()
    np.testing.assert_array_equal(bare, _reference(paths))


@needs_tools
@pytest.mark.parametrize("kind", ["nc4", "cdf5"])
def test_metadata_bytes_leave_out_data_and_free_the_global_attribute_values(tmp_path, rng, kind):
    """What each format's hook says, checked against the file: data outside, globals free."""
    path = _ensemble(tmp_path, kind, rng, n=1)[0]
    with open_member(path) as store:
        infos = dict(store.variables())
        fmt = type(store)
    blob = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        meta = fmt.metadata_bytes(fd, path, infos)
    finally:
        os.close(fd)
    # :member and :shift; netCDF-C adds _NCProperties to a netCDF-4 file's root group
    assert meta is not None and meta.attributes == (3 if kind == "nc4" else 2)
    state = infos["state"]
    start, stop = state.raw_offset, state.raw_offset + state.nbytes
    inside = any(lo <= start and stop <= hi for lo, hi in meta.spans)
    assert not inside or any(lo <= start and stop <= hi for lo, hi in meta.data)
    with netCDF4.Dataset(path) as ds:
        member = np.asarray(ds.getncattr("member")).astype(">i4" if kind == "cdf5" else "<i4")
    free = [blob[lo:hi] for lo, hi in meta.free]
    assert any(member.tobytes() in piece for piece in free)
    for lo, hi in meta.free:  # free ranges lie inside the metadata
        assert any(a <= lo and hi <= b for a, b in meta.spans)


@needs_tools
@pytest.mark.parametrize("kind", ["nc4", "cdf5", "classic"])
def test_members_whose_header_moved_take_the_quick_look(tmp_path, rng, monkeypatch, kind):
    """A global attribute of another length per member: no byte match, the format's look.

    (A time stamp in ``history`` does this.) Every member but the first is still
    quick-checked, with its own offsets, and the matrix is the full check's.
    """
    paths = [tmp_path / f"mem{m:03d}.nc" for m in range(1, 5)]
    for m, p in enumerate(paths, start=1):
        stamp = "x" * (8 * m + int(rng.integers(0, 4)))  # another padded length each
        _write(kind, _cdl(rng, m).replace(":member = ", f':history = "{stamp}" ;\n  :member = '), p)
    cfg = _config(tmp_path, len(paths))
    layout = members_mod.layout_from_member(cfg.ensemble, paths[0])
    _, tmpl = members_mod.member_template(paths[0], layout)
    assert tmpl is not None and tmpl.signature is not None
    assert not any(same_bytes(p, tmpl.bytes) for p in paths[1:])
    fast, metas = _read(cfg, True, monkeypatch)
    slow, full_metas = _read(cfg, False, monkeypatch)
    assert [m.quick for m in metas] == [False] + [True] * (len(paths) - 1)
    assert fast.tobytes() == slow.tobytes()
    np.testing.assert_array_equal(fast, _reference(paths))
    for a, b in zip(metas, full_metas, strict=True):
        for name in ("state", "rec"):
            assert a.infos[name].raw_offset == b.infos[name].raw_offset
    _write(kind, _cdl(rng, 3, lat=[-50.0, -15.0, 15.0, 45.0]), paths[2])  # same message
    msg = _error(cfg)
    assert msg.startswith(f"{paths[2]}: coordinate 'lat' differs") and "\n" not in msg
