"""The analysis on row sets that are not contiguous blocks equals the block analysis.

The reference is the usual contiguous block distribution (itself checked
against independent formulas elsewhere); here every rank owns a scattered
set of rows drawn at random (seeded), as the group shuffle gives it.
"""

from __future__ import annotations

import numpy as np
import pytest

from ensio.analysis.inputs import assimilate_block, observation_sources
from ensio.cli.synth import main as synth_main
from ensio.config.load import load_config
from ensio.io.ensemble import read_ensemble
from ensio.layout.rowsetblock import RowSetBlock
from ensio.parallel.rowsets import RowSets


def _random_sets(n_rows: int, comm, seed: int) -> RowSets:
    """Pieces of random lengths (1..7 rows) dealt to random ranks; the same on every rank."""
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < n_rows:
        lengths.append(int(min(rng.integers(1, 8), n_rows - sum(lengths))))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    owners = rng.integers(0, comm.size, len(lengths))
    owners[: comm.size] = np.arange(comm.size)  # no rank is left empty
    return RowSets.from_pieces(n_rows, comm.size, comm.rank, starts, np.array(lengths), owners)


@pytest.mark.parametrize(
    "sets", [[], ["analysis.filter=lenkf"], ["analysis.filter=etkf", "analysis.localization=null"]]
)
@pytest.mark.parametrize("levels", [None, 2])
def test_row_sets_match_blocks(shared_dir, comm, sets, levels) -> None:
    case = shared_dir / "case"
    if comm.rank == 0:
        argv = [str(case), "--nx", "13", "--ny", "7", "--members", "5", "--seed", "4"]
        assert synth_main(argv + (["--levels", str(levels)] if levels else [])) == 0
    comm.Barrier()
    cfg = load_config(case / "ensio.yaml", sets)
    obs = observation_sources(cfg.observations, cfg.resolve)
    prior = read_ensemble(cfg, comm)
    ref = assimilate_block(prior, obs, cfg.analysis, comm, cycle=2, seconds={})
    full_prior = np.concatenate(comm.allgather(prior.data), axis=1)
    full_ref = np.concatenate(comm.allgather(ref.ensemble), axis=1)
    plan = _random_sets(prior.layout.n_rows, comm, seed=11)
    block = RowSetBlock.of(prior.layout, plan, np.ascontiguousarray(full_prior[:, plan.rows]))
    got = assimilate_block(block, obs, cfg.analysis, comm, cycle=2, seconds={})
    np.testing.assert_allclose(got.ensemble, full_ref[:, plan.rows], rtol=0, atol=1e-12)
    assert got.qc == ref.qc
    assert got.posterior.rms == pytest.approx(ref.posterior.rms, rel=1e-12)
