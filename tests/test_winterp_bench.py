"""``ensio bench analysis --weight-stride``: result keys, the increment difference, the CLI.

No timing assertions: only that every figure exists, and that
``increment_rel_rms`` is the figure computed here from two separate analyses.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ensio.analysis.inputs import assimilate_block, observation_sources
from ensio.bench.analysis_winterp import bench_weight_interpolation
from ensio.cli.bench import main as bench_main
from ensio.config import load_config
from ensio.config.analysis import WeightInterpolationSection
from ensio.io.modes.ensemble import read_ensemble
from ensio.models.synthetic import SyntheticSpec, write_synthetic

ANALYSIS = """
observations: [obs.nc]
analysis:
  filter: letkf
  localization: {taper: gaspari-cohn, radius_km: 3000}
  tile_points: 16
"""


def _case(tmp_path: Path) -> Path:
    case = write_synthetic(tmp_path, SyntheticSpec(nx=24, ny=12, members=5, seed=3))
    with open(case.config, "a") as f:
        f.write(ANALYSIS)
    return Path(case.config)


def test_bench_reports_the_increment_difference(tmp_path):
    config = load_config(_case(tmp_path))
    res = bench_weight_interpolation(config, MPI.COMM_SELF, [2, 3])
    assert set(res["strides"]) == {"2", "3"} and res["seconds"] > 0
    prior = read_ensemble(config, MPI.COMM_SELF)
    obs = observation_sources(config.observations, config.resolve)

    def increment(k: int) -> np.ndarray:
        wi = WeightInterpolationSection(k)
        an = dataclasses.replace(config.analysis, weight_interpolation=wi)
        res = assimilate_block(prior, obs, an, MPI.COMM_SELF, cycle=0, seconds={})
        return res.ensemble - prior.data

    exact = increment(1)
    for k in (2, 3):
        want = np.sqrt(np.sum((increment(k) - exact) ** 2) / np.sum(exact**2))
        got = res["increment_rel_rms"][str(k)]
        assert 0 < want and abs(got - want) <= 1e-9 * want
        s = res["strides"][str(k)]
        assert s["seconds"] > 0 and s["speedup"] > 0 and s["phases"]["transform"] > 0
        # peak memory per stride (one untimed run): the posterior is a new block, so at least it
        mem, block = s["memory"], 8 * 5 * 24 * 12
        assert mem["block_bytes"] == block and mem["peak_bytes_per_rank"] >= block
        assert mem["budget_bytes"] > block + mem["tile_work_bytes"]


def test_cli_writes_the_json(tmp_path):
    cfg = _case(tmp_path)
    out = tmp_path / "r.json"
    argv = ["analysis", str(cfg), "--weight-stride", "2", "--json", str(out)]
    assert bench_main(argv) == 0
    res = json.loads(out.read_text())
    assert set(res["increment_rel_rms"]) == {"2"} and res["benchmark"].endswith("interpolation")
