"""``ensio cycle`` end to end on the Lorenz-96 example: layout, report, resume after SIGKILL."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from cases import SYNTHETIC, SYNTHETIC_FAST, content_digest

from ensio.models.l96case import rmse_table
from ensio.workflow.todo import TodoError, TodoList

EXAMPLE = Path(__file__).parents[1] / "examples" / "lorenz96" / "cycle.yaml"
SMALL = [
    "--set",
    "ensemble.size=6",
    "--set",
    "workflow.jobs=2",
    "--set",
    "workflow.analysis_ranks=1",
]


def _cycle(workdir: Path, cycles: int, *extra: str, **kw) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "ensio",
        "cycle",
        str(EXAMPLE),
        "--workdir",
        str(workdir),
        "--cycles",
        str(cycles),
        *SMALL,
        *extra,
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw
    )


def _digests(workdir: Path, cycle: int) -> dict[str, str]:
    """Members: their bytes; mean/spread: their content except the history time stamps."""
    d = workdir / f"cycle_{cycle:03d}" / "analysis"
    return {p.name: content_digest(p) if p.name in ("mean.nc", "spread.nc")
            else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("*.nc"))}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cycle") / "ref"
    proc = _cycle(workdir, 2)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return workdir, out


def test_layout_records_and_rmse(reference):
    workdir, out = reference
    assert "cycle 2: done" in out
    for c in (1, 2):
        cdir = workdir / f"cycle_{c:03d}"
        assert sorted(p.name for p in (cdir / "forecast").glob("mem*.nc")) == [
            f"mem{m:03d}.nc" for m in range(1, 7)
        ]
        names = {p.name for p in (cdir / "analysis").glob("*.nc")}
        assert {f"mem{m:03d}.nc" for m in range(1, 7)} | {"mean.nc", "spread.nc"} == names
        assert (cdir / ".done").exists()
    rows = rmse_table(workdir)
    assert [r[0] for r in rows] == [1, 2]
    assert rows[-1][2] < rows[0][1]  # the analysis beats the first (uninformed) prior
    report = subprocess.run(
        [sys.executable, "-m", "ensio", "report", str(workdir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    firsts = [line.split()[0] for line in report.stdout.splitlines() if line.split()]
    assert "mean" in firsts and "sd" in firsts, report.stdout
    assert (workdir / "report.csv").read_text().startswith("cycle,total,queuing,running,io")
    assert (workdir / "report.png").stat().st_size > 0


def _groups_of_run(workdir: Path, driver: subprocess.Popen) -> set[int]:
    """Process groups of the driver and of every process working in ``workdir``.

    Local worker jobs run in their own sessions, and so may their commands:
    killing the driver's group alone would leave them running. They are found
    by a scan of ``/proc``: every worker, member, analysis and coupled rank
    has a path inside the run directory on its command line.
    """
    groups, ours, needle = {driver.pid}, os.getpgrp(), str(workdir).encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "cmdline").read_bytes():
                groups.add(os.getpgid(int(d.name)))
        except OSError:  # it ended meanwhile
            continue
    return groups - {ours}


def _signal_run(workdir: Path, driver: subprocess.Popen, sig: int) -> None:
    """``sig`` to every group of the run, scanning again until no new group shows up."""
    done: set[int] = set()
    while new := _groups_of_run(workdir, driver) - done:
        for g in new:
            try:
                os.killpg(g, sig)
            except ProcessLookupError:
                pass
        done |= new


def _kill_mid_cycle_then_rerun(start, workdir: Path, mid_cycle, cycles=(1, 2)) -> None:
    """SIGKILL the run (driver and jobs) mid-cycle, check that it was, then run it again.

    The moment comes from the state on disk, drawn afresh every run with a
    printed seed (``ENSIO_TEST_SEED`` replays one): a cycle ``c`` and a number
    ``k`` of finished members;
    ``mid_cycle(c, k)`` tells when the run is there. Then every process of the
    run is stopped (SIGSTOP) and ``mid_cycle`` asked again: with nothing
    moving, a yes proves the kill lands mid-cycle, and everything is killed;
    a no (the cycle ended in between) lets the run go on to the next cycle.
    """
    seed = int(os.environ.get("ENSIO_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    rng = random.Random(seed)
    k = rng.randrange(0, 6)
    chances = [c for c in cycles if c >= rng.choice(cycles)]
    print(f"kill seed {seed}: cycles {chances}, after {k} finished members")
    proc = start()
    killed = None
    try:
        deadline = time.monotonic() + 600
        for c in chances:
            while killed is None and proc.poll() is None:
                assert time.monotonic() < deadline, f"seed {seed}: never mid-cycle"
                if mid_cycle(c, k):
                    _signal_run(workdir, proc, signal.SIGSTOP)
                    if mid_cycle(c, k):  # nothing moves: the kill lands here
                        _signal_run(workdir, proc, signal.SIGKILL)
                        killed = c
                        break
                    _signal_run(workdir, proc, signal.SIGCONT)
                    break  # cycle c ended meanwhile: try the next
                if (workdir / f"cycle_{c:03d}" / ".done").exists():
                    break
                time.sleep(0.01)
    finally:
        if killed is None:
            _signal_run(workdir, proc, signal.SIGKILL)
        proc.communicate()
    assert killed is not None, f"seed {seed}: the kill never landed mid-cycle"
    assert not (workdir / f"cycle_{killed:03d}" / ".done").exists()
    again = start()
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, f"seed {seed}: " + err[-3000:]
    _exactly_once(workdir, cycles, seed)


def _exactly_once(workdir: Path, cycles, seed: int) -> None:
    """One "done" record per (cycle, task): the README's "without redoing finished work"."""
    recs = [json.loads(x) for x in (workdir / "records.jsonl").read_text().splitlines()]
    done = Counter((r["cycle"], r["task"]) for r in recs
                   if r.get("kind") in ("member", "analysis") and r["status"] == "done")
    tasks = [f"mem{m:03d}" for m in range(1, 7)] + ["analysis"]
    assert done == Counter((c, t) for c in cycles for t in tasks), f"seed {seed}: {done}"


def _offline_mid_cycle(workdir: Path):
    """``mid_cycle`` of the offline run: cycle c's list has ≥ k members done, a task leased."""
    def mid_cycle(c: int, k: int) -> bool:
        path = workdir / f"cycle_{c:03d}" / "todo.json"
        try:
            tasks = TodoList(path).tasks() if path.exists() else []
        except TodoError:  # being created
            return False
        done = sum(t.state == "done" and t.kind == "member" for t in tasks)
        return done >= k and any(t.state == "leased" for t in tasks)
    return mid_cycle


def test_resume_after_sigkill_is_bitwise_identical(reference, tmp_path):
    ref, _ = reference
    workdir = tmp_path / "run"
    # a 10 s lease: the killed jobs' tasks are taken over after 10 s, not the default minute
    _kill_mid_cycle_then_rerun(lambda: _cycle(workdir, 2, "--set", "workflow.lease=10"),
                               workdir, _offline_mid_cycle(workdir))
    for c in (1, 2):
        assert _digests(workdir, c) == _digests(ref, c), f"cycle {c} differs"


def test_setup_is_reproducible(reference, tmp_path):
    ref, _ = reference
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ensio",
            "model",
            "l96",
            "setup",
            "--workdir",
            str(tmp_path),
            "--members",
            "6",
            "--cycles",
            "2",
            "--seed",
            "1",
            "--steps",
            "5",
        ],
        check=True,
        timeout=120,
    )
    for sub in ("init", "obs", "truth"):
        for p in sorted((ref / sub).glob("*.nc")):
            assert (tmp_path / sub / p.name).read_bytes() == p.read_bytes(), p


# ---------------------------------------------------------------- min_members

FLAKY_MEMBER = '''
import sys
from pathlib import Path
from ensio.models import l96case
member, init, out = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
if member == 3:
    sys.exit("member 3: the model blew up")
l96case.run(init, out, 5)
'''


def _run_flaky(workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    script = workdir.parent / "flaky_member.py"
    script.write_text(FLAKY_MEMBER)
    cmd = [
        sys.executable, "-m", "ensio", "cycle", str(EXAMPLE), "--workdir", str(workdir),
        "--cycles", "2", *SMALL, "--set", "workflow.retries=0",
        "--set", f"workflow.member_command=python {script} {{member}} {{analysis}} {{forecast}}",
        *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_failed_member_refuses_the_analysis_without_min_members(tmp_path):
    res = _run_flaky(tmp_path / "run")
    assert res.returncode == 2  # an ensio error: one line, exit status 2 (README)
    last = res.stderr.strip().splitlines()[-1]
    assert "min_members" in last and "mem003" in last, res.stderr
    assert not (tmp_path / "run" / "cycle_001" / "analysis" / "mean.nc").exists()


def test_min_members_analyses_the_survivors(tmp_path):
    workdir = tmp_path / "run"
    res = _run_flaky(workdir, "--set", "workflow.min_members=5")
    assert res.returncode == 0, res.stderr
    alive = [1, 2, 4, 5, 6]
    for c in (1, 2):
        cdir = workdir / f"cycle_{c:03d}"
        assert sorted(p.name for p in (cdir / "analysis").glob("mem*.nc")) == [
            f"mem{m:03d}.nc" for m in alive
        ]
    # cycle 2 started only the survivors: member 3 has no forecast there
    assert not (workdir / "cycle_002" / "forecast" / "mem003.nc").exists()
    assert "failed: mem003" in res.stdout
    # independent check: the same five forecasts, renumbered 1..5 in their own
    # directory, analysed as an ordinary 5-member ensemble (no ensemble.ids)
    import yaml
    from mpi4py import MPI

    from ensio.config import config_from_dict
    from ensio.offline import run_analysis

    alone = tmp_path / "alone"
    (alone / "fc").mkdir(parents=True)
    for k, m in enumerate(alive, start=1):
        src = workdir / "cycle_001" / "forecast" / f"mem{m:03d}.nc"
        (alone / "fc" / f"mem{k:03d}.nc").write_bytes(src.read_bytes())
    raw = yaml.safe_load((workdir / "cycle_001" / "analysis.yaml").read_text())
    raw["ensemble"] = {**raw["ensemble"], "members": str(alone / "fc" / "mem{member:03d}.nc"),
                       "size": 5}
    raw["output"] = {"members": str(alone / "an" / "mem{member:03d}.nc")}
    run_analysis(config_from_dict(raw, base_dir=alone), MPI.COMM_SELF, cycle=1)
    for k, m in enumerate(alive, start=1):
        x, _ = l96case_read(workdir / "cycle_001" / "analysis" / f"mem{m:03d}.nc")
        ref, _ = l96case_read(alone / "an" / f"mem{k:03d}.nc")
        assert np.max(np.abs(x - ref)) <= 1e-12 * np.max(np.abs(ref)), m


def l96case_read(path: Path):
    """``x`` and the model time (None in product files, which have no ``time``)."""
    import netCDF4

    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        t = float(ds["time"][...]) if "time" in ds.variables else None
        return np.asarray(ds["x"][:], dtype=float), t


# ----------------------------------------------------------------- online mode


def _online(workdir: Path, cycles: int, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "ensio", "cycle", str(EXAMPLE), "--mode", "online",
        "--workdir", str(workdir), "--cycles", str(cycles), *SMALL, *extra,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _assert_same_analysis(workdir: Path, ref: Path, cycles=(1, 2)) -> None:
    for c in cycles:
        names = sorted(p.name for p in (ref / f"cycle_{c:03d}" / "analysis").glob("*.nc"))
        got = sorted(p.name for p in (workdir / f"cycle_{c:03d}" / "analysis").glob("*.nc"))
        assert got == names, c
        for name in names:
            x, t = l96case_read(workdir / f"cycle_{c:03d}" / "analysis" / name)
            y, u = l96case_read(ref / f"cycle_{c:03d}" / "analysis" / name)
            assert t == u
            # ≤ 1e-12 relative: the filter runs on P ranks, the offline analysis on its own
            assert np.max(np.abs(x - y)) <= 1e-12 * np.max(np.abs(y)), (c, name)


@pytest.mark.mpi
@pytest.mark.parametrize("p", [1, 2])
def test_online_mode_gives_the_offline_analyses(reference, tmp_path, p):
    ref, _ = reference
    workdir = tmp_path / "online"
    proc = _online(workdir, 2, "--set", f"workflow.online.tasks_per_member={p}")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "cycle 2: done" in out
    _assert_same_analysis(workdir, ref)
    for c in (1, 2):
        assert (workdir / f"cycle_{c:03d}" / ".done").exists()
    # the report reads the online records like the offline ones
    from ensio.workflow.records import cycle_summaries, read_records

    summaries = cycle_summaries(read_records(workdir / "records.jsonl"))
    assert [s.cycle for s in summaries] == [1, 2]
    assert all(s.tasks == 6 + 1 for s in summaries)


@pytest.mark.mpi
def test_online_mode_resumes_after_sigkill(reference, tmp_path):
    ref, _ = reference
    workdir = tmp_path / "online"

    def mid_cycle(c: int, k: int) -> bool:
        """The coupled job runs cycle c: its forecasts are written (at least k + 1
        of them), its analysis is not complete (``.done`` is written last)."""
        cdir = workdir / f"cycle_{c:03d}"
        return (len(list((cdir / "forecast").glob("mem*.nc"))) > k
                and not (cdir / ".done").exists())

    _kill_mid_cycle_then_rerun(lambda: _online(workdir, 2), workdir, mid_cycle)
    _assert_same_analysis(workdir, ref)


@pytest.mark.mpi
def test_modes_can_alternate_between_cycles(reference, tmp_path):
    """Cycle 1 offline, cycle 2 online: the same run directory, the same analyses."""
    ref, _ = reference
    workdir = tmp_path / "mixed"
    first = _cycle(workdir, 1)
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    second = _online(workdir, 2)
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-3000:]
    assert "cycles 2..2" in out
    _assert_same_analysis(workdir, ref)


def test_online_mode_without_command_is_a_config_error(tmp_path):
    cmd = [sys.executable, "-m", "ensio", "cycle", str(EXAMPLE), "--mode", "online",
           "--workdir", str(tmp_path), "--cycles", "1", "--set", "workflow.online.command=null"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].endswith(
        "workflow.online.command: required for --mode online")




@pytest.mark.mpi
def test_synthetic_example_gives_the_same_analyses_both_ways(tmp_path):
    """The coupled synthetic model (no forecast files) against the offline pool, with advection."""
    fast = list(SYNTHETIC_FAST)
    runs = {}
    for mode in ("offline", "online"):
        workdir = tmp_path / mode
        cmd = [sys.executable, "-m", "ensio", "cycle", str(SYNTHETIC), "--mode", mode,
               "--workdir", str(workdir), "--cycles", "2", *fast]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        runs[mode] = workdir
    import netCDF4

    assert not (runs["online"] / "cycle_002" / "forecast").exists()  # nothing written to read
    names = sorted(p.name for p in (runs["offline"] / "cycle_002" / "analysis").glob("*.nc"))
    assert names == ["mean.nc", "mem001.nc", "mem002.nc", "mem003.nc", "mem004.nc", "spread.nc"]
    for name in names:
        with netCDF4.Dataset(runs["offline"] / "cycle_002" / "analysis" / name) as a, \
                netCDF4.Dataset(runs["online"] / "cycle_002" / "analysis" / name) as b:
            assert set(a.variables) == set(b.variables), name
            for v in a.variables:
                x, y = np.asarray(a[v][:]), np.asarray(b[v][:])
                scale = max(float(np.max(np.abs(x))), 1e-300) if x.size else 1.0
                assert x.shape == y.shape and np.max(np.abs(x - y), initial=0.0) <= 1e-12 * scale, (
                    name, v)


def test_a_resident_analysis_gives_the_same_cycles(reference, tmp_path) -> None:
    """``workflow.resident: true``: every analysis on one program, bitwise the same result."""
    ref, _ = reference
    workdir = tmp_path / "resident"
    proc = subprocess.run(
        [sys.executable, "-m", "ensio", "cycle", str(EXAMPLE), "--workdir", str(workdir),
         "--cycles", "2", *SMALL, "--set", "workflow.resident=true"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    for c in (1, 2):
        assert _digests(workdir, c) == _digests(ref, c)
    assert "listening" in (workdir / "logs" / "resident.log").read_text()
    logs = "".join(p.read_text() for p in (workdir / "logs").glob("ensio-c*.log"))
    assert logs.count("timing:") == 2  # each analysis printed into its job's log
