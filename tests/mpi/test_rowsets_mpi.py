"""The analysis on row sets that are not contiguous blocks equals the block analysis.

The reference is the usual contiguous block distribution (itself checked
against independent formulas elsewhere); here every rank owns a scattered
set of rows drawn at random (seeded), as the group shuffle gives it.
"""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest
from missing_cases import poke_missing
from rowsets_support import random_row_sets

from ensio.analysis.inputs import assimilate_block, observation_sources
from ensio.cli.synth import main as synth_main
from ensio.config.load import load_config
from ensio.io.modes.ensemble import read_ensemble
from ensio.layout.rowsetblock import RowSetBlock


def _bilinear_obs(case) -> None:
    """obs.nc moved off the grid points and without ``index``: H interpolates 4 rows."""
    with netCDF4.Dataset(case / "obs.nc") as src, \
            netCDF4.Dataset(case / "obs_bilinear.nc", "w") as dst:
        dst.createDimension("obs", len(src.dimensions["obs"]))
        for name in ("lon", "lat", "value", "error"):
            v = np.asarray(src[name][:], dtype=float)
            if name in ("lon", "lat"):
                v = v + (7.0 if name == "lon" else -5.0)
                v = np.clip(v, -80.0, 80.0) if name == "lat" else v
            dst.createVariable(name, "f8", ("obs",))[:] = v


@pytest.mark.parametrize(
    "sets",
    [[], ["analysis.filter=lenkf"], ["analysis.filter=etkf", "analysis.localization=null"],
     ["observations=[{file: obs_bilinear.nc}]"], ["missing"],
     ["analysis.observations={distribution: regional}"]],
)
@pytest.mark.parametrize("levels", [None, 2])
def test_row_sets_match_blocks(shared_dir, comm, sets, levels) -> None:
    case = shared_dir / "case"
    if comm.rank == 0:
        argv = [str(case), "--nx", "13", "--ny", "7", "--members", "5", "--seed", "4"]
        assert synth_main(argv + (["--levels", str(levels)] if levels else [])) == 0
        _bilinear_obs(case)
        if sets == ["missing"]:
            poke_missing(case)
    comm.Barrier()
    missing = sets == ["missing"]
    sets = [] if missing else sets
    if levels and "bilinear" in " ".join(sets):  # one level of the 3-D state is observed
        sets = ["observations=[{file: obs_bilinear.nc, level_index: 1}]"]
    cfg = load_config(case / "ensio.yaml", sets)
    obs = observation_sources(cfg.observations, cfg.resolve)
    prior = read_ensemble(cfg, comm)
    ref = assimilate_block(prior, obs, cfg.analysis, comm, cycle=2, seconds={})
    full_prior = np.concatenate(comm.allgather(prior.data), axis=1)
    full_ref = np.concatenate(comm.allgather(ref.ensemble), axis=1)
    plan = random_row_sets(prior.layout.n_rows, comm, seed=11)
    block = RowSetBlock.of(prior.layout, plan, np.ascontiguousarray(full_prior[:, plan.rows]))
    got = assimilate_block(block, obs, cfg.analysis, comm, cycle=2, seconds={})
    np.testing.assert_allclose(got.ensemble, full_ref[:, plan.rows], rtol=0, atol=1e-12)
    assert np.isnan(got.ensemble).sum() == np.isnan(full_prior[:, plan.rows]).sum()
    assert np.isnan(full_prior).any() == missing
    assert got.qc == ref.qc and got.qc.accepted > 0
    assert got.posterior.rms == pytest.approx(ref.posterior.rms, rel=1e-12)
