"""Rows regrouped by location for the analysis (``ensio.analysis.regroup``).

The block distribution gives each rank one stretch of the variable-major
state vector; with several variables the analysis moves the rows so that each
rank holds the same locations of every variable, and moves the result back.
Checked here: the move against the gathered matrix, the plan's shape, and the
whole analysis of a two-variable state against one rank's analysis of it.
"""

from __future__ import annotations

import numpy as np
import pytest

from ensio.analysis.inputs import assimilate_block, observation_sources
from ensio.analysis.regroup import location_plan, move_columns
from ensio.cli.synth import main as synth_main
from ensio.config.load import load_config
from ensio.io.modes.ensemble import read_ensemble
from ensio.layout.block import EnsembleBlock
from ensio.layout.state import StateLayout, VariableLayout
from ensio.parallel.distribution import RowDistribution


def _layout(sizes: list[int]) -> StateLayout:
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    variables = tuple(VariableLayout(name=f"v{i}", dims=("x",), shape=(int(n),),
                                     dtype=np.dtype("f8"), offset=int(o), size=int(n))
                      for i, (o, n) in enumerate(zip(offsets, sizes, strict=True)))
    return StateLayout(variables=variables, n_rows=int(sum(sizes)))


@pytest.mark.parametrize("sizes", [[5, 5], [7, 3, 11], [1, 1, 1, 1, 1, 9]])
def test_move_columns_there_and_back(comm, sizes) -> None:
    layout = _layout(sizes)
    plan = location_plan(layout, comm)
    if comm.size == 1:
        assert plan is None
        return
    assert plan is not None
    rng = np.random.default_rng([len(sizes), 17])
    full = rng.standard_normal((4, layout.n_rows))  # the same on every rank (same seed)
    dist = RowDistribution.of(layout.n_rows, comm)
    mine = np.arange(dist.start, dist.stop)
    there = move_columns(full[:, mine], mine, plan.rows, dist.owner, plan.owner, comm)
    np.testing.assert_array_equal(there, full[:, plan.rows])
    back = move_columns(there, plan.rows, mine, plan.owner, dist.owner, comm)
    np.testing.assert_array_equal(back, full[:, mine])
    # each rank holds the same stretch [a_r, b_r) of every variable's block distribution
    for v in layout.variables:
        rows = plan.rows[(plan.rows >= v.offset) & (plan.rows < v.offset + v.size)] - v.offset
        part = RowDistribution.of(v.size, comm)
        np.testing.assert_array_equal(rows, np.arange(part.start, part.stop))


def test_one_variable_keeps_the_block_distribution(comm) -> None:
    assert location_plan(_layout([12]), comm) is None


@pytest.mark.parametrize("levels", [None, 2])
def test_two_variable_analysis_matches_one_rank(shared_dir, comm, levels) -> None:
    """The regrouped analysis of every rank's rows equals the whole analysis on one rank."""
    case = shared_dir / "case2v"
    if comm.rank == 0:
        argv = [str(case), "--nx", "13", "--ny", "7", "--members", "6", "--seed", "5",
                "--perturbation", "1.0"]
        assert synth_main(argv + (["--levels", str(levels)] if levels else [])) == 0
    comm.Barrier()
    cfg = load_config(case / "ensio.yaml", ["ensemble.variables=[state, aux]"])
    obs = observation_sources(cfg.observations, cfg.resolve)
    prior = read_ensemble(cfg, comm)
    assert len(prior.layout.variables) == 2
    got = assimilate_block(prior, obs, cfg.analysis, comm, cycle=3, seconds={})
    assert got.ensemble.shape == prior.data.shape
    full_prior = np.concatenate(comm.allgather(np.asarray(prior.data)), axis=1)
    full_got = np.concatenate(comm.allgather(got.ensemble), axis=1)
    n_obs = np.concatenate(comm.allgather(got.n_obs))
    if comm.rank == 0:
        from mpi4py import MPI

        whole = EnsembleBlock(prior.layout, 0, prior.layout.n_rows, full_prior)
        ref = assimilate_block(whole, obs, cfg.analysis, MPI.COMM_SELF, cycle=3, seconds={})
        np.testing.assert_allclose(full_got, ref.ensemble, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(n_obs, ref.n_obs)
        assert got.qc == ref.qc and ref.qc.accepted > 0
        assert not np.allclose(full_got, full_prior)  # the analysis did something
