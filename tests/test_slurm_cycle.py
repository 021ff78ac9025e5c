"""Issue 4 acceptance on real SLURM: a 4-member, 2-cycle experiment via sbatch.

``ensio cycle`` with ``workflow.backend=slurm`` end to end: worker jobs are
batch jobs, members and analyses run in them, leftover pending jobs are
scancel'ed, and a member that outlives its job's time limit is stopped by
SLURM's warning signal (or the worker's own timer), requeued at the front and
completed by another job, with bitwise the same analysis as without the
interruption. Marked ``slurm``: skipped with a visible reason without SLURM,
failed with it when ``CI=true`` (``.ci/setup-slurm.sh`` starts one on CI).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from cases import content_digest

from ensio.workflow.pool import read_job_file
from ensio.workflow.todo import TodoError, TodoList

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "lorenz96" / "cycle.yaml"
MEMBERS = 4
CYCLES = 2
TIMEOUT = 600  # seconds for one experiment; it must never hang CI


pytestmark = pytest.mark.slurm


def active_jobs_under(workdir: Path,
                      states: str = "PENDING,RUNNING,CONFIGURING,COMPLETING") -> list[str]:
    """SLURM jobs in *states* whose working directory is inside *workdir*."""
    proc = subprocess.run(
        ["squeue", "-h", "-t", states, "-o", "%i|%T|%Z"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    out = []
    for line in proc.stdout.splitlines():
        job, state, wd = line.split("|", 2)
        if Path(wd).resolve().is_relative_to(workdir.resolve()):
            out.append(f"{job} {state} {wd}")
    return out


def cancel_jobs_under(workdir: Path) -> None:
    jobs = [line.split()[0] for line in active_jobs_under(workdir)]
    if jobs:
        subprocess.run(["scancel", *jobs], timeout=30, check=False)


def cycle_argv(run_dir: Path, *overrides: str) -> list[str]:
    """``ensio cycle`` of the example on SLURM with MEMBERS members and CYCLES cycles."""
    argv = [sys.executable, "-m", "ensio", "cycle", str(EXAMPLE),
            "--workdir", str(run_dir), "--cycles", str(CYCLES),
            "--set", "workflow.backend=slurm",
            "--set", f"ensemble.size={MEMBERS}"]
    for o in overrides:
        argv += ["--set", o]
    return argv


def run_cycle(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    argv = cycle_argv(run_dir, *overrides)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        # ensio scancel'ed the jobs still queued: none may be pending now ...
        assert active_jobs_under(run_dir, "PENDING,CONFIGURING") == [], "pending leftovers"
        # ... and running ones see the finished list and exit by themselves.
        deadline = time.monotonic() + 60
        while active := active_jobs_under(run_dir):
            assert time.monotonic() < deadline, f"jobs still alive after the run: {active}"
            time.sleep(0.5)
    finally:
        cancel_jobs_under(run_dir)  # never leave jobs holding the shared node
    return proc


def task_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, filter(str.strip, lines))
            if r.get("kind") in ("member", "analysis")]


def analysis_bytes(run_dir: Path) -> dict[str, bytes]:
    return {f"{c}/{m}": (run_dir / f"cycle_{c:03d}" / "analysis" / f"mem{m:03d}.nc").read_bytes()
            for c in range(1, CYCLES + 1) for m in range(1, MEMBERS + 1)}


def check_experiment(run_dir: Path) -> list[dict]:
    """Files, exactly-once tasks, analysis after members, SLURM job ids."""
    for c in range(1, CYCLES + 1):
        for phase in ("forecast", "analysis"):
            for m in range(1, MEMBERS + 1):
                f = run_dir / f"cycle_{c:03d}" / phase / f"mem{m:03d}.nc"
                assert f.is_file(), f"missing {f}"
    recs = task_records(run_dir)
    done = [r for r in recs if r["status"] == "done"]
    assert Counter((r["cycle"], r["task"]) for r in done) == Counter(
        (c, t) for c in range(1, CYCLES + 1)
        for t in [f"mem{m:03d}" for m in range(1, MEMBERS + 1)] + ["analysis"]
    )
    for c in range(1, CYCLES + 1):
        members = [r for r in done if r["cycle"] == c and r["kind"] == "member"]
        (analysis,) = [r for r in done if r["cycle"] == c and r["kind"] == "analysis"]
        assert analysis["started"] >= max(r["finished"] for r in members)
    # every task ran in a SLURM batch job: numeric job ids, a submission time
    assert all(str(r["job"]).isdigit() for r in recs), {r["job"] for r in recs}
    assert all(r["submitted"] is not None and r["submitted"] <= r["started"] for r in recs)
    return recs


def analysis_digests(run_dir: Path) -> dict[str, str]:
    """sha256 of every analysis member; of mean/spread, of the content but the history stamps."""
    return {f"{c}/{p.name}": content_digest(p) if p.name in ("mean.nc", "spread.nc")
            else hashlib.sha256(p.read_bytes()).hexdigest()
            for c in range(1, CYCLES + 1)
            for p in sorted((run_dir / f"cycle_{c:03d}" / "analysis").glob("*.nc"))}


#: The plain run's settings: more jobs than the node's CPUs (each job asks for
#: analysis_ranks = 2 CPUs), so some wait in the queue and must be scancel'ed.
PLAIN = ("workflow.jobs=3", "workflow.time_limit=00:05:00")


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("slurm-cycle") / "plain"
    run_cycle(run_dir, *PLAIN)
    return run_dir


def test_two_cycles_four_members_through_sbatch(plain_run):
    check_experiment(plain_run)


def test_time_limit_requeue_through_sbatch(plain_run, tmp_path):
    """Member 1 of cycle 1 outlives its 1-minute job; another job completes it."""
    wrapper = tmp_path / "slow_first.py"
    wrapper.write_text(
        "import os, sys, time\n"
        "e = os.environ\n"
        "if (e['ENSIO_CYCLE'], e['ENSIO_MEMBER'], e['ENSIO_ATTEMPT']) == ('1', '1', '1'):\n"
        "    time.sleep(600)  # only the first attempt: far beyond the job's limit\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'ensio', 'model', 'l96', *sys.argv[1:]])\n"
    )
    run_dir = tmp_path / "requeue"
    run_cycle(
        run_dir,
        "workflow.jobs=2",
        "workflow.time_limit=00:01:00",
        "workflow.task_estimate=00:00:05",
        f"workflow.member_command={sys.executable} {wrapper} run --init {{analysis}} "
        "--out {forecast} --steps 5",
    )
    recs = check_experiment(run_dir)
    first = [r for r in recs if (r["cycle"], r["task"]) == (1, "mem001")]
    assert [(r["status"], r["attempt"]) for r in first] == [("interrupted", 1), ("done", 2)]
    assert first[0]["job"] != first[1]["job"], "the requeued member must go to another job"
    # stopped before the time limit: by SLURM's warning or the worker's own timer,
    # and its job ended normally (a job killed at the limit writes no job record)
    reasons = {r["job"]: r["reason"] for r in map(json.loads, (
        run_dir / "records.jsonl").read_text().splitlines()) if r.get("kind") == "job"}
    assert reasons.get(first[0]["job"]) in ("signal SIGUSR1", "time_limit"), reasons
    # it went back to the front: the next lease in cycle 1 after the interruption
    later = [r for r in recs if r["cycle"] == 1 and r["leased"] > first[0]["finished"]]
    assert min(later, key=lambda r: r["leased"]) is first[1]
    # the interruption changes nothing in the results
    assert analysis_bytes(run_dir) == analysis_bytes(plain_run)


def test_resume_after_sigkill_of_the_driver_through_sbatch(plain_run, tmp_path):
    """Issue 4: SIGKILL the driver mid-cycle, rerun the command: bitwise the plain result.

    The killed driver's batch jobs survive it. The rerun adopts the live ones
    from ``cycle_001/jobs.jsonl`` (they count toward N_j, running ones may
    still commit — fencing makes that safe) and cancels those still queued at
    the end of the cycle, so none of them starts later and none is left over.
    """
    run_dir = tmp_path / "killed"
    out = (tmp_path / "killed-driver.log").open("w")
    driver = subprocess.Popen(cycle_argv(run_dir, *PLAIN), stdout=out, stderr=subprocess.STDOUT,
                              cwd=ROOT, start_new_session=True)
    todo_path = run_dir / "cycle_001" / "todo.json"
    try:
        # the kill moment comes from the state on disk: a member of cycle 1 is done
        deadline = time.monotonic() + TIMEOUT
        while True:
            assert driver.poll() is None, (tmp_path / "killed-driver.log").read_text()[-3000:]
            try:
                seen = TodoList(todo_path).summary() if todo_path.exists() else None
            except TodoError:  # the list is being created
                seen = None
            if seen is not None and seen.done >= 1:
                break
            assert time.monotonic() < deadline, "no member of cycle 1 finished"
            time.sleep(0.05)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    finally:
        out.close()
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert not seen.finished and not (run_dir / "cycle_001" / ".done").exists()  # mid-cycle
    try:
        left = active_jobs_under(run_dir)
        assert left, "the killed driver's jobs should outlive it"
        recorded = [e["id"] for e in read_job_file(run_dir / "cycle_001" / "jobs.jsonl")]
        assert {line.split()[0] for line in left} <= set(recorded), (left, recorded)
        run_cycle(run_dir, *PLAIN)  # the same command again; no job is left over after it
    finally:
        cancel_jobs_under(run_dir)
    assert active_jobs_under(run_dir) == []
    check_experiment(run_dir)  # every task done exactly once, analyses after members
    assert analysis_digests(run_dir) == analysis_digests(plain_run)
    # The killed driver's queued jobs were adopted and cancelled at the end of
    # cycle 1: a cycle-1 job whose worker started after the cycle was done must be
    # one SLURM had already started when the driver wound down (its batch script
    # was still starting Python), left to see the finished list, and did nothing.
    records = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]
    pools = [r for r in records if r.get("kind") == "pool" and r["cycle"] == 1]
    assert len(pools) == 1, pools  # the rerun's; the killed driver wrote none
    final = pools[0]
    cycle1_done = (run_dir / "cycle_001" / ".done").stat().st_mtime
    cycle1_jobs = {e["id"] for e in read_job_file(run_dir / "cycle_001" / "jobs.jsonl")}
    late = [r for r in records
            if r.get("kind") == "job" and r["job"] in cycle1_jobs and r["started"] > cycle1_done]
    assert all(r["job"] in final["left_running"] and r["tasks"] == 0 for r in late), \
        ("jobs of cycle 1 left in the queue started after it was done", late, final)


def test_online_mode_through_sbatch(plain_run, tmp_path):
    """``--mode online`` with the SLURM back-end: one batch job of N_e ranks runs the cycles.

    The 2-CPU test node cannot hold 4 tasks, so the job asks ``--overcommit``
    (``workflow.slurm.extra``), as a user on an oversubscribed partition would.
    """
    run_dir = tmp_path / "online"
    argv = cycle_argv(run_dir, *PLAIN, 'workflow.slurm.extra=["--overcommit"]')
    argv += ["--mode", "online"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "through SLURM" in proc.stdout and "submitted SLURM job" in proc.stdout
        assert active_jobs_under(run_dir) == []  # the driver waited for its job to end
    finally:
        cancel_jobs_under(run_dir)
    import netCDF4
    import numpy as np

    for c in range(1, CYCLES + 1):
        assert (run_dir / f"cycle_{c:03d}" / ".done").exists()
        for m in range(1, MEMBERS + 1):
            rel = Path(f"cycle_{c:03d}") / "analysis" / f"mem{m:03d}.nc"
            with netCDF4.Dataset(run_dir / rel) as a, netCDF4.Dataset(plain_run / rel) as b:
                x, y = np.asarray(a["x"][:]), np.asarray(b["x"][:])
                assert np.max(np.abs(x - y)) <= 1e-12 * np.max(np.abs(y)), rel
    recs = task_records(run_dir)
    assert {r["mode"] for r in recs} == {"online"}
    (job,) = {r["job"] for r in recs}  # one coupled job, a SLURM job id
    assert str(job).isdigit()
    first = [r for r in recs if r["cycle"] == 1]
    assert all(r["submitted"] <= r["started"] for r in first)
