"""Communicator groups: the only place where ensio splits communicators.

Why one place: every layer (I/O, analysis, online coupling) must agree on who
is an I/O task and which ranks it serves; computing that twice invites hangs.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpi4py import MPI

from .distribution import block_distribution

__all__ = ["CommGroups", "IOGroups", "io_groups", "serial_comm"]


def serial_comm() -> MPI.Comm:
    """The communicator of a plain one-process run (no mpiexec needed)."""
    return MPI.COMM_SELF


@dataclass(frozen=True)
class IOGroups:
    """Which filter ranks are I/O tasks and which compute ranks each serves.

    The N_mpi filter ranks are cut into N_io contiguous groups
    (``block_distribution(N_mpi, N_io, t)``); the first rank of group t is
    I/O task t. Because rows are distributed in contiguous blocks over ranks,
    group t owns one contiguous row range of the state vector.

    Attributes
    ----------
    n_io : int
        Number of I/O tasks.
    group : int
        The group (= I/O task index) of this rank.
    group_comm : MPI.Comm
        This rank's group; rank 0 of it is the I/O task.
    io_comm : MPI.Comm or None
        The I/O tasks among themselves (``None`` on non-I/O ranks).
    """

    n_io: int
    group: int
    group_comm: MPI.Comm
    io_comm: MPI.Comm | None

    @property
    def is_io(self) -> bool:
        return self.group_comm.rank == 0

    def free(self) -> None:
        for c in (self.group_comm, self.io_comm):
            if c is not None and c != MPI.COMM_NULL:
                c.Free()


def group_of_rank(rank: int, size: int, n_io: int) -> int:
    """Index of the I/O group containing filter rank ``rank``."""
    for t in range(n_io):
        start, count = block_distribution(size, n_io, t)
        if start <= rank < start + count:
            return t
    raise ValueError(f"rank {rank} outside 0..{size - 1}")


def io_groups(comm: MPI.Comm, n_io: int) -> IOGroups:
    """Split ``comm`` (collective) into N_io contiguous I/O groups."""
    size = comm.size
    if not 1 <= n_io <= size:
        raise ValueError(f"io.tasks: N_io = {n_io} must be between 1 and N_mpi = {size}")
    g = group_of_rank(comm.rank, size, n_io)
    group_comm = comm.Split(color=g, key=comm.rank)
    is_io = group_comm.rank == 0
    io_comm = comm.Split(color=0 if is_io else MPI.UNDEFINED, key=comm.rank)
    if io_comm == MPI.COMM_NULL:
        io_comm = None
    return IOGroups(n_io=n_io, group=g, group_comm=group_comm, io_comm=io_comm)


@dataclass(frozen=True)
class CommGroups:
    """The communicators of one ensio job.

    Offline, ``filter`` is the whole world. The online mode (coupled members)
    adds ``model`` and ``coupled`` communicators built by its own split
    function in this module.
    """

    world: MPI.Comm
    filter: MPI.Comm
    model: MPI.Comm | None = None
    coupled: MPI.Comm | None = None

    @classmethod
    def offline(cls, comm: MPI.Comm) -> CommGroups:
        return cls(world=comm, filter=comm)
