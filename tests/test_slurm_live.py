"""The SLURM back-end against a real scheduler (``.ci/setup-slurm.sh``).

Marked ``slurm``: skipped with a visible reason when no SLURM answers here,
failed with it when ``CI=true`` (see ``tests/conftest.py``). Every wait is
bounded; polling ``squeue`` is how one follows an external scheduler (it is not
used to synchronise ensio's own code). Jobs left over by a failing test are
cancelled by the ``backend`` fixture.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ensio.workflow.backends.base import JobSpec, JobState
from ensio.workflow.backends.slurm import SlurmBackend

pytestmark = pytest.mark.slurm

POLL = 0.5  # seconds between squeue calls
FINISHED = {"done", "failed", "cancelled"}


class TrackingBackend(SlurmBackend):
    """Remembers every job it submitted, so the fixture can clean up."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.submitted: list[str] = []

    def submit(self, spec: JobSpec) -> str:
        job_id = super().submit(spec)
        self.submitted.append(job_id)
        return job_id


@pytest.fixture
def backend() -> Iterator[TrackingBackend]:
    b = TrackingBackend(command_timeout=30)
    yield b
    if b.submitted:
        b.cancel(b.submitted)  # never leave jobs holding the shared node


def name(tag: str) -> str:
    return f"ensio-test-{os.getpid()}-{tag}"


def wait_states(
    backend: SlurmBackend,
    ids: list[str],
    ok: Callable[[dict[str, JobState]], bool],
    timeout: float,
    what: str,
) -> dict[str, JobState]:
    """Poll squeue until ``ok(states)`` or fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    states = backend.states(ids)
    while not ok(states):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}; states: {states}")
        time.sleep(POLL)
        states = backend.states(ids)
    return states


def py_job(tmp: Path, tag: str, code: str, *, time_limit: float = 300, **kw) -> JobSpec:
    return JobSpec(
        name=name(tag),
        argv=(sys.executable, "-c", code),
        time_limit=time_limit,
        workdir=str(tmp),
        **kw,
    )


def test_job_runs_and_is_followed_to_done(backend, tmp_path):
    # blanks and '%' in the workdir must survive the #SBATCH lines
    wd = tmp_path / "work dir 50%"
    wd.mkdir()
    out = wd / "result.txt"
    code = (
        "import os, sys; "
        "open(sys.argv[1], 'w').write(os.environ['GREETING'] + ' ' + os.getcwd()); "
        "open(sys.argv[2], 'w').write(os.environ['ENSIO_SUBMITTED']); "
        "print('stdout of the job')"
    )
    spec = JobSpec(
        name=name("hello"),
        argv=(sys.executable, "-c", code, str(out), str(wd / "submitted.txt")),
        time_limit=120,
        workdir=str(wd),
        env=(("GREETING", "hello 'world' $x"),),
    )
    before = time.time()
    job = backend.submit(spec)
    after = time.time()
    assert job.isdigit()
    assert (wd / f"{spec.name}.sbatch").read_text() == backend.script_for(spec)
    states = wait_states(backend, [job], lambda s: s[job] in FINISHED, 120, "the job to finish")
    assert states[job] == "done"
    assert out.read_text() == f"hello 'world' $x {wd}"
    # the submission time reaches the job for the records' queuing time
    assert before <= float((wd / "submitted.txt").read_text()) <= after
    assert (wd / f"{spec.name}-{job}.out").read_text() == "stdout of the job\n"
    assert backend.log_path(job) == wd / f"{spec.name}-{job}.out"
    assert (wd / f"{spec.name}-{job}.err").exists()


def test_failing_job_is_failed(backend, tmp_path):
    job = backend.submit(py_job(tmp_path, "fail", "raise SystemExit(3)"))
    states = wait_states(backend, [job], lambda s: s[job] in FINISHED, 120, "the job to fail")
    assert states[job] == "failed"


def test_forgotten_job_counts_as_done(backend):
    # A job id the controller does not know (purged after MinJobAge) has ended.
    assert backend.states(["999999990"]) == {"999999990": "done"}
    assert backend.states(["999999990", "999999991"]) == {
        "999999990": "done",
        "999999991": "done",
    }
    assert backend.states([]) == {}
    backend.cancel(["999999990"])  # cancelling a finished job is not an error


def test_time_limit_warning_signal(tmp_path):
    """With --time=1 min and a 50 s lead, SIGUSR1 arrives long before the kill."""
    backend = TrackingBackend(signal_lead=50, command_timeout=30)
    marker = tmp_path / "usr1.txt"
    code = (
        "import signal, sys, time\n"
        "t0 = time.monotonic()\n"
        "def warned(signum, frame):\n"
        "    open(sys.argv[1], 'w').write(signal.Signals(signum).name)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGUSR1, warned)\n"
        "signal.signal(signal.SIGTERM, warned)\n"
        "while time.monotonic() - t0 < 300:\n"
        "    time.sleep(0.2)\n"
    )
    spec = JobSpec(
        name=name("usr1"),
        argv=(sys.executable, "-c", code, str(marker)),
        time_limit=60,
        workdir=str(tmp_path),
    )
    assert "--signal=B:USR1@50" in backend.script_for(spec)
    job = backend.submit(spec)
    try:
        # SLURM checks limits every ~30 s: the warning comes 10-40 s after start.
        states = wait_states(
            backend, [job], lambda s: s[job] in FINISHED, 150, "the warned job to exit"
        )
    finally:
        backend.cancel(backend.submitted)
    assert marker.exists(), f"no SIGUSR1 before the job ended (state {states[job]})"
    # the warning came before the time limit, which sends SIGTERM first
    assert marker.read_text() == "SIGUSR1", "the warning must come before the time limit"
    assert states[job] == "done"  # the worker exited by itself, not killed


def test_cancel_pending_job_never_runs(backend, tmp_path):
    release = tmp_path / "release"
    ran = tmp_path / "victim-ran"
    hold = (
        "import os, sys, time\n"
        "t0 = time.monotonic()\n"
        "while not os.path.exists(sys.argv[1]) and time.monotonic() - t0 < 240:\n"
        "    time.sleep(0.2)\n"
    )
    # One exclusive job holds the whole node, whatever its CPU count.
    exclusive = TrackingBackend(extra=["--exclusive"], command_timeout=30)
    try:
        blocker = exclusive.submit(
            JobSpec(
                name=name("blocker"),
                argv=(sys.executable, "-c", hold, str(release)),
                time_limit=300,
                workdir=str(tmp_path),
            )
        )
        wait_states(
            exclusive, [blocker], lambda s: s[blocker] == "running", 120,
            "the exclusive blocker job to start",
        )
        victim = backend.submit(
            JobSpec(
                name=name("victim"),
                argv=("/usr/bin/touch", str(ran)),
                time_limit=120,
                workdir=str(tmp_path),
            )
        )
        assert backend.states([victim])[victim] == "pending"
        backend.cancel([victim])
        states = wait_states(
            backend, [victim], lambda s: s[victim] != "pending", 60, "the cancellation"
        )
        assert states[victim] in ("cancelled", "done")  # "done" only if already purged
        release.touch()
        states = wait_states(
            exclusive, [blocker], lambda s: s[blocker] in FINISHED, 120, "the blocker to end"
        )
        assert states[blocker] == "done"
        assert backend.states([victim])[victim] in ("cancelled", "done")
        assert not ran.exists(), "the cancelled pending job ran"
    finally:
        release.touch()
        exclusive.cancel(exclusive.submitted)
