"""Quick member checks under mpiexec: same matrix as the full check, one error on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from cases import EnsembleCase, VarCase, reference_matrix

from ensio.config import config_from_dict
from ensio.errors import InputError
from ensio.io.modes.ensemble import open_ensemble
from ensio.io.scan import members as members_mod

CASES = {
    "nc4": EnsembleCase(members=7, seed=71, variables=[
        VarCase("state", ("lat", "lon")), VarCase("q", ("lev", "lat", "lon"), dtype="f4")]),
    "cdf5": EnsembleCase(members=5, seed=52, fmt="NETCDF3_64BIT_DATA",
                         variables=[VarCase("state", ("lat", "lon"))]),
}  # fmt: skip


def _make(case, shared_dir, comm):
    paths = case.write(shared_dir) if comm.rank == 0 else None
    return comm.bcast(paths, root=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_metadata_pass_spread_over_ranks_reads_the_reference(name, comm, shared_dir, monkeypatch):
    case = CASES[name]
    paths = _make(case, shared_dir, comm)
    cfg = config_from_dict(case.config(shared_dir))
    ref = reference_matrix(paths, case.variables)
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, comm) as ens:
        fast = ens.read().data.copy()
        ens.scan.invalidate()
        ens.scan.refresh()
        quick = comm.allreduce(ens.scan.quick)
        lo = ens.rows.start
    assert quick == len(paths)  # every member (member 1 too) accepted by the quick check
    np.testing.assert_array_equal(fast, ref[:, lo : lo + fast.shape[1]])
    monkeypatch.setattr(members_mod, "make_template", lambda *a, **k: None)
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, comm) as ens:
        assert ens.read().data.tobytes() == fast.tobytes()


def test_bad_member_is_one_error_on_every_rank(comm, shared_dir):
    case = CASES["nc4"]
    paths = _make(case, shared_dir, comm)
    cfg = config_from_dict(case.config(shared_dir))
    if comm.rank == 0:  # member 4: corrupt HDF5 metadata
        blob = bytearray(paths[3].read_bytes())
        blob[48:112] = b"\xff" * 64
        paths[3].write_bytes(bytes(blob))
    comm.Barrier()
    with pytest.raises(InputError) as err, \
            open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, comm):  # fmt: skip
        pass
    msg = str(err.value)
    assert msg.startswith(f"{paths[3]}:") and "\n" not in msg
    assert comm.allgather(msg) == [msg] * comm.size
