"""MPICH shared-memory segments that killed test jobs leave behind in ``/dev/shm``.

MPICH removes its node segment's name (``/dev/shm/mpich_shm_*``, a few MB of RAM) in
``MPI_Finalize``; ensio's own aborts remove it too (``ensio.parallel.abort``). Jobs the
tests kill on purpose (recovery, timeouts) cannot, and 5000 such files (11 GB) had piled
up on one CI machine over a few dozen runs. At the end of a test session the segments
it created that no process maps any more are removed: a segment some process maps,
or one younger than ``_MIN_AGE_S`` (a job of someone else just starting), is left.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SHM = Path("/dev/shm")
_PREFIX = "mpich_shm_"
_MIN_AGE_S = 10.0


def segments() -> set[str]:
    """The MPICH segment files now in /dev/shm."""
    try:
        return {e.name for e in os.scandir(SHM) if e.name.startswith(_PREFIX)}
    except OSError:
        return set()


def _mapped() -> set[str]:
    """Segment names some process maps (every /proc/PID/maps this user may read)."""
    names = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                names |= {line.rsplit("/", 1)[-1].split()[0] for line in f
                          if f"/dev/shm/{_PREFIX}" in line}
        except OSError:
            continue
    return names


def remove_orphans(before: set[str]) -> int:
    """Remove the segments not in ``before`` that no process maps; how many."""
    new = segments() - before
    if not new:
        return 0
    in_use = _mapped()
    removed = 0
    for name in sorted(new - in_use):
        path = SHM / name
        try:
            if time.time() - path.stat().st_mtime >= _MIN_AGE_S:
                path.unlink()
                removed += 1
        except OSError:
            continue
    return removed
