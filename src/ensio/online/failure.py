"""Ending a coupled job when one rank fails: never a deadlock, always a message.

Why this exists: in a coupled job every rank eventually waits for every other
one (the members' blocks meet at the filter). An exception on one rank that
simply unwinds leaves the others blocked in a collective forever (MPICH as
shipped in the mpich wheel does not notice). Two kinds of failure are told
apart:

**Agreed errors** are raised by ensio on *every* rank at the same point (a
wrong block size, a bad observation file reported by the filter): they are
ordinary exceptions; if uncaught, every rank exits with status 1 and no rank
is left waiting. They are registered here (:func:`mark_agreed`) so the hooks
below let them pass.

**Local failures** happen on some ranks only (a member's model code raises,
a bug). The failing rank prints ``ensio online: member M failed: <error>``
with its traceback on stderr and calls ``MPI_Abort`` on the world, which makes
``mpiexec`` (hydra) kill every rank within a second or so. This is done by
:class:`FailurePolicy`: its :meth:`~FailurePolicy.guard` context, its
``sys.excepthook`` (so a model script needs no try/except at all) and its
:meth:`~FailurePolicy.deadline` watchdog, a timer thread that aborts when a
rank waits longer than a configured bound (mpi4py initializes MPI with
``MPI_THREAD_MULTIPLE``, so calling ``MPI_Abort`` from that thread while the
main thread is blocked in a collective is legal). The watchdog bounds three
waits: a filter rank whose analysis failed waits for the other filter ranks
to report the same error (they never do if it failed inside one of their
collectives); a process ending without ``Ensemble.close`` waits for all ranks
to end too (``sys.exit`` in one member); and, if the user sets a
``timeout``, every ``assimilate`` call.
"""

from __future__ import annotations

import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from mpi4py import MPI

from ..parallel.abort import abort_job

__all__ = ["FailurePolicy", "is_agreed", "mark_agreed"]

#: Exceptions raised identically on every rank (weak: no leak of tracebacks).
_AGREED: weakref.WeakSet[BaseException] = weakref.WeakSet()


def mark_agreed(exc: BaseException) -> BaseException:
    """Register ``exc`` as raised on every rank (see the module docstring); returns it."""
    try:
        _AGREED.add(exc)
    except TypeError:  # not weak-referenceable: then it is treated as local (abort)
        pass
    return exc


def is_agreed(exc: BaseException) -> bool:
    """Whether ``exc`` was raised on every rank by ensio."""
    try:
        return exc in _AGREED
    except TypeError:
        return False


class FailurePolicy:
    """How the ranks of one coupled job end the job when one of them fails.

    Parameters
    ----------
    world : MPI.Comm
        The communicator aborted on failure.
    who : str
        Names this rank in messages, e.g. ``"member 3"``.
    """

    def __init__(self, world: MPI.Comm, who: str) -> None:
        self.world = world
        self.who = who
        self._previous_hook: Callable[..., object] | None = None

    # ------------------------------------------------------------------ abort

    def abort(self, reason: str, exc: BaseException | None = None, verb: str = "failed") -> None:
        """Print ``ensio online: <who> failed: <reason>`` (and the traceback), abort the job."""
        try:
            if exc is not None:
                traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            print(
                f"ensio online: {self.who} (world rank {self.world.rank}) {verb}: {reason}",
                file=sys.stderr,
                flush=True,
            )
        finally:  # the line is out of this process's pipes first (parallel/abort.py)
            abort_job(self.world, 1)

    def abort_for(self, exc: BaseException) -> None:
        """Abort for a local failure ``exc`` (see :meth:`abort`)."""
        self.abort(f"{type(exc).__name__}: {exc}", exc)

    # ------------------------------------------------------------------ guard

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Abort the whole job if the body raises on this rank (agreed errors pass through)."""
        try:
            yield
        except BaseException as exc:
            if is_agreed(exc):
                raise
            self.abort_for(exc)

    # ------------------------------------------------------------- excepthook

    def install_excepthook(self) -> None:
        """Make an uncaught local failure abort the job instead of hanging it."""
        if self._previous_hook is None:
            self._previous_hook = sys.excepthook
            sys.excepthook = self._excepthook

    def remove_excepthook(self) -> None:
        """Restore the previous hook (if ours is still the installed one)."""
        if self._previous_hook is not None and sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_hook
        self._previous_hook = None

    def _excepthook(
        self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        previous = self._previous_hook or sys.__excepthook__
        if is_agreed(exc):
            # Every rank raises it: one report (world rank 0) is enough; each
            # rank then exits with status 1 and nobody waits.
            if self.world.rank == 0:
                previous(kind, exc, tb)
            return
        self.abort_for(exc)

    # --------------------------------------------------------------- watchdog

    @contextmanager
    def deadline(
        self,
        seconds: float | None,
        what: Callable[[], str],
        verb: str = "gave up",
        exc: BaseException | None = None,
    ) -> Iterator[None]:
        """Abort the job if the body takes longer than ``seconds`` (``None``: no bound).

        ``what()`` describes the wait for the message (called only on expiry);
        ``verb`` and ``exc`` are passed on to :meth:`abort`.
        A hang guard, not a synchronization: the body normally finishes and
        the timer is cancelled.
        """
        if seconds is None:
            yield
            return
        timer = threading.Timer(
            seconds,
            lambda: self.abort(f"{what()} (waited more than {seconds:g} s)", exc, verb),
        )
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
