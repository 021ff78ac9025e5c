"""Async files finished on the other hosts after the producer's close has returned.

Why: a close that waited until every other host had sealed its copy left the link
idle while the producer opened and began its next file, and the producer idle while
the link carried the last bytes: across two network namespaces the end-to-end time
was about 1.3 times one TCP stream of the bytes. In ``mode: async`` the producer's
close now returns once its own host has sealed the file (its bytes can no longer
change), and the rest of the stream runs here, in a thread per file.

What the producer still learns, and when:
- at its exit (``SETTLE``, sent by the interposer before the process's status is
  final): its exit waits until every file it closed has reached the other hosts, and
  a file that did not turns an exit status of 0 into 1, with one line on its stderr
  (as a failed close did before);
- a later ``CREATE``, ``RENAME`` or ``UNLINK`` of the same path waits for that path's
  stream first, so the other hosts see the operations in the producer's order (a new
  version never meets the old one still arriving).

A producer killed after its close has nothing to learn: its files are complete here
and go on to the other hosts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Settling"]

_FAILED_PIDS = 256   # producers whose failures are kept until they ask (oldest dropped)


@dataclass(frozen=True)
class _Pending:
    path: str
    pid: int


class Settling:
    """Streams finishing in the background, by entry id; failures by producer pid."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[int, _Pending] = {}
        self._failed: dict[int, list[str]] = {}

    def start(self, entry_id: int, path: str, pid: int,
              finish: Callable[[], str | None]) -> None:
        """Run ``finish`` (None, or the failure's one line) in a thread of its own."""
        with self._cond:
            self._pending[entry_id] = _Pending(path, pid)
        threading.Thread(target=self._run, args=(entry_id, pid, finish), daemon=True,
                         name=f"settle-{entry_id}").start()

    def _run(self, entry_id: int, pid: int, finish: Callable[[], str | None]) -> None:
        err: str | None = "the stream ended unexpectedly"
        try:
            err = finish()
        finally:
            with self._cond:
                del self._pending[entry_id]
                if err is not None:
                    self._failed.setdefault(pid, []).append(err)
                    while len(self._failed) > _FAILED_PIDS:
                        del self._failed[next(iter(self._failed))]
                self._cond.notify_all()

    def wait_paths(self, *paths: str) -> None:
        """Until no stream of ``paths`` is still finishing."""
        want = set(paths)
        with self._cond:
            self._cond.wait_for(lambda: not any(p.path in want
                                                for p in self._pending.values()))

    def wait_pid(self, pid: int) -> list[str]:
        """Until every stream of producer ``pid`` ended; the failures (then forgotten)."""
        with self._cond:
            self._cond.wait_for(lambda: not any(p.pid == pid for p in self._pending.values()))
            return self._failed.pop(pid, [])

    def wait_all(self, timeout: float) -> bool:
        """Until no stream is finishing, at most ``timeout`` seconds; True if none is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending,
                                       max(0.0, deadline - time.monotonic()))
