"""The small Veros OSSE set up once per test session, for the kill and SLURM tests.

``ensio example veros DIR --members 4 --cycles 2 --days 1`` (the size of
test_veros_osse.py; about two minutes on 2 cores, most of it Veros's start-up per run)
writes the set-up (grid, initial members, observations, ``DIR/cycle.yaml``) and its
uninterrupted analysis run ``DIR/assim``. The tests rerun ``ensio cycle DIR/cycle.yaml``
into fresh work directories and compare with ``DIR/assim``; they only read DIR.

Shared through a fixed directory under the session's base temporary directory (the
same for every module of a session, one per xdist worker), not through a fixture: a
fixture imported into two modules would be set up once per module.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import needs
import pytest

ENSIO = [sys.executable, "-m", "ensio"]
MEMBERS, CYCLES = 4, 2


def small_osse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DIR of the small OSSE of this session (run on first use)."""
    needs.venv_tool("veros")
    root = tmp_path_factory.getbasetemp() / "veros-small-osse"
    report, tmp = root / "osse.json", root.parent / "veros-small-osse.json"
    if report.exists():
        return root
    proc = subprocess.run([*ENSIO, "example", "veros", str(root), "--members", str(MEMBERS),
                           "--cycles", str(CYCLES), "--days", "1", "--spinup-days", "10",
                           "--spacing-days", "1.5", "--json", str(tmp)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tmp.rename(report)  # last: a failed set-up is run again, not reused
    return root


def cycle_argv(root: Path, workdir: Path, cycles: int, *sets: str) -> list[str]:
    """The arguments of ``ensio cycle`` that reruns the OSSE's analysis into ``workdir``."""
    argv = [str(root / "cycle.yaml"), "--workdir", str(workdir), "--cycles", str(cycles)]
    for s in sets:
        argv += ["--set", s]
    return argv


def analysis_digests(workdir: Path, cycle: int) -> dict[str, str]:
    """sha256 of every analysis restart (``memNNN.nc``, Veros HDF5) of ``cycle``."""
    d = workdir / f"cycle_{cycle:03d}" / "analysis"
    found = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(d.glob("mem*.nc"))}
    assert sorted(found) == [f"mem{m:03d}.nc" for m in range(1, MEMBERS + 1)], (d, found)
    return found
