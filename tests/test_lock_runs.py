"""The ensemble lock is per directory and per run (issue 25, item 7).

The ranks of one MPI run share node-local directories (one ``/local`` per
node) and may name the global directory as their local one: a lock whose
record names the taker's own run is joined, not refused; a lock of any other
live run is refused, naming it. Real processes hold the other run's lock, so
the flock is the one a separate run would hold.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ensio.locks import LOCK_NAME, EnsembleLock, Holder, LockError, run_id

SRC = str(Path(__file__).parents[1] / "src")

HOLD = """
import sys
sys.path.insert(0, {src!r})
from ensio.locks import EnsembleLock
lock = EnsembleLock({root!r}, {command!r}, run={run!r}).acquire()
print("held", flush=True)
sys.stdin.readline()
lock.release()
"""


def _holder(root: Path, command: str, run: str) -> subprocess.Popen[str]:
    """Another process holding the lock of ``root`` until its stdin gets a line."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(src=SRC, root=str(root),
                                                              command=command, run=run)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=60) == 0


def test_a_process_of_the_same_run_joins(tmp_path) -> None:
    proc = _holder(tmp_path, "ensio analyse a.yaml", "run-a")
    try:
        lock = EnsembleLock(tmp_path, "ensio analyse a.yaml", run="run-a").acquire()
        assert lock.held and lock.joined is not None and lock.joined.pid == proc.pid
        assert lock.taken_over is None
        lock.release()  # a joined lock leaves the holder's file alone
        assert not lock.held
        assert Holder.parse((tmp_path / LOCK_NAME).read_text()).pid == proc.pid
    finally:
        _stop(proc)
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.parametrize("run", ["run-b", ""])
def test_another_live_run_is_refused_and_named(tmp_path, run) -> None:
    """A different run id, or none (a lone ``ensio recover``), never joins."""
    proc = _holder(tmp_path, "ensio analyse other.yaml", "run-a")
    try:
        with pytest.raises(LockError, match=r"^members locked by `ensio analyse other.yaml` "
                                            rf"\(host \S+, pid {proc.pid}, started "):
            EnsembleLock(tmp_path, "ensio analyse mine.yaml", run=run).acquire()
        assert Holder.parse((tmp_path / LOCK_NAME).read_text()).pid == proc.pid
    finally:
        _stop(proc)


def test_a_lone_holder_is_never_joined(tmp_path) -> None:
    """A holder without a run (``ensio recover``) is refused even to a taker with one."""
    proc = _holder(tmp_path, "ensio recover", "")
    try:
        with pytest.raises(LockError, match=r"^members locked by `ensio recover`"):
            EnsembleLock(tmp_path, "ensio analyse a.yaml", run="run-a").acquire()
    finally:
        _stop(proc)


def test_the_record_names_the_run(tmp_path) -> None:
    me = run_id()
    host, pid, start = me.split(":")
    assert host and int(pid) > 0 and start.isdigit()
    with EnsembleLock(tmp_path, "ensio analyse a.yaml", run=me) as lock:
        assert lock.joined is None
        assert Holder.parse((tmp_path / LOCK_NAME).read_text()).run == me
        # the same process locking again under its run joins itself (local dir = global)
        again = EnsembleLock(tmp_path, "ensio analyse a.yaml", run=me).acquire()
        assert again.joined is not None
        again.release()
        assert (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / LOCK_NAME).exists()
