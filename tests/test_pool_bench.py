"""``ensio bench pool`` on a tiny case: the result has every number the docs quote."""

from __future__ import annotations

import json
import math

from pool_support import WORKER

from ensio.bench.pool import bench_pool, result_table
from ensio.workflow import spec


def test_bench_pool_small(tmp_path, monkeypatch):
    # light worker processes (see pool_support) keep this test fast
    monkeypatch.setattr(spec, "worker_argv", lambda todo, time_limit=None, **kw: (
        *WORKER, str(todo), "--time-limit", repr(time_limit)))
    res = bench_pool(tmp_path / "b", noop_tasks=30, sleep_tasks=8, sleep_seconds=0.05, jobs=2,
                     repeat=2, keep=True)
    a, b = res["noop"], res["sleep"]
    assert a["tasks"] == 30 and a["lock"] == "flock" and a["tasks_per_second"] > 0
    assert 0 <= a["overhead_ms"]["median"] <= a["overhead_ms"]["p99"]
    assert a["commit_ms"]["median"] > 0 and a["command_ms"]["median"] > 0
    assert b["tasks"] == 8 and b["ideal"] == 8 * 0.05 / 2
    assert b["ratio"] == b["makespan"] / b["ideal"] and b["ratio"] > 0.9
    assert b["ok"] == (b["ratio"] <= 1.05) and math.isfinite(b["ratio_from_worker_start"])
    assert b["repeat"] == 2 and b["ratio"] in b["ratios"] and b["mean_task_seconds"] >= 0.05
    assert res["machine"]["filesystem"]["mount"] and res["workdir"] == str(tmp_path / "b")
    json.dumps(res)  # JSON-ready
    assert result_table(res).row_count >= 10


def test_bench_pool_from_the_command_line(tmp_path):
    """``ensio bench pool`` as users type it: real ``ensio worker`` jobs, table and JSON."""
    import subprocess
    import sys

    out = tmp_path / "pool.json"
    res = subprocess.run(
        [sys.executable, "-m", "ensio", "bench", "pool", "--jobs", "2", "--noop-tasks", "12",
         "--sleep-tasks", "4", "--sleep-seconds", "0.05", "--repeat", "1",
         "--workdir", str(tmp_path / "w"), "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ensio bench pool" in res.stdout
    got = json.loads(out.read_text())
    assert got["jobs"] == 2 and got["noop"]["tasks"] == 12 and got["sleep"]["tasks"] == 4
    assert got["sleep"]["ideal"] == 4 * 0.05 / 2 and got["sleep"]["repeat"] == 1
