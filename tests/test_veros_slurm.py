"""Issue 26 item 4: the Veros OSSE's cycle once on the real SLURM, bitwise the local run.

The small OSSE (tests/veros_support.py: 4 members, set up and cycled with the local
back-end by ``ensio example veros``) gives the set-up and the local analysis. Its
``ensio cycle`` command runs one cycle of 1 day again with ``workflow.backend: slurm``:
each member is a ``veros run`` inside a batch job. The analysis restarts equal the
local back-end's byte for byte, and every task ran in a SLURM job. Marked ``slurm``:
skipped with the reason without a cluster, failed with it when ``CI=true``.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from test_slurm_cycle import active_jobs_under, cancel_jobs_under
from veros_support import ENSIO, MEMBERS, analysis_digests, cycle_argv, small_osse

pytestmark = pytest.mark.slurm
TIMEOUT = 600  # seconds; the run must never hang CI


def test_veros_cycle_through_sbatch_equals_local(tmp_path_factory: pytest.TempPathFactory,
                                                 tmp_path: Path) -> None:
    osse = small_osse(tmp_path_factory)
    run_dir = tmp_path / "slurm"
    argv = [*ENSIO, "cycle", *cycle_argv(osse, run_dir, 1, "workflow.backend=slurm",
                                         "workflow.resident=false",  # local back-end only
                                         "workflow.time_limit=00:10:00")]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert active_jobs_under(run_dir, "PENDING,CONFIGURING") == [], "pending leftovers"
    finally:
        cancel_jobs_under(run_dir)  # never leave jobs holding the shared node
    recs = [r for r in map(json.loads, (run_dir / "records.jsonl").read_text().splitlines())
            if r.get("kind") in ("member", "analysis")]
    done = Counter((r["cycle"], r["task"]) for r in recs if r["status"] == "done")
    tasks = [f"mem{m:03d}" for m in range(1, MEMBERS + 1)] + ["analysis"]
    assert done == Counter((1, t) for t in tasks), done
    assert all(str(r["job"]).isdigit() for r in recs), {r["job"] for r in recs}  # SLURM ids
    logs = [run_dir / "cycle_001" / "work" / f"mem{m:03d}" / "veros.log"
            for m in range(1, MEMBERS + 1)]
    assert all("Integration done" in p.read_text() for p in logs)
    assert analysis_digests(run_dir, 1) == analysis_digests(osse / "assim", 1)
