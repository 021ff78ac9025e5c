"""The ensemble lock (issue 10, item 5), with real processes.

* a second ``ensio analyse`` (or ``ensio recover``) while a run holds the
  lock fails at once: exit 2, one line naming the holder; the first run then
  finishes and the files hold exactly one analysis;
* a lock left by a dead process (pid gone, pid reused, another boot) is
  taken over; several processes racing for one stale lock: exactly one wins;
* a lock of another host is never broken; a live holder is refused even
  where the flock is not held (the record decides).

The first run is held at a fault point by ``safety_child.py`` (it waits for a
line on stdin): no sleeps.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safety_support import (
    CHILD,
    ENSIO,
    analyse,
    copy_setup,
    env,
    leftovers,
    make_setup,
    member_digests,
    one_line_error,
    same_fields,
)

from ensio.locks import LOCK_NAME, EnsembleLock, LockError, process_start

SRC = str(Path(__file__).parents[1] / "src")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A prior ensemble and the files one analysis of it gives (run on a copy)."""
    root = tmp_path_factory.mktemp("lock")
    prior = make_setup(root / "prior")
    ref = copy_setup(prior, root / "ref")
    proc = analyse(ref)
    assert proc.returncode == 0, proc.stderr
    assert member_digests(ref) != member_digests(prior)  # the analysis changed the files
    return prior, ref


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(proc.stdout)
    assert not Path(f"/proc/{pid}").exists()
    return pid


def _record(**kw) -> str:
    rec = {"host": socket.gethostname(), "pid": os.getpid(),
           "pid_start": process_start(os.getpid()), "boot_id": _boot_id(),
           "started": "2020-01-01T00:00:00Z", "command": "ensio analyse old.yaml"}
    rec.update(kw)
    return json.dumps(rec) + "\n"


def test_second_run_fails_at_once_naming_the_holder(reference, tmp_path):
    prior, ref = reference
    s = copy_setup(prior, tmp_path / "w")
    first = subprocess.Popen(
        [sys.executable, str(CHILD), "analyse", str(s.config)],
        env=env(ENSIO_TEST_PAUSE_AT="data-write:3"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        paused = first.stdout.readline().split()
        assert paused[:2] == ["paused", "data-write"], (paused, first.stderr.read())
        pid = paused[2]
        during = member_digests(s)  # the first run is half-way through its member writes
        second = analyse(s)
        one_line_error(second, "locked by", f"analyse {s.config}`", f"pid {pid}",
                       f"host {socket.gethostname()}", "started ", LOCK_NAME)
        rec = subprocess.run([*ENSIO, "recover", str(s.root)], capture_output=True, text=True,
                             timeout=60, env=env())
        one_line_error(rec, "locked by", f"pid {pid}")
        assert member_digests(s) == during  # neither touched a byte (no recovery either)
        first.stdin.write("\n")
        first.stdin.flush()
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    assert member_digests(s) == member_digests(ref)  # exactly one analysis
    for a, b in zip(s.products, ref.products, strict=True):
        assert same_fields(a, b)
    assert leftovers(s.root) == []


@pytest.mark.parametrize("how", ["dead pid", "pid reused", "other boot"])
def test_stale_lock_is_taken_over(reference, tmp_path, how):
    prior, ref = reference
    s = copy_setup(prior, tmp_path / "w")
    record = {
        "dead pid": lambda: _record(pid=_dead_pid(), pid_start=12345),
        "pid reused": lambda: _record(pid_start=process_start(os.getpid()) + 1),
        "other boot": lambda: _record(pid=1, pid_start=process_start(1),
                                      boot_id="00000000-0000-0000-0000-000000000000"),
    }[how]()
    (s.root / LOCK_NAME).write_text(record)
    proc = analyse(s)
    assert proc.returncode == 0, proc.stderr
    assert "took over the stale lock of `ensio analyse old.yaml`" in proc.stderr
    assert member_digests(s) == member_digests(ref)
    assert leftovers(s.root) == []  # the lock is gone with its run


@pytest.mark.parametrize("how", ["other host", "live process without flock"])
def test_live_or_foreign_lock_is_refused(reference, tmp_path, how):
    prior, _ = reference
    s = copy_setup(prior, tmp_path / "w")
    record = _record(host="far-away.invalid") if how == "other host" else _record()
    lock = s.root / LOCK_NAME
    lock.write_text(record)
    before = member_digests(s)
    line = one_line_error(analyse(s), "locked by", "`ensio analyse old.yaml`",
                          f"pid {os.getpid()}", "started 2020-01-01T00:00:00Z")
    if how == "other host":
        assert "host far-away.invalid" in line and f"rm {lock}" in line
    assert member_digests(s) == before
    assert lock.read_text() == record  # never broken
    assert not s.out.exists()


RACER = """
import sys
sys.path.insert(0, {src!r})
from ensio.locks import EnsembleLock, LockError
lock = EnsembleLock({root!r}, "racer")
print("ready", flush=True)
sys.stdin.readline()
try:
    lock.acquire()
    print("won", flush=True)
except LockError as exc:
    print("lost", exc, flush=True)
sys.stdin.readline()
lock.release()
"""


def test_racing_for_a_stale_lock_exactly_one_wins(tmp_path):
    """Four processes released together onto one stale lock, ten rounds."""
    for round_ in range(10):
        root = tmp_path / f"r{round_}"
        root.mkdir()
        (root / LOCK_NAME).write_text(_record(pid=_dead_pid(), pid_start=1))
        code = RACER.format(src=SRC, root=str(root))
        procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True) for _ in range(4)]
        try:
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
            for p in procs:  # as close together as the pipes allow
                p.stdin.write("go\n")
                p.stdin.flush()
            results = [p.stdout.readline().split()[0] for p in procs]
            assert results.count("won") == 1, results
            holder = json.loads((root / LOCK_NAME).read_text())
            winner = procs[results.index("won")]
            assert holder["pid"] == winner.pid and holder["command"] == "racer"
            for p in procs:
                p.stdin.write("\n")
                p.stdin.flush()
                p.wait(timeout=30)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        assert sorted(os.listdir(root)) == []  # winner released; no temporaries


def test_lock_in_process_and_release(tmp_path):
    """Two lock objects of one process exclude each other (one flock per open file)."""
    first = EnsembleLock(tmp_path, "first").acquire()
    with pytest.raises(LockError, match=r"locked by `first` \(host .*, pid \d+, started "):
        EnsembleLock(tmp_path, "second").acquire()
    assert first.taken_over is None
    first.release()
    first.release()  # idempotent
    assert not (tmp_path / LOCK_NAME).exists()
    with EnsembleLock(tmp_path, "third") as third:
        assert json.loads((tmp_path / LOCK_NAME).read_text())["command"] == "third"
        assert third.held
    assert os.listdir(tmp_path) == []
