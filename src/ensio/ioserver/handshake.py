"""The setup handshake of server mode: every rank's verdict, one line, no hang.

Why a module of its own: an error found while starting (a bad config on the
server ranks, an attached/sync config given to ``ensio ioserver``, a bad
environment on a C client, a plan that cannot be made) used to end only the
rank that found it, while the others waited forever in the first collective.
Here every rank takes part in the same ``MPI_Allgather`` whatever it found
(:class:`~.protocol.Status` words), so every rank learns that the setup failed
and who failed; the reason travels as text from the lowest failed rank, one
rank prints it, all meet in a barrier (the line is out before any exit) and
all end with :class:`SetupFailed`. The C client (``csrc/ensio_ioclient.c``)
does the same steps; the protocol module's docstring is the reference.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import numpy as np
from mpi4py import MPI

from ..errors import ConfigError, EnsioError
from .protocol import TAG_TABLE, VERDICT_ERROR, IOServerError, Status

__all__ = ["SetupFailed", "exchange_status", "fail_setup", "announce", "one_line",
           "LINE_PREFIX"]

#: The start of the one line a failed setup prints (C and Python alike).
LINE_PREFIX = "ensio ioserver: error: "


class SetupFailed(IOServerError):
    """The job's setup failed (on this rank or another); every rank raises it.

    ``printed`` is True when the line is out (printed by this or another
    rank): the caller must not print it again, only exit non-zero.
    """

    def __init__(self, text: str, printed: bool) -> None:
        super().__init__(text)
        self.printed = printed


def one_line(exc: BaseException) -> str:
    """An exception as the one line the job prints (whitespace collapsed)."""
    text = " ".join(str(exc).split())
    return text if isinstance(exc, EnsioError | ConfigError) else f"{type(exc).__name__}: {text}"


def exchange_status(world: MPI.Comm, server: bool, problem: str | None) -> np.ndarray:
    """Step 1 of the protocol: every rank's :class:`Status` word (collective).

    Raises :class:`SetupFailed` on every rank when any rank's ``problem`` is set.
    """
    mine = np.array([(Status.SERVER if server else 0) | (Status.ERROR if problem else 0)],
                    dtype=np.intc)
    states = np.zeros(world.size, dtype=np.intc)
    world.Allgather([mine, MPI.INT], [states, MPI.INT])
    if (states & Status.ERROR).any():
        fail_setup(world, states, problem)
    return states


def fail_setup(world: MPI.Comm, states: np.ndarray, problem: str | None) -> NoReturn:
    """Some rank's setup failed: its reason to everyone, one line, then raise everywhere."""
    src = int(np.flatnonzero(states & Status.ERROR)[0])
    comm = world.Dup()
    if world.rank == src:
        assert problem is not None
        msg = bytearray((VERDICT_ERROR + problem).encode())
        MPI.Request.Waitall([comm.Isend([msg, MPI.CHAR], dest=r, tag=TAG_TABLE)
                             for r in range(world.size) if r != src])
        text = problem
    else:
        status = MPI.Status()
        comm.Probe(source=src, tag=TAG_TABLE, status=status)
        buf = bytearray(status.Get_count(MPI.CHAR))
        comm.Recv([buf, MPI.CHAR], source=src, tag=TAG_TABLE)
        text = buf.decode(errors="replace").removeprefix(VERDICT_ERROR)
    comm.Free()
    announce(world, states, src, text)


def announce(world: MPI.Comm, states: np.ndarray, src: int, text: str) -> NoReturn:
    """Print ``text`` once and raise :class:`SetupFailed` on every rank (collective).

    The printer is the lowest C client (its model's log is where a modeller
    looks), else ``src`` when it is a server; a Python model rank that failed
    itself raises without printing (its program reports its exceptions).
    """
    printers = np.flatnonzero(states & Status.PRINTS)
    printer = int(printers[0]) if printers.size else (
        src if states[src] & Status.SERVER else None)
    if world.rank == printer:
        print(LINE_PREFIX + text, file=sys.stderr, flush=True)
    world.Barrier()
    raise SetupFailed(text, printed=printer is not None)
