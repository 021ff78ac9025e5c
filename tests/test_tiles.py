"""Tiled members (``{tile}``): geometry, read equal to the single-file read, in-place write.

The reference is always the untiled case: its members are read with
``io.mode: files`` (``read_ensemble``) and each tiled member is cut from them,
by a small cutter here (netCDF4) or by ``ncks -d`` from NCO, halo included.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
from mpi4py import MPI
from tiles_support import (
    PATTERN,
    add_mask,
    assert_tiles_hold,
    box_with_halo,
    cut,
    nemo_attrs,
    tile_case,
    tile_values,
)

from ensio.analysis.inputs import assimilate_block, observation_sources
from ensio.cli.main import main as ensio_main
from ensio.cli.synth import main as synth_main
from ensio.config import ConfigError
from ensio.config.load import load_config
from ensio.errors import InputError
from ensio.io.modes.ensemble import read_ensemble, write_ensemble
from ensio.io.modes.tiledio import TiledEnsembleIO
from ensio.io.tiles import tilefile as tilefile_mod
from ensio.io.tiles.tiled import TiledEnsemble
from ensio.io.tiles.tilefile import plan_runs
from ensio.layout.block import EnsembleBlock
from ensio.layout.state import StateLayout, VariableLayout
from ensio.layout.tiles import TileBox, TileGeometry, declared_geometry, nemo_box
from ensio.offline import run_analysis

NX, NY, NE = 13, 10, 3


# ------------------------------------------------------------------------ helpers


@pytest.fixture(scope="module", params=[None, 2], ids=["2d", "3levels"])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiles") / "case"
    argv = [str(out), "--nx", str(NX), "--ny", str(NY), "--members", str(NE), "--seed", "5",
            "--format", "cdf5"]  # fmt: skip
    if request.param is not None:
        argv += ["--levels", str(request.param)]
    assert synth_main(argv) == 0
    return out


def fresh(case: Path, tmp_path: Path) -> Path:
    """A private copy of the synthetic case (the tests write into it)."""
    dst = tmp_path / "case"
    shutil.copytree(case, dst)
    return dst


def tiled(case: Path, count: int | None, layout: tuple[int, int] = (1, 1), halo: int = 0):
    sets = [f"ensemble.members={PATTERN}"]
    if count is not None:
        sets.append(f"ensemble.tiles={{count: {count}, layout: [{layout[0]}, {layout[1]}], "
                    f"halo: {halo}}}")  # fmt: skip
    cfg = load_config(case / "ensio.yaml", sets)
    return TiledEnsemble(cfg.ensemble, cfg.base_dir)


def single_read(case: Path) -> np.ndarray:
    return read_ensemble(load_config(case / "ensio.yaml"), MPI.COMM_SELF).data


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------- geometry


@pytest.mark.parametrize("grid", [(10, 13), (7, 5), (4, 4)])
@pytest.mark.parametrize("layout", [(1, 1), (2, 1), (1, 3), (3, 2), (4, 4)])
@pytest.mark.parametrize("halo", [0, 1, 2])
def test_declared_cover_and_runs(grid, layout, halo) -> None:
    """Every point owned once; runs map global elements to the right tile elements."""
    geo = declared_geometry(grid, layout[0] * layout[1], layout, halo)
    geo.check()
    ny, nx = grid
    g_all = np.zeros(2 * ny * nx, dtype=np.int64)
    field = np.arange(2 * ny * nx).reshape(2, ny, nx)
    for b in geo.boxes:
        assert (b.index % layout[0], b.index // layout[0]) == (
            [k for k in range(layout[0]) if b.x0 == sum(_sizes(nx, layout[0])[:k])][0],
            [k for k in range(layout[1]) if b.y0 == sum(_sizes(ny, layout[1])[:k])][0],
        )
        ys, xs = box_with_halo(b)
        tile = field[:, ys, xs]
        assert tile.shape[1:] == b.file_shape
        g, t, n = b.runs((2, ny, nx), grid)
        for gk, tk in zip(g, t, strict=True):
            np.testing.assert_array_equal(field.ravel()[gk : gk + n], tile.ravel()[tk : tk + n])
            g_all[gk : gk + n] += 1
    np.testing.assert_array_equal(g_all, 1)


def _sizes(n: int, p: int) -> list[int]:
    """Block sizes written out independently: the first n mod p blocks one larger."""
    return [n // p + (1 if k < n % p else 0) for k in range(p)]


def test_check_finds_overlap_and_gap() -> None:
    a = TileBox(0, 0, 5, 0, 7)
    with pytest.raises(InputError, match="f1.nc: tile interior overlaps that of f0.nc"):
        TileGeometry((10, 13), (a, TileBox(1, 4, 10, 0, 13))).check(["f0.nc", "f1.nc"])
    with pytest.raises(InputError, match="uncovered .first at y=0, x=7"):
        TileGeometry((10, 13), (a, TileBox(1, 5, 10, 0, 13))).check(["f0.nc", "f1.nc"])


def test_nemo_box_reading() -> None:
    b = TileBox(3, 4, 8, 6, 13, 1, 1, 1, 0)
    got, total, grid = nemo_box(nemo_attrs(b, 6, (NY, NX)), 3, "x.nc")
    assert (got, total, grid) == (b, 6, (NY, NX))
    attrs = nemo_attrs(b, 6, (NY, NX))
    del attrs["DOMAIN_halo_size_end"]
    with pytest.raises(InputError, match="x.nc: global attribute DOMAIN_halo_size_end missing"):
        nemo_box(attrs, 3, "x.nc")


# ------------------------------------------------------------------- read / write


@pytest.mark.parametrize("layout,halo", [((1, 1), 0), ((2, 2), 1), ((3, 2), 2), ((1, 4), 1)])
@pytest.mark.parametrize("nemo", [False, True], ids=["declared", "nemo"])
def test_tiled_read_equals_single_file(case, tmp_path, layout, halo, nemo) -> None:
    case = fresh(case, tmp_path)
    count = layout[0] * layout[1]
    tile_case(case, declared_geometry((NY, NX), count, layout, halo), NE, nemo=nemo)
    ens = tiled(case, None if nemo else count, layout, halo)
    ref = single_read(case)
    got = ens.read()
    assert got.shape == ref.shape
    assert got.tobytes() == ref.tobytes()


@pytest.mark.parametrize("nemo", [False, True], ids=["declared", "nemo"])
def test_ncks_cut_with_halo(case, tmp_path, nemo) -> None:
    """Tiles cut by NCO (`ncks -d`, halo included) read as the single files."""
    needs.tool("ncks")  # NCO
    case = fresh(case, tmp_path)
    geo = declared_geometry((NY, NX), 6, (3, 2), 1)
    (case / "tiles").mkdir()
    for m in range(1, NE + 1):
        for b in geo.boxes:
            ys, xs = box_with_halo(b)
            subprocess.run(
                ["ncks", "-O", "-d", f"lat,{ys.start},{ys.stop - 1}",
                 "-d", f"lon,{xs.start},{xs.stop - 1}",
                 str(case / f"mem{m:03d}.nc"), str(case / PATTERN.format(member=m, tile=b.index))],
                check=True, capture_output=True,
            )  # fmt: skip
            if nemo:
                with netCDF4.Dataset(case / PATTERN.format(member=m, tile=b.index), "a") as ds:
                    ds.setncatts(nemo_attrs(b, 6, (NY, NX)))
    ens = tiled(case, None) if nemo else tiled(case, 6, (3, 2), 1)
    assert ens.read().tobytes() == single_read(case).tobytes()


@pytest.mark.parametrize("nemo", [False, True], ids=["declared", "nemo"])
def test_write_interior_only(case, tmp_path, rng, nemo) -> None:
    """An analysis written to tiles: interiors equal the single-file write, halos untouched."""
    case = fresh(case, tmp_path)
    geo = declared_geometry((NY, NX), 6, (2, 3), 1)
    tile_case(case, geo, NE, nemo=nemo)
    ens = tiled(case, None if nemo else 6, (2, 3), 1)
    first = {b.index: case / PATTERN.format(member=1, tile=b.index) for b in geo.boxes}
    before = {t: tile_values(path) for t, path in first.items()}
    ref = single_read(case)
    analysis = ref + rng.standard_normal(ref.shape)
    ens.write(analysis)
    cfg = load_config(case / "ensio.yaml")
    write_ensemble(cfg, MPI.COMM_SELF, EnsembleBlock(ens.layout, 0, ref.shape[1], analysis))
    assert ens.read().tobytes() == single_read(case).tobytes()
    for m in range(1, NE + 1):
        with netCDF4.Dataset(case / f"mem{m:03d}.nc") as ds:
            whole = np.array(ds["state"][...])
        for b in geo.boxes:
            now = tile_values(case / PATTERN.format(member=m, tile=b.index))
            iy, ix = b.interior()
            np.testing.assert_allclose(now[..., iy, ix], whole[..., b.y0 : b.y1, b.x0 : b.x1],
                                       rtol=0, atol=1e-12)  # fmt: skip
            if m == 1:
                halo = np.ones(b.file_shape, dtype=bool)
                halo[iy, ix] = False
                np.testing.assert_array_equal(now[..., halo], before[b.index][..., halo])
    assert not (case / "tiles" / ".ensio-journal").exists() or not any(
        (case / "tiles" / ".ensio-journal").iterdir()
    )


def test_row_windows(case, tmp_path, rng) -> None:
    """Any row range reads the same rows as the whole read; writes by range compose."""
    case = fresh(case, tmp_path)
    tile_case(case, declared_geometry((NY, NX), 6, (3, 2), 1), NE)
    ens = tiled(case, 6, (3, 2), 1)
    whole = ens.read()
    n = whole.shape[1]
    cuts = np.sort(rng.choice(np.arange(1, n), size=4, replace=False))
    for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):
        assert ens.read(int(lo), int(hi)).tobytes() == whole[:, lo:hi].tobytes()
    new = whole * 2.0 + 1.0
    for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):
        ens.write_rows(new[:, lo:hi], int(lo), None, False)
    np.testing.assert_array_equal(ens.read(), new)


@pytest.mark.parametrize("nemo", [False, True], ids=["declared", "nemo"])
def test_analysis_on_tiles_equals_single_file(case, tmp_path, nemo) -> None:
    """The LETKF on tiled members gives the single-file analysis; halos stay byte-identical."""
    case = fresh(case, tmp_path)
    geo = declared_geometry((NY, NX), 4, (2, 2), 2)
    tile_case(case, geo, NE, nemo=nemo)
    halos = {}
    for m in range(1, NE + 1):
        for b in geo.boxes:
            halos[m, b.index] = tile_values(case / PATTERN.format(member=m, tile=b.index))
    cfg = load_config(case / "ensio.yaml")
    obs = observation_sources(cfg.observations, cfg.resolve)
    prior = read_ensemble(cfg, MPI.COMM_SELF)
    ref = assimilate_block(prior, obs, cfg.analysis, MPI.COMM_SELF, cycle=0, seconds={})
    sets = [f"ensemble.members={PATTERN}"]
    if not nemo:
        sets.append("ensemble.tiles={count: 4, layout: [2, 2], halo: 2}")
    tcfg = load_config(case / "ensio.yaml", sets)
    with TiledEnsembleIO(tcfg.ensemble, tcfg.base_dir, tcfg.io, MPI.COMM_SELF) as io:
        block = io.read()
        assert block.data.tobytes() == prior.data.tobytes()
        got = assimilate_block(block, obs, tcfg.analysis, MPI.COMM_SELF, cycle=0, seconds={})
        io.write(EnsembleBlock(block.layout, block.start, block.count, got.ensemble))
    assert np.abs(ref.ensemble - prior.data).max() > 1e-3  # the analysis did change the state
    lead = (
        () if prior.layout.variables[0].shape == (NY, NX) else prior.layout.variables[0].shape[:-2]
    )
    for m in range(1, NE + 1):
        want = ref.ensemble[m - 1].reshape(*lead, NY, NX)
        assert_tiles_hold(case, geo, m, want, halos)


def test_ensio_analyse_on_tiles(case, tmp_path, capsys) -> None:
    """`ensio analyse --set ...` on tiled members: the single-file analysis, halos untouched."""
    case = fresh(case, tmp_path)
    geo = declared_geometry((NY, NX), 6, (3, 2), 1)
    tile_case(case, geo, NE, nemo=True)
    before = {(m, b.index): tile_values(case / PATTERN.format(member=m, tile=b.index))
              for m in range(1, NE + 1) for b in geo.boxes}  # fmt: skip
    yaml = str(case / "ensio.yaml")
    assert ensio_main(["analyse", yaml]) == 0
    single = single_read(case)
    sets = ["--set", f"ensemble.members={PATTERN}", "--set", "output.mean=null",
            "--set", "output.spread=null"]  # fmt: skip
    assert ensio_main(["analyse", yaml, *sets]) == 0
    for m in range(1, NE + 1):
        with netCDF4.Dataset(case / f"mem{m:03d}.nc") as ds:
            whole = np.array(ds["state"][...])
        np.testing.assert_array_equal(whole.ravel(), single[m - 1])
        for b in geo.boxes:
            now = tile_values(case / PATTERN.format(member=m, tile=b.index))
            iy, ix = b.interior()
            np.testing.assert_allclose(now[..., iy, ix], whole[..., b.y0 : b.y1, b.x0 : b.x1],
                                       rtol=0, atol=1e-12)  # fmt: skip
            assert not np.array_equal(now[..., iy, ix], before[m, b.index][..., iy, ix])
            halo = np.ones(b.file_shape, dtype=bool)
            halo[iy, ix] = False
            assert now[..., halo].tobytes() == before[m, b.index][..., halo].tobytes()
    # the run record knows the tiles: the same command again does nothing
    capsys.readouterr()
    assert ensio_main(["analyse", yaml, *sets]) == 0
    assert "already analysed" in capsys.readouterr().out


def test_failed_write_rolls_back_every_tile(case, tmp_path, monkeypatch) -> None:
    """A write that fails part-way leaves every tile byte-identical to before."""
    case = fresh(case, tmp_path)
    tile_case(case, declared_geometry((NY, NX), 4, (2, 2), 1), NE)
    ens = tiled(case, 4, (2, 2), 1)
    snap = _snapshot(case)
    real, calls = tilefile_mod.raw_write, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # into the second member's tiles (one write per tile and variable)
            raise OSError("disk full (test)")
        real(*args, **kwargs)

    monkeypatch.setattr(tilefile_mod, "raw_write", failing)
    with pytest.raises(OSError, match="disk full"):
        ens.write(ens.read() + 1.0)
    assert len(calls) == 6
    assert _snapshot(case) == snap


@pytest.mark.parametrize("nemo", [False, True], ids=["declared", "nemo"])
def test_tiled_products(case, tmp_path, nemo) -> None:
    """Mean and spread of tiled members: one file per tile, the single-file product cut by NCO.

    The reference is the product of the equivalent single-file run, cut to
    each tile's box (halo included) by ``ncks -d`` where NCO is installed
    (numpy slicing otherwise); each product tile keeps its tile's own
    coordinates, and the run record lists every product tile.
    """
    single, tiled_case = fresh(case, tmp_path / "s"), fresh(case, tmp_path / "t")
    geo = declared_geometry((NY, NX), 6, (3, 2), 1)
    tile_case(tiled_case, geo, NE, nemo=nemo)
    assert ensio_main(["analyse", str(single / "ensio.yaml")]) == 0  # an/mean.nc, an/spread.nc
    sets = ["--set", f"ensemble.members={PATTERN}",
            "--set", "output.mean=tiled/mean_{tile:04d}.nc",
            "--set", "output.spread=tiled/spread_{tile:04d}.nc"]  # fmt: skip
    if not nemo:
        sets += ["--set", "ensemble.tiles={count: 6, layout: [3, 2], halo: 1}"]
    assert ensio_main(["analyse", str(tiled_case / "ensio.yaml"), *sets]) == 0
    for stat in ("mean", "spread"):
        with netCDF4.Dataset(single / "an" / f"{stat}.nc") as ds:
            whole = np.array(ds["state"][...])
            lon = np.array(ds["lon"][...])
        for b in geo.boxes:
            path = tiled_case / "tiled" / f"{stat}_{b.index:04d}.nc"
            ys, xs = box_with_halo(b)
            want = whole[..., ys, xs]
            ref = tmp_path / f"ref_{stat}_{b.index}.nc"
            if shutil.which("ncks") is not None:
                subprocess.run(
                    ["ncks", "-O", "-d", f"lat,{ys.start},{ys.stop - 1}",
                     "-d", f"lon,{xs.start},{xs.stop - 1}", str(single / "an" / f"{stat}.nc"),
                     str(ref)], check=True)  # fmt: skip
                with netCDF4.Dataset(ref) as ds:
                    want = np.array(ds["state"][...])
            with netCDF4.Dataset(path) as ds:
                got = np.array(ds["state"][...])
                np.testing.assert_array_equal(np.array(ds["lon"][...]), lon[xs])
                assert stat in ds["state"].getncattr("cell_methods") or stat == "spread"
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    record = (tiled_case / "tiles" / ".ensio-runs.jsonl").read_text().splitlines()
    listed = json.loads(record[-1])["products"]
    assert sorted(Path(p).name for p in listed) == sorted(
        f"{s}_{b.index:04d}.nc" for s in ("mean", "spread") for b in geo.boxes)


@pytest.mark.parametrize("layout", [(1, 1), (3, 2), (1, 3)])
@pytest.mark.parametrize("halo", [0, 1])
def test_masked_runs_map_each_point(rng, layout, halo) -> None:
    """The runs of a masked variable map every active interior point to its own state row
    and tile element, checked point by point against the mask (random masks)."""
    ny, nx, levels = 7, 9, 2
    geo = declared_geometry((ny, nx), layout[0] * layout[1], layout, halo)
    sea = rng.random((ny, nx)) < 0.6
    active = np.flatnonzero(np.broadcast_to(sea, (levels, ny, nx)))
    v = VariableLayout("s", ("z", "lat", "lon"), (levels, ny, nx), np.dtype("f8"), 5,
                       active.size, active)  # fmt: skip
    plan = plan_runs(geo, StateLayout((v,), 5 + active.size))
    seen = []
    for b, (runs,) in zip(geo.boxes, plan, strict=True):
        elems, rows = runs.window(0, 10**9)
        fy, fx = b.file_shape
        for e, r in zip(elems.tolist(), rows.tolist(), strict=True):
            k, rest = divmod(e, fy * fx)
            j, i = divmod(rest, fx)
            gy, gx = b.y0 - b.hy0 + j, b.x0 - b.hx0 + i
            assert b.y0 <= gy < b.y1 and b.x0 <= gx < b.x1  # interior only
            assert active[r - 5] == (k * ny + gy) * nx + gx
            seen.append(r)
    assert sorted(seen) == list(range(5, 5 + active.size))


@pytest.mark.parametrize("nemo", [False, True], ids=["declared", "nemo"])
def test_masked_tiles_equal_single_file(case, tmp_path, nemo) -> None:
    """A masked state variable on tiles: the same matrix as the masked single files, the
    same analysis in the interiors' sea points; land and halo bytes untouched; the
    products hold the fill value on land."""
    single, tiled_case = fresh(case, tmp_path / "s"), fresh(case, tmp_path / "t")
    for c in (single, tiled_case):
        for m in range(1, NE + 1):
            add_mask(c / f"mem{m:03d}.nc")
    geo = declared_geometry((NY, NX), 6, (3, 2), 1)
    tile_case(tiled_case, geo, NE, nemo=nemo)
    with netCDF4.Dataset(single / "mem001.nc") as ds:
        sea = np.array(ds["landmask"][...]) != 0
    assert 0 < sea.sum() < sea.size and not sea[3].any()
    masked = "ensemble.variables=[{name: state, mask: landmask}]"
    prior = read_ensemble(load_config(single / "ensio.yaml", [masked]), MPI.COMM_SELF).data
    sets = [f"ensemble.members={PATTERN}", masked]
    if not nemo:
        sets.append("ensemble.tiles={count: 6, layout: [3, 2], halo: 1}")
    tcfg = load_config(tiled_case / "ensio.yaml", sets)
    with TiledEnsembleIO(tcfg.ensemble, tcfg.base_dir, tcfg.io, MPI.COMM_SELF) as io:
        assert io.read().data.tobytes() == prior.tobytes()
    before = {(m, b.index): tile_values(tiled_case / PATTERN.format(member=m, tile=b.index))
              for m in range(1, NE + 1) for b in geo.boxes}  # fmt: skip
    assert ensio_main(["analyse", str(single / "ensio.yaml"), "--set", masked]) == 0
    argv = [a for kv in sets for a in ("--set", kv)]
    argv += ["--set", "output.mean=tm/mean_{tile}.nc", "--set", "output.spread=null"]
    assert ensio_main(["analyse", str(tiled_case / "ensio.yaml"), *argv]) == 0
    for m in range(1, NE + 1):
        with netCDF4.Dataset(single / f"mem{m:03d}.nc") as ds:
            ds.set_auto_maskandscale(False)
            whole = np.where(sea, np.array(ds["state"][...]), np.nan)  # land: no state row
        assert_tiles_hold(tiled_case, geo, m, whole, before)
    with netCDF4.Dataset(single / "an" / "mean.nc") as ds:
        ds.set_auto_maskandscale(False)
        mean, fill = np.array(ds["state"][...]), ds["state"].getncattr("_FillValue")
    for b in geo.boxes:
        ys, xs = box_with_halo(b)
        with netCDF4.Dataset(tiled_case / "tm" / f"mean_{b.index}.nc") as ds:
            ds.set_auto_maskandscale(False)
            got = np.array(ds["state"][...])
        np.testing.assert_allclose(got, mean[..., ys, xs], rtol=0, atol=1e-12)
        assert (got[..., ~sea[ys, xs]] == fill).all()


def test_index_on_tiles_equals_single_file(case, tmp_path, rng, capsys) -> None:
    """``ensio index`` on tiled members names the row and point the single files give."""
    case = fresh(case, tmp_path)
    tile_case(case, declared_geometry((NY, NX), 6, (3, 2), 1), NE, nemo=True)
    yaml = str(case / "ensio.yaml")
    levels = tile_values(case / PATTERN.format(member=1, tile=0)).ndim == 3
    for lon, lat in zip(rng.uniform(0, 360, 5), rng.uniform(-80, 80, 5), strict=True):
        where = ["--lon", f"{lon:.3f}", "--lat", f"{lat:.3f}"]
        where += ["--level-index", "1"] if levels else []
        assert ensio_main(["index", yaml, *where]) == 0
        single = capsys.readouterr().out
        assert ensio_main(["index", yaml, *where, "--set", f"ensemble.members={PATTERN}"]) == 0
        assert capsys.readouterr().out == single


def test_tiled_copies(case, tmp_path, capsys) -> None:
    """``io.in_place: false`` on tiles: copies hold the single-file analysis, the prior tiles
    are untouched, halos are the prior's, and a rerun is recognised by the run record."""
    single, tiled_case = fresh(case, tmp_path / "s"), fresh(case, tmp_path / "t")
    geo = declared_geometry((NY, NX), 6, (3, 2), 1)
    tile_case(tiled_case, geo, NE, nemo=True)
    assert ensio_main(["analyse", str(single / "ensio.yaml")]) == 0
    prior = _snapshot(tiled_case)
    sets = ["--set", f"ensemble.members={PATTERN}", "--set", "output.mean=null",
            "--set", "output.spread=null", "--set", "io.in_place=false",
            "--set", "output.members=an/a{member:03d}_{tile:04d}.nc"]  # fmt: skip
    yaml = str(tiled_case / "ensio.yaml")
    assert ensio_main(["analyse", yaml, *sets]) == 0
    assert _snapshot(tiled_case) == prior
    for m in range(1, NE + 1):
        with netCDF4.Dataset(single / f"mem{m:03d}.nc") as ds:
            whole = np.array(ds["state"][...])
        for b in geo.boxes:
            src = tile_values(tiled_case / PATTERN.format(member=m, tile=b.index))
            got = tile_values(tiled_case / "an" / f"a{m:03d}_{b.index:04d}.nc")
            iy, ix = b.interior()
            np.testing.assert_allclose(got[..., iy, ix], whole[..., b.y0 : b.y1, b.x0 : b.x1],
                                       rtol=0, atol=1e-12)  # fmt: skip
            halo = np.ones(b.file_shape, dtype=bool)
            halo[iy, ix] = False
            assert got[..., halo].tobytes() == src[..., halo].tobytes()
    capsys.readouterr()
    assert ensio_main(["analyse", yaml, *sets]) == 0
    assert "already analysed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ([f"ensemble.members={PATTERN}", "ensemble.tiles={count: 4, layout: [2, 2], halo: 1}"],
         "^output.mean: tiled members"),
        (["output.mean=an/mean_{tile}.nc"], "^output.mean: has {tile} but ensemble.members"),
        ([f"ensemble.members={PATTERN}", "ensemble.tiles={count: 4, layout: [2, 2], halo: 1}",
          "output.mean=null", "output.spread=null", "io.in_place=false",
          "output.members=an/a{member}.nc"],
         "^output.members: tiled members"),
        ([f"ensemble.members={PATTERN}", "ensemble.tiles={count: 4, layout: [2, 2], halo: 1}",
          "output.mean=null", "output.spread=null", "io.in_place=false",
          "output.members=an/a{member}_{tile}.nc", "io.mode=shuffle", "io.local_dir=tiles"],
         "^io.in_place: io.mode shuffle"),
    ],
    ids=["tiled-without-tile", "single-with-tile", "copies-without-tile", "shuffle-copies"],
)
def test_tiled_products_bad_names(case, tmp_path, sets, message) -> None:
    case = fresh(case, tmp_path)
    tile_case(case, declared_geometry((NY, NX), 4, (2, 2), 1), NE)
    snap = _snapshot(case)
    singles = {p.name: digest(p) for p in case.glob("mem*.nc")}
    cfg = load_config(case / "ensio.yaml", sets)
    with pytest.raises(ConfigError, match=message):
        run_analysis(cfg, MPI.COMM_SELF)
    assert _snapshot(case) == snap
    assert {p.name: digest(p) for p in case.glob("mem*.nc")} == singles


# ---------------------------------------------------------------------- bad input


def _snapshot(case: Path) -> dict[str, str]:
    return {p.name: digest(p) for p in sorted((case / "tiles").glob("*.nc"))}


def test_missing_tile(case, tmp_path) -> None:
    case = fresh(case, tmp_path)
    tile_case(case, declared_geometry((NY, NX), 4, (2, 2), 1), NE)
    gone = case / PATTERN.format(member=2, tile=3)
    gone.unlink()
    with pytest.raises(InputError, match=f"^{gone}: tile file not found$"):
        tiled(case, 4, (2, 2), 1)


def test_wrong_shape_tile(case, tmp_path) -> None:
    case = fresh(case, tmp_path)
    geo = declared_geometry((NY, NX), 4, (2, 2), 1)
    tile_case(case, geo, NE)
    bad = case / PATTERN.format(member=3, tile=2)
    wide = TileBox(2, geo.boxes[2].y0, geo.boxes[2].y1, 0, NX, *(geo.boxes[2].hy0, 0, 0, 0))
    cut(case / "mem003.nc", bad, wide)
    snap = _snapshot(case)
    with pytest.raises(InputError, match=f"^{bad}: state variable 'state' has shape"):
        tiled(case, 4, (2, 2), 1)
    assert _snapshot(case) == snap


def test_declared_layout_that_does_not_fit(case, tmp_path) -> None:
    case = fresh(case, tmp_path)
    tile_case(case, declared_geometry((NY, NX), 4, (2, 2), 1), NE)
    with pytest.raises(InputError, match="tile 0 .* shape|fit no 4x1 block"):
        tiled(case, 4, (4, 1), 1)


@pytest.mark.parametrize("fault", ["overlap", "gap"])
def test_nemo_overlap_or_gap(case, tmp_path, fault) -> None:
    case = fresh(case, tmp_path)
    geo = declared_geometry((NY, NX), 4, (2, 2), 0)
    tile_case(case, geo, NE, nemo=True)
    b = geo.boxes[1]
    # tile 1's attributes claim one column more (overlap) or less (gap) to the west
    shift = -1 if fault == "overlap" else 1
    moved = TileBox(1, b.y0, b.y1, b.x0 + shift, b.x1)
    path = case / PATTERN.format(member=1, tile=1)
    with netCDF4.Dataset(path, "a") as ds:
        ds.setncatts(nemo_attrs(moved, 4, (NY, NX)))
    snap = _snapshot(case)
    want = "overlaps that of" if fault == "overlap" else "uncovered"
    with pytest.raises(InputError, match=want):
        tiled(case, None)
    assert _snapshot(case) == snap


def test_tile_without_decomposition(case, tmp_path) -> None:
    case = fresh(case, tmp_path)
    tile_case(case, declared_geometry((NY, NX), 4, (2, 2), 0), NE)
    first = case / PATTERN.format(member=1, tile=0)
    with pytest.raises(InputError, match=f"^{first}: ensemble.members has {{tile}} but no "):
        tiled(case, None)


def test_config_keys(case) -> None:
    with pytest.raises(ConfigError, match=r"^ensemble.tiles: pattern .* has no \{tile\}"):
        load_config(case / "ensio.yaml", ["ensemble.tiles={count: 2, layout: [2, 1]}"])
    with pytest.raises(ConfigError, match=r"^ensemble.tiles.layout: \[2, 2\] is not"):
        load_config(case / "ensio.yaml", [f"ensemble.members={PATTERN}",
                                          "ensemble.tiles={count: 2, layout: [2, 2]}"])  # fmt: skip
    cfg = load_config(case / "ensio.yaml", [f"ensemble.members={PATTERN}"])
    with pytest.raises(ConfigError, match=r"^ensemble.members: .* names tiled members"):
        cfg.member_paths()
