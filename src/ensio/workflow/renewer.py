"""Lease renewal of a worker: the thread that keeps a job's leases alive.

A worker holds up to two leases at once (the running task and the one leased
ahead). Their deadlines are short (the list's ``lease_seconds``) so that the
task of a dead job comes back soon; a live job therefore renews them in the
background, every quarter of the lease time, while its commands run. When a
renewal is refused (:class:`~ensio.workflow.leases.StaleLease`: the job was
stalled past the deadline and the task was re-leased) the lease is marked
lost and the worker is woken to stop that command without committing it.
Transient file-system errors are logged and retried at the next period.

Split out of :mod:`ensio.workflow.worker`, which only asks :meth:`Renewer.hold`,
:meth:`Renewer.drop`, :meth:`Renewer.lost` and :meth:`Renewer.valid`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .leases import Lease, StaleLease, TodoError
from .todo import TodoList

__all__ = ["Renewer"]


class Renewer(threading.Thread):
    """Renews every lease the worker holds, every quarter of the lease time."""

    def __init__(self, todo: TodoList, period: float, wake: threading.Event,
                 log: Callable[[str], None]) -> None:
        super().__init__(name="ensio-renew", daemon=True)
        self.todo, self.period, self.wake, self.log = todo, max(0.01, period), wake, log
        self._held: dict[str, Lease] = {}
        self._lost: set[int] = set()
        self._guard = threading.Lock()
        self._halt = threading.Event()

    def hold(self, lease: Lease) -> None:
        """Renew ``lease`` from now on (replaces an older lease of the same task)."""
        with self._guard:
            self._held[lease.task] = lease

    def drop(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (settled or given back); a newer lease of its task stays."""
        with self._guard:
            if self._held.get(lease.task, lease).token == lease.token:
                self._held.pop(lease.task, None)

    def lost(self, lease: Lease) -> bool:
        """Whether a renewal of ``lease`` was refused (someone else holds the task now)."""
        with self._guard:
            return lease.token in self._lost

    def valid(self, lease: Lease) -> bool:
        """Not lost and, as far as we know, not expired (e.g. after the job was stalled)."""
        with self._guard:
            current = self._held.get(lease.task, lease)
            return lease.token not in self._lost and current.deadline > time.time()

    def run(self) -> None:
        while not self._halt.wait(self.period):
            with self._guard:
                leases = list(self._held.values())
            for lease in leases:
                try:
                    renewed = self.todo.renew(lease)
                except StaleLease as exc:
                    self.log(f"lost the lease of {lease.task}: {exc}")
                    with self._guard:
                        self._lost.add(lease.token)
                        self._held.pop(lease.task, None)
                    self.wake.set()
                except (OSError, TodoError) as exc:  # transient file-system trouble: retry
                    self.log(f"renewing {lease.task} failed, retrying: {exc}")
                else:
                    with self._guard:
                        if lease.task in self._held:
                            self._held[lease.task] = renewed

    def halt(self) -> None:
        """Stop the thread and wait for it (a renewal in progress completes)."""
        self._halt.set()
        if self.is_alive():
            self.join()
