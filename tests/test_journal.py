"""Undo journal: exact rollback, commit, torn records, backups, crashes anywhere.

Crashes are simulated in-process by making the journal's fault hook raise at
the k-th fault point (for every k); the SIGKILL version is test_journal_kill.py.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from ensio import faults
from ensio.cli import recover as recover_cli
from ensio.durable import replacing
from ensio.errors import EnsioError
from ensio.io.txn import journal, staging
from ensio.io.txn.journal import (
    COMMITTED_NAME,
    JOURNAL_DIRNAME,
    JournalError,
    RecoveryReport,
    UndoLog,
    abort,
    commit,
    journal_root,
    recover,
)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digests(paths: list[Path]) -> list[str]:
    return [sha(p) for p in paths]


def make_files(root: Path, rng: np.random.Generator, n: int = 5) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = root / f"mem{i + 1:03d}.bin"
        p.write_bytes(rng.integers(0, 256, int(rng.integers(2000, 9000)), np.uint8).tobytes())
        paths.append(p)
    return paths


def random_ranges(rng: np.random.Generator, size: int, k: int) -> list[tuple[int, int]]:
    """k non-overlapping, non-empty [offset, length) ranges inside [0, size)."""
    cuts = np.sort(rng.choice(np.arange(1, size), 2 * k, replace=False))
    return [(int(a), int(b - a)) for a, b in zip(cuts[::2], cuts[1::2], strict=True)]


def journaled_write(log: UndoLog, path: Path, offset: int, new: bytes, form: str = "bytes"):
    """What the real writer does: save the prior bytes, then pwrite the new ones."""
    fd = os.open(path, os.O_RDWR)
    try:
        prior = os.pread(fd, len(new), offset)
        if form == "numpy":
            log.save(path, offset, np.frombuffer(prior, np.uint8))
        elif form == "memoryview":
            log.save(path, offset, memoryview(prior))
        else:
            log.save(path, offset, prior)
        os.pwrite(fd, new, offset)
    finally:
        os.close(fd)


OPEN_LOGS: list[UndoLog] = []


def drop_open_logs() -> None:
    """Close the fds of logs a simulated crash left open, as the kernel would."""
    for log in OPEN_LOGS:
        log.abandon()
    OPEN_LOGS.clear()


def scenario(root: Path, seed: int, *, library: bool, finish: str, fsync: bool = False):
    """Journal and write a 2-task analysis; return (files, prior sha, new sha).

    ``finish`` is "commit", "abort" or "none" (crash before committing).
    The last file, if ``library``, first gets raw ranges from task 1, then is
    backed up by task 0 and replaced by a rewritten copy (the library path).
    """
    rng = np.random.default_rng(seed)
    files = make_files(root, rng)
    prior = digests(files)
    logs = []
    for t in (0, 1):
        logs.append(UndoLog.create(root, t, fsync=fsync))
        OPEN_LOGS.append(logs[-1])
    forms = ("bytes", "numpy", "memoryview")
    for i, path in enumerate(files):
        size = path.stat().st_size
        for j, (off, n) in enumerate(random_ranges(rng, size, 4)):
            new = rng.integers(0, 256, n, np.uint8).tobytes()
            journaled_write(logs[j % 2], path, off, new, forms[(i + j) % 3])
        if library and i == len(files) - 1:
            logs[0].save_file(path)
            tmp = path.with_name(path.name + ".new")
            tmp.write_bytes(rng.integers(0, 256, size + 100, np.uint8).tobytes())
            os.replace(tmp, path)
            # A later raw range into the rewritten file, in the same log: recovery skips it.
            journaled_write(logs[0], path, 10, b"after-the-backup")
    new = digests(files)
    for log in logs:
        log.close()
    if finish == "commit":
        commit(root, fsync=fsync)
    elif finish == "abort":
        abort(root, fsync=fsync)
    return files, prior, new


@pytest.mark.parametrize("library", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_abort_restores_every_byte(tmp_path, seed, library):
    files, prior, new = scenario(tmp_path, seed, library=library, finish="none", fsync=True)
    assert digests(files) == new != prior
    report = abort(tmp_path)
    assert report.state == "rolled_back"
    assert report.files == len(files)
    assert report.ranges == 4 * len(files)
    assert report.missing == ()
    assert digests(files) == prior
    assert not (tmp_path / JOURNAL_DIRNAME).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in files)


def test_report_counts_bytes(tmp_path):
    path = make_files(tmp_path, np.random.default_rng(0), 1)[0]
    before = sha(path)
    with UndoLog.create(tmp_path, 0, fsync=False) as log:
        journaled_write(log, path, 5, b"x" * 100)
        journaled_write(log, path, 500, b"y" * 23)
        log.save(path, 0, b"")  # empty ranges are not journaled
    assert recover(tmp_path) == RecoveryReport("rolled_back", 1, 2, 123)
    assert sha(path) == before


def test_range_overwritten_twice_is_undone_newest_first(tmp_path):
    """A retried write journals the same bytes twice: replay must end at the oldest."""
    path = make_files(tmp_path, np.random.default_rng(1), 1)[0]
    before = sha(path)
    with UndoLog.create(tmp_path, 0, fsync=False) as log:
        journaled_write(log, path, 100, b"first" * 20)
        journaled_write(log, path, 150, b"second" * 20)
        journaled_write(log, path, 90, b"third" * 20)
    assert recover(tmp_path).ranges == 3
    assert sha(path) == before


@pytest.mark.parametrize("library", [False, True])
def test_commit_keeps_new_bytes(tmp_path, library):
    files, prior, new = scenario(tmp_path, 7, library=library, finish="commit", fsync=True)
    assert digests(files) == new
    assert not (tmp_path / JOURNAL_DIRNAME).exists()
    assert list(tmp_path.glob(JOURNAL_DIRNAME + "*")) == []
    assert recover(tmp_path).state == "clean"
    assert digests(files) == new


def test_committed_journal_is_removed_not_rolled_back(tmp_path):
    files, prior, new = scenario(tmp_path, 8, library=True, finish="none")
    (tmp_path / JOURNAL_DIRNAME / COMMITTED_NAME).touch()
    assert recover(tmp_path).state == "committed"
    assert digests(files) == new
    assert not (tmp_path / JOURNAL_DIRNAME).exists()


def test_numpy_prior_of_any_layout(tmp_path):
    path = tmp_path / "m.bin"
    path.write_bytes(bytes(range(256)) * 8)
    before = sha(path)
    a = np.arange(60, dtype=">f4").reshape(6, 10)[:, ::2]  # non-contiguous, big-endian
    fd = os.open(path, os.O_RDWR)
    with UndoLog.create(tmp_path, 0, fsync=False) as log:
        # save the current bytes as a numpy view of the same dtype/shape, then overwrite
        cur = np.frombuffer(os.pread(fd, a.nbytes, 100), dtype=">f4").reshape(a.shape)
        log.save(path, 100, cur)
        os.pwrite(fd, np.ascontiguousarray(a).tobytes(), 100)
        log.save(path, 1000, np.frombuffer(os.pread(fd, 8, 1000), "<f8").reshape(()))  # 0-d
    os.close(fd)
    assert recover(tmp_path).ranges == 2
    assert sha(path) == before


def test_recover_is_idempotent_and_clean_without_journal(tmp_path):
    assert recover(tmp_path) == RecoveryReport("clean")
    files, prior, _ = scenario(tmp_path, 4, library=True, finish="none")
    assert recover(tmp_path).state == "rolled_back"
    assert recover(tmp_path).state == "clean"
    assert digests(files) == prior


@pytest.mark.parametrize("fsync", [False, True])
def test_torn_final_record_is_ignored(tmp_path, fsync):
    """Cut the log at every byte of its last record: that record's write never began."""
    rng = np.random.default_rng(11)
    files = make_files(tmp_path / "d", rng, 2)
    prior = digests(files)
    log = UndoLog.create(tmp_path / "d", 0, fsync=fsync)
    journaled_write(log, files[0], 17, b"a" * 40)
    journaled_write(log, files[1], 3, b"b" * 30)
    logfile = tmp_path / "d" / JOURNAL_DIRNAME / "task-0.undo"
    start = logfile.stat().st_size
    log.save(files[0], 200, files[0].read_bytes()[200:209])  # crash before its pwrite
    log.close()
    full = logfile.read_bytes()
    snapshot = tmp_path / "snap"
    shutil.copytree(tmp_path / "d", snapshot)
    for cut in range(start, len(full)):
        shutil.rmtree(tmp_path / "d")
        shutil.copytree(snapshot, tmp_path / "d")
        with open(logfile, "r+b") as f:
            f.truncate(cut)
        report = recover(tmp_path / "d", fsync=False)
        assert report.ranges == 2, cut
        assert digests(files) == prior, cut
    # a corrupted (not truncated) last record is ignored as well
    shutil.rmtree(tmp_path / "d")
    shutil.copytree(snapshot, tmp_path / "d")
    logfile.write_bytes(full[:-1] + bytes([full[-1] ^ 0xFF]))
    assert recover(tmp_path / "d").ranges == 2
    assert digests(files) == prior
    if fsync:  # power loss can garble the data part of an unsynced record: the CRC sees it
        shutil.rmtree(tmp_path / "d")
        shutil.copytree(snapshot, tmp_path / "d")
        garbled = bytearray(full)
        garbled[-8] ^= 0xFF  # inside the last record's prior bytes
        logfile.write_bytes(bytes(garbled))
        assert recover(tmp_path / "d").ranges == 2
        assert digests(files) == prior


def test_torn_log_header_and_unknown_format(tmp_path):
    (tmp_path / JOURNAL_DIRNAME).mkdir()
    (tmp_path / JOURNAL_DIRNAME / "task-0.undo").write_bytes(b"ENS")
    assert recover(tmp_path) == RecoveryReport("rolled_back")
    (tmp_path / JOURNAL_DIRNAME).mkdir()
    (tmp_path / JOURNAL_DIRNAME / "task-0.undo").write_bytes(b"NOTALOG!" + bytes(64))
    with pytest.raises(JournalError, match="not an ensio undo log"):
        recover(tmp_path)


def test_backup_copy_fallback_and_cross_device_restore(tmp_path, monkeypatch):
    """Journal on another file system: backups are copies, restores copy back."""
    real_replace = os.replace

    def no_link(src, dst, **kw):
        raise OSError(errno.EXDEV, "cross-device link")

    def replace(src, dst, **kw):
        if JOURNAL_DIRNAME in str(src) and str(src).endswith(".bak"):
            raise OSError(errno.EXDEV, "cross-device link")
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(journal.os, "link", no_link)
    files, prior, new = scenario(tmp_path, 5, library=True, finish="none", fsync=True)
    baks = list((tmp_path / JOURNAL_DIRNAME).glob("*.bak"))
    assert len(baks) == 1 and baks[0].stat().st_nlink == 1
    monkeypatch.setattr(journal.os, "replace", replace)
    assert recover(tmp_path).state == "rolled_back"
    assert digests(files) == prior
    assert not list(tmp_path.glob(".*ensio-restore"))


def test_file_replaced_twice(tmp_path):
    """Two library-path rewrites of one file: recovery must end at the oldest backup."""
    path = make_files(tmp_path, np.random.default_rng(4), 1)[0]
    before = sha(path)
    with UndoLog.create(tmp_path, 0, fsync=True) as log:
        journaled_write(log, path, 0, b"raw-before")
        for version in (b"A", b"B"):
            log.save_file(path)
            path.with_name("tmp").write_bytes(version * 5000)
            os.replace(path.with_name("tmp"), path)
            journaled_write(log, path, 7, b"raw-after-" + version)
    report = recover(tmp_path)
    assert (report.files, report.ranges) == (1, 1)
    assert sha(path) == before


def test_backup_of_never_replaced_file(tmp_path):
    """Crash between save_file and the caller's replace: the hard link is the file."""
    path = make_files(tmp_path, np.random.default_rng(3), 1)[0]
    before = sha(path)
    with UndoLog.create(tmp_path, 0, fsync=False) as log:
        journaled_write(log, path, 0, b"raw-first")
        log.save_file(path)
    assert path.stat().st_nlink == 2
    report = recover(tmp_path)
    assert (report.files, report.ranges) == (1, 1)
    assert sha(path) == before and path.stat().st_nlink == 1


def test_stale_journal_refuses_new_write(tmp_path):
    UndoLog.create(tmp_path, 0, fsync=False).close()
    with pytest.raises(JournalError, match="ensio recover"):
        UndoLog.create(tmp_path, 0, fsync=False)
    UndoLog.create(tmp_path, 1, fsync=False).close()  # other tasks join the same journal
    (tmp_path / JOURNAL_DIRNAME / COMMITTED_NAME).touch()
    with pytest.raises(JournalError, match="committed"):
        UndoLog.create(tmp_path, 2, fsync=False)


def test_missing_file_is_reported(tmp_path):
    files = make_files(tmp_path, np.random.default_rng(9), 2)
    with UndoLog.create(tmp_path, 0, fsync=False) as log:
        for p in files:
            journaled_write(log, p, 1, b"zz")
    files[1].unlink()
    report = recover(tmp_path)
    assert report.missing == (str(files[1]),)
    assert report.files == 1


def test_journal_root_is_absolute_parent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert journal_root(Path("sub/mem001.nc")) == tmp_path / "sub"


class Crash(Exception):
    """Stands in for a kill at a fault point (in-process, so it is fast)."""


def crash_at(monkeypatch, k: int | None) -> list[str]:
    """Make the k-th fault point raise; return the list of labels hit."""
    hits: list[str] = []

    def point(label: str) -> None:
        hits.append(label)
        if len(hits) == k:
            raise Crash(label)

    faults.set_hook(point)
    return hits


@pytest.fixture(autouse=True)
def _no_fault_hook_left():
    yield
    faults.set_hook(None)


def test_crash_at_every_point_of_write_and_commit(tmp_path, monkeypatch):
    base = tmp_path / "base"
    files, prior, new = scenario(base, 21, library=True, finish="none")
    shutil.rmtree(base)
    hits = crash_at(monkeypatch, None)
    root = tmp_path / "d"
    scenario(root, 21, library=True, finish="commit", fsync=True)
    total, marker = len(hits), hits.index("commit-marker") + 1
    files = [root / p.name for p in files]
    for k in range(1, total + 1):
        shutil.rmtree(root)
        crash_at(monkeypatch, k)
        with pytest.raises(Crash):
            scenario(root, 21, library=True, finish="commit", fsync=True)
        drop_open_logs()
        faults.set_hook(None)
        recover(root)
        assert digests(files) == (new if k >= marker else prior), (k, hits[k - 1])
        assert [p.name for p in root.iterdir() if p.name.startswith(".ensio")] == []


def test_crash_at_every_point_of_recovery(tmp_path, monkeypatch):
    """A crash during recovery leaves a journal from which recovery finishes."""
    root = tmp_path / "d"
    files, prior, new = scenario(root, 22, library=True, finish="none")
    snapshot = tmp_path / "snap"
    shutil.copytree(root, snapshot)
    hits = crash_at(monkeypatch, None)
    recover(root)
    total = len(hits)
    assert total >= 4 * len(files) + 3
    for k in range(1, total + 1):
        for second in (None, max(1, k // 2)):  # crash once, or again in the next attempt
            shutil.rmtree(root)
            shutil.copytree(snapshot, root)
            crash_at(monkeypatch, k)
            with pytest.raises(Crash):
                recover(root)
            if second is not None:
                crash_at(monkeypatch, second)
                try:
                    recover(root)
                except Crash:
                    pass
            faults.set_hook(None)
            assert recover(root).state in ("rolled_back", "clean")
            assert digests(files) == prior, (k, second)


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ensio")
    recover_cli.add_parser(parser.add_subparsers(dest="command"))
    return recover_cli.run(parser.parse_args(argv))


def test_cli_recover(tmp_path, capsys):
    assert run_cli(["recover", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "clean: no journal\n"
    scenario(tmp_path, 30, library=False, finish="none")
    assert run_cli(["recover", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("recovered: rolled back 20 ranges (") and out.endswith(" in 5 files\n")
    UndoLog.create(tmp_path, 0, fsync=False).close()
    (tmp_path / JOURNAL_DIRNAME / COMMITTED_NAME).touch()
    assert run_cli(["recover", "--no-fsync", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "committed: analysis was complete; journal removed\n"
    with pytest.raises(EnsioError, match="nope"):
        run_cli(["recover", str(tmp_path / "nope")])


def test_cli_recover_reports_missing_files(tmp_path, capsys):
    files = make_files(tmp_path, np.random.default_rng(2), 2)
    with UndoLog.create(tmp_path, 0, fsync=False) as log:
        journaled_write(log, files[0], 0, b"q")
    files[0].unlink()
    assert run_cli(["recover", str(files[1])]) == 1  # a member file names its directory
    out, err = capsys.readouterr()
    assert out == "recovered: rolled back nothing (the journaled files no longer exist)\n"
    assert str(files[0]) in err


# --------------------------------------------------------------------------- transactions
def transaction(root: Path, seed: int, products: list[Path]) -> tuple[list[Path], list, list]:
    """A run transaction: members journaled (as ``scenario``), products staged, one commit."""
    root.mkdir(parents=True, exist_ok=True)
    products[0].parent.mkdir(exist_ok=True)
    token = staging.new_token()
    pairs = [(staging.staged_path(p, token), p) for p in products]
    journal.begin(root, pairs, fsync=True)
    files, prior, new = scenario(root, seed, library=True, finish="commit", fsync=True)
    assert (root / JOURNAL_DIRNAME).is_dir()  # the writer's commit waited for the transaction
    for i, (staged, _) in enumerate(pairs):
        with replacing(staged, label="product") as tmp:
            tmp.write_bytes(f"product {i} of {seed}".encode())
    commit(root, fsync=True, transaction=True)
    return files, prior, new


def test_transaction_crash_at_every_point(tmp_path, monkeypatch):
    """Before the marker: members prior, no product, nothing staged; after: all new."""
    products = [tmp_path / "out" / "mean.nc", tmp_path / "out" / "spread.nc"]
    hits = crash_at(monkeypatch, None)
    files, prior, new = transaction(tmp_path / "d", 7, products)
    total, marker = len(hits), hits.index("commit-marker") + 1
    assert "staged-rename" in hits and "transaction-begun" in hits
    expected = [p.read_bytes() for p in products]
    for k in range(1, total + 1):
        shutil.rmtree(tmp_path / "d")
        shutil.rmtree(tmp_path / "out")
        crash_at(monkeypatch, k)
        with pytest.raises(Crash):
            transaction(tmp_path / "d", 7, products)
        drop_open_logs()
        faults.set_hook(None)
        # the "crashed" owner is this process: recover as its successor would (force)
        report = abort(tmp_path / "d")
        done = k >= marker
        members = [tmp_path / "d" / p.name for p in files]
        if all(p.exists() for p in members):  # else: crashed before the members were made
            assert digests(members) == (new if done else prior), (k, hits[k - 1])
        # after the journal was renamed away there is nothing left to recover
        assert report.state in (("committed", "clean") if done else ("rolled_back",)), k
        if done:
            assert [p.read_bytes() for p in products] == expected
        else:
            assert not any(p.exists() for p in products)
            assert list((tmp_path / "out").iterdir()) == []  # no staged file, no temporary
        assert [p for p in (tmp_path / "d").iterdir() if p.name.startswith(".")] == []


def test_transaction_discards_temporaries_and_keeps_own_journal(tmp_path):
    products = [tmp_path / "mean.nc"]
    token = staging.new_token()
    staged = staging.staged_path(products[0], token)
    journal.begin(tmp_path, [(staged, products[0])], fsync=False)
    staged.write_bytes(b"half")
    left = staged.with_name(f".{staged.name}.ensio-tmp.99999.abcd")  # a killed writer's
    left.write_bytes(b"torn")
    assert recover(tmp_path).state == "open"  # this process's own transaction: left alone
    assert staged.exists()
    with pytest.raises(JournalError, match="stale journal"):
        journal.begin(tmp_path, [], fsync=False)
    report = abort(tmp_path)
    assert (report.state, report.staged) == ("rolled_back", 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_symlinked_product_target_stays_a_link(tmp_path):
    real = tmp_path / "store" / "mean.nc"
    real.parent.mkdir()
    real.write_bytes(b"old")
    os.chmod(real, 0o640)
    link = tmp_path / "mean.nc"
    link.symlink_to(real)
    staged = staging.staged_path(link, staging.new_token())
    assert staged.parent == real.parent
    journal.begin(tmp_path, [(staged, link)], fsync=False)
    staged.write_bytes(b"new")
    assert commit(tmp_path, fsync=False, transaction=True) == 1
    assert link.is_symlink() and real.read_bytes() == b"new"
    assert real.stat().st_mode & 0o777 == 0o640
