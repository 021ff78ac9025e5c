"""``{tile}`` in ``ensemble.slots``: a 4-D analysis of tiled members whose slot states
are tiled too (issue 25, item 8; it was ``KeyError: 'tile'``, a traceback).

The reference is the 4-D analysis of the untiled members and untiled slot
files (``ensio.models.moving``); the tiled run cuts both into the same tiles
(interior + halo, as a model writes them) and must give the same analysis in
every tile's interior, to 1e-12, and its prior bytes in the halo. Bad input
is one line naming ``ensemble.slots`` (or the file) and exit status 2, with
nothing written; ``io.mode: shuffle`` refuses a 4-D analysis in one line.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import netCDF4
import numpy as np
import pytest
from mpi4py import MPI
from tiles_support import cut, tile_values

from ensio.config.load import load_config
from ensio.layout.tiles import declared_geometry
from ensio.models.moving import config_text, write_moving
from ensio.offline import run_analysis

NX, NY, SLOTS = 24, 12, 3
TILES = "  tiles: {count: 4, layout: [2, 2], halo: 1}\n"
MEMBERS = 'members: "mem{member:03d}.nc"'
TILED_MEMBERS = 'members: "tiles/mem{member:03d}_{tile}.nc"'
SLOTS_LINE = 'slots: "fc/mem{member:03d}_slot{slot}.nc"'
TILED_SLOTS = 'slots: "fc/mem{member:03d}_{tile}_slot{slot}.nc"'


@pytest.fixture
def case(tmp_path):
    made = write_moving(tmp_path / "case", nx=NX, ny=NY, members=6, slots=SLOTS, n_obs=60,
                        speed=0.2)  # fmt: skip
    geo = declared_geometry((NY, NX), 4, (2, 2), 1)
    root = made.directory
    (root / "tiles").mkdir()
    for m in range(1, 7):
        for b in geo.boxes:
            cut(root / f"mem{m:03d}.nc", root / "tiles" / f"mem{m:03d}_{b.index}.nc", b)
            for s in range(1, SLOTS + 1):
                cut(root / "fc" / f"mem{m:03d}_slot{s}.nc",
                    root / "fc" / f"mem{m:03d}_{b.index}_slot{s}.nc", b)
    text = config_text(made, True).replace("io: {in_place: false}", "io: {in_place: true}")
    text = "".join(x for x in text.splitlines(True) if "output:" not in x
                   and not x.startswith("  members: \"an") and not x.startswith("  mean:"))
    return root, geo, text


def _tiled(text: str) -> str:
    return text.replace(MEMBERS, TILED_MEMBERS, 1).replace(SLOTS_LINE, TILED_SLOTS) \
        .replace("ensemble:\n", "ensemble:\n" + TILES)


def test_tiled_slots_equal_the_untiled_4d_analysis(case) -> None:
    root, geo, text = case
    (root / "untiled.yaml").write_text(text)
    (root / "tiled.yaml").write_text(_tiled(text))
    before = {b.index: tile_values(root / "tiles" / f"mem001_{b.index}.nc") for b in geo.boxes}
    ref = run_analysis(load_config(root / "untiled.yaml"), MPI.COMM_SELF)
    got = run_analysis(load_config(root / "tiled.yaml"), MPI.COMM_SELF)
    assert got.result is not None and got.four_d
    assert got.result.qc.accepted == ref.result.qc.accepted > 0
    with netCDF4.Dataset(root / "mem001.nc") as ds:
        want = np.asarray(ds["state"][...])
    prior = np.asarray(netCDF4.Dataset(root / "fc" / "mem001_slot1.nc")["state"][...])
    assert np.abs(want - prior).max() > 1e-3  # the analysis did something
    for b in geo.boxes:
        now = tile_values(root / "tiles" / f"mem001_{b.index}.nc")
        iy, ix = b.interior()
        np.testing.assert_allclose(now[iy, ix], want[b.y0:b.y1, b.x0:b.x1], rtol=0, atol=1e-12)
        halo = np.ones(now.shape, bool)
        halo[iy, ix] = False
        assert now[halo].tobytes() == before[b.index][halo].tobytes()


def _cli(root, name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ensio", "analyse", str(root / name)],
                          capture_output=True, text=True, timeout=300)


def _tree(root) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*.nc"))}


@pytest.mark.parametrize("bad", ["untiled members", "missing tile", "shuffle"])
def test_bad_tiled_slots_are_one_line_and_change_nothing(case, bad) -> None:
    root, _, text = case
    if bad == "untiled members":
        text = text.replace(SLOTS_LINE, TILED_SLOTS)
        needle = "ensemble.slots: {tile} in the pattern needs tiled members"
    elif bad == "missing tile":
        text = _tiled(text)
        (root / "fc" / "mem004_2_slot2.nc").unlink()
        needle = "mem004_2_slot2.nc: slot tile file not found (ensemble.slots, tile 2)"
    else:
        (root / "local" / "r0").mkdir(parents=True)
        shuffle = "io: {in_place: true, mode: shuffle, local_dir: 'local/r{rank}'}"
        text = _tiled(text).replace("io: {in_place: true}", shuffle)
        needle = "analysis.time_slots"
    (root / "bad.yaml").write_text(text)
    before = _tree(root)
    out = _cli(root, "bad.yaml")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert _tree(root) == before
    shutil.rmtree(root / "local", ignore_errors=True)
