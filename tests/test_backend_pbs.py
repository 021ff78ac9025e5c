"""A PBS-like scheduler is only class attributes + a script function (issue 9, item 5).

:class:`PbsBackend` below subclasses :class:`BatchBackend` with nothing but
class attributes (argv templates of ``qsub``/``qstat``/``qdel``, job-id
patterns, the state map, the "already gone" and transient messages, file
names) and :func:`pbs_script`. A stand-in scheduler (:data:`STANDIN`, one
Python file behind three commands on ``PATH``) keeps its jobs in files and
really runs each job script with bash in the background, at most ``slots``
at a time (a file the test may change, as a machine gets busy). The pool
drains a to-do list through it: it adopts the jobs of an earlier driver,
submits, follows states and cancels the jobs left in the queue.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys
import threading
import time
from collections import Counter

import pytest
from pool_support import flag, make_fifo, make_spec, records, side_effects

from ensio.workflow.backends import BACKENDS
from ensio.workflow.backends.base import JobSpec
from ensio.workflow.backends.batch import IDS, SCRIPT, BatchBackend, BatchError
from ensio.workflow.pool import drain, read_job_file
from ensio.workflow.spec import create_todo, worker_argv

#: The stand-in scheduler: ``qsub SCRIPT``, ``qstat -x -F dsv ID…``, ``qdel ID…``,
#: and ``run ID`` (the detached runner qsub starts for each job). State in
#: ``$PBS_STANDIN_DIR``: ``<id>.json`` per job, ``seq``, ``slots``, and the
#: optional ``down`` (every command fails) and ``busy`` (qsub fails that many times).
STANDIN = r'''
import contextlib, fcntl, json, os, signal, subprocess, sys, time
from pathlib import Path
STATE = Path(os.environ["PBS_STANDIN_DIR"])

@contextlib.contextmanager
def locked():
    with open(STATE / "lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield

def load(jid):
    p = STATE / f"{jid}.json"
    return json.loads(p.read_text()) if p.exists() else None

def save(job):
    tmp = STATE / f"{job['id']}.tmp"
    tmp.write_text(json.dumps(job))
    os.replace(tmp, STATE / f"{job['id']}.json")

def fail(msg, code):
    print(msg, file=sys.stderr)
    sys.exit(code)

def qsub(script):
    if (STATE / "down").exists():
        fail("qsub: cannot connect to server", 1)
    with locked():
        busy = STATE / "busy"
        if busy.exists() and int(busy.read_text()) > 0:
            busy.write_text(str(int(busy.read_text()) - 1))
            fail("pbs_iff: cannot read reply from server, try again", 1)
        text = Path(script).read_text()
        name = next(ln.split()[2] for ln in text.splitlines() if ln.startswith("#PBS -N "))
        seq = STATE / "seq"
        n = int(seq.read_text()) + 1 if seq.exists() else 1
        seq.write_text(str(n))
        jid = f"{n}.standin"
        save({"id": jid, "name": name, "workdir": os.getcwd(), "state": "Q",
              "script": str(Path(script).resolve())})
    subprocess.Popen([sys.executable, __file__, "run", jid], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    print(jid)

def run(jid):
    while True:  # the scheduler's queue: wait for a free slot (or a qdel)
        with locked():
            job = load(jid)
            if job["state"] != "Q":
                return
            jobs = [load(p.stem) for p in STATE.glob("*.json")]
            if sum(j["state"] in ("R", "E") for j in jobs) < int((STATE / "slots").read_text()):
                out = open(Path(job["workdir"]) / f"{job['name']}.o{jid}", "ab")
                proc = subprocess.Popen(["bash", job["script"]], cwd=job["workdir"],
                                        env={**os.environ, "PBS_JOBID": jid}, stdout=out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
                job.update(state="R", pid=proc.pid)
                save(job)
                break
        time.sleep(0.05)
    rc = proc.wait()
    with locked():
        job = load(jid)
        job["state"] = "D" if job.get("deleted") else "F" if rc == 0 else "X"
        save(job)

def qstat(ids):
    if (STATE / "down").exists():
        fail("qstat: cannot connect to server", 1)
    code = 0
    for jid in ids:
        job = load(jid)
        if job is None:
            print(f"qstat: Unknown Job Id {jid}", file=sys.stderr)
            code = 153
        else:
            print("|".join([jid, job["name"], job["state"], job["workdir"]]))
    sys.exit(code)

def qdel(ids):
    if (STATE / "down").exists():
        fail("qdel: cannot connect to server", 1)
    code = 0
    with locked():
        for jid in ids:
            job = load(jid)
            if job is None:
                print(f"qdel: Unknown Job Id {jid}", file=sys.stderr)
                code = 153
            elif job["state"] == "Q":
                job["state"] = "D"
                save(job)
            elif job["state"] in ("R", "E"):
                job.update(state="E", deleted=True)
                save(job)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job["pid"], signal.SIGTERM)
            else:
                print(f"qdel: Job has finished {jid}", file=sys.stderr)
                code = 35
    sys.exit(code)

cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "qsub":
    qsub(args[-1])
elif cmd == "qstat":
    qstat([a for a in args if not a.startswith("-") and a != "dsv"])
elif cmd == "qdel":
    qdel(args)
else:
    run(args[0])
'''


def pbs_script(spec: JobSpec) -> str:
    """The PBS job script of ``spec`` (a pure function, like SLURM's ``job_script``)."""
    hours, rest = divmod(math.ceil(spec.time_limit), 3600)
    lines = [
        "#!/bin/bash",
        f"#PBS -N {spec.name}",
        f"#PBS -l walltime={hours:02d}:{rest // 60:02d}:{rest % 60:02d}",
        "#PBS -l select=1:ncpus=1",
        "#PBS -j oe",
        *(f"export {k}={shlex.quote(v)}" for k, v in spec.env),
        'export ENSIO_JOB_ID="$PBS_JOBID"',
        f"cd -- {shlex.quote(spec.workdir)} || exit 1",
        "exec " + shlex.join(spec.argv),
    ]
    return "\n".join(lines) + "\n"


class PbsBackend(BatchBackend):
    """A PBS-like scheduler: class attributes and a script function, nothing else."""

    name = "pbs"
    label = "PBS"
    submit_argv = ("qsub", SCRIPT)
    status_argv = ("qstat", "-x", "-F", "dsv", IDS)
    status_columns = ("id", "name", "state", "workdir")
    cancel_argv = ("qdel", IDS)
    submitted_id = re.compile(r"(\d+\.[\w.-]+)")
    job_id = re.compile(r"^\d+\.[\w.-]+$")
    state_map = {"Q": "pending", "H": "pending", "W": "pending", "R": "running",
                 "E": "running", "F": "done", "X": "failed", "D": "cancelled"}
    gone_messages = ("unknown job id", "job has finished")
    transient_messages = ("try again",)
    script_name = "{name}.pbs"
    log_name = "{name}.o{id}"
    script = staticmethod(pbs_script)


FINAL = ("done", "failed", "cancelled")


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in scheduler on PATH; its state directory. Jobs are deleted afterwards."""
    state, bin_dir = tmp_path / "pbs-state", tmp_path / "pbs-bin"
    state.mkdir()
    bin_dir.mkdir()
    (state / "slots").write_text("1")
    prog = bin_dir / "standin.py"
    prog.write_text(STANDIN)
    for cmd in ("qsub", "qstat", "qdel"):
        exe = bin_dir / cmd
        exe.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -S {prog} {cmd} "$@"\n')
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PBS_STANDIN_DIR", str(state))
    yield state
    (state / "down").unlink(missing_ok=True)
    ids = [p.stem for p in state.glob("*.json")]
    live = [j for j, st in PbsBackend(command_timeout=30).states(ids).items() if st not in FINAL]
    if live:
        PbsBackend(command_timeout=30).cancel(live)


def wait_for(backend: BatchBackend, job: str, states: tuple[str, ...], timeout: float = 60):
    """Follow an external scheduler until ``job`` is in ``states`` (bounded)."""
    deadline = time.monotonic() + timeout
    while (st := backend.states([job])[job]) not in states:
        assert time.monotonic() < deadline, f"job {job} still {st}, wanted {states}"
        time.sleep(0.1)
    return st


def test_registry_names_are_the_config_names():
    from typing import get_args

    from ensio.config.workflow import BackendName

    assert set(BACKENDS) == set(get_args(BackendName))


def test_pool_drains_through_a_pbs_like_scheduler(tmp_path, standin):
    """Adopt the earlier driver's jobs, submit, follow states, cancel what still waits."""
    ctl = tmp_path / "ctl"
    todo = create_todo(ctl / "todo.json", make_spec(ctl), range(1, 7), cycle=1)
    flag(ctl, "block", "mem002")  # holds worker 1 until the new driver has adopted
    fifo, go = make_fifo(ctl), make_fifo(ctl, "go")
    logs = ctl / "logs"
    logs.mkdir()
    job = JobSpec("ensio-pbs-worker", worker_argv(todo.path, time_limit=300), 300, str(logs))
    job_file = ctl / "jobs.jsonl"
    earlier = PbsBackend(min_poll=1.0)

    # The earlier driver (killed): worker 1 runs, worker 2 waits in the queue.
    w1 = earlier.submit(job)
    assert wait_for(earlier, w1, ("running",)) == "running"
    (standin / "slots").write_text("0")  # the machine is full from now on: nothing else starts
    w2 = earlier.submit(job)
    assert earlier.states([w2]) == {w2: "pending"}
    with open(job_file, "w") as f:
        for jid in (w1, w2):
            f.write(json.dumps({"id": jid, "backend": "pbs", "name": job.name,
                                "workdir": job.workdir, "submitted": time.time()}) + "\n")

    backend = PbsBackend(min_poll=1.0)
    submitted = threading.Event()
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = drain(todo, backend, job, 3, poll=0.2, timeout=120, settle=30,
                                  job_file=job_file, on_submit=lambda *_: submitted.set())
        except BaseException as exc:  # surfaced below
            out["error"] = exc

    driver = threading.Thread(target=run)
    with open(fifo) as f:
        f.readline()  # worker 1 runs mem002, which now waits for "go"
    driver.start()
    try:
        assert submitted.wait(60), "the new driver submitted nothing"
    finally:
        with open(go, "w") as f:
            f.write("go\n")
        driver.join(150)
    assert not driver.is_alive() and "error" not in out, out.get("error")
    result = out["result"]
    assert result.summary.finished and result.error is None, result
    assert result.adopted == [w1, w2]  # both live, checked by name and workdir
    (w3,) = result.jobs  # N_j = 3: one more submitted, recorded in the job file
    assert [e["id"] for e in read_job_file(job_file)] == [w1, w2, w3]
    assert sorted(result.cancelled) == sorted([w2, w3])  # still queued at the end
    # every task exactly once, the analysis last, all in worker 1
    effects = [task for task, _, _ in side_effects(ctl)]
    assert Counter(effects) == Counter([f"mem{m:03d}" for m in range(1, 7)] + ["analysis"])
    assert effects[-1] == "analysis"
    assert {r["job"] for r in records(ctl) if r["kind"] != "job"} == {w1}
    assert wait_for(backend, w1, FINAL) == "done"
    # the cancelled jobs never ran: no output file, state cancelled
    assert backend.states([w2, w3]) == {w2: "cancelled", w3: "cancelled"}
    assert not (logs / f"{job.name}.o{w2}").exists() and not (logs / f"{job.name}.o{w3}").exists()
    assert backend.log_path(w3) == logs / f"{job.name}.o{w3}"
    assert (logs / f"{job.name}.pbs").read_text() == pbs_script(job)


def test_failed_deleted_and_forgotten_jobs(tmp_path, standin):
    b = PbsBackend(min_poll=1.0)
    spec = JobSpec("ensio-pbs-fail", (sys.executable, "-c", "raise SystemExit(3)"), 60,
                   str(tmp_path))
    jid = b.submit(spec)
    assert wait_for(b, jid, FINAL) == "failed"
    assert b.ending(jid, "failed") == f"PBS state failed (job {jid})"
    # a job the scheduler forgot has ended; deleting a finished job is no error
    assert b.states(["999.standin", jid]) == {"999.standin": "done", jid: "failed"}
    b.cancel([jid, "999.standin"])
    # a running job that is deleted ends as cancelled
    (standin / "slots").write_text("1")
    hold = b.submit(JobSpec("ensio-pbs-hold", (sys.executable, "-c",
                                                "import time; time.sleep(600)"),
                            900, str(tmp_path)))
    wait_for(b, hold, ("running",))
    b.cancel([hold])
    assert wait_for(b, hold, FINAL) == "cancelled"
    with pytest.raises(ValueError, match="not a PBS job id"):
        b.states(["12; rm -rf /"])


def test_scheduler_down_and_busy(tmp_path, standin):
    b = PbsBackend(min_poll=1.0, submit_attempts=2)
    spec = JobSpec("ensio-pbs-busy", (sys.executable, "-c", "pass"), 60, str(tmp_path))
    (standin / "busy").write_text("1")  # the first qsub answers "try again"
    jid = b.submit(spec)
    assert wait_for(b, jid, FINAL) == "done"
    (standin / "down").touch()
    assert b.states([jid]) == {jid: "unknown"}  # no answer: no guess
    assert b.adopt([{"id": jid, "name": spec.name, "workdir": spec.workdir}]) == {}
    with pytest.raises(BatchError, match="qdel failed: qdel: cannot connect"):
        b.cancel([jid])
    with pytest.raises(BatchError, match="cannot connect to server"):
        b.submit(spec)
