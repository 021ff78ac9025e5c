"""Job back-ends of the dynamic job scheme: how N_j worker jobs are started.

A back-end only starts, follows and cancels *jobs*; what a job does is always
the same worker command (``ensio worker …``), which drains the shared to-do
list. So the pool logic is tested once, locally, and SLURM adds no logic of
its own beyond job scripts and scheduler calls.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Backend", "JobSpec", "JobState"]

#: Scheduler-neutral job states.
JobState = Literal["pending", "running", "done", "failed", "cancelled", "unknown"]


@dataclass(frozen=True)
class JobSpec:
    """One worker job to start.

    Attributes
    ----------
    name : str
        Job name (shown by the scheduler).
    argv : tuple of str
        The worker command line (absolute executable path first).
    time_limit : float
        Wall-clock limit of the job in seconds.
    workdir : str
        Working directory of the job; logs go there.
    env : tuple of (str, str)
        Extra environment variables.
    """

    name: str
    argv: tuple[str, ...]
    time_limit: float
    workdir: str
    env: tuple[tuple[str, str], ...] = ()


class Backend(abc.ABC):
    """Starts worker jobs and tells their state; never runs pool logic itself."""

    name: str

    @abc.abstractmethod
    def submit(self, spec: JobSpec) -> str:
        """Start (or queue) one job; return its id."""

    @abc.abstractmethod
    def states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """Current state of each job."""

    @abc.abstractmethod
    def cancel(self, job_ids: Sequence[str]) -> None:
        """Cancel jobs (pending ones must never start)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (e.g. reap local processes)."""
