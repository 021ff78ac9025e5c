"""SIGKILL real ``write_ensemble`` processes at random points; recovery is all-or-nothing.

Writers (serial, and two ranks under mpiexec) are killed at a point drawn
uniformly over every fault point of the write (journal records, data writes,
library-path replace, commit), or from outside at a random moment while they
write: the child reports its fault points on a pipe, the parent sends SIGKILL
after a randomly drawn one, and a trial counts only if the kill landed
mid-write (the child died and its journal was still there); otherwise it is
drawn again. Then ``ensio recover DIR`` — or, in some trials, simply the next
read — must leave every member file entirely prior, or entirely analysis
exactly when the COMMITTED marker had been written. Never a mix.

Seeds of every random draw are printed (pytest shows them on failure).
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
from matrix import draws
from mpi4py import MPI
from seeds import draw_seed

from ensio.config import load_config
from ensio.io.modes.ensemble import read_ensemble

CHILD = Path(__file__).with_name("write_kill_child.py")
MPIEXEC = Path(sys.executable).with_name("mpiexec")
CASE = EnsembleCase(
    members=4,
    seed=9,
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


def _start(ensemble, work: Path, ranks: int, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    """A fresh copy of the prior files in ``work`` and a writer child on them."""
    _, prior_dir, _, _, _, _ = ensemble
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
    return proc, cfg


def _kill_after_point(proc: subprocess.Popen, k: int) -> None:
    """SIGKILL the child's process group once rank 0 has reported its k-th write point."""
    assert proc.stdout.readline().strip() == "ready"  # writing is about to start
    seen = 0
    for line in proc.stdout:  # ends at EOF if the child finished first
        seen += line.startswith("point ")
        if seen == k:
            break
    os.killpg(proc.pid, signal.SIGKILL)


def _check(ensemble, work: Path, cfg: Path, via_read: bool, expect: str | None = None) -> str:
    """Recover ``work`` (command or next read); all prior or all analysis, as the journal says."""
    _, _, names, prior, new, _ = ensemble
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


def _seeded(label: str) -> tuple[int, np.random.Generator]:
    seed = draw_seed(label)  # printed (pytest shows it on failure); ENSIO_TEST_SEED replays
    return seed, np.random.default_rng(seed)


@pytest.mark.parametrize("ranks", [1, 2])
def test_sigkill_at_random_fault_points(ensemble, tmp_path, ranks):
    _, _, _, _, _, counts = ensemble
    _, rng = _seeded(f"test_sigkill_at_random_fault_points[{ranks}]")
    outcomes = []
    trials = draws(10, 40) if ranks == 1 else draws(6, 16)  # ENSIO_TEST_FULL: 40 and 16
    for i in range(trials):
        rank = int(rng.integers(0, ranks))
        n = counts[ranks][rank]["count"]
        k = int(rng.integers(1, n + 1))
        labels = counts[ranks][rank]["labels"]
        # rank 0 commits; a kill after its commit marker leaves the analysis
        commit_at = labels.index("commit-marker") + 1 if "commit-marker" in labels else n + 1
        expect = "new" if k >= commit_at else "prior"
        env = _env(ENSIO_FAULT_KILL_AT=str(k), ENSIO_FAULT_RANK=str(rank))
        proc, cfg = _start(ensemble, tmp_path / f"w{i}", ranks, env)
        proc.wait(timeout=120)
        outcomes.append(_check(ensemble, tmp_path / f"w{i}", cfg, i % 4 == 3, expect))
    assert "prior" in outcomes  # kill points before the commit were hit


def test_sigkill_from_outside(ensemble, tmp_path):
    """Kill at a random moment of the write; every trial must land mid-write."""
    _, _, _, _, _, counts = ensemble
    seed, rng = _seeded("test_sigkill_from_outside")
    n_draws = 0
    trials = draws(4, 8)  # each rank count (1 and 2) at least twice; ENSIO_TEST_FULL: 8
    for i in range(trials):
        ranks = 1 + i % 2
        labels = counts[ranks][0]["labels"]  # rank 0's write points (it reports them)
        last = labels.index("commit-marker") + 1  # later, the journal is already gone
        for _attempt in range(6):
            n_draws += 1
            k = int(rng.integers(1, last + 1))
            work = tmp_path / f"x{i}"
            proc, cfg = _start(ensemble, work, ranks, _env(ENSIO_TEST_REPORT_POINTS="1"))
            _kill_after_point(proc, k)
            proc.wait(timeout=120)
            if proc.returncode != 0 and (work / ".ensio-journal").exists():
                break  # caught mid-write: the child died with its journal in place
            print(f"trial {i}: kill after point {k} landed after the write; drawn again")
        else:
            pytest.fail(f"trial {i}: 6 kills in a row landed after the write (seed {seed})")
        _check(ensemble, work, cfg, via_read=False)
    print(f"{n_draws} draws for {trials} trials")
