"""Weight interpolation under mpiexec: the same analysis on any number of ranks and row sets.

A rank computes the coarse nodes its rows need even where they lie outside
its rows, with the observations within the widened selection radius
(:func:`ensio.analysis.winterp.selection_radius`). The reference is the
same analysis on one process (the whole state on ``MPI.COMM_SELF``); the
interpolation itself is checked against an independent one in
``tests/test_winterp.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from missing_cases import poke_missing
from mpi4py import MPI
from rowsets_support import random_row_sets

from ensio.analysis import winterp_bands as wb
from ensio.analysis.inputs import assimilate_block, observation_sources
from ensio.cli.synth import main as synth_main
from ensio.config.load import load_config
from ensio.io.modes.ensemble import read_ensemble
from ensio.layout.rowsetblock import RowSetBlock


@pytest.mark.parametrize(
    "sets",
    [["analysis.filter=letkf"], ["analysis.filter=lestkf"], ["analysis.filter=lenkf"],
     ["analysis.observations={distribution: regional}"], ["missing"]],
)
@pytest.mark.parametrize("stride", [2, 3])
@pytest.mark.parametrize("levels", [None, 2])
def test_winterp_does_not_depend_on_ranks(shared_dir, comm, sets, stride, levels) -> None:
    check_ranks(shared_dir, comm, sets, stride, levels, members=6)


@pytest.mark.parametrize("filt", ["letkf", "lestkf"])
def test_winterp_vectors_route_does_not_depend_on_ranks(shared_dir, comm, filt, monkeypatch):
    """30 members at stride 2: the nodes' transforms reach the rows as vectors.

    A rank's rows are a subset of a node's rows there; a node whose rows on a
    rank all have weight 0 once crashed the rank (design note 110).
    """
    taken = []
    begin = wb._Vectors.begin
    monkeypatch.setattr(wb._Vectors, "begin", lambda self, *a: taken.append(1) or begin(self, *a))
    check_ranks(shared_dir, comm, [f"analysis.filter={filt}"], 2, None, members=30)
    assert taken  # the vectors route was taken on this rank


def check_ranks(shared_dir, comm, sets, stride, levels, members) -> None:
    """The analysis on ``comm`` (contiguous and random row sets) against one process."""
    case = shared_dir / "case"
    if comm.rank == 0:
        argv = [str(case), "--nx", "24", "--ny", "13", "--members", str(members), "--seed", "4"]
        assert synth_main(argv + (["--levels", str(levels)] if levels else [])) == 0
        if sets == ["missing"]:
            poke_missing(case)
    comm.Barrier()
    missing = sets == ["missing"]
    over = ([] if missing else sets) + [f"analysis.weight_interpolation={{stride: {stride}}}",
                                        "analysis.localization.radius_km=4000"]  # fmt: skip
    cfg = load_config(case / "ensio.yaml", over)
    exact_cfg = load_config(case / "ensio.yaml", over[:-2] + over[-1:])
    obs = observation_sources(cfg.observations, cfg.resolve)
    one = read_ensemble(cfg, MPI.COMM_SELF)
    ref = assimilate_block(one, obs, cfg.analysis, MPI.COMM_SELF, cycle=2, seconds={})
    exact = assimilate_block(one, obs, exact_cfg.analysis, MPI.COMM_SELF, cycle=2, seconds={})
    prior = read_ensemble(cfg, comm)
    got = assimilate_block(prior, obs, cfg.analysis, comm, cycle=2, seconds={})
    full = np.concatenate(comm.allgather(got.ensemble), axis=1)
    plan = random_row_sets(prior.layout.n_rows, comm, seed=11)
    block = RowSetBlock.of(one.layout, plan, np.ascontiguousarray(one.data[:, plan.rows]))
    got_sets = assimilate_block(block, obs, cfg.analysis, comm, cycle=2, seconds={})
    scale = np.nanmax(np.abs(ref.ensemble))
    np.testing.assert_allclose(full, ref.ensemble, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(got_sets.ensemble, ref.ensemble[:, plan.rows], rtol=0,
                               atol=1e-12 * scale)  # fmt: skip
    assert np.isnan(ref.ensemble).any() == missing
    assert np.array_equal(np.isnan(full), np.isnan(one.data))
    assert not np.allclose(ref.ensemble, exact.ensemble, equal_nan=True)  # interpolation acted
    assert not np.allclose(ref.ensemble, one.data, equal_nan=True)  # observations acted
    assert got.qc == ref.qc == got_sets.qc and got.qc.accepted > 0
    assert got.posterior.rms == pytest.approx(ref.posterior.rms, rel=1e-12)
