"""Missing values and packed members under mpiexec: the same analysis for every N_mpi and N_io.

The members (NCO-packed, CF-masked, one chunked and deflated) and the
reference (numpy ETKF on the active points) are those of
tests/test_missing_packing.py; every run starts from the same prior files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import needs
import numpy as np
import pytest
from missing_cases import (
    TOOLS,
    check_analysis,
    config,
    make_obs,
    read_physical,
    read_stored,
    write_members,
    write_obs,
)

from ensio.config import load_config
from ensio.offline import run_analysis

pytestmark = needs.tools_mark(*TOOLS)  # NCO (and nccopy)


def _on_root(comm, fn):
    """``fn()`` on rank 0, its result (or its failure) on every rank: no rank left waiting."""
    out = err = None
    if comm.rank == 0:
        try:
            out = fn()
        except Exception as exc:
            err = f"rank 0: {type(exc).__name__}: {exc}"
    out, err = comm.bcast((out, err), root=0)
    assert err is None, err
    return out


def _prior(root: Path, fmt: str):
    rng = np.random.default_rng(2024)
    mem = write_members(root, rng, fmt=fmt)
    X, inactive = read_physical(mem.paths)
    obs = make_obs(X, inactive, rng)
    write_obs(root / "obs.nc", obs)
    return mem.paths, X, inactive, obs, [read_stored(p) for p in mem.paths]


def _copy(prior: Path, run: Path, n_io: int) -> Path:
    shutil.copytree(prior, run)
    return config(run, run / "obs.nc", tasks=n_io)


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_64BIT_OFFSET"])
def test_packed_missing_analysis_for_every_n_io(fmt, comm, shared_dir):
    paths, X, inactive, obs, prior = _on_root(comm, lambda: _prior(shared_dir / "prior", fmt))
    for n_io in sorted({1, min(2, comm.size), comm.size}):
        run = shared_dir / f"io{n_io}"
        path = _on_root(comm, lambda run=run, n=n_io: _copy(shared_dir / "prior", run, n))
        cfg = load_config(path)
        report = run_analysis(cfg, comm)
        log = f"N_mpi {comm.size}, N_io {n_io}\n" + "\n".join(report.lines())
        mine = [run / p.name for p in paths]
        _on_root(comm, lambda mine=mine, log=log: check_analysis(
            mine, prior, X, inactive, obs, log))
