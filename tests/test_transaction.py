"""The one transaction protocol (issue 25 item 2): every writer keeps the same promises.

Each single-process implementation of :class:`ensio.io.txn.transaction.Transaction`
is driven through the same steps on fresh random bytes: committed, the
targets hold the new bytes and nothing else is left; aborted (leaving the
``with`` block without a commit), the targets hold the old bytes; killed
after its staged writes (neither commit nor abort), its class's ``recover``
over the directory brings the targets back to the old bytes and leaves no
temporary. The expected bytes are the ones the test wrote, never read back
through the code under test. The MPI participants (the shuffle's) have their
kill matrices in tests/test_shuffle_commit.py and tests/mpi/.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from mpi4py import MPI

from ensio.durable import temporary_of
from ensio.io.node.backupworker import BackupAttempt
from ensio.io.node.placecopy import Copy, CopySet
from ensio.io.txn.commit import RunTransaction
from ensio.io.txn.shufflecommit import DirectoryJournal, ShuffleTransaction
from ensio.io.txn.staging import PartialFiles
from ensio.io.txn.transaction import Transaction


@dataclass
class Case:
    txn: Transaction
    targets: list[Path]
    write: Callable[[], None]  # the staged writes of the new bytes
    recover: Callable[[], object]  # the class's recovery of the directory


def _run(root: Path, targets: list[Path], new: list[bytes]) -> Case:
    txn = RunTransaction(root, MPI.COMM_SELF, targets, fsync=False)

    def write() -> None:
        for t, b in zip(targets, new, strict=True):
            txn.stage(t).write_bytes(b)
    # a kill of this very process is simulated: its own open journal is recovered by force
    return Case(txn, targets, write, lambda: RunTransaction.recover(root, fsync=False, force=True))


def _partial(root: Path, targets: list[Path], new: list[bytes]) -> Case:
    txn = PartialFiles(targets)

    def write() -> None:
        for t, b in zip(targets, new, strict=True):
            txn.stage(t).write_bytes(b)
    return Case(txn, targets, write, lambda: PartialFiles.recover(root))


def _copies(root: Path, targets: list[Path], new: list[bytes]) -> Case:
    src = root / "src"
    src.mkdir()
    copies = []
    for t, b in zip(targets, new, strict=True):
        (src / t.name).write_bytes(b)
        copies.append(Copy(src / t.name, t))
    txn = CopySet(copies, fsync=False, label="test-copy")
    return Case(txn, targets, lambda: txn.prepare() and None, lambda: CopySet.recover(root))


MAKERS = {"run": _run, "partial": _partial, "copies": _copies}


def _setup(tmp_path: Path, rng, kind: str) -> tuple[Case, list[bytes], list[bytes]]:
    n = int(rng.integers(1, 5))
    old = [rng.bytes(int(rng.integers(1, 4000))) for _ in range(n)]
    new = [rng.bytes(int(rng.integers(1, 4000))) for _ in range(n)]
    targets = [tmp_path / f"mem{i:03d}.nc" for i in range(n)]
    for t, b in zip(targets, old, strict=True):
        t.write_bytes(b)
    return MAKERS[kind](tmp_path, targets, new), old, new


def _leftovers(root: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(root)
                  if temporary_of(e.name) is not None or e.name.startswith(".ensio-journal"))


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_commit_puts_every_new_file_in_place(tmp_path, rng, kind):
    case, _, new = _setup(tmp_path, rng, kind)
    with case.txn as txn:
        case.write()
        txn.checkpoint()
        txn.commit()
    assert [t.read_bytes() for t in case.targets] == new
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_leaving_without_commit_aborts(tmp_path, rng, kind):
    case, old, _ = _setup(tmp_path, rng, kind)
    with pytest.raises(RuntimeError, match="stop"), case.txn:
        case.write()
        raise RuntimeError("stop")
    assert [t.read_bytes() for t in case.targets] == old
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_recover_after_a_kill_before_the_commit_rolls_back(tmp_path, rng, kind):
    case, old, _ = _setup(tmp_path, rng, kind)
    case.txn.begin()
    case.write()  # killed here: neither commit nor abort runs
    assert _leftovers(tmp_path) != []
    report = case.recover()
    assert report.state == "rolled_back"
    assert [t.read_bytes() for t in case.targets] == old
    assert _leftovers(tmp_path) == []


def test_every_writer_is_a_transaction():
    """The five writers of issue 25 and the shuffle's participant share one protocol."""
    for cls in (RunTransaction, ShuffleTransaction, DirectoryJournal, CopySet, BackupAttempt,
                PartialFiles):
        assert issubclass(cls, Transaction), cls
        assert not getattr(cls, "__abstractmethods__", None), cls

    class Half(Transaction):  # a writer that forgot its recovery cannot be made
        def begin(self): ...
        def stage(self, target): return Path(target)
        def commit(self): return 0
        def abort(self): ...

    with pytest.raises(TypeError, match="recover"):
        Half()


def test_backup_attempt_begin_clears_dead_attempts_and_keeps_the_complete_one(tmp_path):
    backup = tmp_path / "c1"
    first = BackupAttempt(backup, "aaaa", fsync=False, cycle=1, n_nodes=1, expected=0)
    first.begin()
    (first.data / ".part-00000.json").write_text(
        '{"format": "ensio-backup-1", "token": "aaaa", "node": 0, "files": []}')
    first.commit()
    assert first.marked and BackupAttempt.completed(backup)["data"] == "data-aaaa"
    dead = BackupAttempt(backup, "bbbb", fsync=False)
    dead.begin()  # then killed: its data directory stays until the next attempt
    assert dead.data.is_dir()
    BackupAttempt(backup, "cccc", fsync=False).begin()
    assert sorted(p.name for p in backup.glob("data-*")) == ["data-aaaa", "data-cccc"]
    report = BackupAttempt.recover(backup)  # cccc was killed too
    assert report.state == "rolled_back" and report.staged == 1
    assert sorted(p.name for p in backup.glob("data-*")) == ["data-aaaa"]
