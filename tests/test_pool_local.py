"""Local back-end (start delays, time limits, cancel) and the pool driver."""

from __future__ import annotations

import os
import select
from pathlib import Path

import pytest
from pool_support import PY, job_spec, make_fifo, make_spec, records

from ensio.workflow.backends.base import JobSpec
from ensio.workflow.backends.local import LocalBackend, StartDelay
from ensio.workflow.pool import PoolError, drain
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
