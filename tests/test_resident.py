"""The resident analysis (``workflow.resident``): one program serving every cycle's analysis.

Each request must give exactly what a cold ``ensio analyse`` gives, print
into the client's output, survive a bad request, and a resident killed
mid-run must leave nothing a cold run cannot recover.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from ensio.cli.synth import main as synth_main
from ensio.workflow.resident import Resident

PY = sys.executable
MPIEXEC = str(Path(PY).with_name("mpiexec"))


def _case(path: Path) -> Path:
    assert synth_main([str(path), "--nx", "12", "--ny", "6", "--members", "4", "--seed", "7"]) == 0
    return path / "ensio.yaml"


def _digest(case: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(case.glob("mem*.nc"))}


def _analyse(cfg: Path, cycle: int, launcher: list[str], sock: Path | None = None,
             *extra: str) -> subprocess.CompletedProcess:
    argv = [*launcher, PY, "-m", "ensio", "analyse", str(cfg), "--cycle", str(cycle), *extra]
    if sock is not None:
        argv = [PY, "-m", "ensio.workflow.resident", str(sock), "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cfg.parent)


def _listening(res: Resident, timeout: float = 120.0) -> None:
    """Until the resident's socket exists (it binds after its imports)."""
    deadline = time.monotonic() + timeout
    while not res.socket.exists():
        assert res.alive(), res.log.read_text()
        assert time.monotonic() < deadline, "the resident did not come up"
        time.sleep(0.05)


def test_requests_equal_cold_runs(tmp_path: Path) -> None:
    """On 2 ranks (one rank: the kill test below)."""
    launcher = [MPIEXEC, "-n", "2"]
    res = Resident(tuple(launcher), tmp_path / "resident.log")
    res.launch()
    try:
        _listening(res)
        warm, cold = _case(tmp_path / "warm"), _case(tmp_path / "cold")
        for cycle in (1, 2):  # a second request on the same program
            got = _analyse(warm, cycle, launcher, res.socket)
            ref = _analyse(cold, cycle, launcher)
            assert got.returncode == ref.returncode == 0, got.stderr + ref.stderr
            assert _digest(warm.parent) == _digest(cold.parent)
            assert "timing:" in got.stdout  # printed into the client's output
            assert res.alive()
        bad = _analyse(warm, 3, launcher, res.socket, "--set", "analysis.no_such_key=1")
        assert bad.returncode == 2
        lines = [x for x in bad.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and "no_such_key" in lines[0], bad.stderr
        again = _analyse(warm, 3, launcher, res.socket)
        assert again.returncode == 0 and res.alive(), again.stderr
        assert "listening" in res.log.read_text()
    finally:
        res.stop()
    assert not res.alive() and not res.socket.exists()


def test_without_a_resident_the_client_starts_cold(tmp_path: Path) -> None:
    cfg, ref = _case(tmp_path / "a"), _case(tmp_path / "b")
    got = _analyse(cfg, 1, [], tmp_path / "no-such-socket")
    assert got.returncode == 0, got.stderr
    assert _analyse(ref, 1, []).returncode == 0
    assert _digest(cfg.parent) == _digest(ref.parent)


def test_a_resident_killed_mid_run_is_recovered_by_a_cold_run(tmp_path: Path) -> None:
    cfg, ref = _case(tmp_path / "a"), _case(tmp_path / "b")
    assert _analyse(ref, 1, []).returncode == 0
    count = tmp_path / "count.jsonl"
    res = Resident((), tmp_path / "count.log", {**os.environ, "ENSIO_FAULT_COUNT": str(count)})
    res.launch()
    try:
        _listening(res)
        assert _analyse(_case(tmp_path / "c"), 1, [], res.socket).returncode == 0
    finally:
        res.stop()
    points = json.loads(count.read_text().splitlines()[-1])["count"]
    assert points > 3
    k = random.randrange(1, points + 1)
    res = Resident((), tmp_path / "kill.log", {**os.environ, "ENSIO_FAULT_KILL_AT": str(k)})
    res.launch()
    try:
        _listening(res)
        before = _digest(cfg.parent)
        got = _analyse(cfg, 1, [], res.socket)
        assert got.returncode == 1, f"point {k} of {points}: {got.stderr}"
        assert "ended during the run" in got.stderr
        res.proc.wait(30)  # killed at its k-th fault point
        assert res.proc.returncode == -9
    finally:
        res.stop()
    changed = _digest(cfg.parent) != before
    again = _analyse(cfg, 1, [])  # cold: takes over the dead run's lock, recovers, analyses
    assert again.returncode == 0, f"point {k} of {points} (changed: {changed}): {again.stderr}"
    assert _digest(cfg.parent) == _digest(ref.parent), f"point {k} of {points}"
