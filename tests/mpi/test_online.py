"""The online (coupled) mode under mpiexec: communicators, online == offline, agreed errors.

The world of ``mpiexec -n N`` is used as N_e × P ranks for every P that divides
N with N_e = N / P ≥ 2 (``-n 2``: N_e = 2, P = 1; ``-n 4``: 4 × 1 and 2 × 2).
Each model rank reads its block of its member with the plain netCDF4 library.
The offline reference is :func:`ensio.offline.run_analysis` on the same files
(its result does not depend on N_mpi, tests/mpi/test_analysis_mpi.py). All
collective calls of a test happen before its assertions, so a failed check
cannot leave ranks waiting. Errors that abort the job are tested by spawning
mpiexec (tests/test_online_spawn.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from cases import reference_matrix
from mpi4py import MPI
from online_child import CYCLE, VARS, config_dict, make_case, read_block

from ensio.config import ConfigError, config_from_dict
from ensio.config.analysis import ObservationFile
from ensio.errors import InputError
from ensio.offline import run_analysis
from ensio.online import Ensemble, OnlineError
from ensio.parallel import CommGroups


def _layouts(size: int) -> list[tuple[int, int]]:
    """(N_e, P) with N_e × P = size and N_e ≥ 2."""
    return [(size // p, p) for p in range(1, size + 1) if size % p == 0 and size // p >= 2]


def _case(root: Path, comm: MPI.Comm, members: int) -> None:
    if comm.rank == 0:
        make_case(root, members)
    comm.Barrier()


def _config(root: Path, members: int, out: str, filter_: str = "letkf"):
    return config_from_dict(config_dict(root, members, out, filter_), base_dir=root)


def test_comm_groups_online(comm):
    for n_e, p in _layouts(comm.size):
        g = CommGroups.online(comm, p)
        seen = comm.allgather(
            (
                g.model.rank,
                g.model.size,
                g.coupled.rank,
                g.coupled.size,
                g.filter.rank if g.is_filter else None,
                g.member_index,
            )
        )
        g.free()
        for r, (m_rank, m_size, c_rank, c_size, f_rank, member) in enumerate(seen):
            assert (m_rank, m_size, member) == (r % p, p, r // p)
            assert (c_rank, c_size) == (r // p, n_e)  # coupled rank = member index
            assert f_rank == (r if r < p else None)  # filter = the ranks of member 1
        assert g.n_members == n_e


def test_comm_groups_online_refuses_bad_layouts(comm):
    with pytest.raises(ValueError, match="not a multiple of tasks_per_member P ="):
        CommGroups.online(comm, 3 if comm.size % 3 else comm.size + 1)
    with pytest.raises(ValueError, match="tasks_per_member differs between ranks"):
        CommGroups.online(comm, 1 if comm.rank == 0 else 2)
    with pytest.raises(ValueError, match="at least 1"):
        CommGroups.online(comm, 0)


@pytest.mark.parametrize("filter_", ["letkf", "enkf", "etkf"])
def test_online_equals_offline(filter_, comm, shared_dir):
    results = {}
    for n_e, p in _layouts(comm.size):
        root = shared_dir / f"{filter_}-{n_e}x{p}"
        _case(root, comm, n_e)
        offline = run_analysis(_config(root, n_e, "offline", filter_), comm, cycle=CYCLE)
        cfg = _config(root, n_e, "online", filter_)
        ens = Ensemble(cfg, comm, tasks_per_member=p, abort_on_exception=False)
        xa = ens.assimilate(read_block(cfg.member_paths()[ens.member - 1], ens.rows), cycle=CYCLE)
        blocks = comm.allgather((ens.member, ens.rows, xa))
        results[n_e, p] = (root, offline.result, ens.last, blocks)
        ens.close()
    comm.Barrier()

    # --- checks (no collectives from here on) ---
    assert results
    for (n_e, p), (root, off, report, blocks) in results.items():
        want = reference_matrix([root / f"offline/mem{m:03d}.nc" for m in range(1, n_e + 1)], VARS)
        got = reference_matrix([root / f"online/mem{m:03d}.nc" for m in range(1, n_e + 1)], VARS)
        scale = np.max(np.abs(want))
        assert np.max(np.abs(got - want)) <= 1e-12 * scale, (n_e, p)
        back = np.zeros_like(want)
        for member, rows, x in blocks:
            back[member - 1, rows] = x
        assert np.max(np.abs(back - want)) <= 1e-12 * scale, (n_e, p)
        for name in ("mean", "spread"):
            with netCDF4.Dataset(root / f"online/{name}.nc") as a:
                with netCDF4.Dataset(root / f"offline/{name}.nc") as b:
                    for v in VARS:
                        np.testing.assert_allclose(a[v.name][:], b[v.name][:], rtol=1e-12)
        assert report.qc == off.qc
        assert report.prior.rms == pytest.approx(off.prior.rms, rel=1e-12)
        assert report.posterior.rms == pytest.approx(off.posterior.rms, rel=1e-12)
        assert report.cycle == CYCLE and report.seconds["total"] >= 0


def test_wrong_block_size_is_refused_on_every_rank_then_works(comm, shared_dir):
    outcomes = []
    for n_e, p in _layouts(comm.size):
        root = shared_dir / f"size-{n_e}x{p}"
        _case(root, comm, n_e)
        cfg = _config(root, n_e, "online")
        ens = Ensemble(cfg, comm, tasks_per_member=p, abort_on_exception=False)
        x = read_block(cfg.member_paths()[ens.member - 1], ens.rows)
        bad = x[:-1] if ens.member == n_e and ens.model_rank == p - 1 else x
        try:
            ens.assimilate(bad, cycle=CYCLE)
            message = None
        except OnlineError as exc:
            message = str(exc)
        # the same Ensemble still works: no rank is out of step after the error
        xa = ens.assimilate(x, cycle=CYCLE)
        outcomes.append((n_e, p, message, xa.shape == (ens.count,)))
        ens.close()
    for n_e, p, message, ok in outcomes:
        assert message is not None, (n_e, p)
        assert f"member {n_e} model rank {p - 1} passed a block of shape" in message
        assert ok


def test_non_finite_block_and_bad_config_are_refused(comm, shared_dir):
    n_e, p = comm.size, 1
    root = shared_dir / "nan"
    _case(root, comm, n_e)
    cfg = _config(root, n_e, "online")
    ens = Ensemble(cfg, comm, tasks_per_member=p, abort_on_exception=False)
    x = read_block(cfg.member_paths()[ens.member - 1], ens.rows)
    y = x.copy()
    if ens.member == 1:
        y[3] = np.nan
    with pytest.raises(OnlineError, match="member 1 model rank 0 passed a block with 1 non-finite"):
        ens.assimilate(y)
    other = dataclasses.replace(cfg, ensemble=dataclasses.replace(cfg.ensemble, size=n_e + 1))
    with pytest.raises(OnlineError, match="ensemble.size"):
        ens.assimilate(x, config=other)
    ens.close()


def test_filter_error_is_raised_on_every_rank(comm, shared_dir):
    n_e, p = _layouts(comm.size)[-1]
    root = shared_dir / "badobs"
    _case(root, comm, n_e)
    cfg = _config(root, n_e, "online")
    ens = Ensemble(cfg, comm, tasks_per_member=p, abort_on_exception=False)
    x = read_block(cfg.member_paths()[ens.member - 1], ens.rows)
    missing = dataclasses.replace(cfg, observations=(ObservationFile("in/none.nc"),))
    with pytest.raises(InputError, match="none.nc: observation file not found"):
        ens.assimilate(x, cycle=CYCLE, config=missing)
    xa = ens.assimilate(x, cycle=CYCLE)
    assert xa.shape == (ens.count,)
    ens.close()


def test_ensemble_size_must_match_the_job(comm, shared_dir):
    root = shared_dir / "esize"
    _case(root, comm, comm.size)
    cfg = _config(root, comm.size + 1, "online")
    with pytest.raises(ConfigError, match=r"ensemble.size: .* start"):
        Ensemble(cfg, comm, tasks_per_member=1, abort_on_exception=False)


def test_missing_template_is_reported_on_every_rank(comm, shared_dir):
    root = shared_dir / "notemplate"
    (shared_dir / "notemplate").mkdir(exist_ok=True)
    cfg = _config(root, comm.size, "online")
    with pytest.raises(ConfigError, match="layout template"):
        Ensemble(cfg, comm, tasks_per_member=1, abort_on_exception=False)


def test_explicit_layouts_must_agree(comm, shared_dir):
    from ensio.io.scan.members import layout_from_member

    root = shared_dir / "layout"
    _case(root, comm, comm.size)
    cfg = _config(root, comm.size, "online")
    layout = layout_from_member(cfg.ensemble, cfg.member_paths()[0])
    if comm.rank == comm.size - 1:
        v = layout.variables[-1]
        shorter = dataclasses.replace(v, size=v.size - 1)
        layout = dataclasses.replace(
            layout, variables=(*layout.variables[:-1], shorter), n_rows=layout.n_rows - 1
        )
    with pytest.raises(OnlineError, match="disagree on the state length"):
        Ensemble(cfg, comm, tasks_per_member=1, layout=layout, abort_on_exception=False)
