"""The analysis started ahead while the last members run (``workflow.prestart``).

The other job is this test, holding a member's lease by hand, so every step
is ordered without sleeps: the started-ahead command announces itself on a
FIFO the test reads, and the test settles the member only then.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

from pool_support import PY, WORKER, make_fifo, make_spec, quote, records, side_effects

from ensio.workflow.spec import create_todo
from ensio.workflow.todo import Idle, TodoList
from ensio.workflow.worker import Worker

#: The analysis command: started ahead it says so on the FIFO ``ahead`` and waits for
#: its go line; at EOF it records ``cancelled-TOKEN`` (and says ``eof`` on ``bye`` if
#: that FIFO exists). Argument 1: control dir, 3: ``{members}`` (a cold start's).
ANALYSIS = r"""
import json, os, sys, time
ctl, token = sys.argv[1], os.environ["ENSIO_TOKEN"]
ahead = os.environ.get("ENSIO_PRESTART") == "1"
members = sys.argv[3]
if ahead:
    with open(os.path.join(ctl, "ahead"), "w") as f:
        f.write(f"{token} {os.getpid()}\n")
    line = sys.stdin.readline()
    if not line.strip():
        open(os.path.join(ctl, f"cancelled-{token}"), "w").close()
        if os.path.exists(os.path.join(ctl, "bye")):
            with open(os.path.join(ctl, "bye"), "w") as f:
                f.write("eof\n")
        sys.exit(0)
    members = json.loads(line)["members"]
fd = os.open(os.path.join(ctl, "side.txt"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, f"analysis {token} {time.time_ns()}\n".encode())
os.close(fd)
with open(os.path.join(ctl, "analysis-go.json"), "w") as f:
    json.dump({"members": members, "ahead": ahead, "token": token}, f)
"""


def _setup(tmp_path: Path, **kw) -> tuple[Path, TodoList]:
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    spec = make_spec(ctl, prestart=True)
    spec = type(spec)(**{**spec.to_meta(), "analysis_command":
                         f"{PY} -S -c {quote(ANALYSIS)} {ctl} {{analysis_ranks}} {{members}}"})
    make_fifo(ctl, "ahead")
    return ctl, create_todo(ctl / "todo.json", spec, [1, 2], cycle=1, **kw)


def _read_fifo(path: Path, timeout: float = 60.0) -> str:
    """One message from a FIFO (its writer opens, writes a line, closes); fails on timeout."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        data = b""
        deadline = time.monotonic() + timeout
        while not data.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"nothing on {path.name} within {timeout} s"
            chunk = os.read(fd, 4096)
            if chunk:
                data += chunk
        return data.decode()
    finally:
        os.close(fd)


class _Job(threading.Thread):
    """A worker in a thread: its exit status and log lines."""

    def __init__(self, todo: TodoList) -> None:
        super().__init__(daemon=True)
        self.todo, self.lines, self.code = todo, [], None

    def run(self) -> None:
        self.code = Worker(self.todo, job_id="w", log=self.lines.append).run()


def test_the_analysis_starts_ahead_and_runs_on_go(tmp_path: Path) -> None:
    ctl, todo = _setup(tmp_path)
    other = todo.lease("other")  # mem001 runs in "another job": this test
    assert other.task == "mem001"
    job = _Job(todo)
    job.start()
    token, _pid = _read_fifo(ctl / "ahead").split()  # started ahead while mem001 runs
    assert not (ctl / "analysis-go.json").exists()
    assert todo.lease("third") == Idle("busy")  # the analysis is taken: others leave it
    settled = time.time()
    todo.done(other)
    job.join(60)
    assert job.code == 0, job.lines
    go = json.loads((ctl / "analysis-go.json").read_text())
    assert go == {"members": "1,2", "ahead": True, "token": token}
    (rec,) = [r for r in records(ctl) if r["kind"] == "analysis"]
    assert rec["status"] == "done" and rec["prestarted"] < settled <= rec["started"]
    assert [t for t, _, _ in side_effects(ctl)].count("analysis") == 1
    assert any("starts analysis ahead" in line for line in job.lines)


def test_a_member_pending_again_takes_the_analysis_back(tmp_path: Path) -> None:
    ctl, todo = _setup(tmp_path, retries=1)
    other = todo.lease("other")
    job = _Job(todo)
    job.start()
    token, _ = _read_fifo(ctl / "ahead").split()
    assert todo.fail(other, "boom")  # retried: mem001 waits for a job again
    job.join(60)
    assert job.code == 0, job.lines
    assert (ctl / f"cancelled-{token}").exists()  # the started-ahead command got EOF
    go = json.loads((ctl / "analysis-go.json").read_text())
    assert go["members"] == "1,2" and go["ahead"] is False  # after mem001: a cold start
    tasks = {t.id: t for t in todo.tasks()}
    assert tasks["analysis"].state == "done" and tasks["analysis"].attempts == 1
    assert tasks["mem001"].state == "done" and tasks["mem001"].failures == 1
    assert [t for t, _, _ in side_effects(ctl)].count("analysis") == 1


def test_a_refused_analysis_cancels_the_command_started_ahead(tmp_path: Path) -> None:
    ctl, todo = _setup(tmp_path, retries=0)  # min_members: all
    other = todo.lease("other")
    job = _Job(todo)
    job.start()
    token, _ = _read_fifo(ctl / "ahead").split()
    assert not todo.fail(other, "boom")  # failed for good: the gate refuses the analysis
    job.join(60)
    assert job.code == 1
    assert (ctl / f"cancelled-{token}").exists()
    assert not (ctl / "analysis-go.json").exists()
    assert "analysis refused" in (todo.snapshot()["error"] or "")


def test_a_killed_job_ends_the_command_it_started_ahead(tmp_path: Path) -> None:
    ctl, todo = _setup(tmp_path)
    make_fifo(ctl, "bye")
    other = todo.lease("other")
    worker = subprocess.Popen([*WORKER, str(todo.path)], stderr=subprocess.DEVNULL)
    try:
        _read_fifo(ctl / "ahead")
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        assert _read_fifo(ctl / "bye") == "eof\n"  # its standard input ended with the job
    finally:
        if worker.poll() is None:
            worker.kill()
    analysis = next(t for t in todo.tasks() if t.id == "analysis")
    assert analysis.state == "leased" and analysis.owner != "other"  # until its lease expires
    assert not (ctl / "analysis-go.json").exists()
    todo.done(other)


def test_no_early_lease_while_a_member_waits_or_none_runs(tmp_path: Path) -> None:
    _ctl, todo = _setup(tmp_path)
    assert todo.lease_analysis_early("w") is None  # members pending: run those first
    a = todo.lease("a")
    assert todo.lease_analysis_early("w") is None  # mem002 still pending
    b = todo.lease("b")
    early = todo.lease_analysis_early("w")
    assert early is not None and early.kind == "analysis"
    assert todo.settle_early(early) == "running"
    todo.done(a)
    assert todo.settle_early(early) == "running"
    todo.done(b)
    assert todo.settle_early(early) == "ready"


def test_ensio_analyse_prepares_then_waits_for_go(tmp_path: Path) -> None:
    """The real command on 2 ranks (rank 1 waits asleep): EOF ends it with nothing
    changed; go runs the given members."""
    ranks = 2
    import hashlib

    from ensio.cli.synth import main as synth_main

    mpiexec = Path(PY).with_name("mpiexec")
    launcher = [str(mpiexec), "-n", str(ranks)] if ranks > 1 else []
    cases = {}
    for name in ("ahead", "cancel", "cold"):
        assert synth_main([str(tmp_path / name), "--nx", "12", "--ny", "6", "--members", "4",
                           "--seed", "3"]) == 0
        cases[name] = tmp_path / name

    def digest(case: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(case.glob("mem*.nc"))}

    def start(case: Path, *extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [*launcher, PY, "-m", "ensio", "analyse", str(case / "ensio.yaml"), "--cycle", "1",
             "--members", "1,2,3,4", *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={**os.environ, "ENSIO_PRESTART": "1"})

    before = digest(cases["cancel"])
    proc = start(cases["cancel"])
    out, err = proc.communicate(b"", timeout=300)  # EOF: not needed after all
    assert proc.returncode == 0, err
    assert digest(cases["cancel"]) == before and not (cases["cancel"] / "an").exists()

    proc = start(cases["ahead"])
    out, err = proc.communicate(b'{"members": "1,3,4"}\n', timeout=300)
    assert proc.returncode == 0, err
    cold = subprocess.run([*launcher, PY, "-m", "ensio", "analyse",
                           str(cases["cold"] / "ensio.yaml"), "--cycle", "1", "--members",
                           "1,3,4"], capture_output=True, timeout=300)
    assert cold.returncode == 0, cold.stderr
    assert digest(cases["ahead"]) == digest(cases["cold"]) != before
    assert digest(cases["ahead"])["mem002.nc"] == before["mem002.nc"]  # not among the go's
