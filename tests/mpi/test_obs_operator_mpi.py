"""Observations on a mixed CDO state (2-D + 3-D with levels, time record dimension):
the analysis does not depend on N_mpi (issue 10 item 3)."""

from __future__ import annotations

import dataclasses

import needs
import netCDF4
import numpy as np
import pytest
from mpi4py import MPI

from ensio.config import config_from_dict
from ensio.io.modes.ensemble import read_ensemble
from ensio.offline import run_analysis

N_E = 5


def _setup(root) -> dict:
    from test_obs_operator import cdo_member

    for m in range(1, N_E + 1):
        cdo_member(root, m, mask=True)
    rng = np.random.default_rng(17)  # fixed: the same observations on every rank count
    for name, n, extra in (("ps.nc", 40, {}), ("t.nc", 60, {"level": (30000.0, 95000.0)})):
        with netCDF4.Dataset(root / name, "w") as ds:
            ds.createDimension("obs", n)
            cols = {
                "lon": rng.uniform(-180, 180, n),
                "lat": rng.uniform(-80, 80, n),
                "value": rng.uniform(0, 1, n),
                "error": np.full(n, 0.2),
            }
            if extra:
                cols["level"] = rng.uniform(*extra["level"], n)
            for k, v in cols.items():
                ds.createVariable(k, "f8", ("obs",))[:] = v
            if extra:
                ds.setncattr("variable", "t")
    return {
        "ensemble": {
            "members": str(root / "mem{member:03d}.nc"),
            "size": N_E,
            "variables": [{"name": "ps", "mask": "land"}, "t"],
        },
        "observations": ["ps.nc", "t.nc"],
        "io": {"in_place": False, "journal": False},
    }


@needs.tools_mark("cdo")
@pytest.mark.parametrize("filt", ["letkf", "etkf"])
def test_obs_on_mixed_state_independent_of_n_mpi(comm, shared_dir, filt):
    raw = _setup(shared_dir) if comm.rank == 0 else None
    raw = comm.bcast(raw, root=0)
    raw["analysis"] = {"filter": filt, "seed": 3}
    if filt == "letkf":
        raw["analysis"]["localization"] = {"radius_km": 3000}

    def run(c, tag):
        cfg = config_from_dict(
            {**raw, "output": {"members": str(shared_dir / tag / "mem{member:03d}.nc")}},
            base_dir=shared_dir,
        )
        report = run_analysis(cfg, c)
        out = dataclasses.replace(
            cfg, ensemble=dataclasses.replace(cfg.ensemble, members=cfg.output.members)
        )
        return report, out

    report, out = run(comm, "par")
    serial = None
    if comm.rank == 0:
        rep1, out1 = run(MPI.COMM_SELF, "ser")
        serial = (rep1.result.qc, read_ensemble(out1, MPI.COMM_SELF).data)
    serial = comm.bcast(serial, root=0)
    full = np.concatenate(comm.allgather(read_ensemble(out, comm).data), axis=1)
    assert report.result.qc == serial[0]
    assert report.result.qc.accepted > 50 and report.result.qc.outside > 0  # masked cells
    np.testing.assert_allclose(full, serial[1], rtol=1e-12, atol=1e-12)
