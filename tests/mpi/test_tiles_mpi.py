"""Tiled members under mpiexec: the collective read/write is rank-count independent."""

from __future__ import annotations

import subprocess

import needs
import netCDF4
import numpy as np
import pytest
from tiles_support import (
    PATTERN,
    add_mask,
    assert_tiles_hold,
    box_with_halo,
    tile_case,
    tile_values,
)

from ensio.analysis.inputs import assimilate_block, observation_sources
from ensio.cli.synth import main as synth_main
from ensio.config.load import load_config
from ensio.errors import InputError
from ensio.io.modes.ensemble import read_ensemble
from ensio.io.modes.tiledio import TiledEnsembleIO
from ensio.layout.block import EnsembleBlock
from ensio.layout.tiles import declared_geometry
from ensio.offline import run_analysis

NX, NY, NE = 11, 9, 4
SETS = [f"ensemble.members={PATTERN}", "ensemble.tiles={count: 6, layout: [3, 2], halo: 1}"]


def _case(shared_dir, comm, levels=None):
    case = shared_dir / "case"
    if comm.rank == 0:
        argv = [str(case), "--nx", str(NX), "--ny", str(NY), "--members", str(NE), "--seed", "3",
                "--format", "cdf5"]  # fmt: skip
        if levels:
            argv += ["--levels", str(levels)]
        assert synth_main(argv) == 0
        tile_case(case, declared_geometry((NY, NX), 6, (3, 2), 1), NE)
    comm.Barrier()
    return case


@pytest.mark.parametrize("levels", [None, 3])
def test_tiled_analysis_matches_single_file(shared_dir, comm, levels) -> None:
    """Each rank's rows read from tiles equal the files read; the analysis written in
    place lands in the interiors only and equals the single-file analysis."""
    case = _case(shared_dir, comm, levels)
    cfg = load_config(case / "ensio.yaml")
    obs = observation_sources(cfg.observations, cfg.resolve)
    prior = read_ensemble(cfg, comm)
    ref = assimilate_block(prior, obs, cfg.analysis, comm, cycle=0, seconds={})
    full = np.concatenate(comm.allgather(ref.ensemble), axis=1)
    geo = declared_geometry((NY, NX), 6, (3, 2), 1)
    before = {(m, b.index): tile_values(case / PATTERN.format(member=m, tile=b.index))
              for m in range(1, NE + 1) for b in geo.boxes}  # fmt: skip
    comm.Barrier()
    tcfg = load_config(case / "ensio.yaml", SETS)
    with TiledEnsembleIO(tcfg.ensemble, tcfg.base_dir, tcfg.io, comm) as io:
        block = io.read()
        assert (block.start, block.count) == (prior.start, prior.count)
        assert block.data.tobytes() == prior.data.tobytes()
        got = assimilate_block(block, obs, tcfg.analysis, comm, cycle=0, seconds={})
        io.write(EnsembleBlock(block.layout, block.start, block.count, got.ensemble))
    comm.Barrier()
    shape = prior.layout.variables[0].shape
    for m in range(1, NE + 1):
        want = full[m - 1].reshape(shape)
        assert_tiles_hold(case, geo, m, want, before)


def test_missing_tile_fails_on_every_rank(shared_dir, comm) -> None:
    case = _case(shared_dir, comm)
    gone = case / PATTERN.format(member=NE, tile=5)
    if comm.rank == 0:
        gone.unlink()
    comm.Barrier()
    tcfg = load_config(case / "ensio.yaml", SETS)
    with pytest.raises(InputError, match=f"^{gone}: tile file not found$"):
        TiledEnsembleIO(tcfg.ensemble, tcfg.base_dir, tcfg.io, comm)


def test_tiled_products_and_copies_any_rank_count(shared_dir, comm) -> None:
    """``ensio analyse`` on tiles with products and copies (``io.in_place: false``): each
    product tile is the ensemble mean / spread of the single-file analysis on the tile's
    box, halo included, each copy's interior that analysis, on any rank count."""
    case = _case(shared_dir, comm, 2)
    cfg = load_config(case / "ensio.yaml")
    obs = observation_sources(cfg.observations, cfg.resolve)
    prior = read_ensemble(cfg, comm)
    ref = assimilate_block(prior, obs, cfg.analysis, comm, cycle=0, seconds={})
    full = np.concatenate(comm.allgather(ref.ensemble), axis=1)
    shape = prior.layout.variables[0].shape
    comm.Barrier()
    tcfg = load_config(case / "ensio.yaml", [*SETS, "output.mean=tm/mean_{tile:02d}.nc",
                                             "output.spread=tm/spread_{tile:02d}.nc",
                                             "io.in_place=false",
                                             "output.members=tm/a{member}_{tile}.nc"])
    run_analysis(tcfg, comm)
    comm.Barrier()
    geo = declared_geometry((NY, NX), 6, (3, 2), 1)
    for m in range(1, NE + 1):
        want = full[m - 1].reshape(shape)
        for b in geo.boxes:
            got = tile_values(case / "tm" / f"a{m}_{b.index}.nc")
            iy, ix = b.interior()
            np.testing.assert_allclose(got[..., iy, ix], want[..., b.y0 : b.y1, b.x0 : b.x1],
                                       rtol=0, atol=1e-12)  # fmt: skip
    stats = {"mean": full.mean(axis=0).reshape(shape),
             "spread": full.std(axis=0, ddof=1).reshape(shape)}
    for b in geo.boxes:
        ys, xs = box_with_halo(b)
        for name, field in stats.items():
            with netCDF4.Dataset(case / "tm" / f"{name}_{b.index:02d}.nc") as ds:
                got = np.array(ds["state"][...])
            np.testing.assert_allclose(got, field[..., ys, xs], rtol=0, atol=1e-12)


def test_masked_tiles_any_rank_count(shared_dir, comm) -> None:
    """A masked state variable on tiles: each rank's rows equal the masked single files'
    rows, and the analysis lands in the sea points of the interiors only."""
    case = shared_dir / "masked"
    masked = "ensemble.variables=[{name: state, mask: landmask}]"
    geo = declared_geometry((NY, NX), 6, (3, 2), 1)
    if comm.rank == 0:
        assert synth_main([str(case), "--nx", str(NX), "--ny", str(NY), "--members", str(NE),
                           "--seed", "4", "--format", "cdf5", "--levels", "2"]) == 0
        for m in range(1, NE + 1):
            add_mask(case / f"mem{m:03d}.nc")
        tile_case(case, geo, NE)
    comm.Barrier()
    cfg = load_config(case / "ensio.yaml", [masked])
    obs = observation_sources(cfg.observations, cfg.resolve)
    prior = read_ensemble(cfg, comm)
    ref = assimilate_block(prior, obs, cfg.analysis, comm, cycle=0, seconds={})
    full = np.concatenate(comm.allgather(ref.ensemble), axis=1)
    v = prior.layout.variables[0]
    before = {(m, b.index): tile_values(case / PATTERN.format(member=m, tile=b.index))
              for m in range(1, NE + 1) for b in geo.boxes}  # fmt: skip
    comm.Barrier()
    tcfg = load_config(case / "ensio.yaml", [*SETS, masked, "output.mean=null",
                                             "output.spread=null"])
    with TiledEnsembleIO(tcfg.ensemble, tcfg.base_dir, tcfg.io, comm) as io:
        block = io.read()
        assert block.data.tobytes() == prior.data.tobytes()
    comm.Barrier()
    run_analysis(tcfg, comm)
    comm.Barrier()
    for m in range(1, NE + 1):
        want = np.full(v.n_elements, np.nan)
        want[v.active] = full[m - 1]
        want = want.reshape(v.shape)
        assert_tiles_hold(case, geo, m, want, before)


def test_chunked_tiles_any_rank_count(shared_dir, comm) -> None:
    """Tiles rewritten compressed by nccopy: every rank's rows reach each tile's owner, and
    the tiles hold the single-file analysis whatever the number of ranks."""
    needs.tool("nccopy")
    case = shared_dir / "chunked"
    geo = declared_geometry((NY, NX), 6, (3, 2), 1)
    if comm.rank == 0:
        assert synth_main([str(case), "--nx", str(NX), "--ny", str(NY), "--members", str(NE),
                           "--seed", "6", "--format", "netcdf4", "--levels", "2"]) == 0
        tile_case(case, geo, NE)
        for m in range(1, NE + 1):
            for t in (0, 2, 5):
                path = case / PATTERN.format(member=m, tile=t)
                tmp = path.with_suffix(".tmp.nc")
                subprocess.run(["nccopy", "-k", "nc4", "-d", "1", "-c", "lat/2,lon/3", str(path),
                                str(tmp)], check=True, capture_output=True)  # fmt: skip
                tmp.replace(path)
    comm.Barrier()
    cfg = load_config(case / "ensio.yaml")
    obs = observation_sources(cfg.observations, cfg.resolve)
    prior = read_ensemble(cfg, comm)
    ref = assimilate_block(prior, obs, cfg.analysis, comm, cycle=0, seconds={})
    full = np.concatenate(comm.allgather(ref.ensemble), axis=1)
    before = {(m, b.index): tile_values(case / PATTERN.format(member=m, tile=b.index))
              for m in range(1, NE + 1) for b in geo.boxes}  # fmt: skip
    comm.Barrier()
    run_analysis(load_config(case / "ensio.yaml", [*SETS, "output.mean=null",
                                                   "output.spread=null"]), comm)
    comm.Barrier()
    shape = prior.layout.variables[0].shape
    for m in range(1, NE + 1):
        assert_tiles_hold(case, geo, m, full[m - 1].reshape(shape), before)
