"""The 4-D analysis (parallel observation operator, HX exchange) under MPI:
the same analysis for any number of ranks, and one error on every rank."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest
from mpi4py import MPI

import ensio.analysis.inputs as inputs
from ensio.config.load import load_config
from ensio.errors import InputError
from ensio.models.moving import config_text, write_moving
from ensio.offline import run_analysis


def _members(directory, out, k) -> np.ndarray:
    rows = []
    for j in range(1, k + 1):
        with netCDF4.Dataset(directory / out / f"mem{j:03d}.nc") as ds:
            rows.append(np.asarray(ds["state"][:]).ravel())
    return np.array(rows)


def _case(comm, root, members, slots, filt):
    case = None
    if comm.rank == 0:
        case = write_moving(root, nx=24, ny=12, members=members, slots=slots, n_obs=80,
                            speed=0.2)
        for out in ("par", "ser"):
            text = config_text(case, True, out=out).replace("filter: letkf", f"filter: {filt}")
            if filt == "etkf":
                text = "".join(ln for ln in text.splitlines(True) if "localization" not in ln)
            (root / f"{out}.yaml").write_text(text)
    return comm.bcast(case, root=0)


@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize(("members", "slots", "filt"),
                         [(3, 2, "letkf"), (5, 3, "letkf"), (4, 3, "etkf")])
def test_4d_analysis_independent_of_n_mpi(comm, shared_dir, monkeypatch, members, slots, filt,
                                          partial):
    """Pairs per rank from several members to none (3 × 2 pairs on 4 ranks, 15 on 2)."""
    if partial:  # every rank reads the locations and only its observations' values
        monkeypatch.setattr(inputs, "PARTIAL_READ_BYTES", 0)
    case = _case(comm, shared_dir, members, slots, filt)
    rep = run_analysis(load_config(shared_dir / "par.yaml"), comm)
    serial = None
    if comm.rank == 0:
        one = run_analysis(load_config(shared_dir / "ser.yaml"), MPI.COMM_SELF)
        serial = (one.result.qc, one.result.prior, _members(shared_dir, "ser", case.members))
    serial = comm.bcast(serial, root=0)
    comm.Barrier()
    assert rep.result.qc == serial[0]
    prior = rep.result.prior  # sums over the ranks: equal to rounding
    assert prior.count == serial[1].count
    assert prior.rms == pytest.approx(serial[1].rms, rel=1e-12)
    assert prior.mean == pytest.approx(serial[1].mean, rel=1e-9, abs=1e-15)
    assert rep.result.qc.accepted == case.n_obs
    got = _members(shared_dir, "par", case.members)
    np.testing.assert_allclose(got, serial[2], rtol=1e-12, atol=1e-12)


def test_missing_slot_file_on_one_rank_is_one_error_everywhere(comm, shared_dir):
    """The last member's last slot is read by the last rank only; every rank raises its error."""
    _case(comm, shared_dir, 3, 2, "letkf")
    if comm.rank == 0:
        (shared_dir / "fc" / "mem003_slot2.nc").unlink()
    comm.Barrier()
    with pytest.raises(InputError, match=r"mem003_slot2\.nc: member file not found$"):
        run_analysis(load_config(shared_dir / "par.yaml"), comm)
    comm.Barrier()
    assert not (shared_dir / "par").exists()
