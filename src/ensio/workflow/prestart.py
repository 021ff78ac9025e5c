"""The analysis started ahead: imports and warm-up while the last members run.

A cycle's analysis can start only when its members are settled, and what it
does first — start an interpreter (under ``mpiexec`` one per rank), import
numpy, scipy, h5py, netCDF4 and ensio, load numba's cached kernels, read its
configuration — does not depend on them. On the Veros OSSE that start was
0.6 s of interpreter and imports plus 0.5 s of scipy and numba loading per
cycle, a third of what the analysis added to a 21 s cycle. When a job finds
nothing left to run but the analysis (every member runs or is settled, at
least one still runs), its core would sit idle until the last member ends;
so, with ``WorkerSpec.prestart``, it leases the analysis early
(:meth:`~ensio.workflow.todo.TodoList.lease_analysis_early`), starts the
command with ``ENSIO_PRESTART=1`` and waits. The command prepares and then
blocks reading one line from its standard input:

* when every member is settled and the gate passes
  (:meth:`~ensio.workflow.todo.TodoList.settle_early`), the worker writes the
  *go* line, ``{"members": "1,2,4"}`` (the done members, what ``{members}``
  of the template would have been), and the task counts as started from then
  (its record's ``started``; ``prestarted`` is when the process began);
* anything else — a member pending again (a retry: the lease goes back
  unstarted, so a one-job pool cannot deadlock), the gate refusing the
  analysis, the job told to stop, the lease lost — closes the pipe, and the
  command exits 0 having changed nothing. A worker that dies closes it too,
  by the kernel, and its early lease expires like any other.

The lease is the usual one (renewed, fenced), so whoever holds the analysis
is decided exactly as before; only the moment the command starts moves. A
prestarted process that died before *go* is replaced by a fresh start. Not
under ``workflow.transfer`` (the interposed analysis would announce itself
as a consumer run before its producers end).

:func:`await_go` is the command's side: rank 0 reads the line, the other
ranks wait without spinning (MPICH busy-polls inside a blocking collective,
which would take the core the last member runs on), then all get it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .leases import Idle, Lease, StaleLease

if TYPE_CHECKING:
    from mpi4py import MPI

    from .spec import TaskCommand
    from .todo import TodoList

__all__ = ["PRESTART_ENV", "Prestarted", "await_go", "await_members", "close_and_reap"]

#: Set to ``1`` in the environment of an analysis started ahead.
PRESTART_ENV = "ENSIO_PRESTART"

#: Seconds between looks at the list while the last members run (a lock-free read).
POLL = 0.05


@dataclass
class Prestarted:
    """An analysis command started ahead of its go (the worker's side)."""

    cmd: TaskCommand
    proc: subprocess.Popen
    started: float

    @classmethod
    def start(cls, cmd: TaskCommand) -> Prestarted:
        """Start ``cmd`` (its ``{members}`` provisional) with :data:`PRESTART_ENV` set."""
        env = dict(cmd.env)
        env[PRESTART_ENV] = "1"
        started = time.time()
        proc = subprocess.Popen(cmd.argv, cwd=cmd.workdir, env=env, stdin=subprocess.PIPE,
                                start_new_session=True)
        return cls(cmd, proc, started)

    def go(self, members: Sequence[int]) -> bool:
        """Tell the command to run for ``members``; False if it is gone already."""
        if self.proc.poll() is not None:
            return False
        line = json.dumps({"members": ",".join(str(m) for m in sorted(members))}) + "\n"
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.encode())
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            return False
        return True

    def cancel(self) -> None:
        """Close the pipe; a command still preparing is killed (it has changed nothing)."""
        close_and_reap(self.proc, 0.5)


def close_and_reap(proc: subprocess.Popen, timeout: float) -> None:
    """Close a child's standard input (its signal to end), wait ``timeout`` seconds for it,
    then SIGKILL its process group (it runs in a session of its own)."""
    try:
        assert proc.stdin is not None
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def await_members(todo: TodoList, lease: Lease, wake: threading.Event,
                  stopping: Callable[[], bool]) -> str | Idle:
    """The worker's wait with an early analysis lease: until the members decide.

    ``"ready"`` (start), ``"pending"`` (a member needs a job again: give the lease
    back), ``"stop"`` (``stopping()`` said so), ``"lost"`` (the lease is no longer
    ours) or :class:`~ensio.workflow.leases.Idle` ``failed`` (the analysis was
    refused). The list is looked at without its lock every :data:`POLL` seconds
    (or when ``wake`` is set); only a change is decided under the lock.
    """
    while True:
        if stopping():
            return "stop"
        now = time.time()
        members = [t for t in todo.tasks() if t.kind == "member"]
        if all(t.state in ("done", "failed") for t in members) or any(
                t.state == "pending" or t.state == "leased" and (t.deadline or 0.0) < now
                for t in members):
            try:  # decided under the lock (which also reclaims expired leases)
                state = todo.settle_early(lease)
            except StaleLease:
                return "lost"
            if state != "running":
                return state
        else:
            wake.wait(POLL)
            wake.clear()


def await_go(comm: MPI.Comm, prepare: Callable[[], Any] | None = None) -> dict[str, Any] | None:
    """Collective: ``{}`` when not started ahead; else run ``prepare``, then the go line
    (``None``: cancelled, exit without doing anything).

    A failing ``prepare`` is not fatal: the run does the same work again after go.
    """
    if os.environ.get(PRESTART_ENV) != "1":
        return {}
    if prepare is not None:
        try:
            prepare()
        except Exception as exc:  # the real run reports it, in its words
            print(f"ensio: preparing ahead failed ({exc}); the run will do it", file=sys.stderr)
    msg: dict[str, Any] | None = None
    if comm.rank == 0:
        line = sys.stdin.readline()
        if line.strip():
            msg = json.loads(line)
    if comm.size > 1:  # the others wait asleep, not in a spinning collective
        req = comm.Ibarrier()
        while not req.Test():
            time.sleep(0.002)
        msg = comm.bcast(msg, root=0)
    os.environ.pop(PRESTART_ENV, None)
    return msg
