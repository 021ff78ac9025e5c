"""SIGKILL real ``write_ensemble`` processes at random points; recovery is all-or-nothing.

Writers (serial, and two ranks under mpiexec) are killed at a point drawn
uniformly over every fault point of the write (journal records, data writes,
library-path replace, commit), or from outside at a random moment. Then
``ensio recover DIR`` — or, in some trials, simply the next read — must leave
every member file entirely prior, or entirely analysis exactly when the
COMMITTED marker had been written. Never a mix.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from cases import EnsembleCase, VarCase, sha256
from mpi4py import MPI

from ensio.config import load_config
from ensio.io.ensemble import read_ensemble

CHILD = Path(__file__).with_name("write_kill_child.py")
MPIEXEC = Path(sys.executable).with_name("mpiexec")
CASE = EnsembleCase(
    members=4,
    nlat=6,
    nlon=10,
    variables=[
        VarCase("state", ("lat", "lon")),
        VarCase("t", ("lev", "lat", "lon"), "f4", "big"),
        VarCase("soil", ("lev", "lat", "lon"), mask="landmask"),
        VarCase("q", ("lat", "lon"), "f4", chunked=True),  # library path: backup + replace
    ],
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENSIO_FAULT")}
    env.update(extra)
    return env


def _cmd(cfg: Path, ranks: int) -> list[str]:
    child = [sys.executable, str(CHILD), str(cfg)]
    return child if ranks == 1 else [str(MPIEXEC), "-n", str(ranks), *child]


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory):
    """Pristine prior files, the analysis they become, and the fault-point counts."""
    root = tmp_path_factory.mktemp("kill")
    prior_dir, new_dir = root / "prior", root / "new"
    paths = CASE.write(prior_dir)
    shutil.copytree(prior_dir, new_dir)
    cfg_new = new_dir / "ensio.yaml"
    cfg_new.write_text(yaml.safe_dump(CASE.config(new_dir, fsync=False)))
    counts = {}
    for ranks in (1, 2):
        shutil.rmtree(new_dir)
        shutil.copytree(prior_dir, new_dir)
        cfg_new.write_text(yaml.safe_dump(CASE.config(new_dir, tasks=ranks)))
        count_file = root / f"count{ranks}.jsonl"
        subprocess.run(
            _cmd(cfg_new, ranks),
            env=_env(ENSIO_FAULT_COUNT=str(count_file)),
            check=True,
            capture_output=True,
            timeout=120,
        )
        lines = [json.loads(x) for x in count_file.read_text().splitlines()]
        counts[ranks] = {r["rank"]: r for r in lines}
    new = [sha256(new_dir / p.name) for p in paths]
    prior = [sha256(p) for p in paths]
    assert all(a != b for a, b in zip(new, prior, strict=True))
    return root, prior_dir, [p.name for p in paths], prior, new, counts


def _trial(
    ensemble,
    work: Path,
    ranks: int,
    env: dict[str, str],
    external_kill: bool,
    rng: np.random.Generator,
    via_read: bool,
    expect: str | None = None,
) -> str:
    root, prior_dir, names, prior, new, _ = ensemble
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(prior_dir, work)
    cfg = work / "ensio.yaml"
    cfg.write_text(yaml.safe_dump(CASE.config(work, tasks=ranks)))
    proc = subprocess.Popen(
        _cmd(cfg, ranks),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    if external_kill:
        assert proc.stdout.readline().strip() == "ready"  # writing is about to start
        # a random extra delay only moves the kill point; the check holds at any point
        try:
            proc.wait(timeout=float(rng.uniform(0.0, 0.15)))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=120)
    journal_dir = work / ".ensio-journal"
    committed = (journal_dir / "COMMITTED").exists()
    pending = journal_dir.exists() and not committed
    if via_read:
        read_ensemble(
            load_config(cfg, ["io.tasks=1"]), MPI.COMM_SELF
        )  # the next run recovers by itself
    else:
        out = subprocess.run(
            [sys.executable, "-m", "ensio", "recover", str(work)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
    got = [sha256(work / n) for n in names]
    assert not journal_dir.exists()
    assert got in (prior, new), "member files are a mix of prior and analysis"
    state = "prior" if got == prior else "new"
    if committed:
        assert state == "new"
    if pending:
        assert state == "prior"
    if expect is not None:
        assert state == expect
    return state


@pytest.mark.parametrize("ranks", [1, 2])
def test_sigkill_at_random_fault_points(ensemble, tmp_path, ranks):
    _, _, _, _, _, counts = ensemble
    rng = np.random.default_rng()
    outcomes = []
    trials = 40 if ranks == 1 else 16
    for i in range(trials):
        rank = int(rng.integers(0, ranks))
        n = counts[ranks][rank]["count"]
        k = int(rng.integers(1, n + 1))
        labels = counts[ranks][rank]["labels"]
        # rank 0 commits; a kill after its commit marker leaves the analysis
        commit_at = labels.index("commit-marker") + 1 if "commit-marker" in labels else n + 1
        expect = "new" if k >= commit_at else "prior"
        env = _env(ENSIO_FAULT_KILL_AT=str(k), ENSIO_FAULT_RANK=str(rank))
        outcomes.append(
            _trial(
                ensemble,
                tmp_path / f"w{i}",
                ranks,
                env,
                False,
                rng,
                via_read=(i % 4 == 3),
                expect=expect,
            )
        )
    assert "prior" in outcomes  # kill points before the commit were hit


def test_sigkill_from_outside(ensemble, tmp_path):
    rng = np.random.default_rng()
    for i in range(8):
        ranks = 1 + i % 2
        _trial(ensemble, tmp_path / f"x{i}", ranks, _env(), True, rng, via_read=False)
