"""``parallel.abort``: the line a rank writes before ``MPI_Abort`` reaches mpiexec's stderr.

Hydra's proxy reads each rank's stdout and stderr pipes; a line still unread when the
rank aborts was sometimes lost (an empty stderr in CI). ``abort_job`` first waits until
the pipes are read empty.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from transfer_hosts import in_syscall
from transfer_support import wait_for

from ensio.parallel.abort import _unread, drain_output

MPIEXEC = Path(sys.executable).with_name("mpiexec")
_CLOCK_NANOSLEEP = {"x86_64": "230", "aarch64": "115"}.get(platform.machine())


def test_unread_counts_the_bytes_a_pipes_reader_has_not_read(tmp_path):
    r, w = os.pipe()
    try:
        os.write(w, b"x" * 123)
        assert _unread(w) == 123 and _unread(r) == 123  # either end of the pipe
        assert os.read(r, 100) == b"x" * 100
        assert _unread(w) == 23
        os.read(r, 100)
        assert _unread(w) == 0
    finally:
        os.close(r)
        os.close(w)
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    with open(f, "rb") as fh:
        assert _unread(fh.fileno()) == 0  # not a pipe: nothing to wait for


def test_drain_returns_once_the_reader_has_read_everything():
    """A child writes 64 KiB to its stdout pipe and drains: it sleeps in the drain's
    wait, without a word on stderr, until this test has read all of it."""
    code = ("import os, sys; from ensio.parallel.abort import drain_output\n"
            "os.write(1, b'y' * 65536); os.write(2, b'wrote\\n')\n"
            "drain_output(60.0); os.write(2, b'drained\\n')\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        assert child.stderr.readline() == b"wrote\n"
        assert _unread(child.stdout.fileno()) == 65536  # written, not read: it must wait
        if _CLOCK_NANOSLEEP is not None:
            wait_for(lambda: in_syscall(child.pid, _CLOCK_NANOSLEEP), what="the child waiting")
        assert _unread(child.stderr.fileno()) == 0  # no "drained" yet
        assert child.stdout.read(65536) == b"y" * 65536
        assert child.stderr.readline() == b"drained\n"
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    drain_output(0.0)  # this process: returns (pytest's capture is no pipe to wait on)


def test_the_line_before_abort_job_reaches_mpiexecs_stderr():
    code = ("import sys; from mpi4py import MPI; from ensio.parallel.abort import abort_job\n"
            "c = MPI.COMM_WORLD\n"
            "if c.rank == 0:\n"
            "    print('x' * 3000 + ' the reason', file=sys.stderr, flush=True)\n"
            "    abort_job(c, 3)\n"
            "c.Barrier()\n")
    for _ in range(3):
        p = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-c", code],
                           capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        assert p.returncode != 0
        assert "x" * 3000 + " the reason" in p.stderr, p.stderr[-500:]
