"""Fault points: the one place where crash tests stop a process mid-step.

Every step after which a crash must be survivable (a journal record, a data
write, a rename of the to-do list, ...) calls :func:`point` with a label.
In production this costs one test of a module flag. Crash tests use it in two
ways:

* **Across processes** (environment, read once at import):
  ``ENSIO_FAULT_KILL_AT=k`` SIGKILLs the process at its k-th point;
  ``ENSIO_FAULT_COUNT=<file>`` appends ``{"rank", "count", "labels"}`` as one
  JSON line at exit (so a test can first count the points of a run, then kill
  at a uniformly drawn one); ``ENSIO_FAULT_RANK=r`` limits both to MPI rank r.
* **In process**: :func:`set_hook` (or the :func:`hooked` context manager)
  installs a function called with every label, e.g. one that raises or kills
  at a chosen step.

Standard library only: worker jobs import it at start-up.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["active", "hooked", "point", "set_hook"]

_RANK = next((int(os.environ[v]) for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
              if os.environ.get(v, "").isdigit()), 0)
_KILL_AT = int(os.environ.get("ENSIO_FAULT_KILL_AT") or 0)
_COUNT_FILE = os.environ.get("ENSIO_FAULT_COUNT") or None
_ENV_ACTIVE = bool(_KILL_AT or _COUNT_FILE) and (
    os.environ.get("ENSIO_FAULT_RANK", "") in ("", str(_RANK)))
_labels: list[str] = []
_hook: Callable[[str], None] | None = None


def point(label: str) -> None:
    """A survivable step has just completed; a crash test may stop the process here."""
    if _hook is not None:
        _hook(label)
    if _ENV_ACTIVE:
        _labels.append(label)
        if len(_labels) == _KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)


def active() -> bool:
    """True while a crash test watches the points (steps may then be split finer)."""
    return _ENV_ACTIVE or _hook is not None


def set_hook(fn: Callable[[str], None] | None) -> None:
    """Install (or with ``None`` remove) the in-process hook called at every point."""
    global _hook
    _hook = fn


@contextmanager
def hooked(fn: Callable[[str], None]) -> Iterator[None]:
    """Call ``fn`` at every point inside the ``with`` block."""
    previous = _hook
    set_hook(fn)
    try:
        yield
    finally:
        set_hook(previous)


def _report() -> None:
    line = json.dumps({"rank": _RANK, "count": len(_labels), "labels": _labels}) + "\n"
    with open(_COUNT_FILE, "a") as f:  # one small O_APPEND write per process
        f.write(line)


if _ENV_ACTIVE and _COUNT_FILE:
    atexit.register(_report)
