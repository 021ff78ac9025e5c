"""Workers: command templates, time limits, lease expiry, fencing, retries."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pool_support import PY, WORKER, flag, make_fifo, make_spec, quote, records, side_effects

from ensio.config.errors import ConfigError
from ensio.config.workflow import MEMBER_PLACEHOLDERS, command_fields
from ensio.workflow.records import append_record
from ensio.workflow.spec import WorkerSpec, create_todo, render, worker_argv
from ensio.workflow.todo import TodoList
from ensio.workflow.worker import Worker


def setup(tmp_path: Path, n: int = 3, **kw) -> tuple[Path, TodoList]:
    ctl = tmp_path / "ctl"
    ctl.mkdir(parents=True)
    spec_kw = {k: kw.pop(k) for k in ("task_estimate", "analysis") if k in kw}
    todo = create_todo(ctl / "todo.json", make_spec(ctl, **spec_kw), range(1, n + 1),
                       cycle=1, **kw)
    return ctl, todo


def run_worker(todo: TodoList, **kw) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = Worker(todo, log=lines.append, **kw).run()
    return code, lines


def task_records(ctl: Path, job: str | None = None) -> list[dict]:
    return [r for r in records(ctl) if r["kind"] != "job" and (job is None or r["job"] == job)]


def spawn(todo: TodoList, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*WORKER, str(todo.path), *args], stderr=subprocess.DEVNULL)


def stop_outside_the_lock(proc: subprocess.Popen, todo: TodoList) -> None:
    """SIGSTOP a worker at a moment it does not hold the list's lock.

    A stopped holder of an flock/lockf lock would block every other job for
    good (such locks have no timeout); the stall this models is a job whose
    member runs on, not one frozen inside a transition. So: stop it, look
    whether its lock is free (a non-blocking attempt from here), and if not,
    let it run on and try again.
    """
    assert todo.lock_kind in ("flock", "lockf"), todo.lock_kind
    lock_file = todo.path.with_name(todo.path.name + ".lock")
    take = fcntl.flock if todo.lock_kind == "flock" else fcntl.lockf
    deadline = time.monotonic() + 60
    while True:
        proc.send_signal(signal.SIGSTOP)
        while Path(f"/proc/{proc.pid}/stat").read_text().split(")")[-1].split()[0] != "T":
            assert time.monotonic() < deadline, "the worker never stopped"
        fd = os.open(lock_file, os.O_RDWR)
        try:
            take(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            take(fd, fcntl.LOCK_UN)
            return
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
        proc.send_signal(signal.SIGCONT)
        assert time.monotonic() < deadline, "the worker always held the lock"


def wait_until(deadline: float) -> None:
    """Let wall-clock time pass a lease deadline (lease semantics, not synchronisation)."""
    time.sleep(max(0.0, deadline - time.time()) + 0.05)


# ---------------------------------------------------------------------- templates
def test_values_stay_one_argument_and_no_shell_runs():
    nasty = "a b 'c' \"d\" $(touch pwned); `x` | y > z {member} \\ *"
    argv = render("prog --dir {workdir} --m={member:03d} '{forecast} x'",
                  {"workdir": nasty, "member": 7, "forecast": "f o", "cycle": 1, "analysis": ""},
                  MEMBER_PLACEHOLDERS)
    assert argv == ["prog", "--dir", nasty, "--m=007", "f o x"]


@pytest.mark.parametrize("template, needle", [
    ("prog {member.__class__}", "not a plain name"),
    ("prog {forecast[0]}", "not a plain name"),
    ("prog {0}", "not a plain name"),
    ("prog {}", "not a plain name"),
    ("prog {nope}", "unknown placeholder {nope}"),
    ("prog {member:{cycle}}", "nested placeholder"),
    ("prog 'unbalanced", "cannot split"),
    ("", "empty command"),
    ("prog {member", "bad placeholder"),
])
def test_bad_templates_are_refused(template, needle):
    with pytest.raises(ConfigError, match=needle.replace("{", r"\{").replace("[", r"\[")):
        command_fields(template, MEMBER_PLACEHOLDERS, "workflow.member_command")


def test_escaped_braces_and_spec_checks(tmp_path):
    assert render("echo {{member}}", {}, MEMBER_PLACEHOLDERS) == ["echo", "{member}"]
    with pytest.raises(ConfigError, match="uses {forecast} but no forecast path"):
        WorkerSpec(member_command="m {forecast}").validate()
    with pytest.raises(ConfigError, match="forecast: unknown placeholder"):
        WorkerSpec(member_command="m", forecast="x/{workdir}.nc").validate()
    with pytest.raises(ConfigError, match="analysis_command"):
        create_todo(tmp_path / "t.json", WorkerSpec(member_command="m",
                    analysis_command="a {member}"), [1], cycle=1)
    assert not (tmp_path / "t.json").exists()


def test_member_gets_exact_arguments_in_its_workdir(tmp_path):
    ctl = tmp_path / "ctl"
    code = ("import json, os, sys; "
            "open(sys.argv[-1], 'w').write(json.dumps([os.getcwd(), *sys.argv[1:]]))")
    odd = "work dir 'q' \"dq\" $(touch pwned); {member:02d}"
    spec = WorkerSpec(member_command=f"{PY} -S -c {quote(code)} --in {{analysis}} {{workdir}} "
                                     f"--cycle={{cycle}} {{forecast}}",
                      forecast=str(ctl / "out" / "m{member}.json"),
                      analysis=str(ctl / "an a" / "m{member}.nc"),
                      workdir=str(ctl / odd), task_estimate=1.0)
    todo = create_todo(ctl / "todo.json", spec, [4], cycle=2)
    assert run_worker(todo)[0] == 0
    cwd, *args = json.loads((ctl / "out" / "m4.json").read_text())
    wd = str(ctl / "work dir 'q' \"dq\" $(touch pwned); 04")
    assert cwd == wd and args[:4] == ["--in", str(ctl / "an a" / "m4.nc"), wd, "--cycle=2"]
    assert args[4] == str(ctl / "out" / ".ensio-stage" / "t1" / "m4.json")  # staged, then moved
    assert not list(tmp_path.rglob("pwned")) and not (ctl / "out" / ".ensio-stage").exists()


# ---------------------------------------------------------------------- time limits
def test_time_limit_requeues_at_front_and_another_job_completes_it(tmp_path):
    """Acceptance: the interrupted member is the next task leased, by another job."""
    ctl, todo = setup(tmp_path, 3)
    flag(ctl, "sleep", "mem001", "1.0")  # longer than job A's remaining time
    a = spawn(todo, "--time-limit", "0.8", "--margin", "0.2", "--job-id", "A")
    assert a.wait(30) == 0
    assert [v.id for v in todo.tasks()][0] == "mem001"  # back at the front
    b = spawn(todo, "--job-id", "B")
    assert b.wait(60) == 0
    ra, rb = task_records(ctl, "A"), task_records(ctl, "B")
    assert [(r["task"], r["status"], r["token"]) for r in ra] == [("mem001", "interrupted", 1)]
    assert ra[0]["exit"] == -signal.SIGTERM
    # stopped before its 1 s sleep ended: A's attempt (token 1) never reached the
    # member's side effect, which follows the sleep
    assert ("mem001", 1) not in [(task, token) for task, token, _ in side_effects(ctl)]
    # tokens count leases in order: A took 1 (mem001) and maybe 2 (mem002, leased ahead
    # and given back unstarted); the first lease after A is B's mem001
    a_leases = todo.snapshot()["token"] - len(rb)
    assert [(r["task"], r["status"], r["token"]) for r in rb] == [
        ("mem001", "done", a_leases + 1), ("mem002", "done", a_leases + 2),
        ("mem003", "done", a_leases + 3), ("analysis", "done", a_leases + 4)]
    assert a_leases in (1, 2)
    job_a = [r for r in records(ctl) if r["kind"] == "job" and r["job"] == "A"]
    assert job_a[0]["reason"] == "time_limit"
    assert [t for t, _, _ in side_effects(ctl)] == ["mem001", "mem002", "mem003", "analysis"]
    t = {v.id: v for v in todo.tasks()}
    assert t["mem001"].interrupts == 1 and t["mem001"].failures == 0
    assert (ctl / "forecast" / "mem001.nc").read_text() == str(a_leases + 1)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_scheduler_signal_stops_member_and_requeues_it(tmp_path, sig):
    ctl, todo = setup(tmp_path, 2)
    flag(ctl, "block", "mem001")
    fifo = make_fifo(ctl)
    a = spawn(todo, "--job-id", "A")
    with open(fifo) as f:
        pid = int(f.readline())  # the member is running
    a.send_signal(sig)
    assert a.wait(30) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the member's process group was stopped (and reaped)
    tasks = todo.tasks()
    assert tasks[0].id == "mem001" and tasks[0].state == "pending" and tasks[0].interrupts == 1
    (rec,) = task_records(ctl, "A")
    assert rec["status"] == "interrupted" and rec["exit"] == -signal.SIGTERM
    assert side_effects(ctl) == []


def test_member_killed_with_the_job_is_requeued_not_failed(tmp_path):
    """scancel signals every process of a job: the member's death is not its fault."""
    ctl, todo = setup(tmp_path, 2, retries=0)
    flag(ctl, "block", "mem001")
    fifo = make_fifo(ctl)
    a = spawn(todo, "--job-id", "A")
    with open(fifo) as f:
        pid = int(f.readline())
    os.kill(pid, signal.SIGTERM)  # the member first, then the worker
    a.send_signal(signal.SIGTERM)
    assert a.wait(30) == 0
    first = todo.tasks()[0]
    assert first.id == "mem001" and first.state == "pending" and first.failures == 0
    assert [r["status"] for r in task_records(ctl, "A")] == ["interrupted"]


#: Member for the leased-ahead tests: the first attempt of mem001 reports its pid
#: on the FIFO and runs until SIGTERM, which it reports the shell's way (exit
#: 143 = 128 + SIGTERM, as ``mpiexec`` or a trapping wrapper script would).
TRAPPING_MEMBER = r"""
import os, signal, sys, time
ctl, out = sys.argv[1], sys.argv[2]
e = os.environ
if (e["ENSIO_TASK"], e["ENSIO_ATTEMPT"]) == ("mem001", "1"):
    signal.signal(signal.SIGTERM, lambda *a: os._exit(128 + signal.SIGTERM))
    with open(os.path.join(ctl, "fifo"), "w") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(3600)
with open(out, "w") as f:
    f.write(e["ENSIO_ATTEMPT"])
"""


def gone(pid: int, timeout: float = 30.0) -> None:
    """Wait until process ``pid`` has exited and was reaped (polls /proc)."""
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}"):
        assert time.monotonic() < deadline, f"process {pid} still exists"
        time.sleep(0.005)


@pytest.mark.parametrize("how", ["warning", "job_killed_member_first"])
def test_task_leased_ahead_goes_back_uncounted_on_the_time_limit_signal(tmp_path, how):
    """Issue 4: the task leased ahead goes back behind the interrupted one; no attempt counts.

    ``warning``: SLURM's USR1 reaches only the worker, which stops the member.
    ``job_killed_member_first``: the scheduler's SIGTERM reaches the member
    first; it exits 143 and is reaped before the worker's own signal arrives.
    """
    ctl = tmp_path / "ctl"
    spec = WorkerSpec(member_command=f"{PY} -S -c {quote(TRAPPING_MEMBER)} {ctl} {{forecast}}",
                      forecast=str(ctl / "forecast" / "mem{member:03d}.nc"),
                      records=str(ctl / "records.jsonl"), task_estimate=0.05, grace=5.0)
    todo = create_todo(ctl / "todo.json", spec, range(1, 4), cycle=1, retries=0)
    fifo = make_fifo(ctl)
    a = spawn(todo, "--job-id", "A")
    with open(fifo) as f:
        pid = int(f.readline())  # mem001 runs
    deadline = time.monotonic() + 30
    while (ahead := {v.id: v for v in todo.tasks()}["mem002"]).state != "leased":
        assert time.monotonic() < deadline, "mem002 was never leased ahead"
        time.sleep(0.01)
    assert ahead.owner.startswith("A@") and ahead.attempts == 1
    if how == "warning":
        a.send_signal(signal.SIGUSR1)
    else:
        os.kill(pid, signal.SIGTERM)
        gone(pid)  # the worker has seen the exit (143) before its own signal
        a.send_signal(signal.SIGTERM)
    assert a.wait(30) == 0
    # both back at the front, the interrupted one first; retries=0, so a counted
    # failure would have failed the member for good
    assert [(v.id, v.state, v.attempts, v.failures, v.interrupts) for v in todo.tasks()] == [
        ("mem001", "pending", 1, 0, 1), ("mem002", "pending", 0, 0, 0),
        ("mem003", "pending", 0, 0, 0)]
    (rec,) = task_records(ctl, "A")  # the unstarted ahead lease leaves no task record
    assert (rec["task"], rec["status"], rec["exit"]) == ("mem001", "interrupted", 143)
    assert run_worker(todo, job_id="B")[0] == 0
    assert todo.summary().finished
    assert [(r["task"], r["status"], r["attempt"]) for r in task_records(ctl, "B")] == [
        ("mem001", "done", 2), ("mem002", "done", 1), ("mem003", "done", 1)]
    assert [(ctl / "forecast" / f"mem{m:03d}.nc").read_text() for m in (1, 2, 3)] == [
        "2", "1", "1"]


def test_never_starts_a_task_expected_to_exceed_the_job(tmp_path):
    ctl, todo = setup(tmp_path, 2, task_estimate=5.0)
    code, log = run_worker(todo, time_limit=1.0, margin=0.1)
    assert code == 3 and "expected to take 5 s" in log[0]
    assert todo.summary().token == 0  # nothing was leased
    # an estimate from the records beats task_estimate
    ctl2, todo2 = setup(tmp_path / "b", 2, task_estimate=0.01)
    append_record(ctl2 / "records.jsonl", {"kind": "member", "status": "done",
                                           "started": 10.0, "ended": 12.0})
    assert run_worker(todo2, time_limit=1.5, margin=0.1)[0] == 3


def test_stops_taking_tasks_when_time_runs_short(tmp_path):
    ctl, todo = setup(tmp_path, 6, task_estimate=0.3)
    for m in range(1, 7):
        flag(ctl, "sleep", f"mem{m:03d}", "0.3")
    code, log = run_worker(todo, time_limit=1.0, margin=0.1)
    assert code == 0
    recs = task_records(ctl)
    assert recs and all(r["expected"] <= r["remaining"] for r in recs)  # the rule, as applied
    assert all(r["expected"] >= 0.3 for r in recs[1:])  # own runs raise the estimate
    tasks = todo.tasks()
    pending = [v.id for v in tasks if v.state == "pending"]
    assert any(v.attempts == 0 for v in tasks)
    if recs[-1]["status"] == "done":  # not cut short by a run slower than all before:
        assert "does not fit" in log[-2]  # the next member (never leased, or leased ahead
        assert pending[0] == f"mem{len(recs) + 1:03d}"  # and given back) comes first
    else:
        assert recs[-1]["status"] == "interrupted" and pending[0] == recs[-1]["task"]


# ---------------------------------------------------------------------- leases
def test_killed_workers_task_returns_to_the_front(tmp_path):
    ctl, todo = setup(tmp_path, 3, lease_seconds=0.6)
    block = flag(ctl, "block", "mem001")
    fifo = make_fifo(ctl)
    a = spawn(todo, "--job-id", "A")
    with open(fifo) as f:
        pid = int(f.readline())
    a.kill()
    a.wait()
    os.killpg(pid, signal.SIGKILL)  # a dead job's processes die with it
    block.unlink()
    wait_until(todo.tasks()[0].deadline)
    assert run_worker(todo, job_id="B")[0] == 0
    rb = task_records(ctl, "B")
    first = todo.snapshot()["token"] - len(rb) + 1  # A's leases (1, maybe 2) came before
    assert [(r["task"], r["token"]) for r in rb][:2] == [("mem001", first), ("mem002", first + 1)]
    assert {v.id: v for v in todo.tasks()}["mem001"].expiries == 1
    assert todo.summary().finished


def test_stalled_zombie_cannot_commit(tmp_path):
    ctl, todo = setup(tmp_path, 2, lease_seconds=0.6)
    block = flag(ctl, "block", "mem001")
    fifo, go = make_fifo(ctl), make_fifo(ctl, "go")
    a = spawn(todo, "--job-id", "A")
    with open(fifo) as f:
        int(f.readline())
    stop_outside_the_lock(a, todo)  # the job stalls while its member runs on
    with open(go, "w") as f:
        f.write("go\n")
    staged = ctl / "forecast" / ".ensio-stage" / "t1" / "mem001.nc"
    deadline = time.monotonic() + 60
    while not (staged.exists() and staged.read_text() == "1"):
        assert time.monotonic() < deadline, "the member never wrote its output"
        time.sleep(0.01)  # wait for the member's output file
    block.unlink()
    wait_until(todo.tasks()[0].deadline)
    assert run_worker(todo, job_id="B")[0] == 0  # takes mem001 over and finishes
    a.send_signal(signal.SIGCONT)
    assert a.wait(30) == 0
    (ra,) = task_records(ctl, "A")
    assert ra["task"] == "mem001" and ra["status"] == "stale" and ra["exit"] == 0
    (mem1,) = [t for t in todo.snapshot()["tasks"] if t["id"] == "mem001"]
    assert mem1["done_token"] > 1 and mem1["done_by"].startswith("B@")
    out = (ctl / "forecast" / "mem001.nc").read_text()
    assert out == str(mem1["done_token"])  # B's output, not the zombie's
    assert [t for t, k, _ in side_effects(ctl) if k == 1] == ["mem001"]  # ran, never counted


# ---------------------------------------------------------------------- retries
def test_member_failing_for_good_refuses_the_analysis(tmp_path):
    ctl, todo = setup(tmp_path, 3, retries=1)
    flag(ctl, "fail", "mem002")
    code, log = run_worker(todo)
    assert code == 1 and any("analysis refused" in x for x in log)
    recs = task_records(ctl)
    assert [(r["task"], r["status"], r["attempt"]) for r in recs] == [
        ("mem001", "done", 1), ("mem002", "failed", 1), ("mem003", "done", 1),
        ("mem002", "failed", 2)]
    s = todo.summary()
    assert "member 2 after 2 attempt(s): mem002: exit status 1" in s.error
    assert not (ctl / "analysis-argv.json").exists()


def test_min_members_lets_the_analysis_run_on_the_rest(tmp_path):
    ctl, todo = setup(tmp_path, 3, retries=0, min_members=2)
    flag(ctl, "noout", "mem002")  # exit 0 but no output is a failure too
    flag(ctl, "io", "mem003")
    assert run_worker(todo)[0] == 0
    assert json.loads((ctl / "analysis-argv.json").read_text()) == [str(ctl), "1", "1,3"]
    recs = {r["task"]: r for r in task_records(ctl)}
    assert recs["mem002"]["status"] == "failed" and recs["mem003"]["io_seconds"] == 0.25
    assert "was not written" in {v.id: v for v in todo.tasks()}["mem002"].error
    assert todo.summary().finished


def test_missing_program_is_a_failed_attempt(tmp_path):
    ctl = tmp_path / "c"
    todo = create_todo(ctl / "todo.json", WorkerSpec(member_command="/nonexistent/prog {member}"),
                       [1], cycle=1, retries=0)
    code, log = run_worker(todo)
    assert code == 1 and "cannot start the command" in log[1]
    s = todo.summary()
    assert s.failed == 1 and "only 0 of 1 members succeeded" in s.error


# ---------------------------------------------------------------------- entry points
def test_module_entry_point_and_cli_parser(tmp_path):
    ctl, todo = setup(tmp_path, 2, analysis=False)
    argv = worker_argv(todo.path, time_limit=60, margin=1)
    assert argv[:3] == (sys.executable, "-m", "ensio.cli.worker")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert todo.summary().finished and "exits (finished) after 2 task(s)" in p.stderr

    from ensio.cli import worker as cli

    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["worker", str(todo.path), "--time-limit", "00:10:00"])
    assert args.func is cli.run and args.time_limit == "00:10:00"
    assert cli.main([str(tmp_path / "missing.json")]) == 2  # one-line error, no traceback
    assert cli.main([str(todo.path), "--time-limit", "soon"]) == 2
