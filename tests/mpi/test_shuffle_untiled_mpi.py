"""``io.mode: shuffle`` on untiled members: one tile each, P = 1 (issue 25, item 8).

The README's staging rule already counts untiled members as P = 1 (file
f = m in the local directory of rank m); the shuffle refused them. Each
(N_e, S) with N_e · S = N_mpi is checked against the ``files``-mode analysis
of the same members (in process, not through the shuffle), and a rerun is
"already analysed".
"""

from __future__ import annotations

import shutil

import netCDF4
import numpy as np
import pytest
from test_shuffle_mpi import NX, NY, reference

from ensio.cli.synth import main as synth_main
from ensio.config.load import load_config
from ensio.offline import run_analysis


def _shapes(size: int) -> list[tuple[int, int]]:
    return [(size // s, s) for s in (1, 2, 4) if size % s == 0 and size // s >= 2]


def test_untiled_members_equal_files_mode(shared_dir, comm) -> None:
    for n_e, s in _shapes(comm.size):
        case = shared_dir / f"untiled{n_e}_{s}"
        if comm.rank == 0:
            assert synth_main([str(case), "--nx", str(NX), "--ny", str(NY), "--members",
                               str(n_e), "--seed", "7", "--format", "cdf5"]) == 0  # fmt: skip
            for r in range(comm.size):
                (case / "local" / f"r{r}").mkdir(parents=True)
            for m in range(n_e):  # what ensio stage in does: file f = m to rank m
                shutil.copy(case / f"mem{m + 1:03d}.nc", case / "local" / f"r{m}")
        comm.Barrier()
        _, full_ref, layout = reference(case, comm)
        cfg = load_config(case / "ensio.yaml", ["io.mode=shuffle", "io.local_dir=local/r{rank}",
                                                "output.mean=null", "output.spread=null"])
        assert run_analysis(cfg, comm).result is not None
        comm.Barrier()
        shape = layout.variables[0].shape
        for m in range(n_e):
            with netCDF4.Dataset(case / "local" / f"r{m}" / f"mem{m + 1:03d}.nc") as ds:
                got = np.asarray(ds["state"][...])
            np.testing.assert_allclose(got, full_ref[m].reshape(shape), rtol=0, atol=1e-12)
        assert run_analysis(cfg, comm).already is not None
        comm.Barrier()


def test_untiled_copies_are_refused(shared_dir, comm) -> None:
    from ensio.config.errors import ConfigError
    from ensio.io.modes.shuffle import ShuffleEnsembleIO

    case = shared_dir / "copies"
    if comm.rank == 0:
        assert synth_main([str(case), "--nx", str(NX), "--ny", str(NY), "--members",
                           str(comm.size), "--seed", "7"]) == 0  # fmt: skip
    comm.Barrier()
    cfg = load_config(case / "ensio.yaml", ["io.mode=shuffle", "io.local_dir=local/r{rank}",
                                            "io.in_place=false", "output.members=an/m{member}.nc"])
    with pytest.raises(ConfigError, match="^io.in_place: io.mode shuffle writes the tiles in "
                                          "place only$"):
        ShuffleEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, comm)
