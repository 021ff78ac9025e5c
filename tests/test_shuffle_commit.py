"""``io.mode: shuffle`` commits atomically across local directories (issue 13).

Every test runs real ``ensio analyse`` / ``ensio recover`` processes, the
analysis under ``mpiexec -n 2`` (2 members x 1 tile) and ``-n 4`` (2 members x
2 tiles): one local directory per rank, so a run writes several directories.
It is SIGKILLed at a fault point of its commit (``ENSIO_FAULT_KILL_AT`` on one
rank; mpiexec then ends the others):

* after every directory is prepared, before the decision (the run-record
  entry): every directory rolls back to the prior bytes, bitwise;
* after the decision, before the local journals go: every directory rolls
  forward, bitwise equal to an uninterrupted run (which a rerun then calls
  "already analysed");
* while the journals are dropped (some gone, some not): the same.

Recovery is either ``ensio recover LOCAL_DIR`` (one directory at a time, so
some are recovered while others still hold their journal) or the next run.
The expected files come from an uninterrupted run on a fresh copy and from
the prior, never from the run under test; the analysis itself is checked
against ``files`` mode in tests/mpi/test_shuffle_commit_mpi.py.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matrix import draws
from safety_support import env
from shuffle_commit_support import ShuffleCase, make_shuffle_case

from ensio.io.txn import journal
from ensio.io.txn.runrecord import RUNS_NAME
from ensio.io.txn.shufflejournal import ShuffleMarker
from ensio.io.txn.undolog import UndoLog

ENSIO = [sys.executable, "-m", "ensio"]
MPIEXEC = Path(sys.executable).with_name("mpiexec")
JOURNAL = ".ensio-journal"


def analyse(case: ShuffleCase, ranks: int, *args: str, **extra: str) -> subprocess.CompletedProcess:
    cmd = [str(MPIEXEC), "-n", str(ranks), *ENSIO, "analyse", str(case.config), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env(**extra))


def recover(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*ENSIO, "recover", str(path)], capture_output=True, text=True,
                          timeout=120, env=env())


def copy_case(case: ShuffleCase, root: Path) -> ShuffleCase:
    shutil.copytree(case.root, root)
    return dataclasses.replace(case, root=root)


def record_lines(case: ShuffleCase) -> list[dict]:
    path = case.global_dir / RUNS_NAME
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@dataclasses.dataclass(frozen=True)
class Baseline:
    prior: ShuffleCase
    prior_digests: list[str]
    after_digests: list[str]  # an uninterrupted run
    labels: dict[int, list[str]]  # fault points of an uninterrupted run, per rank


def _baseline(root: Path, ranks: int, fsync: bool) -> Baseline:
    prior = make_shuffle_case(root / "prior", ranks, fsync=fsync)
    work = copy_case(prior, root / "count")
    count = root / "count.jsonl"
    proc = analyse(work, ranks, ENSIO_FAULT_COUNT=str(count))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("observations:"), proc.stdout
    assert work.digests() != prior.digests()
    assert work.leftovers() == []
    labels = {r["rank"]: r["labels"] for r in map(json.loads, count.read_text().splitlines())}
    assert {"shuffle-prepared", "shuffle-decided", "shuffle-dropped"} <= set(labels[0])
    return Baseline(prior, prior.digests(), work.digests(), labels)


@pytest.fixture(scope="module")
def baselines(tmp_path_factory):
    root = tmp_path_factory.mktemp("shufcommit")
    return {ranks: _baseline(root / f"n{ranks}", ranks, False) for ranks in (2, 4)}


def _kill(case: ShuffleCase, ranks: int, rank: int, k: int, label: str) -> None:
    proc = analyse(case, ranks, ENSIO_FAULT_KILL_AT=str(k), ENSIO_FAULT_RANK=str(rank))
    assert proc.returncode != 0, f"not killed at point {k} ({label}) of rank {rank}"


def _journals(case: ShuffleCase) -> list[bool]:
    return [(d / JOURNAL).is_dir() for d in case.locals]


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("label", ["shuffle-prepared", "shuffle-decided", "shuffle-dropped"])
@pytest.mark.parametrize("how", ["cli", "rerun"])
def test_kill_in_the_commit_ends_every_directory_on_one_side(baselines, tmp_path, ranks,
                                                            label, how):
    base = baselines[ranks]
    case = copy_case(base.prior, tmp_path / "w")
    k = base.labels[0].index(label) + 1
    _kill(case, ranks, 0, k, label)
    decided = label != "shuffle-prepared"
    assert len(record_lines(case)) == int(decided)
    if label == "shuffle-dropped":  # rank 0 dropped its own directory's journal
        assert not _journals(case)[0]
    else:  # every directory prepared, none dropped
        assert all(_journals(case)), _journals(case)
    want = base.after_digests if decided else base.prior_digests
    if how == "cli":
        first = recover(case.locals[0])
        assert first.returncode == 0, first.stderr
        if label != "shuffle-dropped":
            side = "committed: analysis was complete (shuffle transaction" if decided else \
                "recovered: rolled back"
            assert first.stdout.startswith(side), first.stdout
            assert case.digests()[0] == want[0]
            assert not _journals(case)[0] and all(_journals(case)[1:])  # one side, one by one
        for d in case.locals[1:]:
            out = recover(d)
            assert out.returncode == 0, out.stderr
        assert case.digests() == want  # every directory on the same side, bitwise
        # the dead run's local locks were taken over and released (its global lock goes
        # with the next run, or with a recovery that had to read the record)
        assert [p for p in case.leftovers() if not p.startswith(str(case.global_dir))] == []
    proc = analyse(case, ranks)  # the next run recovers whatever is left, then decides
    assert proc.returncode == 0, proc.stderr
    if decided:
        assert proc.stdout.startswith("already analysed:"), proc.stdout
    else:
        assert proc.stdout.startswith("observations:"), proc.stdout
    assert case.digests() == base.after_digests  # exactly one analysis, bitwise
    assert len(record_lines(case)) == 1
    assert case.leftovers() == []


def test_kill_while_writing_the_diag_file_leaves_no_temporary(baselines, tmp_path):
    """Killed between the diag file's temporary and its rename (before the transaction):
    nothing changed, and the next run removes the dead run's temporary and analyses once."""
    base = baselines[2]
    case = copy_case(base.prior, tmp_path / "w")
    k = base.labels[0].index("diagnostics-written") + 1
    _kill(case, 2, 0, k, "diagnostics-written")
    assert case.digests() == base.prior_digests and record_lines(case) == []
    assert any(".ensio-tmp." in p for p in case.leftovers()), case.leftovers()
    proc = analyse(case, 2)
    assert proc.returncode == 0, proc.stderr
    assert case.digests() == base.after_digests
    assert case.leftovers() == []


@pytest.mark.parametrize("ranks,fsync,trials", [(2, True, 4), (4, False, 3)])
def test_kill_anywhere_leaves_all_prior_or_all_analysed(baselines, tmp_path_factory, rng,
                                                        ranks, fsync, trials):
    """SIGKILL at a fault point drawn over a whole run on a random rank: after ``ensio
    recover`` of every local directory, all tiles are prior or all analysed; a rerun
    gives one analysis. With fsync the fault points differ: own baseline."""
    root = tmp_path_factory.mktemp(f"anywhere{ranks}")
    base = _baseline(root / "base", ranks, fsync) if fsync else baselines[ranks]
    seen = []
    for i in range(draws(2, trials)):  # ENSIO_TEST_FULL: ``trials`` draws
        rank = int(rng.integers(0, ranks))
        labels = base.labels[rank]
        k = int(rng.integers(1, len(labels) + 1))
        case = copy_case(base.prior, root / f"t{i}")
        _kill(case, ranks, rank, k, labels[k - 1])
        for d in case.locals:
            out = recover(d)
            assert out.returncode == 0, (k, labels[k - 1], out.stderr)
        state = case.digests()
        assert state in (base.prior_digests, base.after_digests), (rank, k, labels[k - 1])
        seen.append(f"{rank}:{labels[k - 1]}" + ("*" if state == base.after_digests else ""))
        proc = analyse(case, ranks)
        assert proc.returncode == 0, proc.stderr
        assert case.digests() == base.after_digests, (rank, k, labels[k - 1])
        assert case.leftovers() == [], (rank, k, labels[k - 1])
    print("killed at (rank:label, * committed):", seen)


# --------------------------------------------------------------- recovery of one directory
def _journaled_local(tmp_path: Path, global_root: Path) -> tuple[Path, Path, bytes, bytes]:
    """A local directory whose tile was overwritten under a shuffle journal (no decision)."""
    local = tmp_path / "local"
    local.mkdir()
    tile = local / "mem001_0000.nc"
    prior = np.arange(64, dtype=np.uint8).tobytes()
    tile.write_bytes(prior)
    ShuffleMarker("t" * 32, str(global_root)).write(local / JOURNAL, fsync=False)
    undo = UndoLog.create(local, 0, fsync=False)
    undo.save(tile, 8, prior[8:24])
    undo.close()
    with open(tile, "r+b") as f:
        f.seek(8)
        f.write(b"\xff" * 16)
    return local, tile, prior, tile.read_bytes()


def test_recover_with_unreachable_global_directory_changes_nothing(tmp_path):
    gone = tmp_path / "global"
    local, tile, prior, new = _journaled_local(tmp_path, gone)
    out = recover(local)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(gone) in lines[0] and "not reachable" in lines[0], out.stderr
    assert tile.read_bytes() == new and (local / JOURNAL).is_dir()
    gone.mkdir()  # reachable, no record of the transaction: roll back
    out = recover(local)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("recovered: rolled back 1 range (16 B) in 1 file")
    assert "is not in the global run record" in out.stdout
    assert tile.read_bytes() == prior and not (local / JOURNAL).exists()


def test_recover_rolls_forward_when_the_record_holds_the_transaction(tmp_path):
    glob = tmp_path / "global"
    glob.mkdir()
    local, tile, _, new = _journaled_local(tmp_path, glob)
    (glob / RUNS_NAME).write_text(json.dumps({"key": "k", "txid": "t" * 32}) + "\n")
    out = recover(local)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("committed: analysis was complete (shuffle transaction")
    assert tile.read_bytes() == new and not (local / JOURNAL).exists()


def test_recover_refuses_while_a_live_run_holds_the_global_lock(tmp_path):
    """A run between prepare and decision holds the global lock: recovery must not decide."""
    glob = tmp_path / "global"
    glob.mkdir()
    local, tile, _, new = _journaled_local(tmp_path, glob)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from ensio.locks import EnsembleLock; "
         f"lock = EnsembleLock({str(glob)!r}, 'ensio analyse live.yaml').acquire(); "
         "print('locked', flush=True); sys.stdin.read(); lock.release()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env())
    try:
        assert holder.stdout.readline().strip() == "locked"  # the pipe is the synchronisation
        out = recover(local)
        assert out.returncode == 2, out.stdout
        assert "members locked by `ensio analyse live.yaml`" in out.stderr
        assert tile.read_bytes() == new and (local / JOURNAL).is_dir()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert holder.returncode == 0
    assert recover(local).returncode == 0
    assert not (local / JOURNAL).exists()


def test_journal_without_marker_is_unchanged_behaviour(tmp_path):
    """An ordinary (files-mode) journal still rolls back without a COMMITTED marker."""
    local = tmp_path / "d"
    local.mkdir()
    f = local / "m.nc"
    f.write_bytes(b"a" * 32)
    undo = UndoLog.create(local, 0, fsync=False)
    undo.save(f, 0, b"a" * 4)
    undo.close()
    f.write_bytes(b"b" * 4 + b"a" * 28)
    report = journal.recover(local, fsync=False)
    assert report.state == "rolled_back" and report.transaction == ""
    assert f.read_bytes() == b"a" * 32


