"""One process per node: the node communicator and its leaders.

Why here: ``parallel/`` is the only place that splits communicators. Staging
and the backup copy files between a node's local disk and the global file
system; one process per node does that for all the node's ranks, so that N
ranks on a node do not open N competing streams to the same disk.

A node is what ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` groups, split
further by the host name each rank reports (the name that fills ``{host}``
in ``io.local_dir``), so ranks that name different hosts never share a
leader (and tests can stand several "hosts" up on one machine).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from mpi4py import MPI

__all__ = ["HOST_ENV", "NodeGroups", "node_groups", "this_host"]

#: Overrides the host name of ``{host}`` (e.g. a short name where hostname is long).
HOST_ENV = "ENSIO_HOST"


def this_host() -> str:
    """The name ``{host}`` stands for on this process: ``$ENSIO_HOST`` or the hostname."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


@dataclass(frozen=True)
class NodeGroups:
    """The node of this rank and its leader.

    Attributes
    ----------
    node_comm : MPI.Comm
        The ranks of this node (rank 0 of it is the leader).
    node : int
        Index of this node, 0..n_nodes-1, in the order of the nodes' lowest world ranks.
    n_nodes : int
        Number of nodes.
    members : tuple of int
        World ranks of this node, ascending.
    """

    node_comm: MPI.Comm
    node: int
    n_nodes: int
    members: tuple[int, ...]

    @property
    def is_leader(self) -> bool:
        return self.node_comm.rank == 0

    def free(self) -> None:
        if self.node_comm not in (MPI.COMM_NULL, MPI.COMM_SELF, MPI.COMM_WORLD):
            self.node_comm.Free()


def node_groups(comm: MPI.Comm, host: str) -> NodeGroups:
    """Collective over ``comm``: split it into nodes (shared memory, then host name).

    With one rank (``COMM_SELF``, a serial run) the node is that rank.
    """
    if comm.size == 1:
        return NodeGroups(MPI.COMM_SELF, 0, 1, (comm.rank,))
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    names = shared.allgather(host)
    node_comm = shared.Split(color=names.index(host), key=comm.rank)
    shared.Free()
    members = tuple(node_comm.allgather(comm.rank))
    lowest = comm.allgather(members[0])
    firsts = sorted(set(lowest))
    return NodeGroups(node_comm, firsts.index(members[0]), len(firsts), members)
