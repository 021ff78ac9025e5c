"""The locked to-do list: order, leases and fencing, retries, locks, crash safety."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from pool_support import LIGHT, PY

from ensio.locks import LockUnsupported, detect_lock_kind, make_lock
from ensio.locks import filelock as locks
from ensio.workflow.todo import Idle, Lease, StaleLease, TodoError, TodoList


def new(tmp_path: Path, n: int = 3, **kw) -> TodoList:
    return TodoList.create(tmp_path / "todo.json", range(1, n + 1), cycle=7, **kw)


def check_invariants(st: dict, ids: set[str] | None = None) -> None:
    """Nothing lost or duplicated: every lease ended exactly once or is still held."""
    tasks = st["tasks"]
    assert len({t["id"] for t in tasks}) == len(tasks)
    if ids is not None:
        assert {t["id"] for t in tasks} == ids
    tokens = [t["token"] for t in tasks if t["token"]]
    assert len(set(tokens)) == len(tokens)
    assert max(tokens, default=0) <= st["token"]
    for t in tasks:
        t = {**{"state": "pending", "attempts": 0, "failures": 0, "interrupts": 0,
                "expiries": 0, "owner": None, "deadline": None, "done_token": None}, **t}
        assert t["state"] in ("pending", "leased", "done", "failed")
        assert (t["owner"] is not None) == (t["state"] == "leased"), t
        assert (t["deadline"] is not None) == (t["state"] == "leased"), t
        assert (t["done_token"] is not None) == (t["state"] == "done"), t
        held = t["state"] in ("leased", "done")
        assert t["attempts"] == t["failures"] + t["interrupts"] + t["expiries"] + held, t


# ---------------------------------------------------------------------- list semantics
def test_members_in_order_then_analysis_only_when_all_done(tmp_path):
    todo = new(tmp_path)
    a = todo.lease("a", now=0)
    b = todo.lease("b", now=0)
    c = todo.lease("c", now=0)
    assert [x.task for x in (a, b, c)] == ["mem001", "mem002", "mem003"]
    assert [x.token for x in (a, b, c)] == [1, 2, 3] and c.cycle == 7
    todo.done(a, now=1)
    todo.done(b, now=1)
    busy = todo.lease("d", now=1)
    assert isinstance(busy, Idle) and busy.reason == "busy"  # mem003 still running
    nxt = todo.done(c, now=2, next_owner="c")
    assert isinstance(nxt, Lease) and nxt.task == "analysis" and nxt.kind == "analysis"
    assert todo.done(nxt, now=3, next_owner="c") == Idle("finished")
    s = todo.summary(now=3)
    assert s.finished and s.done == 4 and s.error is None
    check_invariants(todo.snapshot())


def test_interrupted_task_goes_to_the_front(tmp_path):
    todo = new(tmp_path, 4)
    a, b = todo.lease("a", now=0), todo.lease("b", now=0)
    todo.interrupt(b, now=1)
    again = todo.lease("c", now=1)
    assert again.task == "mem002" and again.attempt == 2 and again.token == 3
    assert todo.lease("d", now=1).task == "mem003"
    t = {v.id: v for v in todo.tasks()}
    assert t["mem002"].interrupts == 1 and t["mem002"].failures == 0
    assert a.task == "mem001"
    check_invariants(todo.snapshot())


def test_unstarted_lease_given_back_counts_no_attempt(tmp_path):
    """A task leased ahead and returned unstarted is behind the interrupted one, uncounted."""
    todo = new(tmp_path, 3, retries=0)
    running = todo.lease("a", now=0)
    ahead = todo.lease("a", now=0, spare=True)
    assert (running.task, ahead.task, ahead.attempt) == ("mem001", "mem002", 1)
    # the job's time-limit signal: the ahead task first, then the running one, to the front
    todo.interrupt(ahead, now=1, started=False)
    todo.interrupt(running, now=1)
    t = todo.tasks()
    assert [(v.id, v.state, v.attempts, v.failures, v.interrupts) for v in t[:3]] == [
        ("mem001", "pending", 1, 0, 1), ("mem002", "pending", 0, 0, 0),
        ("mem003", "pending", 0, 0, 0)]
    check_invariants(todo.snapshot())
    first, second = todo.lease("b", now=1), todo.lease("c", now=1)
    assert (first.task, first.attempt) == ("mem001", 2)
    assert (second.task, second.attempt) == ("mem002", 1)  # its first real attempt
    with pytest.raises(StaleLease):  # the undone lease is fenced off like any other
        todo.done(ahead, now=2)
    check_invariants(todo.snapshot())


def test_expired_lease_returns_to_front_and_zombie_cannot_commit(tmp_path):
    todo = new(tmp_path, 3, lease_seconds=10)
    zombie = todo.lease("zombie", now=0)
    other = todo.lease("other", now=0, duration=100)
    assert todo.renew(other, now=9).deadline == 19  # renewal extends by lease_seconds
    taken = todo.lease("fresh", now=11)  # zombie's lease expired at 10: back to the front
    assert taken.task == zombie.task and taken.token > other.token
    ran = []
    for op in (lambda: todo.done(zombie, now=12, commit=lambda: ran.append(1)),
               lambda: todo.renew(zombie, now=12),
               lambda: todo.interrupt(zombie, now=12),
               lambda: todo.fail(zombie, "late", now=12)):
        with pytest.raises(StaleLease):
            op()
    assert ran == []  # the zombie's output never lands
    todo.done(taken, now=13)
    t = {v.id: v for v in todo.tasks()}
    assert t["mem001"].state == "done" and t["mem001"].expiries == 1
    assert todo.snapshot()["tasks"][0]["done_token"] == taken.token
    check_invariants(todo.snapshot())


def test_own_expired_lease_cannot_commit(tmp_path):
    todo = new(tmp_path, 1, lease_seconds=5)
    lease = todo.lease("a", now=0)
    with pytest.raises(StaleLease):
        todo.done(lease, now=6)  # nobody re-leased it, but the deadline passed
    assert todo.lease("b", now=6).task == "mem001"


def test_failed_attempt_goes_behind_the_members_and_retries_are_bounded(tmp_path):
    todo = new(tmp_path, 3, retries=1)
    a = todo.lease("a", now=0)
    assert todo.fail(a, "exit status 1", now=1) is True
    order = [todo.lease(o, now=1).task for o in "bcd"]
    assert order == ["mem002", "mem003", "mem001"]  # retry behind the members
    check_invariants(todo.snapshot())


def test_member_failing_for_good_refuses_the_analysis(tmp_path):
    todo = new(tmp_path, 3, retries=1)
    for _ in range(2):
        lease = todo.lease("a", now=0, fits=lambda v: v.id == "mem002")
        assert lease.task == "mem002"
        todo.fail(lease, "exit status 3", now=0)
    for _ in range(2):
        todo.done(todo.lease("a", now=0), now=0)
    res = todo.lease("a", now=0)
    assert isinstance(res, Idle) and res.reason == "failed"
    assert "analysis refused" in res.message and "member 2" in res.message
    assert "min_members = 3" in res.message and "exit status 3" in res.message
    s = todo.summary(now=0)
    assert s.error == res.message and not s.finished and s.available == 0
    assert todo.lease("b", now=0).reason == "failed"
    check_invariants(todo.snapshot())


def test_min_members_lets_the_analysis_run(tmp_path):
    todo = new(tmp_path, 3, retries=0, min_members=2)
    a = todo.lease("a", now=0)
    todo.fail(a, "boom", now=0)
    nxt = todo.done(todo.lease("a", now=0), now=0, next_owner="a")
    nxt = todo.done(nxt, now=0, next_owner="a")
    assert isinstance(nxt, Lease) and nxt.task == "analysis"
    todo.done(nxt, now=0)
    s = todo.summary(now=0)
    assert s.finished and s.failed == 1 and s.error is None


def test_no_fit_and_busy(tmp_path):
    todo = new(tmp_path, 2)
    res = todo.lease("a", now=0, fits=lambda v: False)
    assert res.reason == "no_fit" and res.blocked.id == "mem001"
    assert todo.snapshot()["seq"] == 0  # nothing changed, nothing written


def test_create_checks_and_resume(tmp_path):
    todo = new(tmp_path, 2)
    with pytest.raises(TodoError, match="exists"):
        new(tmp_path, 2)
    assert TodoList.create(todo.path, [1, 2], exist_ok=True).summary().total == 3
    with pytest.raises(TodoError, match="min_members"):
        TodoList.create(tmp_path / "b.json", [1, 2], min_members=3)
    with pytest.raises(TodoError, match="no such"):
        TodoList(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "bad.json.lock").write_text("flock\n")
    with pytest.raises(TodoError, match="corrupt"):
        TodoList(tmp_path / "bad.json").summary()


# ---------------------------------------------------------------------- locks
COUNTER = LIGHT + r"""
import os, sys
from ensio.locks import make_lock
kind, base, counter, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lock = make_lock(kind, base, stale_after=60)
print("ready", flush=True)
sys.stdin.readline()
for _ in range(n):
    with lock:
        v = int(open(counter).read() or 0)
        os.sched_yield()
        with open(counter, "w") as f:
            f.write(str(v + 1))
"""


@pytest.mark.parametrize("kind", ["flock", "lockf", "mkdir"])
def test_lock_excludes_processes_and_threads(tmp_path, kind):
    counter = tmp_path / "counter"
    counter.write_text("0")
    base, n = tmp_path / "list.json", 20
    procs = [subprocess.Popen([PY, "-c", COUNTER, kind, str(base), str(counter), str(n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"

    def bump() -> None:
        lock = make_lock(kind, base)
        for _ in range(n):
            with lock:
                v = int(counter.read_text())
                os.sched_yield()
                counter.write_text(str(v + 1))

    threads = [threading.Thread(target=bump) for _ in range(2)]
    for p in procs:  # start barrier
        p.stdin.write("go\n")
        p.stdin.flush()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(p.wait(60) == 0 for p in procs)
    assert int(counter.read_text()) == 5 * n


HOLDER = LIGHT + r"""
import sys
from ensio.locks import make_lock
lock = make_lock(sys.argv[1], sys.argv[2])
lock.acquire()
print("held", flush=True)
sys.stdin.readline()
lock.release()
"""


@pytest.mark.parametrize("kind", ["flock", "lockf", "mkdir"])
def test_lock_of_a_killed_holder_is_recovered(tmp_path, kind):
    base = tmp_path / "list.json"
    p = subprocess.Popen([PY, "-c", HOLDER, kind, str(base)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    lock = make_lock(kind, base, stale_after=0.5)
    got = threading.Event()
    t = threading.Thread(target=lambda: (lock.acquire(), got.set()))
    t.start()
    assert not got.wait(0.2)  # held by a live process: we wait
    p.kill()
    p.wait()
    assert got.wait(30)  # kernel release (flock/lockf) or stale-lock recovery (mkdir)
    t.join()
    lock.release()
    assert not any(x.name.startswith("list.json.lock.d.") for x in tmp_path.iterdir())


def test_mkdir_lock_breaks_only_stale_locks(tmp_path):
    base = tmp_path / "list.json"
    d = tmp_path / "list.json.lock.d"
    d.mkdir()
    (d / "owner").write_text(json.dumps({"owner": "ghost:1:x", "time": time.time() - 100}))
    lock = make_lock("mkdir", base, stale_after=30)
    with lock:
        assert json.loads((d / "owner").read_text())["pid"] == os.getpid()
        assert lock.still_held()
    assert not d.exists()


def _refuse(code: int):
    def fn(*_a, **_k):
        raise OSError(code, os.strerror(code))
    return fn


def test_lock_kind_detection_falls_back(tmp_path, monkeypatch):
    assert detect_lock_kind(tmp_path) == "flock"
    monkeypatch.setattr(locks.fcntl, "flock", _refuse(errno.EOPNOTSUPP))
    assert detect_lock_kind(tmp_path) == "lockf"
    todo = TodoList.create(tmp_path / "a.json", [1])  # auto: records what works
    assert (tmp_path / "a.json.lock").read_text().strip() == "lockf"
    assert TodoList(tmp_path / "a.json").lease("x").task == "mem001"
    with pytest.raises(LockUnsupported, match="mkdir"):
        with make_lock("flock", tmp_path / "b.json"):
            pass
    monkeypatch.setattr(locks.fcntl, "lockf", _refuse(errno.ENOLCK))
    assert detect_lock_kind(tmp_path) == "mkdir"
    todo = TodoList.create(tmp_path / "c.json", [1, 2])
    assert todo.lock_kind == "mkdir" and todo.lease("x").task == "mem001"
    assert not list(tmp_path.glob(".ensio-lockprobe*"))


# ---------------------------------------------------------------------- crash safety
CHURN = LIGHT + r"""
import json, os, random, signal, sys
from ensio import faults
from ensio.workflow import todo as T
path, seed, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
calls = 0
def hook(stage):
    global calls
    calls += 1
    if calls == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
faults.set_hook(hook)
todo = T.TodoList(path)
rng = random.Random(seed)
clock, held = 1000.0, []
while True:
    clock += rng.random()
    try:
        if held and rng.random() < 0.6:
            lease = held.pop(rng.randrange(len(held)))
            op = rng.choice(["done", "done", "fail", "interrupt", "renew"])
            if op == "done":
                todo.done(lease, now=clock)
            elif op == "fail":
                todo.fail(lease, "injected", now=clock)
            elif op == "interrupt":
                todo.interrupt(lease, now=clock)
            else:
                held.append(todo.renew(lease, now=clock))
        else:
            res = todo.lease(f"o{rng.randrange(3)}", now=clock, duration=4.0)
            if isinstance(res, T.Lease):
                held.append(res)
            elif res.reason in ("finished", "failed"):
                break
    except T.StaleLease:
        pass
    st = todo.snapshot()
    print(st["seq"], json.dumps(st["tasks"], sort_keys=True, separators=(",", ":")), flush=True)
"""


def _finish(todo: TodoList) -> None:
    """Drain a list in this process, long after every lease of the crashed child expired."""
    res = todo.lease("after", now=1e12)
    while isinstance(res, Lease):
        res = todo.done(res, now=1e12, next_owner="after")
    assert res.reason in ("finished", "failed")
    assert todo.summary(now=1e12).leased == 0


def _churn(path: Path, seed: int, kill_at: int) -> tuple[int, list[int]]:
    p = subprocess.run([PY, "-c", CHURN, str(path), str(seed), str(kill_at)],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, [int(line.split()[0]) for line in p.stdout.splitlines()]


def _history(path: Path, seed: int) -> dict[int, list]:
    """Tasks after every transition of an uninterrupted churn from a copy of ``path``.

    The churn is deterministic (its clock and choices come from ``seed``), so
    a killed run's file must hold exactly one of these states: the one it
    last reported, or the next (its interrupted transition took effect).
    """
    replay = path.parent.with_name(path.parent.name + "-replay") / path.name
    shutil.copytree(path.parent, replay.parent)  # the list and its lock-kind file
    states = {TodoList(path).snapshot()["seq"]: TodoList(path).snapshot()["tasks"]}
    p = subprocess.run([PY, "-c", CHURN, str(replay), str(seed), "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    for line in p.stdout.splitlines():
        seq, tasks = line.split(" ", 1)
        states[int(seq)] = json.loads(tasks)
    shutil.rmtree(replay.parent)
    return states


def _canonical(tasks: list) -> list:
    return json.loads(json.dumps(tasks, sort_keys=True))


@pytest.mark.parametrize("kind", ["flock", "mkdir"])
def test_crash_at_any_step_of_a_transition_leaves_old_or_new(tmp_path, kind):
    rng = random.Random(4)
    killed = 0
    for run in range(4 if kind == "flock" else 3):
        path = tmp_path / f"run{run}" / "todo.json"
        TodoList.create(path, range(1, 6), retries=2, lock=kind, lease_seconds=4.0)
        ids = {t["id"] for t in TodoList(path).snapshot()["tasks"]}
        history = _history(path, seed=run)
        rc, seqs = _churn(path, seed=run, kill_at=rng.randrange(1, 80))
        todo = TodoList(path, stale_after=0.2)
        st = todo.snapshot()  # parses: never a torn file
        check_invariants(st, ids)
        last = seqs[-1] if seqs else 0
        if rc == -signal.SIGKILL:
            killed += 1
            assert st["seq"] in (last, last + 1)  # the interrupted transition: old or new
        else:
            assert rc == 0 and st["seq"] == last
        assert _canonical(st["tasks"]) == history[st["seq"]]  # ... and exactly its content
        assert len(list(path.parent.glob(".todo.json.ensio-tmp.*"))) <= 1
        _finish(todo)  # later transitions work (the lock is recovered) ...
        assert not list(path.parent.glob(".todo.json.ensio-tmp.*"))  # ... and clean up
        check_invariants(todo.snapshot(), ids)
    assert killed >= 2


def test_random_sigkill_of_a_busy_process(tmp_path):
    path = tmp_path / "todo.json"
    TodoList.create(path, range(1, 100), retries=1000, lease_seconds=4.0)
    ids = {t["id"] for t in TodoList(path).snapshot()["tasks"]}
    rng = random.Random(11)
    for seed in range(4):
        history = _history(path, seed=100 + seed)
        p = subprocess.Popen([PY, "-c", CHURN, str(path), str(100 + seed), "0"],
                             stdout=subprocess.PIPE, text=True)
        last = TodoList(path).snapshot()["seq"]
        for _ in range(rng.randrange(3, 25)):  # after a random number of transitions
            line = p.stdout.readline()
            if not line:
                break
            last = int(line.split()[0])
        p.kill()
        rest = [int(line.split()[0]) for line in p.stdout.read().splitlines()]
        last = max([last, *rest])  # lines still in the pipe
        p.wait()
        st = TodoList(path).snapshot()
        check_invariants(st, ids)
        assert st["seq"] in (last, last + 1)
        assert _canonical(st["tasks"]) == history[st["seq"]]
