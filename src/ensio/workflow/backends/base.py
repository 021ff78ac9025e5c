"""Job back-ends of the dynamic job scheme: how N_j worker jobs are started.

A back-end only starts, follows and cancels *jobs*; what a job does is always
the same worker command (``ensio worker …``), which drains the shared to-do
list. So the pool logic is tested once, locally, and a batch scheduler adds no
logic of its own beyond its script function and the spelling of its commands
(:class:`~ensio.workflow.backends.batch.BatchBackend`). Back-ends are chosen
by ``workflow.backend`` through the registry of :mod:`ensio.workflow.backends`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ...config.workflow import WorkflowSection

__all__ = ["Backend", "JobShape", "JobSpec", "JobState"]

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


@dataclass(frozen=True)
class JobShape:
    """What every job of one back-end object asks for.

    Attributes
    ----------
    ntasks : int
        Tasks (MPI ranks) per job: 1 for a worker job, N_e × P for the coupled
        job of the online mode.
    cpus_per_task : int
        CPUs per task (a worker job that may run the analysis needs its ranks).
    coupled : bool
        The one coupled job of ``ensio cycle --mode online``: it runs as long
        as the run needs and no later driver could adopt it, so a local one
        is not cut at the time limit and dies with its driver.
    """

    ntasks: int = 1
    cpus_per_task: int = 1
    coupled: bool = False


class Backend(abc.ABC):
    """Starts worker jobs and tells their state; never runs pool logic itself."""

    #: Registry key (``workflow.backend``) and the ``backend`` of job-file entries.
    name: str
    #: The scheduler's name in messages ("through SLURM"); ``None``: this machine.
    label: str | None = None

    #: Shortest interval (seconds) between two :meth:`states` calls of the pool
    #: driver. Local job states cost nothing; a real scheduler's cost a request
    #: to its controller, which many users' drivers share.
    min_poll: float = 0.0

    @abc.abstractmethod
    def submit(self, spec: JobSpec) -> str:
        """Start (or queue) one job; return its id."""

    @abc.abstractmethod
    def states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """Current state of each job."""

    @abc.abstractmethod
    def cancel(self, job_ids: Sequence[str]) -> None:
        """Cancel jobs (pending ones must never start)."""

    def adopt(self, jobs: Sequence[Mapping[str, Any]]) -> dict[str, JobState]:
        """Jobs started by an earlier driver that still wait or run, with their state.

        A driver that was killed leaves its jobs behind when they outlive it
        (batch jobs do); the pool records every job it submits (see
        :func:`ensio.workflow.pool.drain`) and a resumed driver adopts the
        live ones, so they count toward N_j and the pending ones are cancelled
        at the end instead of waiting in the queue. Only ``pending`` and
        ``running`` jobs are returned: an id this back-end cannot vouch for
        (``unknown``) is never adopted, since cancelling it could hit an
        unrelated job.

        Parameters
        ----------
        jobs : sequence of mapping
            Entries of the pool's job file: ``id``, ``name``, ``workdir``.

        Returns
        -------
        dict
            Job id to ``"pending"`` or ``"running"``.
        """
        ids = [str(j["id"]) for j in jobs]
        if not ids:
            return {}
        return {j: st for j, st in self.states(ids).items() if st in ("pending", "running")}

    @classmethod
    def from_config(cls, wf: WorkflowSection, shape: JobShape) -> Backend:
        """The back-end of the ``workflow`` section for jobs of ``shape``.

        The default takes no options; back-ends with options read their own
        keys of ``wf``. Raises ``ValueError`` on options the scheduler cannot take.
        """
        return cls()

    def ending(self, job_id: str, state: JobState) -> str:
        """How a job that ended in ``state`` ended, for messages."""
        return f"{self.label or self.name} state {state} (job {job_id})"

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (e.g. reap local processes)."""
