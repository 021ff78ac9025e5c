"""Communicator groups and small MPI helpers (the only place that splits communicators)."""

from .comms import CommGroups, IOGroups, group_of_rank, io_groups, serial_comm
from .distribution import block_distribution

__all__ = [
    "CommGroups",
    "IOGroups",
    "block_distribution",
    "group_of_rank",
    "io_groups",
    "serial_comm",
]
