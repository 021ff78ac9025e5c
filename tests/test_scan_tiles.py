"""One scan for tiled members: every tile of every member is checked against its place.

Issue 25, item 6. Tiled members used to be checked for their shapes only: a
tile whose coordinates were shifted, two same-shape tiles of a member
swapped, or ``DOMAIN_*`` attributes of members 2.. that disagree with the
decomposition were analysed (the wrong region, rc 0). Each case here is
refused by ``ensio analyse`` (``io.mode: files``) with one line naming the
file and the variable or attribute, exit 2, and NOTHING modified (sha256 of
every file under the case before and after). The shuffle mode runs the same
scan (tests/mpi/test_scan_tiles_mpi.py).

The tiles are cut from the synthetic members the way users cut them (interior
plus halo, tests/tiles_support.py), one case by NCO (``ncks -d``, ``ncap2``).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
from tiles_support import PATTERN, box_with_halo, nemo_attrs, tile_case

from ensio.cli.main import main as ensio_main
from ensio.cli.synth import main as synth_main
from ensio.layout.tiles import TileGeometry, declared_geometry

NX, NY, NE = 13, 10, 3
NAV = "ensemble.coordinates={lon: nav_lon, lat: nav_lat, level: lev}"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic members with 2 levels and a time coordinate (one record), 2-D nav_lon/nav_lat."""
    out = tmp_path_factory.mktemp("scan") / "case"
    argv = [str(out), "--nx", str(NX), "--ny", str(NY), "--members", str(NE), "--seed", "5",
            "--format", "cdf5", "--levels", "2"]  # fmt: skip
    assert synth_main(argv) == 0
    for m in range(1, NE + 1):
        with netCDF4.Dataset(out / f"mem{m:03d}.nc", "a") as ds:
            ds.createDimension("time", 1)
            t = ds.createVariable("time", "f8", ("time",))
            t.units = "days since 2000-01-01"
            t[:] = [731.25]
            lon, lat = np.array(ds["lon"][:]), np.array(ds["lat"][:])
            ds.createVariable("nav_lon", "f8", ("lat", "lon"))[:] = np.broadcast_to(lon, (NY, NX))
            ds.createVariable("nav_lat", "f8", ("lat", "lon"))[:] = np.broadcast_to(
                lat[:, None], (NY, NX))
    return out


def make(base: Path, tmp_path: Path, layout: tuple[int, int], halo: int, *,
         nemo: bool = False) -> tuple[Path, TileGeometry, list[str]]:  # fmt: skip
    """A private copy of the case, its members cut into tiles; the ``--set`` options."""
    case = tmp_path / "case"
    shutil.copytree(base, case)
    geo = declared_geometry((NY, NX), layout[0] * layout[1], layout, halo)
    tile_case(case, geo, NE, nemo=nemo)
    sets = [f"ensemble.members={PATTERN}", "output.mean=null", "output.spread=null"]
    if not nemo:
        sets.append(f"ensemble.tiles={{count: {geo.count}, layout: [{layout[0]}, "
                    f"{layout[1]}], halo: {halo}}}")  # fmt: skip
    return case, geo, sets


def tile(case: Path, member: int, t: int) -> Path:
    return case / PATTERN.format(member=member, tile=t)


def snapshot(case: Path) -> dict[str, str]:
    """Every file under the case: what "nothing modified" compares."""
    return {str(p.relative_to(case)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(case.rglob("*")) if p.is_file()}  # fmt: skip


def analyse(case: Path, sets: list[str]) -> int:
    args = ["analyse", str(case / "ensio.yaml")]
    for s in sets:
        args += ["--set", s]
    return ensio_main(args)


def refused(case: Path, sets: list[str], capsys, *words: str) -> str:
    """``ensio analyse`` exits 2 with one line holding ``words``; no file changed."""
    before = snapshot(case)
    capsys.readouterr()
    assert analyse(case, sets) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    assert snapshot(case) == before
    return err


def edit(path: Path, name: str, change) -> None:
    """Rewrite variable ``name`` of one tile file as ``change(values)``."""
    with netCDF4.Dataset(path, "a") as ds:
        var = ds[name]
        var[...] = change(np.array(var[...]))


# ------------------------------------------------------------- shifted coordinates


@pytest.mark.parametrize("name,member,t,change,nav", [
    ("lon", 2, 1, lambda v: v + 0.5, False),
    ("lon", 1, 1, lambda v: v + 0.5, False),  # member 1: its halo neighbours disagree
    ("lat", 3, 2, lambda v: v[::-1], False),
    ("lev", 3, 2, lambda v: np.where(v == v.max(), v + 50.0, v), False),  # depth 200 -> 250
    ("time", 2, 3, lambda v: v + 1, False),
    ("nav_lon", 2, 0, lambda v: v + 1.0, True),
    ("nav_lat", 3, 3, lambda v: v + 0.25, True),
], ids=["lon", "lon-member1", "lat-inverted", "level", "time", "nav_lon", "nav_lat"])
@pytest.mark.parametrize("nemo", [False, True], ids=["declared", "nemo"])
def test_shifted_coordinate_of_one_tile(base, tmp_path, capsys, name, member, t, change,
                                        nav, nemo) -> None:  # fmt: skip
    case, _, sets = make(base, tmp_path, (2, 2), 1, nemo=nemo)
    bad = tile(case, member, t)
    edit(bad, name, change)
    refused(case, [*sets, *([NAV] if nav else [])], capsys, str(bad), f"'{name}'")


def test_good_tiles_with_2d_coordinates_are_analysed(base, tmp_path, capsys) -> None:
    """The control: the same cut without a change passes the check (halos, nav_lon, time)."""
    case, geo, sets = make(base, tmp_path, (2, 2), 1, nemo=True)
    before = snapshot(case)
    assert analyse(case, [*sets, NAV]) == 0
    assert "posterior" in capsys.readouterr().out
    after = snapshot(case)
    assert all(after[f"tiles/{tile(case, 2, b.index).name}"]
               != before[f"tiles/{tile(case, 2, b.index).name}"] for b in geo.boxes)  # fmt: skip


# ------------------------------------------------------------------ swapped tiles


def swap(a: Path, b: Path) -> None:
    tmp = a.with_suffix(".swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


@pytest.mark.parametrize("layout,halo,pair", [((1, 2), 1, (0, 1)), ((2, 2), 0, (0, 2)),
                                              ((3, 1), 0, (1, 2))],
                         ids=["lat-halo1", "lat-nohalo", "lon-nohalo"])  # fmt: skip
@pytest.mark.parametrize("member", [1, 2])
@pytest.mark.parametrize("nemo", [False, True], ids=["declared", "nemo"])
def test_swapped_tiles_of_one_member(base, tmp_path, capsys, layout, halo, pair, member,
                                     nemo) -> None:  # fmt: skip
    """Two tiles of the same shape swapped: the other region would be analysed. Refused,
    with ``ensemble.tiles`` (by the coordinates) and with DOMAIN_* attributes."""
    case, geo, sets = make(base, tmp_path, layout, halo, nemo=nemo)
    a, b = (geo.boxes[i] for i in pair)
    assert a.file_shape == b.file_shape  # the case: only the place tells them apart
    swap(tile(case, member, a.index), tile(case, member, b.index))
    err = refused(case, sets, capsys)
    assert any(str(tile(case, member, i)) in err for i in pair), err


# ---------------------------------------------------------- DOMAIN_* of member 2..


@pytest.mark.parametrize("key,value", [
    ("DOMAIN_number_total", np.int32(6)),
    ("DOMAIN_size_global", np.array([NX, NY + 1], dtype=np.int32)),
    ("DOMAIN_position_first", np.array([1, 2], dtype=np.int32)),
    ("DOMAIN_number", np.int32(3)),
])
@pytest.mark.parametrize("member", [2, 3])
def test_domain_attributes_of_every_member(base, tmp_path, capsys, key, value, member) -> None:
    case, _, sets = make(base, tmp_path, (2, 2), 1, nemo=True)
    bad = tile(case, member, 1)
    with netCDF4.Dataset(bad, "a") as ds:
        ds.setncattr(key, value)
    refused(case, sets, capsys, str(bad), key)


def test_domain_attributes_missing_in_member_2(base, tmp_path, capsys) -> None:
    case, _, sets = make(base, tmp_path, (2, 2), 1, nemo=True)
    bad = tile(case, 2, 2)
    with netCDF4.Dataset(bad, "a") as ds:
        ds.delncattr("DOMAIN_position_last")
    refused(case, sets, capsys, str(bad), "DOMAIN_position_last")


def test_domain_attributes_disagree_with_declared_tiles(base, tmp_path, capsys) -> None:
    """Files that carry DOMAIN_* and a declared ``ensemble.tiles``: they must agree."""
    case, geo, sets = make(base, tmp_path, (2, 2), 1)
    for m in range(1, NE + 1):
        for b in geo.boxes:
            with netCDF4.Dataset(tile(case, m, b.index), "a") as ds:
                ds.setncatts(nemo_attrs(b, geo.count, geo.grid))
    assert analyse(case, sets) == 0  # agreeing attributes are fine
    bad = tile(case, 3, 0)
    with netCDF4.Dataset(bad, "a") as ds:
        ds.setncatts(nemo_attrs(geo.boxes[1], geo.count, geo.grid))
    refused(case, sets, capsys, str(bad), "DOMAIN_")


# -------------------------------------------------------------- cut by NCO tools


def test_nco_cut_tiles_with_a_shifted_tile(base, tmp_path, capsys) -> None:
    """Tiles cut by ``ncks -d`` (halo included) pass; ``ncap2`` shifting one tile's lon
    by half a grid step is refused."""
    needs.tool("ncks", "ncap2")
    case = tmp_path / "case"
    shutil.copytree(base, case)
    geo = declared_geometry((NY, NX), 6, (3, 2), 1)
    (case / "tiles").mkdir()
    for m in range(1, NE + 1):
        for b in geo.boxes:
            ys, xs = box_with_halo(b)
            subprocess.run(["ncks", "-O", "-d", f"lat,{ys.start},{ys.stop - 1}",
                            "-d", f"lon,{xs.start},{xs.stop - 1}",
                            str(case / f"mem{m:03d}.nc"), str(tile(case, m, b.index))],
                           check=True, capture_output=True)  # fmt: skip
    sets = [f"ensemble.members={PATTERN}", "output.mean=null", "output.spread=null",
            "ensemble.tiles={count: 6, layout: [3, 2], halo: 1}"]  # fmt: skip
    clean = tmp_path / "clean"
    shutil.copytree(case, clean)
    assert analyse(clean, sets) == 0
    bad = tile(case, 2, 4)
    tmp = bad.with_suffix(".tmp.nc")
    subprocess.run(["ncap2", "-O", "-s", "lon=lon+0.5", str(bad), str(tmp)], check=True,
                   capture_output=True)  # fmt: skip
    tmp.replace(bad)
    refused(case, sets, capsys, str(bad), "'lon'")
