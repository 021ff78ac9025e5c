"""Local back-end (start delays, time limits, cancel) and the pool driver."""

from __future__ import annotations

import json
import os
import select
from pathlib import Path

import pytest
from pool_support import PY, job_spec, make_fifo, make_spec, records

from ensio.workflow.backends.base import JobSpec
from ensio.workflow.backends.local import LocalBackend, StartDelay
from ensio.workflow.pool import PoolError, drain, read_job_file
from ensio.workflow.spec import WorkerSpec, create_todo


def alive(pid: int) -> bool:
    """Running (not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def py_job(tmp_path: Path, code: str, *, time_limit: float = 60.0, name: str = "j") -> JobSpec:
    return JobSpec(name, (PY, "-S", "-c", code), time_limit, str(tmp_path))


class ScriptedDelays(LocalBackend):
    """Start delays from a list (to place one job deterministically in the queue)."""

    def __init__(self, delays: list[float], **kw) -> None:
        super().__init__(**kw)
        self._delays = list(delays)

    def sample_delay(self) -> float:
        return self._delays.pop(0) if self._delays else 0.0


def test_delay_model_is_seeded_and_documented_formula():
    a = LocalBackend(StartDelay(base=2.0, per_node=0.5, mean_extra=3.0, seed=7), nodes=4)
    b = LocalBackend(StartDelay(base=2.0, per_node=0.5, mean_extra=3.0, seed=7), nodes=4)
    da = [a.sample_delay() for _ in range(50)]
    assert da == [b.sample_delay() for _ in range(50)]
    assert min(da) >= 4.0 and 4.0 + 1.5 < sum(da) / 50 < 4.0 + 4.5  # base + 0.5*4 + Exp(3)
    assert LocalBackend(StartDelay(base=1.0, per_node=0.25), nodes=2).sample_delay() == 1.5
    assert LocalBackend().sample_delay() == 0.0
    with pytest.raises(ValueError):
        StartDelay(base=-1)


def test_pending_job_is_cancelled_without_ever_starting(tmp_path):
    marker = tmp_path / "started"
    be = LocalBackend(StartDelay(base=30.0))
    jid = be.submit(py_job(tmp_path, f"open({str(marker)!r}, 'w')"))
    assert be.states([jid]) == {jid: "pending"}
    be.cancel([jid])
    assert be.states([jid, "nope"]) == {jid: "cancelled", "nope": "unknown"}
    be.close()
    assert be.pid(jid) is None and not marker.exists()


def test_time_limit_sends_sigterm_then_sigkill(tmp_path):
    fifo = make_fifo(tmp_path)
    code = ("import signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: print('got TERM', flush=True))\n"
            f"open({str(fifo)!r}, 'w').write('up')\n"
            "while True: time.sleep(1)\n")
    be = LocalBackend(kill_wait=0.3)
    jid = be.submit(py_job(tmp_path, code, time_limit=0.3))
    with open(fifo) as f:
        assert f.read() == "up"
    assert be.wait([jid], timeout=20)
    assert be.states([jid])[jid] == "failed" and be._jobs[jid].proc.returncode == -9
    assert "got TERM" in be.log_path(jid).read_text()
    be.close()


def test_cancel_stops_the_whole_process_group(tmp_path):
    fifo = make_fifo(tmp_path)
    code = ("import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-S', '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(fifo)!r}, 'w').write(f'{{c.pid}}')\n"
            "time.sleep(60)\n")
    be = LocalBackend(kill_wait=0.5)
    jid = be.submit(py_job(tmp_path, code))
    with open(fifo) as f:
        child = int(f.read())
    pid = be.pid(jid)
    assert os.getpgid(pid) == pid and os.getpgid(child) == pid  # its own group
    pidfd = os.pidfd_open(child)  # readable once the grandchild has terminated
    be.cancel([jid])
    assert be.wait([jid], timeout=20) and be.states([jid])[jid] == "cancelled"
    assert select.select([pidfd], [], [], 20)[0] == [pidfd]
    os.close(pidfd)
    assert not alive(child)
    be.close()


def test_drain_cancels_queued_jobs_when_the_list_is_finished(tmp_path):
    ctl = tmp_path / "ctl"
    todo = create_todo(ctl / "todo.json", make_spec(ctl, analysis=False), range(1, 7), cycle=3)
    be = ScriptedDelays([0.0, 0.0, 60.0])  # the third job waits in the "queue"
    result = drain(todo, be, job_spec(todo.path, ctl / "logs"), 3, poll=0.05, settle=10)
    try:
        assert result.summary.finished and result.error is None
        assert len(result.jobs) == 3 and result.cancelled == [result.jobs[2]]
        assert be.pid(result.jobs[2]) is None  # never started
        assert result.running == []
        jobs = {r["job"] for r in records(ctl) if r["kind"] == "member"}
        assert jobs <= set(result.jobs[:2])
        assert all(r["submitted"] is not None and r["cycle"] == 3 for r in records(ctl)
                   if r["kind"] == "member")
    finally:
        be.close()


def test_drain_gives_up_on_workers_that_keep_failing(tmp_path):
    todo = create_todo(tmp_path / "todo.json", WorkerSpec(member_command="true"), [1], cycle=1)
    bad = JobSpec("bad", (PY, "-S", "-c", "raise SystemExit(2)"), 10, str(tmp_path))
    be = LocalBackend()
    with pytest.raises(PoolError, match="worker jobs failed"):
        drain(todo, be, bad, 2, poll=0.02, max_failed_jobs=3)
    be.close()


class CountingStates(LocalBackend):
    """Counts the pool's job-state queries; ``min_poll`` as a scheduler would set it."""

    def __init__(self, min_poll: float, **kw) -> None:
        super().__init__(**kw)
        self.min_poll = min_poll
        self.state_calls = 0

    def states(self, job_ids):
        self.state_calls += 1
        return super().states(job_ids)


def test_drain_asks_job_states_at_most_every_min_poll(tmp_path):
    """The list is polled fast, the (scheduler's) job states no faster than min_poll."""
    assert LocalBackend.min_poll == 0.0  # local states cost nothing: the pool stays fast
    ctl = tmp_path / "ctl"
    todo = create_todo(ctl / "todo.json", make_spec(ctl, analysis=False), range(1, 7), cycle=1)
    be = CountingStates(min_poll=3600.0)
    try:
        result = drain(todo, be, job_spec(todo.path, ctl / "logs"), 2, poll=0.01)
        assert result.summary.finished and len(result.jobs) == 2
        # one look while the list ran (the first after submitting), one at the end;
        # polling the states every 0.01 s would have made dozens
        assert be.state_calls <= 2
    finally:
        be.close()


def test_drain_records_its_jobs_and_adopts_the_live_ones_of_an_earlier_driver(tmp_path):
    """A resumed driver counts the killed driver's jobs and cancels its queued one."""
    ctl = tmp_path / "ctl"
    todo = create_todo(ctl / "todo.json", make_spec(ctl, analysis=False), range(1, 5), cycle=1)
    spec = job_spec(todo.path, ctl / "logs")
    jobs_file = ctl / "jobs.jsonl"
    be = ScriptedDelays([0.0, 3600.0])  # the earlier driver's jobs: one runs, one is queued
    try:
        early = [be.submit(spec) for _ in range(2)]
        lines = [{"id": j, "backend": "local", "name": spec.name, "workdir": spec.workdir}
                 for j in early]
        lines += [{"id": "local-1-99", "backend": "local", "name": spec.name},  # long gone
                  {"id": "4242", "backend": "slurm", "name": spec.name}]  # another back-end
        jobs_file.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"id": "cut')
        result = drain(todo, be, spec, 2, poll=0.02, settle=30, job_file=jobs_file)
        assert result.summary.finished and result.error is None
        assert result.adopted == early
        assert result.jobs == []  # the two adopted jobs are N_j: nothing new was submitted
        assert result.cancelled == [early[1]] and be.pid(early[1]) is None  # never started
        assert {r["job"] for r in records(ctl) if r["kind"] == "member"} == {early[0]}
        assert result.running == []
    finally:
        be.close()
    # a later driver of the same list records what it submits, after the torn line
    todo2 = create_todo(ctl / "todo2.json", make_spec(ctl, analysis=False), [5], cycle=2)
    be = LocalBackend()
    try:
        result = drain(todo2, be, job_spec(todo2.path, ctl / "logs"), 1, poll=0.02,
                       settle=30, job_file=jobs_file)
    finally:
        be.close()
    assert result.adopted == [] and len(result.jobs) == 1
    entries = read_job_file(jobs_file)
    assert [e["id"] for e in entries] == [*early, "local-1-99", "4242", *result.jobs]
    assert entries[-1]["backend"] == "local" and entries[-1]["name"] == "worker"
