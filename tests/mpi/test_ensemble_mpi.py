"""Parallel ensemble read/write under mpiexec: rank- and N_io-independence."""

from __future__ import annotations

import numpy as np
import pytest
from cases import (
    EnsembleCase,
    VarCase,
    reference_matrix,
    sha256,
    variable_bytes,
)

from ensio.config import config_from_dict
from ensio.io.modes.ensemble import open_ensemble, read_ensemble, write_ensemble
from ensio.parallel import block_distribution

CASES = {
    "nc4-mixed": EnsembleCase(
        members=6,
        seed=61,
        variables=[
            VarCase("state", ("lat", "lon")),
            VarCase("temp", ("lev", "lat", "lon"), dtype="f4", endian="big"),
            VarCase("soil", ("lev", "lat", "lon"), mask="landmask"),
            VarCase("q", ("lev", "lat", "lon"), dtype="f4", chunked=True),
        ],
    ),
    "cdf5": EnsembleCase(
        members=5,
        seed=51,
        fmt="NETCDF3_64BIT_DATA",
        variables=[VarCase("state", ("lat", "lon")), VarCase("t", ("lev", "lat", "lon"), "f4")],
    ),
}


def _make(case, shared_dir, comm):
    paths = case.write(shared_dir) if comm.rank == 0 else None
    return comm.bcast(paths, root=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_read_matches_netcdf4_for_every_n_io(name, comm, shared_dir):
    case = CASES[name]
    paths = _make(case, shared_dir, comm)
    ref = reference_matrix(paths, case.variables)
    for n_io in range(1, comm.size + 1):
        cfg = config_from_dict(case.config(shared_dir, tasks=n_io))
        block = read_ensemble(cfg, comm)
        start, count = block_distribution(ref.shape[1], comm.size, comm.rank)
        assert (block.start, block.count) == (start, count)
        np.testing.assert_array_equal(block.data, ref[:, start : start + count])


@pytest.mark.parametrize("name", sorted(CASES))
def test_identity_roundtrip_is_byte_identical(name, comm, shared_dir):
    case = CASES[name]
    paths = _make(case, shared_dir, comm)
    before = [sha256(p) for p in paths]
    for n_io in range(1, comm.size + 1):
        cfg = config_from_dict(case.config(shared_dir, tasks=n_io))
        write_ensemble(cfg, comm, read_ensemble(cfg, comm))
        comm.Barrier()
        assert [sha256(p) for p in paths] == before, f"N_io={n_io}"
    assert not (shared_dir / ".ensio-journal").exists()


@pytest.mark.parametrize("name", sorted(CASES))
def test_write_analysis_in_place(name, comm, shared_dir):
    case = CASES[name]
    paths = _make(case, shared_dir, comm)
    aux = [variable_bytes(p, "aux") for p in paths]
    ref = reference_matrix(paths, case.variables)
    n_io = comm.size
    cfg = config_from_dict(case.config(shared_dir, tasks=n_io))
    block = read_ensemble(cfg, comm)
    rows = np.arange(block.start, block.start + block.count)
    members = np.arange(block.n_members)[:, None]
    block.data[...] = 0.5 * block.data + np.sin(rows + 7.0 * members)
    write_ensemble(cfg, comm, block)
    comm.Barrier()
    new = reference_matrix(paths, case.variables)
    allrows = np.arange(ref.shape[1])
    expect = 0.5 * ref + np.sin(allrows + 7.0 * np.arange(ref.shape[0])[:, None])
    # float32 variables round to float32
    np.testing.assert_allclose(new, expect, rtol=1e-6, atol=1e-6)
    assert [variable_bytes(p, "aux") for p in paths] == aux


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_object_reads_and_writes_for_every_n_io(name, comm, shared_dir):
    """The object built once: read, write the analysis, read it back, free its groups."""
    case = CASES[name]
    paths = _make(case, shared_dir, comm)
    ref = reference_matrix(paths, case.variables)
    for n_io in range(1, comm.size + 1):
        cfg = config_from_dict(case.config(shared_dir, tasks=n_io))
        with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, comm) as ens:
            assert ens.n_io == n_io and ens.group_rows.size == ens.groups.group_comm.size
            block = ens.read()
            start, count = block_distribution(ref.shape[1], comm.size, comm.rank)
            assert (block.start, block.count) == (start, count)
            block.data[...] = -block.data  # exact in float32 and float64
            ens.write(block)
            again = ens.read()
            np.testing.assert_array_equal(again.data, -ref[:, start : start + count])
            block.data[...] = ref[:, start : start + count]
            ens.write(block, overlap=False)
        comm.Barrier()
        np.testing.assert_array_equal(reference_matrix(paths, case.variables), ref)
