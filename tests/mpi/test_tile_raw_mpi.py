"""Raw tile reads under mpiexec: each rank's rows equal the library read; bad tiles fail
on every rank with one message naming the file."""

from __future__ import annotations

import pytest
from tiles_support import PATTERN, tile_case

from ensio.cli.synth import main as synth_main
from ensio.config.load import load_config
from ensio.errors import InputError
from ensio.io.modes.tiledio import TiledEnsembleIO
from ensio.io.tiles.tiled import TiledEnsemble
from ensio.layout.tiles import declared_geometry

NX, NY, NE = 11, 9, 4
SETS = [f"ensemble.members={PATTERN}", "ensemble.tiles={count: 6, layout: [3, 2], halo: 1}"]


def _case(shared_dir, comm, fmt):
    case = shared_dir / "case"
    if comm.rank == 0:
        argv = [str(case), "--nx", str(NX), "--ny", str(NY), "--members", str(NE), "--seed", "4",
                "--format", fmt, "--levels", "2"]  # fmt: skip
        assert synth_main(argv) == 0
        tile_case(case, declared_geometry((NY, NX), 6, (3, 2), 1), NE)
    comm.Barrier()
    return load_config(case / "ensio.yaml", SETS)


@pytest.mark.parametrize("fmt", ["netcdf4", "cdf5"])
def test_raw_rows_equal_library_rows(shared_dir, comm, fmt) -> None:
    cfg = _case(shared_dir, comm, fmt)
    with TiledEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, comm) as io:
        mine = len(range(comm.rank, NE * 6, comm.size))  # the tiles this rank checked
        assert io.scan.checked == mine and io.scan.quick == mine
        block = io.read()
        lo, hi = block.start, block.start + block.count
        want = TiledEnsemble(cfg.ensemble, cfg.base_dir).read(lo, hi)
        assert block.data.tobytes() == want.tobytes()


def test_truncated_tile_fails_on_every_rank(shared_dir, comm) -> None:
    cfg = _case(shared_dir, comm, "cdf5")
    io = TiledEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, comm)
    path = cfg.base_dir / PATTERN.format(member=2, tile=4)  # rows of the last rank
    if comm.rank == 0:
        with open(path, "r+b") as fh:
            fh.truncate(path.stat().st_size // 2)
    comm.Barrier()
    with pytest.raises(InputError) as err:
        io.read()
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_corrupt_tile_fails_on_every_rank(shared_dir, comm) -> None:
    cfg = _case(shared_dir, comm, "netcdf4")
    path = cfg.base_dir / PATTERN.format(member=3, tile=1)
    if comm.rank == 0:
        with open(path, "r+b") as fh:
            fh.write(b"\0garbage" * 8)
    comm.Barrier()
    with pytest.raises(InputError) as err:
        TiledEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, comm)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
