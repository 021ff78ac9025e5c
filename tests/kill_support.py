"""Kills from outside that prove where they landed.

A random sleep before ``os.kill`` says nothing about where the kill lands: in the
child's start-up, mid-write, or after it already exited (instrumented, most such
kills in this suite missed the window their test named, and the tests passed
anyway). Here the child reports every fault point it reaches (a line
``point LABEL`` on stdout, written by :func:`ensio.faults.set_hook` before the
child goes on), the parent SIGKILLs it right after the k-th report and then reads
every point the child reported before it died. The kill landed after the last
reported point and before the next one: a test can assert that this is inside
its window, and draw again when it is not (the child outran the signal), failing
after :data:`MAX_MISSES` misses in a row.

The child side is two lines (see journal_kill_child.py): if
``ENSIO_TEST_REPORT_POINTS`` is set, install a hook that ``os.write``\\ s the label to
fd 1 (unbuffered and atomic on a pipe, so a report is never lost in a buffer
when the kill lands; safe from worker threads).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

#: The environment variable that makes a child report its fault points on stdout.
REPORT_ENV = "ENSIO_TEST_REPORT_POINTS"
#: Draws in a row that may miss their window before the test fails.
MAX_MISSES = 5
KILLED = -signal.SIGKILL


@dataclass(frozen=True)
class Kill:
    """One SIGKILL sent after the child's ``k``-th reported point."""

    k: int
    returncode: int
    labels: list[str]  # every point the child reported before it died, in order

    @property
    def last(self) -> str | None:
        """The last point the child reached: the kill landed after it, before the next."""
        return self.labels[-1] if self.labels else None


def kill_after_point(proc: subprocess.Popen, k: int) -> Kill:
    """SIGKILL ``proc`` as soon as it has reported its ``k``-th point; reap it.

    ``proc`` must have been started with binary ``stdout=PIPE`` and ``REPORT_ENV``
    set, and must not have been waited for (so its pid cannot have been reused).
    If it ends before reporting ``k`` points, the kill finds a zombie and the
    return code shows the child's own exit.
    """
    labels: list[str] = []
    for line in proc.stdout:  # ends at EOF if the child finished first
        if line.startswith(b"point "):
            labels.append(line[6:].decode().strip())
            if len(labels) == k:
                break
    os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read()  # what it reported between our read and its death
    labels += [ln[6:].decode().strip() for ln in rest.splitlines() if ln.startswith(b"point ")]
    proc.stdout.close()
    return Kill(k, proc.wait(), labels)


def kill_in_window(start: Callable[[], subprocess.Popen], draw: Callable[[], int],
                   landed: Callable[[Kill], bool], what: str) -> tuple[Kill, int]:
    """Start a child and kill it after a drawn point until the kill lands in the window.

    ``start`` starts a fresh child (resetting whatever the previous attempt left),
    ``draw`` draws k, ``landed`` says whether a kill is inside the window ``what``.
    Returns the landed kill and the number of draws it took; fails the test after
    :data:`MAX_MISSES` misses in a row (the window is then too short for the signal
    to land in it, which a test must be told about rather than pass without a kill).
    """
    for attempt in range(1, MAX_MISSES + 1):
        kill = kill_after_point(start(), draw())
        if landed(kill):
            return kill, attempt
        print(f"kill after point {kill.k} missed {what} (exit {kill.returncode}, last point "
              f"{kill.last!r} of {len(kill.labels)}); drawn again")
    pytest.fail(f"{MAX_MISSES} kills in a row missed {what}")


def _state(pid: int) -> str | None:
    """The one-letter state of ``pid`` in /proc (None if it is gone)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def stop(pid: int, timeout: float = 30.0) -> bool:
    """SIGSTOP ``pid`` and wait until it really is stopped; False if it is gone (or a zombie).

    ``kill`` returns before the target stops (it may run on briefly on another
    core), so a state read right after a bare SIGSTOP proves nothing; one read
    after this returns True holds until SIGCONT or SIGKILL.
    """
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while (state := _state(pid)) not in ("T", "t", None, "Z", "X"):
        if time.monotonic() > deadline:
            pytest.fail(f"pid {pid} did not stop within {timeout} s (state {state})")
    return state in ("T", "t")
