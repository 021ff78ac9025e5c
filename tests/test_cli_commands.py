"""README promises of the ``ensio`` command line, each checked from the outside.

- ``io.fsync: true`` runs an analysis and gives the same files as ``fsync: false``
  (and really syncs);
- ``workflow.initial`` is the ensemble ``ensio cycle`` starts cycle 1 from;
- ``workflow.start_delay`` shows in the records as queuing of at least the delay;
- ``ensio report`` prints the numbers the records give, and its errors are one
  line with exit status 2;
- ``workflow.online.timeout`` aborts a coupled job whose analysis call hangs,
  with a message naming the timeout;
- ``ensio bench pool`` and ``ensio synth --format`` from the command line.

Expected values are computed here from the files (records, netCDF) with the
standard library, numpy and netCDF4, never taken from the code under test.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
from cases import content_digest

from ensio.cli.main import main as ensio_main

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "lorenz96" / "cycle.yaml"
ENSIO = [sys.executable, "-m", "ensio"]
#: Members and jobs of the small Lorenz-96 runs (the example has 10 and 4).
SMALL = ["--set", "ensemble.size=4", "--set", "workflow.jobs=2",
         "--set", "workflow.analysis_ranks=1"]  # fmt: skip
START_DELAY = 1.5
INITIAL = "start/ens{member:02d}.nc"
SEED = 20240901


def _run(*args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    """``ensio ARGS`` in its own session; the whole group is killed if ``timeout`` expires."""
    env = {**os.environ, "COLUMNS": "200"}  # rich tables on one line each
    cmd = [*ENSIO, *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} still running after {timeout} s\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """README: errors are one line naming the problem, exit status 2."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------ io.fsync


def _fsync_case(root: Path) -> Path:
    assert ensio_main(["synth", str(root), "--nx", "24", "--ny", "12", "--members", "4",
                       "--seed", "3"]) == 0  # fmt: skip
    return root / "ensio.yaml"


ANALYSIS_SETS = [
    "--set", "observations=[{file: obs.nc}]",
    "--set", "analysis={filter: letkf, localization: {radius_km: 4000}}",
    "--set", "output={mean: mean.nc, spread: spread.nc}",
]  # fmt: skip


def test_io_fsync_true_gives_the_same_files_and_syncs(tmp_path, monkeypatch):
    calls = {"fsync": 0}
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def counting(real):
        def call(fd):
            calls["fsync"] += 1
            return real(fd)

        return call

    monkeypatch.setattr(os, "fsync", counting(real_fsync))
    monkeypatch.setattr(os, "fdatasync", counting(real_fdatasync))
    files, synced = {}, {}
    for flag in ("false", "true"):
        cfg = _fsync_case(tmp_path / flag)
        before = (tmp_path / flag / "mem001.nc").read_bytes()
        calls["fsync"] = 0
        assert ensio_main(["analyse", str(cfg), *ANALYSIS_SETS, "--set", f"io.fsync={flag}"]) == 0
        synced[flag] = calls["fsync"]
        files[flag] = {p.name: content_digest(p) if p.name in ("mean.nc", "spread.nc")
                       else p.read_bytes() for p in sorted((tmp_path / flag).glob("*.nc"))}
        assert files[flag]["mem001.nc"] != before, "the analysis changed nothing"
    assert files["true"].keys() == files["false"].keys()
    assert {"mean.nc", "spread.nc", "mem004.nc"} <= files["true"].keys()
    for name in files["true"]:
        assert files["true"][name] == files["false"][name], name
    assert synced["true"] > synced["false"], synced


# ---------------------------------------- workflow.initial, start_delay, report


def _write_l96_state(path: Path, x: np.ndarray) -> None:
    from ensio.models.l96case import write_state

    path.parent.mkdir(parents=True, exist_ok=True)
    write_state(path, x, 0.0)


@pytest.fixture(scope="module")
def l96_run(tmp_path_factory):
    """Two Lorenz-96 cycles from a seeded initial ensemble at a non-default place."""
    workdir = tmp_path_factory.mktemp("l96") / "run"
    rng = np.random.default_rng(SEED)
    for m in range(1, 5):
        _write_l96_state(workdir / INITIAL.format(member=m), 8.0 + 2.0 * rng.standard_normal(40))
    res = _run("cycle", EXAMPLE, "--workdir", workdir, "--cycles", 2, *SMALL,
               "--set", f"workflow.start_delay={START_DELAY}",
               "--set", f"workflow.initial='{INITIAL}'", timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return workdir


def _read_x(path: Path) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        return np.asarray(ds["x"][:], dtype=float)


def test_workflow_initial_is_where_cycle_1_starts(l96_run, tmp_path):
    from ensio.models.l96case import run as l96_forecast

    for m in range(1, 5):
        got = _read_x(l96_run / "cycle_001" / "forecast" / f"mem{m:03d}.nc")
        mine = tmp_path / f"from_initial_{m}.nc"
        l96_forecast(l96_run / INITIAL.format(member=m), mine, 5)  # the example's --steps 5
        np.testing.assert_array_equal(got, _read_x(mine), err_msg=f"member {m} (seed {SEED})")
        default = tmp_path / f"from_default_{m}.nc"
        l96_forecast(l96_run / "init" / f"mem{m:03d}.nc", default, 5)
        assert not np.array_equal(got, _read_x(default)), f"member {m} started from init/"


def _records(workdir: Path) -> list[dict]:
    out = []
    for line in (workdir / "records.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_workflow_start_delay_shows_in_the_records(l96_run):
    recs = _records(l96_run)
    jobs = [r for r in recs if r.get("kind") == "job"]
    tasks = [r for r in recs if r.get("kind") in ("member", "analysis")]
    assert jobs and len(tasks) >= 2 * (4 + 1)
    for r in jobs:  # a job starts no earlier than the delay after its submission
        assert r["started"] - r["submitted"] >= START_DELAY, r
    for r in tasks:
        assert r["submitted"] is not None and r["started"] - r["submitted"] >= START_DELAY, r
    done = sorted((r["cycle"], r["task"]) for r in tasks if r["status"] == "done")
    assert len(done) == len(set(done)) == 2 * 5, done  # every task once, nothing redone


def _expected_table(recs: list[dict]) -> list[dict]:
    """README: per cycle total, queuing, running (= total − queuing − I/O) and I/O."""
    rows = []
    for c in sorted({r["cycle"] for r in recs if r.get("kind") in ("member", "analysis")}):
        rs = [r for r in recs if r.get("kind") in ("member", "analysis") and r["cycle"] == c]
        submitted = min(r["submitted"] for r in rs if r.get("submitted") is not None)
        first = min(r["started"] for r in rs if r.get("started") is not None)
        last = max(r["finished"] for r in rs if r.get("finished") is not None)
        io = math.fsum(
            r["io_seconds"] for r in rs if r["status"] == "done" and r.get("io_seconds") is not None
        )
        total, queuing = last - submitted, first - submitted
        rows.append({"cycle": c, "total": total, "queuing": queuing, "io": io,
                     "running": max(0.0, total - queuing - io)})  # fmt: skip
    return rows


def _table_cells(stdout: str) -> dict[str, list[str]]:
    """Rows of the table (cells separated by blanks) by their first cell; empty cells dropped."""
    out = {}
    for line in stdout.splitlines():
        cells = line.split()
        if cells and (cells[0].isdigit() or cells[0] in ("mean", "sd")):
            out[cells[0]] = cells[1:]
    return out


def test_report_numbers_are_those_of_the_records(l96_run):
    res = _run("report", l96_run)
    assert res.returncode == 0, res.stderr
    want = _expected_table(_records(l96_run))
    assert [r["cycle"] for r in want] == [1, 2]
    assert all(r["io"] > 0 and r["queuing"] >= START_DELAY for r in want), want
    with open(l96_run / "report.csv", newline="") as f:
        got = list(csv.DictReader(f))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for key, value in w.items():
            assert math.isclose(float(g[key]), value, rel_tol=1e-12, abs_tol=1e-12), (key, g, w)
    cells = _table_cells(res.stdout)
    parts = ("total", "queuing", "running", "io")
    for w in want:
        expect = []
        for p in parts:
            expect.append(f"{w[p]:.2f}")
            if p != "total":
                expect.append(f"{100 * w[p] / w['total']:.0f}")
        assert cells[str(w["cycle"])] == expect, (cells, w)
    mean_row, sd_row = [], []
    for p in parts:
        vals = [w[p] for w in want]
        mean_row.append(f"{statistics.fmean(vals):.2f}")
        sd_row.append(f"{statistics.stdev(vals):.2f}")
        if p != "total":
            tot = statistics.fmean(w["total"] for w in want)
            mean_row.append(f"{100 * statistics.fmean(vals) / tot:.0f}")
    assert cells["mean"] == mean_row, cells
    assert cells["sd"] == sd_row, cells
    assert max(len(line) for line in res.stdout.splitlines() if line.split()[:1] in (
        ["cycle"], ["mean"], ["sd"], ["1"], ["2"])) <= 80
    assert (l96_run / "report.png").stat().st_size > 0


def test_report_errors_are_one_line_with_status_2(tmp_path):
    missing = tmp_path / "nowhere"
    _one_line_error(_run("report", missing), str(missing), "no records")
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(_run("report", empty), "records.jsonl", "no records")
    # a run that never finished a task: only a job record
    (empty / "records.jsonl").write_text(json.dumps({"kind": "job", "submitted": 1.0}) + "\n")
    _one_line_error(_run("report", empty), "no finished task records")
    assert sorted(p.name for p in empty.iterdir()) == ["records.jsonl"]


# ---------------------------------------------------- workflow.online.timeout

HANGING_PROGRAM = '''
"""A coupled Lorenz-96 program whose member 2 never reaches the analysis."""
import argparse
import threading
from pathlib import Path

from mpi4py import MPI

from ensio.models.l96case import read_state, write_state
from ensio.online.cycling import CoupledRun

p = argparse.ArgumentParser()
for name in ("--workdir", "--initial"):
    p.add_argument(name)
p.add_argument("--first", type=int)
p.add_argument("--cycles", type=int)
a = p.parse_args()
run = CoupledRun(Path(a.workdir), MPI.COMM_WORLD, first=a.first, last=a.cycles,
                 initial=a.initial)
x, t = read_state(run.initial_path)
for c in run.cycles():
    write_state(run.forecast_path(c), x, t)
    if run.member == 2:
        threading.Event().wait()  # hangs: the others wait in the analysis call
    run.assimilate(c, x[run.rows])
run.close()
'''


def test_online_timeout_aborts_a_hanging_coupled_job(tmp_path):
    needs.mpiexec(path_fallback=True)
    program = tmp_path / "hanging.py"
    program.write_text(HANGING_PROGRAM)
    workdir = tmp_path / "run"
    command = (f"python {program} --workdir {{workdir}} --first {{first}} "
               "--cycles {cycles} --initial {initial}")  # fmt: skip
    res = _run("cycle", EXAMPLE, "--mode", "online", "--workdir", workdir, "--cycles", 1,
               "--set", "ensemble.size=2", "--set", "workflow.online.tasks_per_member=1",
               "--set", f"workflow.online.command={command}",
               "--set", "workflow.online.timeout=3", timeout=120)  # fmt: skip
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert "assimilate of cycle 1 did not finish" in res.stderr, res.stderr[-3000:]
    assert "waited more than 3 s" in res.stderr, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert "coupled job ended" in last and "cycles 1 not done" in last, last
    assert not (workdir / "cycle_001" / ".done").exists()


# -------------------------------------------------------------- ensio bench pool


def test_bench_pool_from_the_command_line(tmp_path):
    out, wd = tmp_path / "pool.json", tmp_path / "wd"
    res = _run("bench", "pool", "--json", out, "--workdir", wd, "--keep", "--jobs", 2,
               "--noop-tasks", 12, "--sleep-tasks", 4, "--sleep-seconds", 0.05,
               "--repeat", 1)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert {"jobs", "machine", "noop", "sleep", "workdir"} <= data.keys()
    assert data["jobs"] == 2 and data["workdir"] == str(wd)
    noop, sleep = data["noop"], data["sleep"]
    assert {"tasks", "lock", "overhead_ms", "commit_ms", "command_ms",
            "tasks_per_second"} <= noop.keys()  # fmt: skip
    assert {"tasks", "makespan", "ideal", "ratio", "ok", "ratios", "repeat"} <= sleep.keys()
    for q in ("overhead_ms", "commit_ms"):
        assert 0 <= noop[q]["median"] <= noop[q]["p99"], noop[q]
    # the numbers are those of the kept records
    for name, case, n in (("noop", noop, 12), ("sleep1", sleep, 4)):
        recs = [r for r in _records(wd / name) if r.get("kind") == "member"]
        assert sorted(r["member"] for r in recs if r["status"] == "done") == list(range(1, n + 1))
        assert case["tasks"] == n == len(recs)
    recs = [r for r in _records(wd / "sleep1") if r.get("kind") == "member"]
    makespan = max(r["finished"] for r in recs) - min(r["started"] for r in recs)
    assert math.isclose(sleep["makespan"], makespan, rel_tol=1e-12)
    assert math.isclose(sleep["ideal"], 4 * 0.05 / 2, rel_tol=1e-12)
    assert math.isclose(sleep["ratio"], makespan / sleep["ideal"], rel_tol=1e-12)
    assert sleep["repeat"] == 1 and sleep["ratios"] == [sleep["ratio"]]
    assert sleep["ok"] == (sleep["ratio"] <= 1.05)
    recs = [r for r in _records(wd / "noop") if r.get("kind") == "member"]
    span = max(r["finished"] for r in recs) - min(r["started"] for r in recs)
    assert math.isclose(noop["tasks_per_second"], 12 / span, rel_tol=1e-12)


def test_bench_pool_bad_arguments_exit_2(tmp_path):
    res = _run("bench", "pool", "--jobs", "many", "--workdir", tmp_path / "wd")
    assert res.returncode == 2 and "--jobs" in res.stderr, res.stderr
    assert not (tmp_path / "wd").exists()


# ----------------------------------------------------------- ensio synth --format

KINDS = {"cdf5": {"cdf5", "64-bit data"}, "netcdf4": {"netCDF-4"}}


@needs.tools_mark("ncdump")  # netcdf-bin
@pytest.mark.parametrize("fmt", sorted(KINDS))
def test_synth_format_from_the_command_line(tmp_path, fmt):
    out = tmp_path / "case"
    res = _run("synth", out, "--nx", 16, "--ny", 8, "--members", 3, "--seed", 4, "--format", fmt)
    assert res.returncode == 0, res.stderr
    files = sorted(out.glob("*.nc"))
    assert [p.name for p in files] == ["mem001.nc", "mem002.nc", "mem003.nc", "obs.nc",
                                       "truth.nc"]  # fmt: skip
    for p in files:
        if p.name == "obs.nc":
            continue  # observations: always netCDF-4 (DESIGN.md format), any kind is fine
        kind = subprocess.run(["ncdump", "-k", str(p)], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
        assert kind in KINDS[fmt], (p.name, kind)


def test_synth_unknown_format_exits_2(tmp_path):
    res = _run("synth", tmp_path / "case", "--nx", 16, "--ny", 8, "--members", 3, "--seed", 4,
               "--format", "hdf4")  # fmt: skip
    assert res.returncode == 2 and "--format" in res.stderr, res.stderr
    assert not (tmp_path / "case").exists()
