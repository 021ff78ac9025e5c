"""Ending an MPI job with ``MPI_Abort`` without losing the line that says why.

Why: under ``mpiexec`` (hydra) a rank's stdout and stderr are pipes that the launcher's
proxy reads and forwards. ``MPI_Abort`` tears the job down at once, and a line the
rank wrote just before could still sit unread in its pipe: the job then failed with an
empty stderr (seen in CI: a missing restart variable, one run in several). So before
aborting, the rank waits until the proxy has read its pipes empty (``FIONREAD`` on a
pipe counts the unread bytes, from either end), at most ``drain_s``; on a terminal,
file or socket there is nothing to wait for.

MPICH (the ``mpich`` wheel) keeps one shared-memory segment per node under
``/dev/shm/mpich_shm_*`` and removes its name in ``MPI_Finalize``; an aborted job left
it behind, a few MB of RAM each (5000 of them, 11 GB, had piled up on the CI machine).
Every rank of the job has the segment mapped by the time anything can abort, so the
name is removed before ``MPI_Abort`` (:func:`forget_shm_segments`); the memory goes
when the job's processes are gone.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import sys
import termios
import time

__all__ = ["abort_job", "drain_output", "forget_shm_segments"]

_SHM_PREFIX = "/dev/shm/mpich_shm_"


def _unread(fd: int) -> int:
    """Bytes written to pipe ``fd`` that its reader has not read (0 if not a pipe)."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return 0
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def drain_output(drain_s: float = 2.0) -> None:
    """Flush Python's streams, then wait (at most ``drain_s``) until the reader of this
    process's stdout and stderr pipes has read what was written."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    deadline = time.monotonic() + drain_s
    while any(_unread(fd) for fd in (1, 2)) and time.monotonic() < deadline:
        time.sleep(0.002)  # the launcher's proxy reads on its own schedule


def forget_shm_segments(maps: str = "/proc/self/maps") -> list[str]:
    """Remove the names of the MPICH segments this process maps (the removed paths)."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            paths = {line.split(None, 5)[5].strip() for line in f
                     if _SHM_PREFIX in line and not line.rstrip().endswith("(deleted)")}
    except (OSError, IndexError):
        return []
    removed = []
    for path in sorted(p for p in paths if p.startswith(_SHM_PREFIX)):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass  # another rank of this node removed it first
    return removed


def abort_job(comm, code: int, drain_s: float = 2.0) -> None:
    """``comm.Abort(code)`` once the output is out (:func:`drain_output`) and the node's
    MPICH segment names are removed (:func:`forget_shm_segments`); should ``MPI_Abort``
    return (MPICH's has, under load), exit with ``code``: never a hang."""
    drain_output(drain_s)
    forget_shm_segments()
    comm.Abort(code)
    os._exit(code)
