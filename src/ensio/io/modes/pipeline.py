"""The double-buffered pipeline of an I/O task: file I/O in a thread, collectives in the caller.

Reading and writing an ensemble are the same loop run in opposite directions.
For member m = 1..N_e an I/O task does a *file step* (``pread`` its rows of
file m into a buffer / ``pwrite`` a buffer into file m) and a *collective*
(scatter the buffer to its group / gather the group's rows into a buffer).
:func:`run_pipeline` overlaps the two: a worker thread does the file steps on
buffers taken from a queue of free ones while the calling thread does the
collectives, so with ``depth = 2`` file m+1 is read while file m is scattered
(or file m is written while m+1 is gathered).

Why a thread and not non-blocking collectives: MPICH (as shipped in the mpich
wheel) progresses a non-blocking scatter only inside MPI calls, so a rank busy
in ``pread`` stalls its own scatter. ``os.preadv``, numpy casts and mpi4py's
blocking calls all release the GIL, so a worker thread gives real overlap.

Errors: a file step that raises is recorded (the first one is returned) and
later file steps are skipped, but every collective still runs, so no rank of
the group waits forever; the caller then agrees on the error across ranks.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Literal

import numpy as np

from ...parallel.agree import ErrorNote, guard
from ...stopwatch import Stopwatch

__all__ = ["Scratch", "Step", "run_pipeline"]

#: One step of member ``m`` on a buffer of the group's rows.
Step = Callable[[int, np.ndarray], None]


class Scratch:
    """Reusable on-disk-dtype buffers: a fresh array per segment would cost page faults."""

    def __init__(self) -> None:
        self._bufs: dict[np.dtype, np.ndarray] = {}

    def get(self, dtype: np.dtype, n: int) -> np.ndarray:
        buf = self._bufs.get(dtype)
        if buf is None or buf.size < n:
            buf = self._bufs[dtype] = np.empty(n, dtype=dtype)
        return buf[:n]


class _FileSteps:
    """The file step with its error rule: after the first failure, skip (zero-fill on read)."""

    def __init__(self, step: Step, sw: Stopwatch, phase: str, zero_on_error: bool) -> None:
        self.step, self.sw, self.phase, self.zero = step, sw, phase, zero_on_error
        self.note: ErrorNote = None

    def __call__(self, m: int, buf: np.ndarray) -> None:
        if self.note is None:
            with self.sw(self.phase):
                self.note = guard(lambda: self.step(m, buf))
        if self.note is not None and self.zero:
            buf[...] = 0.0  # scattered all the same: defined values, error raised after


def run_pipeline(
    direction: Literal["read", "write"],
    n_members: int,
    n_rows: int,
    file_step: Step,
    collective: Step,
    sw: Stopwatch,
    depth: int = 2,
) -> ErrorNote:
    """Run ``n_members`` file steps and collectives, overlapped through ``depth`` buffers.

    Parameters
    ----------
    direction : {"read", "write"}
        ``"read"``: file step, then collective, per member; ``"write"``:
        collective, then file step.
    n_members : int
        Members m = 0 .. n_members - 1, in order.
    n_rows : int
        Length of each float64 buffer (the I/O group's rows).
    file_step, collective : callable ``(m, buf) -> None``
        The file step runs in a worker thread (timed as ``direction``), the
        collective in the calling thread (timed as ``"comm"``).
    sw : Stopwatch
        Also gets ``"wait"``: time the calling thread waits for a buffer.
    depth : int
        Buffers in flight; ``0`` is the unoverlapped reference (one buffer,
        file step and collective in turn, no thread).

    Returns
    -------
    ErrorNote
        The first file step's error, or ``None``.
    """
    files = _FileSteps(file_step, sw, direction, zero_on_error=direction == "read")

    def comm_step(m: int, buf: np.ndarray) -> None:
        with sw("comm"):
            collective(m, buf)

    first, second = (files, comm_step) if direction == "read" else (comm_step, files)
    if depth == 0:
        buf = np.empty(n_rows, dtype=np.float64)
        for m in range(n_members):
            first(m, buf)
            second(m, buf)
        return files.note
    free: queue.Queue[np.ndarray] = queue.Queue()
    handoff: queue.Queue[np.ndarray] = queue.Queue()
    for _ in range(depth):
        free.put(np.empty(n_rows, dtype=np.float64))

    def first_loop() -> None:
        for m in range(n_members):
            buf = _take(free, sw, timed=direction == "write")
            first(m, buf)
            handoff.put(buf)

    def second_loop() -> None:
        for m in range(n_members):
            buf = _take(handoff, sw, timed=direction == "read")
            second(m, buf)
            free.put(buf)

    worker, main = (first_loop, second_loop) if direction == "read" else (second_loop, first_loop)
    th = threading.Thread(target=worker, name=f"ensio-{direction}er", daemon=True)
    th.start()
    main()
    th.join()
    return files.note


def _take(q: queue.Queue[np.ndarray], sw: Stopwatch, timed: bool) -> np.ndarray:
    """The next buffer; the calling (collective) thread's waiting time goes to ``"wait"``."""
    if not timed:
        return q.get()
    with sw("wait"):
        return q.get()
