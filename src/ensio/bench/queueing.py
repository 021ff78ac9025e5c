"""A batch-queue model and a discrete-event replay of one assimilation cycle.

Why a model: the seed paper (Zheng et al. 2020, GMD 13, 3607, Table 2)
compares the offline mode (many small jobs) with the online mode (one large
coupled MPI job) on a production supercomputer, where the time to solution of
a cycle is dominated by how long jobs wait in the queue, and the wait depends
on how many nodes a job asks for and on how busy the machine is. A laptop or
a one-node SLURM has no such queue, so ``ensio bench modes`` measures the
running and I/O times of both modes for real and *replays* each measured
cycle under this model. Everything here is pure (no clock, no files): a
seeded :class:`numpy.random.Generator` is passed in, so a replay is
reproducible.

Queue wait of one job
---------------------
A job asking for ``n`` nodes on a machine at utilisation ``ρ`` waits ::

    wait = unit · s(ρ) · (base + per_node · n**alpha) · G,   s(ρ) = ρ / (1 − ρ),

``G`` a Gamma variate of shape ``shape`` and mean 1 (``shape = 1``: the
exponential distribution, the simplest model of a queue in which resources
free up at random moments; larger shapes are less dispersed). The parameters
(:class:`QueueModel`):

``unit``
    seconds per model time unit. ``ensio bench modes`` sets it to the measured
    mean time to solution of one coupled (online) cycle without queueing, so
    waits are expressed in cycle times and the *shape* of the result does not
    depend on how fast the benchmark case runs (a Lorenz-96 cycle takes
    seconds, the paper's cycles took tens of minutes, and a real queue's waits
    scale with the jobs around them).
``base``
    wait of a job regardless of its size (scheduler cycle, priority of a
    fresh submission), in units, at ``s(ρ) = 1``.
``per_node``, ``alpha``
    extra wait per requested node, growing like ``n**alpha``: a larger job
    must wait until that many nodes are free at the same moment, and
    backfilling favours small jobs. ``alpha = 1``: linear.
``s(ρ) = ρ / (1 − ρ)``
    the load factor: the mean wait of an M/M/1 queue in units of the service
    time, which is small on a quiet machine (0.43 at ρ = 0.3) and grows
    without bound as the machine fills up (9 at ρ = 0.9).

Load presets (:data:`LOADS`) and how they were chosen
-----------------------------------------------------
``low``: ρ = 0.3, ``high``: ρ = 0.9; defaults ``base = 0.1``,
``per_node = 0.1``, ``alpha = 1``, ``shape = 1``. The paper's Table 2 has
this shape (its abstract: "the queuing time might be less than the running
time in a low-loaded supercomputer …, but the offline mode can be nearly as
fast as, if not faster than, the online mode …; the queuing time is dominant
and several times larger than the running time in a high-loaded
supercomputer", so the offline mode is substantially faster there). With the
example's N_e = 10 members on one node each, the coupled job asks for 10
nodes: its mean wait is 0.47 cycle times at low load (less than its running
time) and 9.9 cycle times at high load (several times its running time),
while an offline job of one node waits 0.09 and 1.8 cycle times on average,
and the first of N_j = 4 such jobs about a quarter of that. The ρ values are
the conventional "quiet" and "busy" utilisations of a shared machine;
``base`` and ``per_node`` were set (equal, round numbers) so that the high
load gives the coupled job a wait of about ten cycle times, and not tuned
further. They are parameters, not measurements: change them with
``ensio bench modes --base/--per-node/--alpha/--shape/--loads``.

Replay of one cycle
-------------------
*Offline* (:func:`replay_offline`): N_j jobs of ``nodes_per_member`` nodes
are submitted at time 0; job j starts at its sampled wait ``wait_j`` and can
take tasks ``startup`` later (the measured start-up of a worker). The
measured member durations are list-scheduled greedily in their order onto the
job that is free first (:func:`list_schedule`); the analysis starts
``analysis_lag`` after the last member ends (the measured lease and commit
delay), on the first free job, and runs its measured duration. *Online*
(:func:`replay_online`): one job of ``N_e · P`` nodes waits its sampled
delay, then runs the measured coupled cycle (its start-up included).

Per replayed cycle: *queuing* = the scheduler wait until the first job of the
cycle starts, *total* (time to solution) = last task end − submission, *I/O*
= the measured I/O seconds, *running* = total − queuing − I/O. As on a
cluster, a job is running from the moment the scheduler starts it, so the
start-up of processes and MPI counts as running here (``ensio report`` on a
local run, with no scheduler, can only count it as queuing).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "LOADS",
    "CycleReplay",
    "QueueModel",
    "list_schedule",
    "load_factor",
    "mean_wait",
    "replay_offline",
    "replay_online",
    "sample_waits",
]

#: Load presets: name → machine utilisation ρ (see the module docstring).
LOADS: Mapping[str, float] = {"low": 0.3, "high": 0.9}


@dataclass(frozen=True)
class QueueModel:
    """Parameters of the queue-wait model (see the module docstring).

    Parameters
    ----------
    base : float
        Size-independent wait, in units at load factor 1 (>= 0).
    per_node : float
        Wait per node (to the power ``alpha``), in units at load factor 1 (>= 0).
    alpha : float
        Growth exponent of the wait with the node count (>= 0).
    shape : float
        Gamma shape of the random factor, mean 1 (> 0; 1 = exponential).
    unit : float
        Seconds per model time unit (> 0).
    """

    base: float = 0.1
    per_node: float = 0.1
    alpha: float = 1.0
    shape: float = 1.0
    unit: float = 1.0

    def __post_init__(self) -> None:
        if min(self.base, self.per_node, self.alpha) < 0 or not all(
            math.isfinite(v) for v in (self.base, self.per_node, self.alpha, self.shape,
                                       self.unit)):
            raise ValueError("QueueModel: base, per_node and alpha must be finite and >= 0")
        if self.shape <= 0 or self.unit <= 0:
            raise ValueError("QueueModel: shape and unit must be > 0")


def load_factor(rho: float) -> float:
    """``ρ / (1 − ρ)``: the mean M/M/1 wait in service times, for ``0 <= ρ < 1``.

    Raises
    ------
    ValueError
        If ``ρ`` is outside ``[0, 1)``.
    """
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"load ρ must be in [0, 1), got {rho!r}")
    return rho / (1.0 - rho)


def mean_wait(model: QueueModel, nodes: float, rho: float) -> float:
    """Expected wait in seconds of a job of ``nodes`` nodes at load ``rho``.

    ``unit · s(ρ) · (base + per_node · nodes**alpha)``.
    """
    if nodes < 0:
        raise ValueError(f"nodes must be >= 0, got {nodes!r}")
    return model.unit * load_factor(rho) * (model.base + model.per_node * nodes ** model.alpha)


def sample_waits(model: QueueModel, nodes: Sequence[float], rho: float,
                 rng: np.random.Generator) -> np.ndarray:
    """One sampled wait (seconds) per job, job i asking for ``nodes[i]`` nodes.

    Parameters
    ----------
    model : QueueModel
    nodes : sequence of float
        Node count of each job.
    rho : float
        Machine utilisation in ``[0, 1)``.
    rng : numpy.random.Generator
        Source of the random factors (one Gamma draw per job, in order).

    Returns
    -------
    numpy.ndarray
        ``mean_wait(model, nodes[i], rho) · G_i``, ``G_i ~ Gamma(shape, 1/shape)``.
    """
    means = np.array([mean_wait(model, n, rho) for n in nodes], dtype=float)
    factors = rng.gamma(model.shape, 1.0 / model.shape, size=len(means))
    return means * factors


def list_schedule(ready: Sequence[float], durations: Sequence[float]
                  ) -> tuple[list[float], list[float], list[int]]:
    """Greedy list scheduling: each task, in order, on the job that is free first.

    Parameters
    ----------
    ready : sequence of float
        Time at which each job can start its first task.
    durations : sequence of float
        Task durations (>= 0), scheduled in this order.

    Returns
    -------
    starts, ends : list of float
        Start and end time of each task.
    jobs : list of int
        Index of the job each task ran on (ties: the lowest index).
    """
    if not ready:
        raise ValueError("list_schedule: at least one job is needed")
    if any(d < 0 for d in durations):
        raise ValueError("list_schedule: durations must be >= 0")
    heap = [(float(t), j) for j, t in enumerate(ready)]
    heapq.heapify(heap)
    starts, ends, jobs = [], [], []
    for d in durations:
        t, j = heapq.heappop(heap)
        starts.append(t)
        ends.append(t + float(d))
        jobs.append(j)
        heapq.heappush(heap, (t + float(d), j))
    return starts, ends, jobs


@dataclass(frozen=True)
class CycleReplay:
    """One replayed cycle (seconds from the submission of its jobs).

    ``queuing`` = scheduler wait until the cycle's first job starts, ``total``
    = last task end (time to solution), ``io`` = the measured I/O,
    ``running = total − queuing − io``.
    """

    queuing: float
    running: float
    io: float
    total: float

    def as_dict(self) -> dict[str, float]:
        return {"total": self.total, "queuing": self.queuing, "running": self.running,
                "io": self.io}


def _replay(queuing: float, total: float, io: float) -> CycleReplay:
    return CycleReplay(queuing=queuing, running=max(0.0, total - queuing - io), io=io,
                       total=total)


def replay_offline(member_durations: Sequence[float], analysis_duration: float,
                   waits: Sequence[float], *, startup: float = 0.0, analysis_lag: float = 0.0,
                   io: float = 0.0) -> CycleReplay:
    """Replay an offline cycle: members list-scheduled on the jobs, then the analysis.

    Parameters
    ----------
    member_durations : sequence of float
        Time each member task occupies a job (>= 0), in to-do list order.
    analysis_duration : float
        Time of the analysis task (>= 0).
    waits : sequence of float
        Per job: queue wait from the submission to its start (>= 0).
    startup : float
        Time from a job's start to its first task (>= 0).
    analysis_lag : float
        Delay between the end of the last member and the start of the analysis.
    io : float
        Measured I/O seconds of the cycle (carried into the result).

    Returns
    -------
    CycleReplay
        ``queuing = min(waits)``, ``total`` = end of the analysis.
    """
    if min(analysis_duration, analysis_lag, startup) < 0 or any(w < 0 for w in waits):
        raise ValueError("replay_offline: waits, start-up, analysis duration and lag "
                         "must be >= 0")
    ready = [float(w) + startup for w in waits]
    _, ends, jobs = list_schedule(ready, member_durations)
    free = list(ready)
    for end, j in zip(ends, jobs, strict=True):
        free[j] = max(free[j], end)
    members_done = max(ends) if ends else min(free)
    first_free = min(free)  # the job that ran the last member is free by members_done
    a_start = max(members_done + analysis_lag, first_free)
    return _replay(float(min(waits)), a_start + analysis_duration, io)


def replay_online(cycle_total: float, wait: float, *, io: float = 0.0) -> CycleReplay:
    """Replay a coupled cycle: one job waits ``wait``, then runs as measured.

    Parameters
    ----------
    cycle_total : float
        Measured submission-to-end time of the coupled cycle without a queue
        (start-up of the MPI job included).
    wait : float
        Sampled queue wait of the job.
    io : float
        Measured I/O seconds.

    Returns
    -------
    CycleReplay
        ``queuing = wait``, ``total = wait + cycle_total``.
    """
    if min(cycle_total, wait) < 0:
        raise ValueError("replay_online: times must be >= 0")
    return _replay(wait, wait + cycle_total, io)
