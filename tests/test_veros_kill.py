"""Issue 26: SIGKILL a member job and the driver during the Veros OSSE; the resume is bitwise.

The small OSSE (4 members, 2 cycles of 1 day, tests/veros_support.py) gives the set-up
and the uninterrupted analysis run. Its ``ensio cycle`` command is rerun into a fresh
work directory, and in that run

* the driver (``ensio cycle``) is SIGKILLed alone in cycle 1 while member forecasts run
  (after a drawn number of finished members; checked with the driver stopped). Its
  worker jobs run in their own sessions and outlive it (checked: one of them finishes a
  task after the kill), renewing their leases: the resume waits for no lease to expire
  (the local back-end cannot adopt another driver's processes, so the resume's own jobs
  take what is left and the live leftovers commit what they hold);
* the resumed driver (through veros_kill_child.py, which reports its fault points) is
  SIGKILLed right after a drawn one of its fault points and run again;
  kill_support.py reads every point it reported before it died, so the test knows
  after which step the kill landed;
* one member's ``veros run`` process is SIGKILLed mid-forecast: between the log line
  ``Current iteration: i`` (i drawn) and ``Integration done``, with no restart written
  yet, checked while the process is stopped (SIGSTOP), so the kill provably lands there.
  The member command fails, and the worker runs the member again (``workflow.retries``).

Then both cycles' analysis restarts equal the uninterrupted run's byte for byte, and
every task is recorded done exactly once. One draw of each kind by default (about 30 s
on 2 cores beside the shared set-up: one cycle run, two driver restarts and one member
run again); ``ENSIO_TEST_FULL=1`` runs three.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import kill_support
import matrix
import pytest
import seeds
from veros_support import CYCLES, MEMBERS, analysis_digests, cycle_argv, small_osse

from ensio.workflow.todo import TodoError, TodoList

CHILD = Path(__file__).with_name("veros_kill_child.py")
#: Fault points of a driver resuming a run killed in cycle 1's forecasts: each a durable
#: write of 4 points (written, synced, renamed, directory synced): cycle 1's analysis
#: config and done marker (its to-do list exists), then cycle 2's analysis config, to-do
#: list (created, then rewritten) and done marker. The drawn kill point is uniform over them.
RESUME_POINTS = 8 + 16 * (CYCLES - 1)
TIMEOUT = 600.0  # seconds for one driver run; it must never hang CI


@pytest.fixture(scope="module")
def osse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_osse(tmp_path_factory)


def _run_processes(workdir: Path) -> list[int]:
    """Pids of every process with ``workdir`` on its command line (driver, jobs, members)."""
    needle, pids = str(workdir).encode(), []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if needle in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:  # it ended meanwhile
                continue
    return pids


def _kill_run(workdir: Path) -> None:
    """SIGKILL every process of the run (cleanup after a failure; nothing is left running)."""
    while pids := _run_processes(workdir):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _forecasts(workdir: Path) -> list[tuple[int, Path, Path]]:
    """(pid, working directory, restart it will write) of the run's ``veros run`` processes."""
    found = []
    for pid in _run_processes(workdir):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if "run" in args and "restart_output_filename" in args and any(
                a == "veros" or a.endswith("/veros") for a in args):
            found.append((pid, cwd, Path(args[args.index("restart_output_filename") + 1])))
    return found


@dataclass(frozen=True)
class MemberKill:
    """Where the member kill landed: the forecast of ``member`` in ``cycle``, after ``log``."""

    cycle: int
    member: int
    iteration: int
    log: str  # the last line of its Veros log when it was stopped and killed


class MemberKiller(threading.Thread):
    """Watches the run's ``veros run`` processes and SIGKILLs one forecast mid-integration.

    The target is member ``member``'s first forecast seen past ``Current iteration:
    {iteration}``; when a stopped forecast turns out to be out of the window (Veros
    finished meanwhile) it is let go and the next forecast of any member is tried.
    """

    def __init__(self, workdir: Path, member: int, iteration: int) -> None:
        super().__init__(daemon=True)
        self.workdir, self.member, self.iteration = workdir, member, iteration
        self.stop_event = threading.Event()
        self.killed: MemberKill | None = None
        self.misses: list[str] = []
        self._seen: set[int] = set()
        self._mark = re.compile(rf"^ *Current iteration: {iteration}\b", re.MULTILINE)

    def _in_window(self, log: Path, out: Path) -> bool:
        text = log.read_text(errors="replace") if log.exists() else ""
        return (self._mark.search(text) is not None and "Integration done" not in text
                and not out.exists())

    def run(self) -> None:
        while self.killed is None and not self.stop_event.is_set():
            for pid, cwd, out in _forecasts(self.workdir):
                member = int(cwd.parent.name.removeprefix("mem"))  # CYCLE/work/memNNN/veros
                if pid in self._seen or (member != self.member and not self.misses):
                    continue
                log = cwd.parent / "veros.log"
                if not self._in_window(log, out):
                    continue
                self._seen.add(pid)
                if not kill_support.stop(pid):
                    continue  # it ended before it stopped
                if self._in_window(log, out):  # nothing moves: the kill lands here
                    os.kill(pid, signal.SIGKILL)
                    last = log.read_text(errors="replace").strip().splitlines()[-1]
                    self.killed = MemberKill(int(cwd.parents[2].name.removeprefix("cycle_")),
                                             member, self.iteration, last.strip())
                    return
                os.kill(pid, signal.SIGCONT)
                self.misses.append(f"{cwd.parents[2].name}/{cwd.parent.name}")
            time.sleep(0.01)


def _driver(osse: Path, workdir: Path, log: Path, report: bool) -> subprocess.Popen:
    env = dict(os.environ)
    if report:
        env[kill_support.REPORT_ENV] = "1"
    return subprocess.Popen([sys.executable, str(CHILD), *cycle_argv(osse, workdir, CYCLES)],
                            stdout=subprocess.PIPE if report else log.open("ab"),
                            stderr=log.open("ab"), env=env, start_new_session=True)


def _records(workdir: Path) -> list[dict]:
    return [json.loads(x) for x in (workdir / "records.jsonl").read_text().splitlines()]


def _kill_driver_mid_forecast(osse: Path, workdir: Path, log: Path,
                              done: int) -> tuple[int, float]:
    """Run the driver and SIGKILL it (alone) in cycle 1 while a member forecast runs.

    The moment: ``done`` members of cycle 1 finished and a ``veros run`` of cycle 1
    alive; checked again with the driver stopped, so the kill lands mid-cycle. Its worker
    jobs run in their own sessions and outlive it. Returns
    the driver's pid (local job ids are ``local-PID-N``) and the time of the kill.
    """
    todo = workdir / "cycle_001" / "todo.json"

    def moment() -> int | None:
        try:
            tasks = TodoList(todo).tasks() if todo.exists() else []
        except TodoError:  # being created
            return None
        if sum(t.state == "done" and t.kind == "member" for t in tasks) < done:
            return None
        running = [pid for pid, cwd, _ in _forecasts(workdir) if cwd.parents[2].name ==
                   "cycle_001"]
        return running[0] if running else None

    driver = _driver(osse, workdir, log, report=False)
    deadline = time.monotonic() + TIMEOUT
    while True:
        assert driver.poll() is None, "the driver finished before the kill:\n" + \
            log.read_text()[-3000:]
        assert time.monotonic() < deadline, "cycle 1 never reached the kill moment"
        if moment() is not None and kill_support.stop(driver.pid):
            forecast = moment()
            if forecast is not None and not (workdir / "cycle_001" / ".done").exists():
                os.kill(driver.pid, signal.SIGKILL)
                killed_at = time.time()
                break
            os.kill(driver.pid, signal.SIGCONT)
        time.sleep(0.01)
    assert driver.wait() == kill_support.KILLED
    return driver.pid, killed_at


def _one_draw(osse: Path, workdir: Path, rng: random.Random, seed: int) -> None:
    done = rng.randint(0, MEMBERS - 1)
    k = rng.randint(1, RESUME_POINTS)
    member, iteration = rng.randint(1, MEMBERS), rng.randint(0, 1)
    print(f"kill seed {seed}: driver in cycle 1 after {done} members; the resumed driver "
          f"after its point {k}; member {member}'s forecast after iteration {iteration}")
    log = workdir.parent / f"{workdir.name}.log"
    killer = MemberKiller(workdir, member, iteration)
    killer.start()
    try:
        first, killed_at = _kill_driver_mid_forecast(osse, workdir, log, done)
        print(f"driver {first} killed in cycle 1 while a member forecast ran")
        driver = kill_support.kill_after_point(_driver(osse, workdir, log, report=True), k)
        assert driver.returncode == kill_support.KILLED and len(driver.labels) >= k, (
            f"seed {seed}: the resumed driver ended by itself (exit {driver.returncode}) "
            f"after {len(driver.labels)} points, before its point {k}: RESUME_POINTS is "
            "stale?\n" + log.read_text()[-3000:])
        print(f"resumed driver killed after its point {k} ({driver.labels[k - 1]!r}); "
              f"it reported {len(driver.labels)}")
        resume = _driver(osse, workdir, log, report=False)
        assert resume.wait(timeout=TIMEOUT) == 0, f"seed {seed}: " + log.read_text()[-3000:]
    finally:
        killer.stop_event.set()
        killer.join()
        _kill_run(workdir)
    hit = killer.killed
    assert hit is not None, f"seed {seed}: no member forecast was killed mid-integration " \
                            f"(missed: {killer.misses})"
    print(f"member kill: {hit}; missed first: {killer.misses}")
    recs = _records(workdir)
    tasks = [r for r in recs if r.get("kind") in ("member", "analysis")]
    # the forecast running at the first driver's kill was finished by that driver's job
    assert any(r["job"].startswith(f"local-{first}-") and r["finished"] > killed_at
               for r in tasks), f"seed {seed}: the first driver's jobs died with it"
    # the killed forecast failed (the member command saw veros die) and ran again
    attempts = [(r["status"], r["attempt"]) for r in tasks
                if (r["cycle"], r["task"]) == (hit.cycle, f"mem{hit.member:03d}")]
    assert attempts == [("failed", 1), ("done", 2)], (seed, attempts)
    finished = Counter((r["cycle"], r["task"]) for r in tasks if r["status"] == "done")
    names = [f"mem{m:03d}" for m in range(1, MEMBERS + 1)] + ["analysis"]
    assert finished == Counter((c, t) for c in range(1, CYCLES + 1) for t in names), \
        (seed, finished)
    for c in range(1, CYCLES + 1):
        assert analysis_digests(workdir, c) == analysis_digests(osse / "assim", c), \
            f"seed {seed}: cycle {c}'s analysis differs from the uninterrupted run's"


def test_member_and_driver_kills_resume_bitwise(osse: Path, tmp_path: Path) -> None:
    for trial in range(matrix.draws(1, 3)):
        seed = seeds.draw_seed(f"veros kill draw {trial}")
        _one_draw(osse, tmp_path / f"run{trial}", random.Random(seed), seed)
