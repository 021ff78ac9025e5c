"""The job pool on real SLURM: workers as sbatch jobs draining a to-do list.

The closest thing to issue 4's "Real SLURM" acceptance that does not need the
cycle driver: the real worker (``python -m ensio.workflow.worker``) runs in
batch jobs submitted by :class:`SlurmBackend`, the pool driver follows them
with squeue and scancels the jobs still pending at the end, and a worker
warned by SLURM's ``--signal=B:USR1`` requeues its member at the front for
another job. Marked ``slurm``: skipped with a visible reason without SLURM,
failed with it when ``CI=true``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import pytest
from pool_support import make_spec, records, side_effects

from ensio.workflow.backends.base import JobSpec
from ensio.workflow.backends.slurm import SlurmBackend
from ensio.workflow.pool import drain
from ensio.workflow.spec import WorkerSpec, create_todo, worker_argv

pytestmark = pytest.mark.slurm

POOL_TIMEOUT = 300  # seconds: a hung scheduler must fail the test, not CI


def node_cpus() -> int:
    proc = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True,
                          timeout=30, check=True)
    return int(proc.stdout.split()[0])


class Tracking(SlurmBackend):
    """Remembers its jobs so the test can always cancel leftovers."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.submitted: list[str] = []

    def submit(self, spec: JobSpec) -> str:
        jid = super().submit(spec)
        self.submitted.append(jid)
        return jid


@pytest.fixture
def backends():
    made: list[Tracking] = []

    def make(**kw) -> Tracking:
        b = Tracking(command_timeout=30, **kw)
        made.append(b)
        return b

    yield make
    for b in made:
        if b.submitted:
            b.cancel(b.submitted)


def test_pool_drains_through_sbatch_and_cancels_pending_jobs(tmp_path, backends):
    ctl = tmp_path / "ctl"
    todo = create_todo(ctl / "todo.json", make_spec(ctl), range(1, 7), cycle=1)
    release = tmp_path / "release"
    # Hold all CPUs but one: of 3 worker jobs, 1 runs and 2 wait in the queue;
    # when the list is finished, at most one of them could have started.
    cpus = node_cpus()
    blocker_backend = backends(cpus_per_task=max(1, cpus - 1))
    hold = ("import os, sys, time\nt0 = time.monotonic()\n"
            "while not os.path.exists(sys.argv[1]) and time.monotonic() - t0 < 300:\n"
            "    time.sleep(0.2)\n")
    if cpus > 1:
        blocker = blocker_backend.submit(JobSpec(
            "ensio-test-blocker", (sys.executable, "-c", hold, str(release)), 600,
            str(tmp_path)))
    backend = backends()
    logs = ctl / "logs"
    logs.mkdir(parents=True)
    job = JobSpec("ensio-test-worker", worker_argv(todo.path, time_limit=300), 300, str(logs))
    try:
        result = drain(todo, backend, job, 3, poll=0.5, timeout=POOL_TIMEOUT, settle=60)
    finally:
        release.touch()
    assert result.summary.finished and result.error is None, result
    assert len(result.jobs) == 3 and all(j.isdigit() for j in result.jobs)
    # every task exactly once, the analysis last
    effects = [task for task, _, _ in side_effects(ctl)]
    assert Counter(effects) == Counter([f"mem{m:03d}" for m in range(1, 7)] + ["analysis"])
    assert effects[-1] == "analysis"
    # the tasks ran in SLURM jobs of this pool (the worker reads SLURM_JOB_ID)
    ran_in = {r["job"] for r in records(ctl) if r["kind"] in ("member", "analysis")}
    assert ran_in <= set(result.jobs), (ran_in, result.jobs)
    if cpus > 1:
        assert blocker not in ran_in
        # Jobs still queued at the end were scancel'ed. One of them may have
        # started between squeue and scancel (the worker's CPU had just been
        # freed): harmless, it finds the list finished. The other never ran.
        assert result.cancelled, "no pending job was left to cancel"
        assert not set(result.cancelled) & ran_in
        deadline = time.monotonic() + 60
        states = backend.states(result.cancelled)
        while any(st in ("pending", "running") for st in states.values()):
            assert time.monotonic() < deadline, f"cancelled jobs still alive: {states}"
            time.sleep(0.5)
            states = backend.states(result.cancelled)
        # slurmd creates a job's output file when it starts the job
        never_ran = [j for j in result.cancelled
                     if not (logs / f"ensio-test-worker-{j}.out").exists()]
        assert never_ran, (states, sorted(p.name for p in logs.iterdir()))
        assert all(states[j] in ("cancelled", "done") for j in never_ran), states
    assert result.running == []


def test_usr1_warning_requeues_member_for_another_job(tmp_path, backends):
    """SLURM's --signal=B:USR1 stops the member; another job completes it."""
    ctl = tmp_path / "ctl"
    # The first attempt of mem001 runs "forever"; any later attempt is quick.
    member = ("import os, sys, time\n"
              "if os.environ['ENSIO_TASK'] == 'mem001' and os.environ['ENSIO_ATTEMPT'] == '1':\n"
              "    time.sleep(600)\n"
              "open(sys.argv[1], 'w').write(os.environ['ENSIO_ATTEMPT'])\n")
    spec = WorkerSpec(
        member_command=f"{sys.executable} -S -c {_quote(member)} {{forecast}}",
        forecast=str(ctl / "forecast" / "mem{member:03d}.nc"),
        records=str(ctl / "records.jsonl"),
        task_estimate=2.0,
        grace=2.0,
    )
    todo = create_todo(ctl / "todo.json", spec, range(1, 4), cycle=1)
    # --time=1 min, warning 50 s before: SLURM sends USR1 10-40 s after the start
    # (it checks every ~30 s), before the worker's own timer (54 s).
    backend = backends(signal_lead=50)
    logs = ctl / "logs"
    logs.mkdir(parents=True)
    job = JobSpec("ensio-test-usr1", worker_argv(todo.path, time_limit=60), 60, str(logs))
    result = drain(todo, backend, job, 2, poll=0.5, timeout=POOL_TIMEOUT, settle=60)
    assert result.summary.finished and result.error is None, result
    recs = [r for r in records(ctl) if r.get("task") == "mem001"]
    assert [(r["status"], r["attempt"]) for r in recs] == [("interrupted", 1), ("done", 2)]
    assert recs[0]["job"] != recs[1]["job"], "the requeued member must go to another job"
    reasons = {r["job"]: r.get("reason") for r in records(ctl) if r["kind"] == "job"}
    assert recs[0]["job"] in reasons, "the warned job must end normally (no kill)"
    # stopped by the warning, not the limit (SIGTERM) nor the worker's own timer
    assert reasons[recs[0]["job"]] == "signal SIGUSR1", reasons
    assert (ctl / "forecast" / "mem001.nc").read_text() == "2"


def _quote(arg: str) -> str:
    """One shlex word for a command template, braces escaped for str.format."""
    arg = arg.replace("{", "{{").replace("}", "}}")
    return "'" + arg.replace("'", "'\"'\"'") + "'"

