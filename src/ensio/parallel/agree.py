"""Collective error agreement: every rank raises the same error, nobody hangs.

Why: in a parallel read one rank may find a bad file while the others wait in
a collective; if it simply raised, the job would hang. Instead each phase ends
with :func:`raise_if_any`, so all ranks leave together with one message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from mpi4py import MPI

__all__ = [
    "ErrorNote",
    "agree",
    "all_call",
    "guard",
    "note_error",
    "raise_if_any",
    "rebuild",
    "root_call",
]

T = TypeVar("T")

#: (exception class, message) of a failure, small enough to allgather.
ErrorNote = tuple[type[BaseException], str] | None


def note_error(exc: BaseException) -> ErrorNote:
    """Turn an exception into something that can be shared with the other ranks."""
    return (type(exc), str(exc))


def guard(fn: Callable[[], object]) -> ErrorNote:
    """Run ``fn``; return its error as a note to share instead of raising mid-collective."""
    try:
        fn()
    except Exception as exc:
        return note_error(exc)
    return None


def agree(comm: MPI.Comm, note: ErrorNote) -> ErrorNote:
    """Collective: the lowest rank's error note, the same on every rank (``None`` if none).

    The one place where ranks agree on a failure; callers that must clean up
    before raising (roll back a journal, abort a coupled job) call it
    directly, the others use :func:`raise_if_any`.
    """
    return next((n for n in comm.allgather(note) if n is not None), None)


def rebuild(
    note: tuple[type[BaseException], str], fallback: type[BaseException] = RuntimeError
) -> BaseException:
    """The exception a shared note describes (``fallback`` if its class takes no message)."""
    cls, msg = note
    try:
        return cls(msg)
    except Exception:  # a class that does not take one message argument
        return fallback(f"{cls.__name__}: {msg}")


def raise_if_any(comm: MPI.Comm, note: ErrorNote) -> None:
    """Collective: if any rank noted an error, raise the lowest rank's on all ranks."""
    agreed = agree(comm, note)
    if agreed is not None:
        raise rebuild(agreed)


def root_call(comm: MPI.Comm, fn: Callable[[], T], root: int = 0) -> T:
    """Run ``fn`` on ``root`` only and broadcast its result (or its error) to all ranks."""
    result: T | None = None
    note: ErrorNote = None
    if comm.rank == root:
        try:
            result = fn()
        except Exception as exc:  # re-raised on every rank below
            note = note_error(exc)
    result, note = comm.bcast((result, note), root=root)
    if note is not None:
        raise rebuild(note)
    return result  # type: ignore[return-value]


def all_call(comm: MPI.Comm, fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank; if it fails anywhere, raise the lowest rank's error everywhere."""
    result: T | None = None
    note: ErrorNote = None
    try:
        result = fn()
    except Exception as exc:  # re-raised on every rank below
        note = note_error(exc)
    raise_if_any(comm, note)
    return result  # type: ignore[return-value]
