"""The SLURM part of ``ensio bench modes``: what only a scheduler can tell.

Both modes go through SLURM with the drivers' own back-end
(``workflow.backend=slurm``): the offline pool submits N_j worker jobs per
cycle, the online driver one batch job of ``--ntasks=N_e*P``. Their records
carry the submission time (``ENSIO_SUBMITTED``, set at ``sbatch``), so queuing
comes out of the records as in every other setting. Kept apart from
:mod:`ensio.bench.modes` because it is the only part that asks the scheduler
anything (``sinfo``, ``squeue``) and it runs only when SLURM answers.
"""

from __future__ import annotations

import subprocess

__all__ = ["overcommit_needed", "queue_length"]


def queue_length() -> int | None:
    """Jobs in the SLURM queue right now (all users), or None if squeue fails."""
    try:
        proc = subprocess.run(["squeue", "-h", "-a", "-o", "%i"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return len(proc.stdout.split()) if proc.returncode == 0 else None


def cpus_of_nodes(partition: str | None = None) -> int | None:
    """CPUs of all nodes of ``partition`` (default: the default one), or None."""
    argv = ["sinfo", "-h", "-N", "-o", "%N %c"] + (["-p", partition] if partition else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    nodes: dict[str, int] = {}
    for line in proc.stdout.splitlines():
        name, _, cpus = line.partition(" ")
        try:
            nodes[name] = int(cpus.strip())
        except ValueError:
            continue
    return sum(nodes.values()) if nodes else None


def overcommit_needed(ntasks: int, partition: str | None = None) -> bool:
    """Whether a job of ``ntasks`` tasks only fits with ``--overcommit``.

    On a test machine (here: one node of 2 CPUs) the coupled job of N_e × P
    ranks asks for more tasks than there are CPUs, which SLURM refuses unless
    the job overcommits; on a cluster it fits and nothing is added.
    """
    cpus = cpus_of_nodes(partition)
    return cpus is not None and ntasks > cpus
