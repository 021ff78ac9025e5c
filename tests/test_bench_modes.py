"""``ensio bench modes`` and its queue model (:mod:`ensio.bench.queueing`).

The model is checked against independent computations: hand-scheduled
tasks, a linear-scan list scheduler written here, Graham's bounds, sample
means against the closed-form mean wait. The driver is run end to end with a
stub runner that writes records as ``ensio cycle`` would (no processes).
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
from pathlib import Path

import numpy as np
import pytest

from ensio.bench import modes, modes_output, modes_slurm
from ensio.bench.queueing import (
    LOADS,
    QueueModel,
    list_schedule,
    load_factor,
    mean_wait,
    replay_offline,
    replay_online,
    sample_waits,
)

# --------------------------------------------------------------------------- #
# queue model
# --------------------------------------------------------------------------- #


def _scan_schedule(ready, durations):
    """Independent list scheduler: linear scan for the earliest free job."""
    free = list(ready)
    ends = []
    for d in durations:
        j = min(range(len(free)), key=lambda k: (free[k], k))
        free[j] += d
        ends.append(free[j])
    return ends, free


def test_list_schedule_by_hand():
    # jobs free at 0, 0: t1(3) job0 0-3; t2(1) job1 0-1; t3(2) job1 1-3;
    # t4(2) tie at 3 -> job0 3-5; t5(1) job1 3-4
    starts, ends, jobs = list_schedule([0.0, 0.0], [3, 1, 2, 2, 1])
    assert starts == [0, 0, 1, 3, 3]
    assert ends == [3, 1, 3, 5, 4]
    assert jobs == [0, 1, 1, 0, 1]
    # then the analysis (2 s) after the last member: 5 + 2
    r = replay_offline([3, 1, 2, 2, 1], 2.0, [0.0, 0.0])
    assert r.total == 7 and r.queuing == 0 and r.running == 7 and r.io == 0


def test_replay_offline_late_jobs_by_hand():
    # job0 ready at 4, job1 at 1: t1(2) job1 1-3; t2(2) job1 3-5 (job0 only at 4);
    # t3(1) job0 4-5; analysis lag 0.5, 1 s: 5.5-6.5; queuing = first start = 1
    r = replay_offline([2, 2, 1], 1.0, [4.0, 1.0], analysis_lag=0.5, io=0.25)
    assert r.queuing == 1.0
    assert r.total == pytest.approx(6.5)
    assert r.io == 0.25 and r.running == pytest.approx(6.5 - 1.0 - 0.25)


@pytest.mark.parametrize("jobs", [1, 2, 3, 7])
def test_zero_wait_replay_equals_independent_list_scheduling(jobs):
    rnd = random.Random(jobs)
    for _ in range(50):
        durations = [rnd.uniform(0.0, 5.0) for _ in range(rnd.randint(1, 25))]
        analysis = rnd.uniform(0.0, 3.0)
        ends, _ = _scan_schedule([0.0] * jobs, durations)
        r = replay_offline(durations, analysis, [0.0] * jobs)
        assert r.total == pytest.approx(max(ends) + analysis)
        # Graham's bounds for the members' makespan
        ms = r.total - analysis
        total, longest = sum(durations), max(durations)
        assert max(total / jobs, longest) - 1e-9 <= ms
        assert ms <= total / jobs + (1 - 1 / jobs) * longest + 1e-9


def test_replay_with_ready_times_matches_scan():
    rnd = random.Random(5)
    for _ in range(50):
        ready = [rnd.uniform(0, 10) for _ in range(rnd.randint(1, 6))]
        durations = [rnd.uniform(0, 4) for _ in range(rnd.randint(1, 15))]
        ends, _ = _scan_schedule(ready, durations)
        r = replay_offline(durations, 1.0, ready)
        assert r.total == pytest.approx(max(ends) + 1.0)
        assert r.queuing == pytest.approx(min(ready))
        assert r.total >= min(ready) + sum(durations) / len(ready) + 1.0 - 1e-9


def test_one_job_runs_everything_in_sequence():
    r = replay_offline([1.0, 2.0, 3.0], 4.0, [2.5], analysis_lag=0.5)
    assert r.total == pytest.approx(2.5 + 6.0 + 0.5 + 4.0)


def test_replay_online():
    r = replay_online(10.0, 7.0, io=0.5)
    assert (r.queuing, r.total, r.io) == (7.0, 17.0, 0.5)
    assert r.running == pytest.approx(17.0 - 7.0 - 0.5)
    with pytest.raises(ValueError):
        replay_online(1.0, -2.0)


def test_startup_shifts_every_job():
    # startup 0.5 after waits [2, 0]: jobs ready at 2.5 and 0.5; queuing = first job start
    r = replay_offline([1.0, 1.0, 1.0], 1.0, [2.0, 0.0], startup=0.5)
    # tasks: job1 0.5-1.5, job1 1.5-2.5, then tie at 2.5 -> job0 2.5-3.5; analysis 3.5-4.5
    assert r.queuing == 0.0 and r.total == pytest.approx(4.5)


def test_waits_increase_with_nodes_and_load():
    m = QueueModel(base=0.2, per_node=0.05, alpha=1.3, unit=3.0)
    rhos = [0.0, 0.1, 0.5, 0.8, 0.95]
    for n in (1, 4, 16):
        w = [mean_wait(m, n, r) for r in rhos]
        assert w[0] == 0 and all(a < b for a, b in zip(w, w[1:], strict=False))
    for r in rhos[1:]:
        w = [mean_wait(m, n, r) for n in (1, 2, 8, 64)]
        assert all(a < b for a, b in zip(w, w[1:], strict=False))
    # closed form, computed here: unit * rho/(1-rho) * (base + per_node * n**alpha)
    assert mean_wait(m, 8, 0.8) == pytest.approx(3.0 * 4.0 * (0.2 + 0.05 * 8 ** 1.3))
    assert load_factor(0.9) == pytest.approx(9.0)
    with pytest.raises(ValueError):
        load_factor(1.0)
    # with the same random factors, every sampled wait grows with n and with rho
    small = sample_waits(m, [1] * 100, 0.5, np.random.default_rng(3))
    big = sample_waits(m, [10] * 100, 0.5, np.random.default_rng(3))
    busy = sample_waits(m, [1] * 100, 0.9, np.random.default_rng(3))
    assert np.all(big > small) and np.all(busy > small)


@pytest.mark.parametrize("shape", [1.0, 4.0])
def test_sample_mean_matches_mean_wait(shape):
    m = QueueModel(shape=shape, unit=2.0)
    w = sample_waits(m, [5] * 40000, 0.7, np.random.default_rng(11))
    mu = mean_wait(m, 5, 0.7)
    se = mu / math.sqrt(shape) / math.sqrt(len(w))  # Gamma: sd = mean / sqrt(shape)
    assert abs(w.mean() - mu) < 4 * se
    assert w.std() == pytest.approx(mu / math.sqrt(shape), rel=0.05)
    assert np.all(w >= 0)


def test_sampling_is_seeded():
    m = QueueModel()
    a = sample_waits(m, [1, 2, 3], 0.9, np.random.default_rng(7))
    b = sample_waits(m, [1, 2, 3], 0.9, np.random.default_rng(7))
    c = sample_waits(m, [1, 2, 3], 0.9, np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_model_rejects_bad_parameters():
    for kw in ({"base": -1.0}, {"shape": 0.0}, {"unit": 0.0}, {"alpha": math.nan}):
        with pytest.raises(ValueError):
            QueueModel(**kw)


# --------------------------------------------------------------------------- #
# records → replay inputs
# --------------------------------------------------------------------------- #


def _records(cycle, submitted, schedule, analysis, *, io=0.01, commit=0.02):
    """Task records of one offline cycle.

    ``schedule``: {job: [(member, started, ended), ...]}; ``analysis``: (job, started, ended).
    """
    recs = []
    for job, tasks in schedule.items():
        for member, s, e in tasks:
            recs.append({"kind": "member", "task": f"mem{member:03d}", "member": member,
                         "cycle": cycle, "job": job, "submitted": submitted, "started": s,
                         "ended": e, "finished": e + commit, "status": "done",
                         "io_seconds": io})
    job, s, e = analysis
    recs.append({"kind": "analysis", "task": "analysis", "member": None, "cycle": cycle,
                 "job": job, "submitted": submitted, "started": s, "ended": e,
                 "finished": e + commit, "status": "done", "io_seconds": 5 * io})
    return recs


def test_measured_rows_and_offline_inputs_by_hand():
    # two jobs submitted at 100; job a starts its first task at 100.5, job b at 100.7;
    # every gap between a job's tasks is 0.1
    sched = {"a": [(1, 100.5, 101.5), (3, 101.6, 102.6)],
             "b": [(2, 100.7, 101.7), (4, 101.8, 102.3)]}
    recs = _records(1, 100.0, sched, ("b", 102.9, 104.0))
    rows = modes.measured_rows(recs)
    assert len(rows) == 1
    r = rows[0]
    assert r["queuing"] == pytest.approx(0.5)
    assert r["total"] == pytest.approx(104.02 - 100.0)
    assert r["io"] == pytest.approx(4 * 0.01 + 0.05)
    assert r["running"] == pytest.approx(r["total"] - 0.5 - r["io"])
    # a process start 5 ms before the submission (online records): queuing 0, not negative
    early = [dict(x, started=99.995) if x["member"] == 1 else x for x in recs]
    r3 = modes.measured_rows(early)[0]
    assert r3["queuing"] == 0.0 and r3["total"] == pytest.approx(4.02)

    (oc,) = modes.offline_inputs(recs)
    assert oc.cycle == 1
    # gaps: a 101.6-101.5, b 101.8-101.7, b 102.9-102.3 -> median 0.1
    assert oc.gap == pytest.approx(0.1)
    assert oc.members == pytest.approx((1.1, 1.1, 1.1, 0.6))  # member order 1, 2, 3, 4
    assert oc.analysis == pytest.approx(104.02 - 102.9)
    assert oc.lag == pytest.approx(102.9 - 102.6 - 0.1)
    assert oc.startup == pytest.approx(0.6)  # median of 0.5 and 0.7
    # the zero-wait replay of a greedy schedule gives back the measured total
    replay = replay_offline(oc.members, oc.analysis, [0.5, 0.7], analysis_lag=oc.lag)
    assert replay.total == pytest.approx(104.02 - 100.0)


def test_model_cycles_seeded_and_shaped():
    oc = modes.OfflineCycle(cycle=1, members=(0.4,) * 10, analysis=1.0, lag=0.05, startup=0.5,
                            io=0.05, gap=0.0, measured_total=2.6)
    online = [{"cycle": 1, "total": 2.5, "queuing": 0.8, "io": 0.0, "running": 1.7}]
    kw = dict(jobs=4, nodes_per_member=1, members=10, draws=300)
    m = QueueModel(unit=2.5)
    a = modes.model_cycles([oc], online, m, 0.9, seed=3, **kw)
    b = modes.model_cycles([oc], online, m, 0.9, seed=3, **kw)
    c = modes.model_cycles([oc], online, m, 0.9, seed=4, **kw)
    assert a == b and a != c
    assert len(a["offline"]) == len(a["online"]) == 300
    # the presets give the shape the docstring promises on this typical cycle
    out = {}
    for name, rho in LOADS.items():
        reps = modes.model_cycles([oc], online, m, rho, seed=1, **kw)
        out[name] = {mode: modes.stats(reps[mode]) for mode in ("offline", "online")}
    low, high = out["low"], out["high"]
    for mode in ("offline", "online"):
        assert low[mode]["queuing"]["mean"] < low[mode]["running"]["mean"]
    assert 0.7 < low["offline"]["total"]["mean"] / low["online"]["total"]["mean"] < 1.3
    assert high["online"]["queuing"]["mean"] > 3 * high["online"]["running"]["mean"]
    assert high["offline"]["total"]["mean"] / high["online"]["total"]["mean"] < 0.6
    # every replayed cycle is at least its zero-wait length
    for r in a["offline"]:  # start-up + work / N_j + lag + analysis
        assert r["total"] >= 0.5 + 10 * 0.4 / 4 + 0.05 + 1.0 - 1e-9
    for r in a["online"]:
        assert r["total"] >= 2.5


def test_stats():
    rows = [{"total": 4.0, "queuing": 1.0, "running": 2.0, "io": 1.0},
            {"total": 6.0, "queuing": 1.0, "running": 4.0, "io": 1.0}]
    st = modes.stats(rows)
    assert st["total"]["mean"] == 5.0 and st["total"]["std"] == pytest.approx(math.sqrt(2))
    assert st["running"]["percent"] == pytest.approx(60.0)
    assert st["queuing"]["percent"] == pytest.approx(20.0)


# --------------------------------------------------------------------------- #
# SLURM helpers
# --------------------------------------------------------------------------- #


def test_overcommit_only_when_the_partition_is_too_small(tmp_path, monkeypatch):
    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/sh\necho 'n1 2'\necho 'n1 2'\necho 'n2 4'\n")  # n1 in 2 partitions
    sinfo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert modes_slurm.cpus_of_nodes() == 6
    assert modes_slurm.overcommit_needed(10)
    assert not modes_slurm.overcommit_needed(6)


# --------------------------------------------------------------------------- #
# the driver, end to end with a stub runner
# --------------------------------------------------------------------------- #

CONFIG = """\
ensemble: {members: "forecast/mem{member:03d}.nc", size: 4, variables: [x]}
observations: [{file: "{workdir}/obs/obs_{cycle:03d}.nc"}]
analysis: {filter: letkf, localization: {radius: 5, periodic: 40}}
workflow:
  jobs: 2
  member_command: "true {forecast}"
  online: {command: "coupled --workdir {workdir} --first {first} --cycles {cycles}"}
"""


class StubRunner:
    """Writes the records an ``ensio cycle --cycles c`` would (cycle c only)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.clock = 1000.0

    def __call__(self, argv, log):
        self.calls.append(list(argv))
        a = argv[argv.index("cycle"):]
        mode, workdir = a[a.index("--mode") + 1], Path(a[a.index("--workdir") + 1])
        c = int(a[a.index("--cycles") + 1])
        workdir.mkdir(parents=True, exist_ok=True)
        t = self.clock
        self.clock += 100.0
        if mode == "offline":  # 2 jobs, 4 members of 1 s, analysis 2 s
            recs = _records(c, t, {"j1": [(1, t + 0.5, t + 1.5), (3, t + 1.5, t + 2.5)],
                                   "j2": [(2, t + 0.5, t + 1.5), (4, t + 1.5, t + 2.5)]},
                            ("j1", t + 2.6, t + 4.6), commit=0.0)
        else:  # the coupled cycle: 3 s after 1 s of start-up
            recs = [{"kind": k, "member": m, "cycle": c, "job": "on", "submitted": t,
                     "started": t + 1.0, "ended": t + 4.0, "finished": t + 4.0,
                     "status": "done", "io_seconds": 0.0}
                    for k, m in [("member", 1), ("member", 2), ("analysis", None)]]
        with open(workdir / "records.jsonl", "a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")


def test_bench_modes_end_to_end(tmp_path):
    cfg = tmp_path / "cycle.yaml"
    cfg.write_text(CONFIG)
    runner = StubRunner()
    steps = []
    res = modes.bench_modes(cfg, tmp_path / "w", modes.ModesSettings(cycles=3, draws=50,
                                                                      slurm="no"),
                            runner=runner, on_step=lambda *a: steps.append(a))
    # one submission per cycle and mode, offline first, no start delay
    assert [(c[c.index("--mode") + 1], c[c.index("--cycles") + 1]) for c in runner.calls] == [
        ("offline", "1"), ("offline", "2"), ("offline", "3"),
        ("online", "1"), ("online", "2"), ("online", "3")]
    assert all(c[-2:] == ["--set", "workflow.start_delay=0"] for c in runner.calls)
    assert [s[1:] for s in steps] == [(k, 6) for k in range(6)]
    loc = res["measured"]["local"]
    assert [r["cycle"] for r in loc["offline"]["cycles"]] == [1, 2, 3]
    assert loc["offline"]["stats"]["total"]["mean"] == pytest.approx(4.6)
    assert loc["online"]["stats"]["total"]["mean"] == pytest.approx(4.0)
    assert loc["online"]["stats"]["queuing"]["mean"] == pytest.approx(1.0)
    assert loc["ratio"] == pytest.approx(4.6 / 4.0)
    # the zero-wait replay reproduces the measured offline cycles
    for chk in res["replay_check"]:
        assert chk["replay_total"] == pytest.approx(chk["measured_total"])
    m = res["model"]
    assert m["params"]["unit"] == pytest.approx(4.0)  # mean online time to solution
    assert m["nodes"] == {"offline_job": 1.0, "online_job": 4.0}
    assert set(m["loads"]) == set(LOADS)
    hi, lo = m["loads"]["high"], m["loads"]["low"]
    assert hi["online"]["stats"]["queuing"]["mean"] > lo["online"]["stats"]["queuing"]["mean"]
    for entry in (hi, lo):
        assert entry["ratio"] == pytest.approx(entry["offline"]["stats"]["total"]["mean"]
                                               / entry["online"]["stats"]["total"]["mean"])
        for mode in ("offline", "online"):
            st = entry[mode]["stats"]
            parts = st["queuing"]["mean"] + st["running"]["mean"] + st["io"]["mean"]
            assert parts == pytest.approx(st["total"]["mean"])
    assert res["measured"]["slurm"] == {"skipped": "not asked for (--slurm no)"}
    assert "--mode online" in res["commands"]["online"] and "--cycles c " in res[
        "commands"]["online"]
    json.loads(json.dumps(res))
    table = modes_output.result_table(res)
    assert table.row_count == 2 * (1 + len(LOADS))
    md = modes_output.markdown_table(res)
    assert md.count("\n") == 1 + 2 * (1 + len(LOADS))
    png = tmp_path / "img" / "modes.png"
    modes_output.plot_result(res, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # same seed, same model numbers; the run directories must be fresh
    with pytest.raises(modes.EnsioError, match="not empty"):
        modes.bench_modes(cfg, tmp_path / "w", modes.ModesSettings(cycles=1, slurm="no"),
                          runner=runner)


def test_bench_modes_needs_online_command(tmp_path):
    cfg = tmp_path / "cycle.yaml"
    cfg.write_text(CONFIG.replace('  online: {command: "coupled --workdir {workdir} --first '
                                  '{first} --cycles {cycles}"}\n', ""))
    with pytest.raises(modes.EnsioError, match="workflow.online.command"):
        modes.bench_modes(cfg, tmp_path / "w", modes.ModesSettings(cycles=1, slurm="no"),
                          runner=StubRunner())


def test_cli_registered():
    from ensio.cli import bench_modes as cli_modes
    from ensio.cli.main import build_parser

    args = build_parser().parse_args(["bench", "modes", "c.yaml", "--cycles", "2", "--loads",
                                      "quiet=0.2,busy=0.95", "--slurm", "no", "--draws", "7"])
    assert args.bench_run is cli_modes.run
    assert args.loads == {"quiet": 0.2, "busy": 0.95} and args.cycles == 2
    st = cli_modes.settings_from_args(args)
    assert (st.cycles, st.draws, st.slurm, st.loads) == (2, 7, "no", args.loads)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "modes", "c.yaml", "--loads", "x=1.5"])


def test_percentages_consistent_with_statistics_module():
    rows = [{"total": t, "queuing": 0.1 * t, "running": 0.8 * t, "io": 0.1 * t}
            for t in (1.0, 2.0, 4.0)]
    st = modes.stats(rows)
    assert st["total"]["std"] == pytest.approx(statistics.stdev([1.0, 2.0, 4.0]))
    assert st["running"]["percent"] == pytest.approx(80.0)


def test_slurm_yes_without_slurm_is_an_error(tmp_path, monkeypatch):
    from ensio.workflow.backends import slurm

    monkeypatch.setattr(slurm, "slurm_unavailable_reason", lambda timeout=10.0: "no sinfo")
    cfg = tmp_path / "cycle.yaml"
    cfg.write_text(CONFIG)
    with pytest.raises(modes.EnsioError, match="no sinfo"):
        modes.bench_modes(cfg, tmp_path / "w", modes.ModesSettings(cycles=1, slurm="yes"),
                          runner=StubRunner())
    res = modes.bench_modes(cfg, tmp_path / "w2",
                            modes.ModesSettings(cycles=1, draws=5, slurm="auto"),
                            runner=StubRunner())
    assert res["measured"]["slurm"] == {"skipped": "no sinfo"}
    assert "SLURM: skipped (no sinfo)" in str(modes_output.result_table(res).caption)
