"""``io.mode: shuffle`` under mpiexec: the same analysis as ``files`` mode, tiles in place.

The reference is the single-file case through ``files`` mode (N_io readers,
scatter, contiguous blocks); the shuffle reads the same members cut into
tiles from per-rank local directories, placed by the staging rule (file
f = m·P + p in the directory of rank f; with S > 1 ranks per tile, rank r
reads part r div N_e·P of file r mod N_e·P there).
"""

from __future__ import annotations

import shutil
import subprocess

import needs
import netCDF4
import numpy as np
import pytest
from tiles_support import PATTERN, add_mask, assert_tile_holds, tile_case, tile_values

from ensio.analysis.inputs import assimilate_block, observation_sources
from ensio.cli.synth import main as synth_main
from ensio.config.errors import ConfigError
from ensio.config.load import load_config
from ensio.errors import FileOpError, InputError
from ensio.io.modes.ensemble import read_ensemble
from ensio.io.modes.shuffle import ShuffleEnsembleIO
from ensio.io.tiles import tilefile
from ensio.io.txn.staging import partial_path as staged
from ensio.layout.tiles import declared_geometry
from ensio.offline import run_analysis

NX, NY = 11, 9
LAYOUTS = {1: (1, 1), 2: (2, 1), 4: (2, 2)}
#: (N_e, P, S) with N_e * P * S = N_mpi
SHAPES = [(2, 1, 1), (2, 2, 1), (4, 1, 1), (2, 1, 2), (2, 4, 1), (4, 2, 1), (2, 2, 2), (8, 1, 1)]


def shapes_for(size: int) -> list[tuple[int, int, int]]:
    return [s for s in SHAPES if s[0] * s[1] * s[2] == size]


MASKED = "ensemble.variables=[{name: state, mask: landmask}]"


def make_case(root, comm, n_e, p, s, *, levels=None, nemo=False, mask=False, chunked=False):
    """Synthetic case, its tiles, and file f = m·P + t in the local directory of rank f
    (what ``ensio stage in`` does); ranks f + q·N_e·P read it there too. With ``mask``
    the members get a land/sea mask (``landmask``, by ncap2) and the state uses it."""
    case = root / f"case{n_e}_{p}_{s}{'_masked' if mask else ''}{'_chunked' if chunked else ''}"
    px, py = LAYOUTS[p]
    geo = declared_geometry((NY, NX), p, (px, py), 1)
    if comm.rank == 0:
        argv = [str(case), "--nx", str(NX), "--ny", str(NY), "--members", str(n_e),
                "--seed", "5", "--format", "cdf5"]  # fmt: skip
        assert synth_main(argv + (["--levels", str(levels)] if levels else [])) == 0
        for m in range(1, n_e + 1) if mask else ():
            add_mask(case / f"mem{m:03d}.nc")
        tile_case(case, geo, n_e, nemo=nemo)
        for r in range(comm.size):
            local = case / "local" / f"r{r}"
            local.mkdir(parents=True, exist_ok=True)
            if r < n_e * p:
                src = case / PATTERN.format(member=r // p + 1, tile=r % p)
                shutil.copy(src, local / src.name)
                if chunked and r % 2 == 0:  # every other file deflated, as XIOS would write it
                    tmp = local / "tmp.nc"
                    subprocess.run(["nccopy", "-k", "nc4", "-d", "1", "-c", "lat/2,lon/3",
                                    str(local / src.name), str(tmp)], check=True)  # fmt: skip
                    tmp.replace(local / src.name)
    comm.Barrier()
    sets = [
        f"ensemble.members={PATTERN}",
        *([] if nemo else [f"ensemble.tiles={{count: {p}, layout: [{px}, {py}], halo: 1}}"]),
        "io.mode=shuffle",
        "io.local_dir=local/r{rank}",
        "output.mean=null",
        "output.spread=null",
        *([MASKED] if mask else []),
    ]
    return case, geo, sets


def reference(case, comm, extra=()):
    """The ``files``-mode analysis of the single-file members, whole (N_e, N_x)."""
    cfg = load_config(case / "ensio.yaml", ["output.mean=null", "output.spread=null", *extra])
    prior = read_ensemble(cfg, comm)
    obs = observation_sources(cfg.observations, cfg.resolve)
    ref = assimilate_block(prior, obs, cfg.analysis, comm, cycle=0, seconds={})
    return (np.concatenate(comm.allgather(prior.data), axis=1),
            np.concatenate(comm.allgather(ref.ensemble), axis=1), prior.layout)  # fmt: skip


def local_file(case, comm, n_e, p, s):
    """The tile this rank reads: file f = rank mod N_e·P, in the local directory of rank f."""
    f = comm.rank % (n_e * p)
    m, t = f // p, f % p
    return case / "local" / f"r{f}" / PATTERN.format(member=m + 1, tile=t).split("/")[-1], m, t


@pytest.mark.parametrize("levels,nemo,mask", [(None, False, False), (2, False, False),
                                              (None, True, False), (2, False, True)])
def test_shuffle_analysis_equals_files_mode(shared_dir, comm, levels, nemo, mask) -> None:
    """Every (N_e, P, S) that fits: the tiles written in place hold the files-mode
    analysis in their interiors (at the sea points of a masked variable), halos and land
    untouched; the read gives the prior exactly. The decomposition is declared, or read
    from NEMO's DOMAIN_* attributes."""
    for n_e, p, s in shapes_for(comm.size):
        case, geo, sets = make_case(shared_dir, comm, n_e, p, s, levels=levels, nemo=nemo,
                                    mask=mask)  # fmt: skip
        full_prior, full_ref, layout = reference(case, comm, [MASKED] if mask else [])
        v = layout.variables[0]
        assert (v.active is not None and v.active.size < v.n_elements) == mask
        path, m, t = local_file(case, comm, n_e, p, s)
        before = tile_values(path)
        comm.Barrier()
        cfg = load_config(case / "ensio.yaml", sets)
        with ShuffleEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, comm) as io:
            block = io.read()
            assert block.data.tobytes() == full_prior[:, block.rows].tobytes()
            assert io.traffic.partners == n_e - 1
        comm.Barrier()
        assert run_analysis(cfg, comm).result is not None
        comm.Barrier()
        want = np.full(v.n_elements, np.nan)
        want[slice(None) if v.active is None else v.active] = full_ref[m]
        assert_tile_holds(tile_values(path), before, want.reshape(v.shape), geo.boxes[t])


def test_chunked_tiles_in_shuffle_mode(shared_dir, comm) -> None:
    """Deflated tiles (nccopy) beside contiguous ones: the holder of each such file
    rewrites it through the library with the parts of all its S ranks; the interiors hold
    the files-mode analysis, halos their values, on every (N_e, P, S) that fits."""
    needs.tool("nccopy")
    for n_e, p, s in shapes_for(comm.size):
        case, geo, sets = make_case(shared_dir, comm, n_e, p, s, levels=2, chunked=True)
        _, full_ref, layout = reference(case, comm)
        path, m, t = local_file(case, comm, n_e, p, s)
        before = tile_values(path)
        comm.Barrier()
        cfg = load_config(case / "ensio.yaml", sets)
        with ShuffleEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, comm) as io:
            assert io.library == ((comm.rank % (n_e * p)) % 2 == 0)  # the deflated files
        assert run_analysis(cfg, comm).result is not None
        comm.Barrier()
        want = full_ref[m].reshape(layout.variables[0].shape)
        assert_tile_holds(tile_values(path), before, want, geo.boxes[t])


def test_shuffle_products_equal_files_mode(shared_dir, comm) -> None:
    """Mean and spread tiles of a shuffle run (masked, 2 levels): each holds the statistic
    of the files-mode analysis on its box, halo included, fill value on land; a rerun is
    "already analysed" and rolls forward a product tile a kill left at its staged name."""
    for n_e, p, s in shapes_for(comm.size):
        case, geo, sets = make_case(shared_dir, comm, n_e, p, s, levels=2, mask=True)
        _, full_ref, layout = reference(case, comm, [MASKED])
        v = layout.variables[0]
        comm.Barrier()
        products = ["output.mean=pr/mean_{tile}.nc", "output.spread=pr/spread_{tile}.nc"]
        cfg = load_config(case / "ensio.yaml", [*sets[:-3], MASKED, *products])
        assert run_analysis(cfg, comm).result is not None
        comm.Barrier()
        stats = {"mean": full_ref.mean(axis=0), "spread": full_ref.std(axis=0, ddof=1)}
        for name, values in stats.items():
            field = np.full(v.n_elements, np.nan)
            field[v.active] = values
            field = field.reshape(v.shape)
            for b in geo.boxes:
                ys, xs = slice(b.y0 - b.hy0, b.y1 + b.hy1), slice(b.x0 - b.hx0, b.x1 + b.hx1)
                with netCDF4.Dataset(case / "pr" / f"{name}_{b.index}.nc") as ds:
                    got = np.ma.filled(ds["state"][...], np.nan)
                want = field[..., ys, xs]
                assert np.array_equal(np.isnan(got), np.isnan(want))
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        comm.Barrier()
        moved = case / "pr" / "mean_0.nc"
        if comm.rank == 0:  # as if killed between the decision and the renames
            moved.rename(staged(moved))
        comm.Barrier()
        assert run_analysis(cfg, comm).already is not None
        comm.Barrier()
        assert moved.is_file() and not staged(moved).exists()


def test_local_dir_missing_on_one_rank(shared_dir, comm) -> None:
    n_e, p, s = shapes_for(comm.size)[0]
    case, _, sets = make_case(shared_dir, comm, n_e, p, s)
    gone = case / "local" / f"r{comm.size - 1}"
    if comm.rank == 0:
        shutil.rmtree(gone)
    comm.Barrier()
    cfg = load_config(case / "ensio.yaml", sets)
    with pytest.raises(InputError, match=f"^{gone}: io.local_dir of rank {comm.size - 1} on host"):
        run_analysis(cfg, comm)


def test_missing_tile_on_one_rank_modifies_nothing(shared_dir, comm) -> None:
    n_e, p, s = shapes_for(comm.size)[0]  # S = 1: every rank its own file
    case, _, sets = make_case(shared_dir, comm, n_e, p, s)
    path, _, _ = local_file(case, comm, n_e, p, s)
    before = path.read_bytes()
    comm.Barrier()
    if comm.rank == comm.size - 1:
        path.unlink()
    gone = comm.bcast(str(path), root=comm.size - 1)
    cfg = load_config(case / "ensio.yaml", sets)
    with pytest.raises(InputError, match=f"^{gone}: tile file not found$"):
        run_analysis(cfg, comm)
    if comm.rank != comm.size - 1:
        assert path.read_bytes() == before


def test_failed_write_on_one_rank_rolls_back_every_rank(shared_dir, comm, monkeypatch) -> None:
    n_e, p, s = shapes_for(comm.size)[-1]
    case, _, sets = make_case(shared_dir, comm, n_e, p, s)
    path, _, _ = local_file(case, comm, n_e, p, s)
    before = path.read_bytes()
    comm.Barrier()
    if comm.rank == comm.size - 1:
        real, calls = tilefile.raw_write, []

        def failing(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise OSError("disk full (test)")
            real(*args, **kwargs)

        monkeypatch.setattr(tilefile, "raw_write", failing)
    cfg = load_config(case / "ensio.yaml", sets)
    with pytest.raises(FileOpError, match="^cannot write: disk full"):
        run_analysis(cfg, comm)
    assert path.read_bytes() == before


def test_rank_count_not_a_multiple(shared_dir, comm) -> None:
    case, _, sets = make_case(shared_dir, comm, 2, 1, 1) if comm.size == 2 else (None, 0, 0)
    if comm.size != 2:
        case, _, sets = make_case(shared_dir, comm, *shapes_for(comm.size)[0])
    cfg = load_config(case / "ensio.yaml", [*sets, f"ensemble.size={comm.size + 1}"])
    with pytest.raises(ConfigError, match=r"^io.mode: shuffle needs N_mpi = N_e x P x S"):
        ShuffleEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, comm)


def test_ranks_of_one_tile_on_another_host(shared_dir, comm, monkeypatch) -> None:
    """With S > 1, rank r reads the file held by rank r mod N_e·P: both on one host."""
    if comm.size % 4:  # runs at -n 4 in CI (make test-mpi runs -n 2 and -n 4)
        pytest.skip("needs N_mpi = 2 members x 1 tile x S with S >= 2")
    case, _, sets = make_case(shared_dir, comm, 2, 1, comm.size // 2)
    monkeypatch.setenv("ENSIO_HOST", f"node{comm.rank}")
    cfg = load_config(case / "ensio.yaml", sets)
    with pytest.raises(ConfigError, match=r"^io.local_dir: rank 2 reads part 1 of the tile held "
                                          r"by rank 0 on host node0, but runs on host node2"):
        ShuffleEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, comm)


def test_shuffle_then_background_backup(shared_dir, comm) -> None:
    """With io.backup_dir the analysed local tiles are copied, complete, after the run."""
    from ensio.io.node.backupworker import data_dir

    n_e, p, s = shapes_for(comm.size)[0]
    case, _, sets = make_case(shared_dir, comm, n_e, p, s)
    cfg = load_config(case / "ensio.yaml", [*sets, "io.backup_dir=backup/c{cycle}"])
    report = run_analysis(cfg, comm, cycle=3)
    assert report.backup is not None
    marker = report.backup.wait(timeout=120)
    assert marker.parent == case / "backup" / "c3"
    path, _, _ = local_file(case, comm, n_e, p, s)
    copy = data_dir(case / "backup" / "c3", report.backup.token) / path.name
    assert copy.read_bytes() == path.read_bytes()
