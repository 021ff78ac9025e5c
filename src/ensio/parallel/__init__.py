"""Communicator groups and small MPI helpers (the only place that splits communicators)."""

from .comms import CommGroups, IOGroups, group_of_rank, io_groups
from .distribution import RowDistribution, block_distribution

__all__ = [
    "CommGroups",
    "IOGroups",
    "RowDistribution",
    "block_distribution",
    "group_of_rank",
    "io_groups",
]
