"""``ensio cycle`` end to end on the Lorenz-96 example: layout, report, resume after SIGKILL."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ensio.models.l96case import rmse_table

EXAMPLE = Path(__file__).parents[1] / "examples" / "lorenz96" / "cycle.yaml"
SMALL = [
    "--set",
    "ensemble.size=6",
    "--set",
    "workflow.jobs=2",
    "--set",
    "workflow.analysis_ranks=1",
]


def _cycle(workdir: Path, cycles: int, **kw) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "ensio",
        "cycle",
        str(EXAMPLE),
        "--workdir",
        str(workdir),
        "--cycles",
        str(cycles),
        *SMALL,
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw
    )


def _digests(workdir: Path, cycle: int) -> dict[str, str]:
    d = workdir / f"cycle_{cycle:03d}" / "analysis"
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("*.nc"))}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cycle") / "ref"
    proc = _cycle(workdir, 2)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return workdir, out


def test_layout_records_and_rmse(reference):
    workdir, out = reference
    assert "cycle 2: done" in out
    for c in (1, 2):
        cdir = workdir / f"cycle_{c:03d}"
        assert sorted(p.name for p in (cdir / "forecast").glob("mem*.nc")) == [
            f"mem{m:03d}.nc" for m in range(1, 7)
        ]
        names = {p.name for p in (cdir / "analysis").glob("*.nc")}
        assert {f"mem{m:03d}.nc" for m in range(1, 7)} | {"mean.nc", "spread.nc"} == names
        assert (cdir / ".done").exists()
    rows = rmse_table(workdir)
    assert [r[0] for r in rows] == [1, 2]
    assert rows[-1][2] < rows[0][1]  # the analysis beats the first (uninformed) prior
    report = subprocess.run(
        [sys.executable, "-m", "ensio", "report", str(workdir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert "mean ± sd" in report.stdout
    assert (workdir / "report.csv").read_text().startswith("cycle,total,queuing,running,io")
    assert (workdir / "report.png").stat().st_size > 0


def test_resume_after_sigkill_is_bitwise_identical(reference, tmp_path):
    ref, _ = reference
    workdir = tmp_path / "run"
    rng = np.random.default_rng()
    proc = _cycle(workdir, 2)
    # a random moment: the assertion below must hold whenever the kill lands
    try:
        proc.wait(timeout=float(rng.uniform(2.0, 10.0)))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    again = _cycle(workdir, 2)
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    for c in (1, 2):
        assert _digests(workdir, c) == _digests(ref, c), f"cycle {c} differs"


def test_setup_is_reproducible(reference, tmp_path):
    ref, _ = reference
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ensio.models.l96case",
            "setup",
            "--workdir",
            str(tmp_path),
            "--members",
            "6",
            "--cycles",
            "2",
            "--seed",
            "1",
            "--steps",
            "5",
        ],
        check=True,
        timeout=120,
    )
    for sub in ("init", "obs", "truth"):
        for p in sorted((ref / sub).glob("*.nc")):
            assert (tmp_path / sub / p.name).read_bytes() == p.read_bytes(), p
