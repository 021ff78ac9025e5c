"""``ensio bench analysis``: peak memory per rank against the issue's budget (issue 14, item 5).

No assertion on the measured ratio (it depends on the allocator and the
case); only lower bounds that follow from what an analysis must allocate and
the budget's parts computed independently from the case.
"""

from __future__ import annotations

from pathlib import Path

from mpi4py import MPI
from rich.console import Console

from ensio.bench.analysis import bench_analysis, result_table
from ensio.config import load_config
from ensio.models.synthetic import SyntheticSpec, write_synthetic

ANALYSIS = """
observations: [obs.nc]
analysis:
  filter: letkf
  localization: {taper: gaspari-cohn, radius_km: 3000}
  tile_points: 16
"""


def test_peak_memory_and_budget(tmp_path: Path) -> None:
    nx, ny, k = 24, 12, 6
    case = write_synthetic(tmp_path, SyntheticSpec(nx=nx, ny=ny, members=k, seed=5))
    with open(case.config, "a") as f:
        f.write(ANALYSIS)
    res = bench_analysis(load_config(Path(case.config)), MPI.COMM_SELF)
    block = 8 * k * nx * ny  # one float64 state variable, every row on the one rank
    assert res["block_bytes"] == block
    # the posterior ensemble is a new block: the analysis cannot allocate less
    assert res["peak_bytes_per_rank"] >= block
    assert res["pointwise_memory"]["peak_bytes_per_rank"] >= block
    # budget = block + observations (at least their observed ensemble) + the largest tile
    hx = 8 * k * res["accepted_observations"]
    assert res["tile_work_bytes"] > 0
    assert res["budget_bytes"] >= block + hx + res["tile_work_bytes"]
    ratio = res["peak_bytes_per_rank"] / res["budget_bytes"]
    assert abs(res["peak_to_budget"] - ratio) <= 1e-12 * ratio
    console = Console(record=True, width=120)
    console.print(result_table(res))
    assert "peak MiB/rank" in console.export_text()
