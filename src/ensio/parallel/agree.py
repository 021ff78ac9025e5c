"""Collective error agreement: every rank raises the same error, nobody hangs.

Why: in a parallel read one rank may find a bad file while the others wait in
a collective; if it simply raised, the job would hang. Instead each phase ends
with :func:`raise_if_any`, so all ranks leave together with one message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from mpi4py import MPI

__all__ = ["ErrorNote", "all_call", "note_error", "raise_if_any", "root_call"]

T = TypeVar("T")

#: (exception class, message) of a failure, small enough to allgather.
ErrorNote = tuple[type[BaseException], str] | None


def note_error(exc: BaseException) -> ErrorNote:
    """Turn an exception into something that can be shared with the other ranks."""
    return (type(exc), str(exc))


def raise_if_any(comm: MPI.Comm, note: ErrorNote) -> None:
    """Collective: if any rank noted an error, raise the lowest rank's on all ranks."""
    notes = comm.allgather(note)
    for n in notes:
        if n is not None:
            cls, msg = n
            raise cls(msg)


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
        cls, msg = note
        raise cls(msg)
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
