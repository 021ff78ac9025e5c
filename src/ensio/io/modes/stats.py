"""What one ensemble read or write measured: the same record for every I/O mode."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np
from mpi4py import MPI

from ...stopwatch import Stopwatch

__all__ = ["IOStats"]


@dataclass
class IOStats:
    """Where the time of one read or write went.

    Seconds are the maximum over ranks (the critical path); ``state_bytes`` is
    the on-disk size of the state variables moved, all members together.
    ``inactive`` (a read) and ``clipped`` (a write) count, per state
    variable and over all ranks, the points left out of the analysis because
    a member holds a missing value there, and the analysis values that did
    not fit the packed type or the valid range and were clipped.
    """

    total_seconds: float = 0.0
    read_seconds: float = 0.0
    write_seconds: float = 0.0
    comm_seconds: float = 0.0
    wait_seconds: float = 0.0
    journal_seconds: float = 0.0
    state_bytes: int = 0
    inactive: dict[str, int] = field(default_factory=dict)
    clipped: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_stopwatch(cls, sw: Stopwatch, total: float, state_bytes: int) -> IOStats:
        """This rank's figures from the phases ``read``, ``write``, ``comm``, ``wait``, ``journal``.

        ``write`` includes the journal's time (it is measured inside the file
        step); reported ``write_seconds`` excludes it, so the parts add up.
        """
        return cls(
            total_seconds=total,
            read_seconds=sw["read"],
            write_seconds=sw["write"] - sw["journal"],
            comm_seconds=sw["comm"],
            wait_seconds=sw["wait"],
            journal_seconds=sw["journal"],
            state_bytes=state_bytes,
        )

    def reduce(self, comm: MPI.Comm) -> IOStats:
        """Collective: every second the maximum over the ranks of ``comm``."""
        seconds = [f.name for f in fields(self) if f.name.endswith("_seconds")]
        vals = np.array([getattr(self, n) for n in seconds], dtype=np.float64)
        out = np.empty_like(vals)
        comm.Allreduce(vals, out, op=MPI.MAX)
        return replace(self, **dict(zip(seconds, out.tolist(), strict=True)))
