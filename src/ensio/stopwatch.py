"""One stopwatch for every room that reports where its time went.

I/O statistics, analysis phases and benchmark tables all need "seconds per
named phase", accumulated over many short intervals, sometimes from two
threads (a reader thread times its reads while the main thread times the
scatter). Standard library only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["Stopwatch"]


class Stopwatch:
    """Seconds accumulated per phase name.

    Two ways to time: ``with sw("read"): ...`` adds the duration of the block
    to ``"read"``; ``sw.lap("gemm")`` adds the time since the previous lap
    (or since creation) to ``"gemm"``, for code that runs phases back to back.
    ``sw.add(name, value)`` adds any number (counts, seconds measured
    elsewhere). Thread-safe.

    Parameters
    ----------
    enabled : bool
        ``False`` makes every method a no-op (timing inside hot loops that
        nobody asked for costs a clock read per call).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._totals: dict[str, float] = {}
        self._lock = threading.Lock()
        self._last = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - t)

    def lap(self, phase: str) -> None:
        """Add the time since the previous lap (or creation) to ``phase``."""
        if self.enabled:
            now = time.perf_counter()
            self.add(phase, now - self._last)
            self._last = now

    def add(self, name: str, value: float) -> None:
        if self.enabled:
            with self._lock:
                self._totals[name] = self._totals.get(name, 0.0) + value

    def __getitem__(self, phase: str) -> float:
        """Seconds of ``phase`` (0 if it never ran)."""
        return self._totals.get(phase, 0.0)

    def as_dict(self) -> dict[str, float]:
        """A copy of all totals."""
        with self._lock:
            return dict(self._totals)

    def merge(self, other: Mapping[str, float] | Stopwatch) -> None:
        """Add another stopwatch's (or mapping's) totals to this one."""
        items = other.as_dict() if isinstance(other, Stopwatch) else dict(other)
        for k, v in items.items():
            self.add(k, v)
