"""The missing-data line in every I/O mode (issue 25, item 8).

``ensio analyse`` prints "missing data: N inactive points …" when a member
holds a missing value; tiled ``files`` mode read the tiles but counted
nothing, so the line was missing. The reference is the untiled ``files``
run on the same members (points poked there, then cut into tiles), never the
tiled code's own count; the shuffle mode (P = 1 tile per member, one rank)
reports it from its read's statistics too.
"""

from __future__ import annotations

import shutil

import netCDF4
import numpy as np
from tiles_support import PATTERN, tile_case

from ensio.cli.synth import main as synth_main
from ensio.config.load import load_config
from ensio.layout.tiles import declared_geometry
from ensio.offline import run_analysis

NX, NY = 11, 9
#: (member, lat, lon) of the missing values: (2, 3) is missing in both members and
#: counts once, so 3 inactive points; they fall in different tiles of the 2 x 2 layout
POKES = [(1, 2, 3), (1, 7, 9), (2, 2, 3), (2, 4, 5)]


def _case(root):
    assert synth_main([str(root), "--nx", str(NX), "--ny", str(NY), "--members", "2",
                       "--seed", "5", "--format", "cdf5"]) == 0  # fmt: skip
    for m, y, x in POKES:
        with netCDF4.Dataset(root / f"mem{m:03d}.nc", "a") as ds:
            ds.set_auto_maskandscale(False)
            ds["state"][y, x] = np.nan
    return root


def _line(report) -> list[str]:
    return [x for x in report.lines() if x.startswith("missing data:")]


def test_tiled_files_mode_prints_the_inactive_points(tmp_path) -> None:
    case = _case(tmp_path / "case")
    geo = declared_geometry((NY, NX), 4, (2, 2), 1)
    tile_case(case, geo, 2)
    untiled = run_analysis(load_config(case / "ensio.yaml", ["output.mean=null",
                                                             "output.spread=null"]),
                           _world())  # fmt: skip
    want = "missing data: 3 inactive points (not analysed, bytes kept) (state 3)"
    assert _line(untiled) == [want]
    tiled = run_analysis(load_config(case / "ensio.yaml", [
        f"ensemble.members={PATTERN}", "ensemble.tiles={count: 4, layout: [2, 2], halo: 1}",
        "output.mean=null", "output.spread=null"]), _world())  # fmt: skip
    assert _line(tiled) == [want]


def test_shuffle_read_counts_the_inactive_points(tmp_path) -> None:
    """One rank reads member 1's single tile (N_e = 1, P = 1): the read's statistics,
    summed over the ranks, count member 1's two missing points, as files mode's do (the
    line every driver prints from them)."""
    from ensio.io.modes.shuffle import ShuffleEnsembleIO

    case = _case(tmp_path / "case")
    geo = declared_geometry((NY, NX), 1, (1, 1), 0)
    tile_case(case, geo, 2)
    local = case / "local" / "r0"
    local.mkdir(parents=True)
    for m in (1, 2):
        src = case / PATTERN.format(member=m, tile=0)
        shutil.copy(src, local / src.name)
    cfg = load_config(case / "ensio.yaml", [
        f"ensemble.members={PATTERN}", "ensemble.tiles={count: 1, layout: [1, 1], halo: 0}",
        "ensemble.size=1", "io.mode=shuffle", "io.local_dir=local/r{rank}"])  # fmt: skip
    with ShuffleEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, _world()) as io:
        io.read()
        assert io.stats.inactive == {"state": 2}  # member 1's two points


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD
