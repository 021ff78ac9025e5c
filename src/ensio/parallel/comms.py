"""Communicator groups: the only place where ensio splits communicators.

Why one place: every layer (I/O, analysis, online coupling) must agree on who
is an I/O task and which ranks it serves; computing that twice invites hangs.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpi4py import MPI

from .distribution import block_distribution

__all__ = ["CommGroups", "IOGroups", "group_of_rank", "io_groups"]


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
    """The communicators of one coupled (online) ensio job, built by :meth:`online`.

    The offline analysis needs no such object: its filter communicator is the
    one it is handed (the world of ``ensio analyse``). The online mode adds
    ``model`` and ``coupled`` communicators; ``filter`` is ``MPI.COMM_NULL`` on
    the ranks that are not filter ranks.

    Attributes
    ----------
    world, filter : MPI.Comm
    model, coupled : MPI.Comm or None
        Online only (see :meth:`online`).
    tasks_per_member : int or None
        P of the online layout; ``None`` offline.
    status : MPI.Comm or None
        Online only: a duplicate of ``world`` for status checks that may run
        while other ranks are inside a collective of ``world`` (a separate
        context, so the two can never be matched with each other).
    """

    world: MPI.Comm
    filter: MPI.Comm
    model: MPI.Comm | None = None
    coupled: MPI.Comm | None = None
    tasks_per_member: int | None = None
    status: MPI.Comm | None = None

    @classmethod
    def online(cls, world: MPI.Comm, tasks_per_member: int) -> CommGroups:
        """Collective over ``world``: the coupled layout of the seed paper (its Fig. 2).

        The world holds N_e × P ranks, member after member: member m
        (0-based here) is world ranks ``[m·P, (m+1)·P)`` and its model rank
        p is world rank ``m·P + p``. Three splits:

        - ``model``: the P ranks of one member (rank = model rank p);
        - ``filter``: the P ranks of the first member (filter rank p is
          model rank p of member 1), so the filter needs no extra ranks;
        - ``coupled``: the N_e ranks holding model rank p in every member
          (coupled rank = member index, so coupled rank 0 is filter rank p).

        Because every member uses the same P and the same block distribution
        of the state rows, coupled communicator p joins exactly the blocks
        that filter rank p owns: a plain gather/scatter moves the ensemble,
        with no redistribution.

        Parameters
        ----------
        world : MPI.Comm
            All ranks of the coupled job.
        tasks_per_member : int
            P, the same on every rank.

        Raises
        ------
        ValueError
            On every rank (nothing is split): P differs between ranks, P < 1,
            or the world size is not a multiple of P.
        """
        every = world.allgather(int(tasks_per_member))
        if len(set(every)) != 1:
            by_value: dict[int, list[int]] = {}
            for r, p in enumerate(every):
                by_value.setdefault(p, []).append(r)
            detail = "; ".join(f"P = {p} on ranks {_ranks(rs)}" for p, rs in by_value.items())
            raise ValueError(
                f"online: tasks_per_member differs between ranks ({detail}); every member "
                "must use the same decomposition"
            )
        size, p_ = world.size, every[0]
        if p_ < 1:
            raise ValueError(f"online: tasks_per_member must be at least 1, got {p_}")
        if size % p_:
            raise ValueError(
                f"online: the world has {size} ranks, not a multiple of tasks_per_member "
                f"P = {p_}; start N_e × P ranks (e.g. mpiexec -n {p_ * max(1, size // p_)})"
            )
        member, rank = divmod(world.rank, p_)
        model = world.Split(color=member, key=rank)
        coupled = world.Split(color=rank, key=member)
        filt = world.Split(color=0 if member == 0 else MPI.UNDEFINED, key=rank)
        return cls(
            world=world,
            filter=filt,
            model=model,
            coupled=coupled,
            tasks_per_member=p_,
            status=world.Dup(),
        )

    @property
    def is_filter(self) -> bool:
        """Whether this rank is a filter rank."""
        return self.filter != MPI.COMM_NULL

    @property
    def n_members(self) -> int:
        """N_e of the online layout (1 offline)."""
        return self.world.size // self.tasks_per_member if self.tasks_per_member else 1

    @property
    def member_index(self) -> int:
        """0-based member of this rank (online); 0 offline."""
        return self.world.rank // self.tasks_per_member if self.tasks_per_member else 0

    def free(self) -> None:
        """Collective: free the communicators this object made (never ``world``)."""
        for c in (self.model, self.coupled, self.filter, self.status):
            if c is not None and c != MPI.COMM_NULL and c != self.world:
                c.Free()


def _ranks(ranks: list[int]) -> str:
    """Short list of ranks for messages."""
    return ", ".join(map(str, ranks[:6])) + (", …" if len(ranks) > 6 else "")
