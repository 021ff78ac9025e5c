"""Per-task records of the job pool as JSON lines (``DIR/records.jsonl``).

Why JSON lines appended with ``O_APPEND``: many jobs on many nodes write to
one file without a lock; each record is one ``write`` of one line, which the
kernel appends whole on local file systems and Lustre (on NFS, appends from
different clients can interleave only when the client cache is bypassed
badly; readers skip lines that do not parse). Records are evidence for
reports and estimates, not state: the to-do list is the state, so records are
not fsynced and a crash can lose at most the last lines; the driver restores
the lost ``done`` records of a finished cycle from the list
(:func:`reconcile_done`, marked ``"recovered": true``).

Task record keys (``"kind"`` is ``"member"`` or ``"analysis"``):

========== ==============================================================
task       task id (``mem001``, ``analysis``)
member     member number (``null`` for the analysis)
cycle      cycle number of the list
job, host  job id and host name of the worker; ``owner`` is the lease owner
submitted  when the job was submitted (epoch seconds; ``null`` if unknown)
leased     when the lease was granted; ``lease_call`` seconds spent getting it
started    just before the command was started
ended      when the command exited (or was stopped)
finished   after the outcome was committed to the list
status     ``done`` | ``failed`` | ``interrupted`` (time limit, requeued at
           the front) | ``stale`` (the lease was lost; nothing committed)
exit       exit status (negative: killed by that signal; ``null``: not run)
io_seconds seconds of I/O the command reported (``ENSIO_REPORT``), else null
attempt    attempt number of the task (1 = first lease); ``token`` its fencing token
========== ==============================================================

A worker also appends one ``"kind": "job"`` record when it ends normally
(``submitted``, ``started``, ``finished``, ``tasks``, ``reason``), and the
``ensio cycle`` driver one ``"kind": "pool"`` record per cycle when its list
ended: ``cycle``, ``ended``, the job ids it submitted (``jobs``), took over
from a killed driver (``adopted``), cancelled while still queued
(``cancelled``) and left running to see the finished list and exit
(``left_running``; such a job's worker may start after the cycle is done).
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CycleSummary",
    "RecordTail",
    "append_record",
    "cycle_summaries",
    "mean_std",
    "read_records",
    "owner_alive",
    "reconcile_done",
    "task_duration",
]

TASK_KINDS = ("member", "analysis")


def append_record(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append one record as one line with a single ``O_APPEND`` write."""
    line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        n = os.write(fd, line)
        if n != len(line):  # a short write would leave half a line: finish it
            os.write(fd, line[n:])
    finally:
        os.close(fd)


def reconcile_done(path: str | Path, cycle: int, done: Iterable[Mapping[str, Any]], *,
                   alive: Callable[[str], bool] | None = None, wait: float = 60.0) -> int:
    """Append a record for every task the to-do list has done but the records lack.

    A worker commits a task to the list, then appends its record; killed in
    between, the task is done (the list is the state) but its record is
    lost. The driver calls this once the list is finished, so the records
    hold exactly one ``done`` per task of the cycle. A restored record is
    marked ``"recovered": true``; it has the owner, token and commit time
    from the list and no run times (``started``/``ended`` are null).

    A job that committed the task may still be about to append its record: a
    job of a driver that was killed (its jobs outlive it, and the new driver
    does not wait for them). So while a missing record's committer is a live
    process of this host (``alive``, default :func:`owner_alive`), this waits
    for it, up to ``wait`` seconds: restoring it then would give two.

    Parameters
    ----------
    path : path-like
        The records file.
    cycle : int
    done : iterable of mapping
        The list's done tasks (``id``, ``kind``, ``member``, ``done_at``,
        ``done_by``, ``done_token``).

    Returns
    -------
    int
        Number of records restored.
    """
    alive = owner_alive if alive is None else alive
    done = list(done)
    deadline = time.monotonic() + wait
    while True:
        have = {r.get("task") for r in read_records(path)
                if r.get("cycle") == cycle and r.get("status") == "done"}
        missing = [t for t in done if t["id"] not in have]
        if time.monotonic() >= deadline or not any(alive(t.get("done_by") or "")
                                                   for t in missing):
            break
        time.sleep(0.05)
    for t in missing:
        append_record(path, {
            "kind": t["kind"], "task": t["id"], "member": t.get("member"), "cycle": cycle,
            "owner": t.get("done_by"), "token": t.get("done_token"), "started": None,
            "ended": None, "finished": t.get("done_at"), "status": "done", "exit": 0,
            "io_seconds": None, "recovered": True})
    return len(missing)


def owner_alive(owner: str) -> bool:
    """Whether a lease owner (``JOB@HOST:PID``, :class:`~ensio.workflow.worker.Worker`) is a
    live process of this host; owners elsewhere count as gone (they cannot be asked)."""
    job_host, sep, pid = owner.rpartition(":")
    host = job_host.rpartition("@")[2]
    if not sep or not pid.isdigit() or host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, its parent gone and nobody reaping) has ended
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _parse(lines: Iterable[bytes]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn or foreign line
        if isinstance(rec, dict):
            out.append(rec)
    return out


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of the file (none if it does not exist)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    return _parse(data.splitlines())


def task_duration(rec: Mapping[str, Any]) -> float | None:
    """Running time of the command of a task record (``ended - started``)."""
    try:
        return float(rec["ended"]) - float(rec["started"])
    except (KeyError, TypeError, ValueError):
        return None


class RecordTail:
    """Incremental reader of a records file, for duration estimates in a worker.

    Reads only what was appended since the last call, so a worker can refresh
    its estimate before every lease at the cost of the new lines. A worker
    notes its own runs directly (:meth:`note`, before its record is written)
    and skips its own lines (``skip_owner``) so they are not counted twice.
    """

    def __init__(self, path: str | Path, keep: int = 10, skip_owner: str | None = None) -> None:
        self.path = Path(path)
        self.keep = keep
        self.skip_owner = skip_owner
        self._offset = 0
        self._partial = b""
        self.durations: dict[str, list[float]] = {k: [] for k in TASK_KINDS}

    def refresh(self) -> None:
        """Read the lines appended since the last call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # incomplete last line (or b"")
        for rec in _parse(lines):
            kind = rec.get("kind")
            d = task_duration(rec)
            if (kind in self.durations and rec.get("status") == "done" and d is not None
                    and (self.skip_owner is None or rec.get("owner") != self.skip_owner)):
                self.note(kind, d)

    def note(self, kind: str, duration: float) -> None:
        """Add a duration observed directly (a worker's own runs, before its record)."""
        hist = self.durations.setdefault(kind, [])
        hist.append(duration)
        del hist[: -self.keep]

    def estimate(self, kind: str, default: float) -> float:
        """Expected duration of a task of ``kind``: the longest of the last ``keep``
        successful runs (cautious: a job that starts a task it cannot finish
        wastes the time and requeues it), else ``default``."""
        hist = self.durations.get(kind) or []
        return max(hist) if hist else default


@dataclass(frozen=True)
class CycleSummary:
    """Timing of one cycle from its task records (seconds; see :func:`cycle_summaries`).

    ``queuing`` = first task start − first submission; ``running`` = last
    finish − first start; ``total`` = last finish − first submission (or
    ``running`` when no submission time was recorded); ``io`` = sum of the
    I/O seconds the commands reported; ``task_seconds`` = sum of command run
    times of the successful tasks.
    """

    cycle: int
    submitted: float | None
    first_start: float
    last_finish: float
    queuing: float | None
    running: float
    total: float
    io: float
    task_seconds: float
    tasks: int
    failed: int
    interrupted: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def cycle_summaries(records: Iterable[Mapping[str, Any]]) -> list[CycleSummary]:
    """Per-cycle summaries of task records, sorted by cycle."""
    by_cycle: dict[int, list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("kind") in TASK_KINDS and r.get("cycle") is not None:
            by_cycle.setdefault(int(r["cycle"]), []).append(r)
    out = []
    for cycle in sorted(by_cycle):
        recs = by_cycle[cycle]
        starts = [float(r["started"]) for r in recs if r.get("started") is not None]
        ends = [float(r["finished"]) for r in recs if r.get("finished") is not None]
        if not starts or not ends:
            continue
        subs = [float(r["submitted"]) for r in recs if r.get("submitted") is not None]
        submitted = min(subs) if subs else None
        first, last = min(starts), max(ends)
        done = [r for r in recs if r.get("status") == "done"]
        io = math.fsum(float(r["io_seconds"]) for r in done if r.get("io_seconds") is not None)
        durations = [d for d in (task_duration(r) for r in done) if d is not None]
        out.append(CycleSummary(
            cycle=cycle,
            submitted=submitted,
            first_start=first,
            last_finish=last,
            queuing=None if submitted is None else first - submitted,
            running=last - first,
            total=last - (submitted if submitted is not None else first),
            io=io,
            task_seconds=math.fsum(durations),
            tasks=len(done),
            failed=sum(r.get("status") == "failed" for r in recs),
            interrupted=sum(r.get("status") == "interrupted" for r in recs),
        ))
    return out


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value), for report tables."""
    import statistics  # here: every worker imports this module, only reports need it

    v = list(values)
    if not v:
        return math.nan, math.nan
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else 0.0)
