"""Large observation files: each rank reads only the observations it needs.

The partial read (locations in full, values of the selection only) must give
the same analysis and the same global counts as reading the whole file, and
it must really read less: the reader is spied on and every rank's count of
observation values read is checked.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import ensio.analysis.inputs as inputs
import ensio.obs.sources as sources
import ensio.offline as offline
from ensio.config import config_from_dict
from ensio.io.modes.ensemble import read_ensemble
from ensio.models.synthetic import SyntheticSpec, write_synthetic


@pytest.mark.parametrize("filt", ["letkf", "lenkf"])
def test_partial_obs_read_gives_the_same_analysis(comm, shared_dir, monkeypatch, filt):
    if comm.rank == 0:
        write_synthetic(shared_dir, SyntheticSpec(nx=36, ny=18, members=6, seed=5))
    comm.Barrier()
    raw = {
        "ensemble": {
            "members": str(shared_dir / "mem{member:03d}.nc"),
            "size": 6,
            "variables": ["state"],
        },
        "observations": [str(shared_dir / "obs.nc")],
        "analysis": {"filter": filt, "localization": {"radius_km": 1500}},
        "io": {"in_place": False, "journal": False},
    }
    results = {}
    values_read = {"whole": 0, "partial": 0}
    locations_read = {"whole": 0, "partial": 0}
    reader = sources.read_obs_file

    def spy(*args, **kwargs):
        batch, attr = reader(*args, **kwargs)
        counter = values_read if kwargs.get("values", True) else locations_read
        counter[mode] += len(batch)
        return batch, attr

    monkeypatch.setattr(sources, "read_obs_file", spy)
    for mode, threshold in (("whole", 1 << 40), ("partial", 0)):
        monkeypatch.setattr(inputs, "PARTIAL_READ_BYTES", threshold)
        cfg = config_from_dict(  # base: the diag file goes there, not the working directory
            {**raw, "output": {"members": str(shared_dir / mode / "mem{member:03d}.nc")}},
            base_dir=shared_dir,
        )
        report = offline.run_analysis(cfg, comm)
        out = dataclasses.replace(
            cfg, ensemble=dataclasses.replace(cfg.ensemble, members=cfg.output.members)
        )
        results[mode] = (read_ensemble(out, comm).data, report)
    total = (36 * 18 + 5) // 10  # 10 % of the grid, as ensio synth
    all_values_partial = comm.allreduce(values_read["partial"])  # before any assertion
    # whole file: rank 0 reads every value and broadcasts
    assert values_read["whole"] == (total if comm.rank == 0 else 0)
    assert locations_read["whole"] == 0
    if comm.size > 1:
        # partial: every rank reads all locations, then the values of its selection only
        assert locations_read["partial"] == total
        assert 0 < values_read["partial"] < total, values_read
        assert all_values_partial >= total  # every observation has an owner
    else:
        assert values_read["partial"] == total  # one rank needs them all: no partial read
    (a, ra), (b, rb) = results["whole"], results["partial"]
    np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
    assert ra.result.qc == rb.result.qc
    assert ra.result.qc.total == total
    assert ra.result.prior.count == rb.result.prior.count
