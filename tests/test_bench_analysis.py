"""``ensio bench analysis``: result keys, both kernels agree, table, CLI.

No timing assertions: only that every figure exists and is positive and that
the batched and pointwise analyses of the same run agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mpi4py import MPI
from rich.console import Console

from ensio.bench.analysis import bench_analysis, result_table
from ensio.cli.bench import main as bench_main
from ensio.config import Config, load_config
from ensio.models.synthetic import SyntheticSpec, write_synthetic

ANALYSIS = """
observations: [obs.nc]
analysis:
  filter: {filter}
  localization: {{taper: gaspari-cohn, radius_km: 3000}}
  tile_points: 16
"""
PHASES = ("select", "weights", "gemm", "transform", "update")


def _case(tmp_path: Path, filt: str = "letkf") -> Path:
    case = write_synthetic(tmp_path, SyntheticSpec(nx=24, ny=12, members=5, seed=3))
    with open(case.config, "a") as f:
        f.write(ANALYSIS.format(filter=filt))
    return Path(case.config)


def _check(res: dict[str, Any], config: Config) -> None:
    keys = ("seconds", "pointwise_seconds", "speedup", "gflops", "pointwise_gflops")
    keys += ("dgemm_gflops", "gemm_fraction_of_peak", "transform_us_per_point")
    for key in keys:
        assert res[key] is not None and res[key] > 0, key
    for phases in (res["phases"], res["pointwise_phases"]):
        for p in PHASES:
            assert phases[p] >= 0, p
        assert "gemm_flops" not in phases
    assert res["phases"]["weights"] > 0 and res["pointwise_phases"]["weights"] > 0
    assert res["gemm_flops"] > 0 and res["pointwise_gemm_flops"] > 0
    assert res["agree"] is True and 0 <= res["max_rel_diff"] <= 1e-10
    assert res["n_mpi"] == 1 and res["members"] == 5 and res["points"] == 24 * 12
    assert res["observations"] > 0 and res["accepted_observations"] > 0
    assert res["kernel"] == "batched" and res["filter"] == config.analysis.filter
    assert res["tiles"] > 0 and 0 <= res["reduced_tiles"] <= res["tiles"]
    assert res["gemm_fraction_of_peak"] == pytest.approx(res["gflops"] / res["dgemm_gflops"])
    us = res["phases"]["transform"] * res["n_mpi"] / res["points"] * 1e6
    assert res["transform_us_per_point"] == pytest.approx(us)
    assert res["variables"] == ["state"]
    assert res["machine"]["logical_cpus"] >= 1
    json.dumps(res)  # JSON-serialisable


@pytest.mark.parametrize("filt", ["letkf", "lestkf"])
def test_bench_analysis_serial(tmp_path: Path, filt: str) -> None:
    config = load_config(_case(tmp_path, filt))
    res = bench_analysis(config, MPI.COMM_SELF, repeat=2)
    _check(res, config)
    assert len(res["samples_seconds"]["batched"]) == len(res["samples_seconds"]["pointwise"]) == 2
    console = Console(record=True, width=120)
    console.print(result_table(res))
    text = console.export_text()
    assert "pointwise" in text and "GFLOP/s" in text and "total" in text
    assert "DGEMM" in text and "µs/point" in text


def test_cli_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _case(tmp_path)
    out = tmp_path / "res" / "analysis.json"
    rc = bench_main(["analysis", str(path), "--json", str(out), "--set", "analysis.tile_points=8"])
    assert rc == 0
    res = json.loads(out.read_text())
    _check(res, load_config(path))
    assert res["tile_points"] == 8 and res["overrides"] == ["analysis.tile_points=8"]
    assert "speedup" in json.dumps(res) and "ensio bench analysis" in capsys.readouterr().out


def test_cli_io_still_registered(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench_main(["io", "--help"])
    with pytest.raises(SystemExit) as exc:
        bench_main(["analysis"])  # CONFIG is required
    assert exc.value.code == 2
