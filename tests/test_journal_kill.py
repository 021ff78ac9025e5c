"""SIGKILL a journaled in-place write anywhere: recovery gives all-prior or all-new.

A child process (journal_kill_child.py) writes a 6-file, 2-task "analysis"
through the undo journal, with one file on the library path (backup + replace).
It is killed either by itself at the k-th fault point (``ENSIO_FAULT_KILL_AT``,
k drawn uniformly over all points, counted first with ``ENSIO_FAULT_COUNT``)
or by the parent right after the child reported a drawn fault point (the
kill then lands between two points; the test asserts it landed while the
journal existed, and draws again on a miss). Then
``recover`` must leave every file entirely prior or -- exactly when the
COMMITTED marker had been written -- entirely new; never a mix.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import matrix
import numpy as np
from kill_support import KILLED, Kill, kill_in_window

from ensio.io.txn.journal import COMMITTED_NAME, JOURNAL_DIRNAME, recover

CHILD = Path(__file__).with_name("journal_kill_child.py")
N_FILES = 6


@dataclass
class Analysis:
    root: Path
    originals: Path
    plan_file: Path
    files: list[Path]
    prior: list[str]
    new: list[str]


def digests(paths: list[Path]) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def make_analysis(tmp: Path, seed: int, finish: str) -> Analysis:
    """Original and new contents of 6 member files plus the child's plan."""
    rng = np.random.default_rng(seed)
    root, originals, newdir = tmp / "members", tmp / "originals", tmp / "new"
    for d in (root, originals, newdir):
        d.mkdir()
    entries, files = [], []
    for i in range(N_FILES):
        size = int(rng.integers(20_000, 60_000))
        old = rng.integers(0, 256, size, np.uint8)
        cuts = np.sort(rng.choice(np.arange(1, size), 8, replace=False))
        ranges = [(int(a), int(b - a), j % 2) for j, (a, b) in
                  enumerate(zip(cuts[::2], cuts[1::2], strict=True))]
        library = i == N_FILES - 1
        if library:  # rewritten copy: different bytes everywhere, different size
            new = rng.integers(0, 256, size + 4096, np.uint8)
        else:
            new = old.copy()
            for a, n, _ in ranges:
                new[a:a + n] = rng.integers(0, 256, n, np.uint8)
        name = f"mem{i + 1:03d}.nc"
        (originals / name).write_bytes(old.tobytes())
        (newdir / name).write_bytes(new.tobytes())
        files.append(root / name)
        entries.append({"path": str(root / name), "new": str(newdir / name),
                        "ranges": ranges, "library": library})
    plan_file = tmp / "plan.json"
    plan_file.write_text(json.dumps({"root": str(root), "fsync": True, "tasks": 2,
                                     "finish": finish, "files": entries}))
    return Analysis(root, originals, plan_file, files,
                    digests([originals / p.name for p in files]),
                    digests([newdir / p.name for p in files]))


def reset(a: Analysis) -> None:
    for p in a.root.iterdir():  # also leftovers of the library path (*.tmp), and the
        if p.is_dir():  # journal's trash directory of a kill that missed its window
            shutil.rmtree(p)
        else:
            p.unlink()
    for p in a.files:
        shutil.copyfile(a.originals / p.name, p)


def start(a: Analysis, **env_extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENSIO_FAULT_")}
    env.update(env_extra)
    proc = subprocess.Popen([sys.executable, str(CHILD), str(a.plan_file)], env=env,
                            stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"  # imports done; writing starts now
    return proc


def finish(proc: subprocess.Popen) -> int:
    proc.stdout.close()
    return proc.wait()


def outcome(a: Analysis) -> str:
    got = digests(a.files)
    return "prior" if got == a.prior else "new" if got == a.new else f"mixed {got}"


def recover_and_check(a: Analysis, expected: str | set[str]) -> None:
    recover(a.root)
    assert outcome(a) in ({expected} if isinstance(expected, str) else expected)
    assert not list(a.root.glob(JOURNAL_DIRNAME + "*"))


def count_points(a: Analysis, tmp: Path) -> list[str]:
    """Run once to completion with fault counting on; the labels, in order."""
    reset(a)
    count_file = tmp / "count.jsonl"
    assert finish(start(a, ENSIO_FAULT_COUNT=str(count_file))) == 0
    (line,) = count_file.read_text().splitlines()
    count_file.unlink()
    labels = json.loads(line)["labels"]
    assert len(labels) == json.loads(line)["count"]
    return labels


def test_self_kill_at_random_points_of_write_and_commit(tmp_path, rng):
    a = make_analysis(tmp_path, 101, "commit")
    labels = count_points(a, tmp_path)
    assert outcome(a) == "new"
    for label in ("record-head", "record-data", "record-fsync", "backup-link",
                  "library-replace", "close-fsync", "journal-remove"):
        assert label in labels
    marker = labels.index("commit-marker") + 1  # first k after which the marker exists
    drawn = rng.integers(1, len(labels) + 1, matrix.draws(20, 60))
    ks = {1, marker - 1, marker, len(labels)} | set(drawn.tolist())
    for k in sorted(ks):
        reset(a)
        assert finish(start(a, ENSIO_FAULT_KILL_AT=str(k))) == KILLED, k
        recover_and_check(a, "new" if k >= marker else "prior")


def test_self_kill_during_rollback(tmp_path, rng):
    """The child aborts after writing; killing its rollback anywhere is harmless."""
    a = make_analysis(tmp_path, 102, "abort")
    labels = count_points(a, tmp_path)
    assert outcome(a) == "prior"
    first = labels.index("restore-backup")
    drawn = rng.integers(first, len(labels) + 1, matrix.draws(6, 12))
    ks = {first, first + 1, len(labels)} | set(drawn.tolist())
    for k in sorted(ks):
        reset(a)
        assert finish(start(a, ENSIO_FAULT_KILL_AT=str(k))) == KILLED, k
        recover_and_check(a, "prior")


def test_external_sigkill_at_random_moments(tmp_path, rng):
    """SIGKILL from outside while the journal exists; every kill is proven to land there.

    The child reports its fault points; the parent kills it right after the k-th,
    so the signal lands at an arbitrary instruction between two points, not only
    at a point as with ``ENSIO_FAULT_KILL_AT``. Eight kills are drawn over the
    write (from the journal's mkdir; counted only if the child died before the
    commit marker existed: all prior), two over the commit (counted only if the
    marker was reported and the journal's rename was not: all new). A miss is
    drawn again; kill_support.MAX_MISSES misses in a row fail.
    """
    a = make_analysis(tmp_path, 103, "commit")
    labels = count_points(a, tmp_path)
    assert outcome(a) == "new"
    jdir = a.root / JOURNAL_DIRNAME
    opened = labels.index("journal-mkdir") + 1  # the k-th point is the journal's mkdir
    marker = labels.index("commit-marker") + 1  # from this k on the marker exists
    renamed = labels.index("journal-rename")  # k <= renamed: the rename not yet reported
    draws, outcomes = 0, []

    def start_reporting() -> subprocess.Popen:
        reset(a)
        return start(a, ENSIO_TEST_REPORT_POINTS="1")

    def in_write(kill: Kill) -> bool:
        return (kill.returncode == KILLED and len(kill.labels) >= opened
                and not (jdir / COMMITTED_NAME).exists())

    def in_commit(kill: Kill) -> bool:
        return (kill.returncode == KILLED and "commit-marker" in kill.labels
                and "journal-rename" not in kill.labels)

    windows = [(in_write, opened, marker - 1, "the write (journal-mkdir .. commit marker)",
                "prior")] * 8 + [(in_commit, marker, renamed,
                                  "the commit (commit marker .. journal rename)", "new")] * 2
    for landed, low, high, what, want in windows:
        kill, n = kill_in_window(start_reporting, lambda lo=low, hi=high: int(
            rng.integers(lo, hi + 1)), landed, what)
        draws += n
        assert kill.labels == labels[:len(kill.labels)]  # the counted run's path, cut short
        rc = kill.returncode
        trash = list(a.root.glob(JOURNAL_DIRNAME + ".trash-*"))
        assert jdir.exists() or trash, kill  # the kill landed while the journal existed
        if rc == 0 or (jdir / COMMITTED_NAME).exists() or trash:
            expected: str | set[str] = "new"
        elif jdir.exists():
            expected = "prior"
        else:  # before the journal existed, or after it was removed
            expected = {"prior", "new"}
        assert expected == want, (what, kill)
        recover_and_check(a, expected)
        outcomes.append((kill.last, outcome(a)))
    print(f"{draws} draws for {len(windows)} kills in their windows; "
          f"(last point, outcome): {outcomes}")
