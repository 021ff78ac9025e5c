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
import time
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


def test_forget_shm_segments_removes_the_names_this_process_maps(tmp_path, monkeypatch):
    import ensio.parallel.abort as ab

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(ab, "_SHM_PREFIX", str(shm / "mpich_shm_"))
    live, gone, other = shm / "mpich_shm_ab12_0", shm / "mpich_shm_cd34_0", shm / "other"
    for p in (live, other):
        p.write_bytes(b"x")
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f00-7f01 rw-s 00000000 00:1a 42 {live}\n"
        f"7f01-7f02 rw-s 00000000 00:1a 43 {gone} (deleted)\n"
        f"7f02-7f03 rw-s 00000000 00:1a 44 {other}\n"
        "7f03-7f04 r-xp 00000000 08:01 45 /usr/lib/libc.so.6\n")
    assert ab.forget_shm_segments(str(maps)) == [str(live)]
    assert not live.exists() and other.exists()


def test_the_abort_of_an_mpi_job_leaves_no_segment_in_dev_shm():
    from shm_support import segments

    code = ("from mpi4py import MPI; from ensio.parallel.abort import abort_job\n"
            "c = MPI.COMM_WORLD; c.Barrier()\n"
            "if c.rank == 0: abort_job(c, 3)\n"
            "c.Barrier()\n")
    before = segments()
    p = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode != 0
    # other jobs on this machine may add segments meanwhile, but not ones nobody maps
    from shm_support import _mapped

    left = segments() - before - _mapped()
    assert not left, left


def test_orphan_segments_are_removed_and_live_or_young_ones_kept(tmp_path, monkeypatch):
    import shm_support

    monkeypatch.setattr(shm_support, "SHM", tmp_path)
    monkeypatch.setattr(shm_support, "_mapped", lambda: {"mpich_shm_live_0"})
    old = time.time() - 60
    for name in ("mpich_shm_orphan_0", "mpich_shm_live_0", "mpich_shm_young_0",
                 "mpich_shm_before_0"):
        (tmp_path / name).write_bytes(b"x")
        if name != "mpich_shm_young_0":
            os.utime(tmp_path / name, (old, old))
    assert shm_support.remove_orphans({"mpich_shm_before_0"}) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mpich_shm_before_0", "mpich_shm_live_0", "mpich_shm_young_0"]


def test_a_segment_this_process_maps_counts_as_mapped():
    import mmap

    from shm_support import SHM, _mapped

    path = SHM / f"mpich_shm_ensiotest{os.getpid()}_0"
    path.write_bytes(b"\0" * 4096)
    try:
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
            assert path.name in _mapped()
            m[0] = 1
        assert path.name not in _mapped()
    finally:
        path.unlink()
