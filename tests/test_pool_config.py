"""The ``workflow:`` config section and the records helpers."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from pool_support import LIGHT, PY

from ensio.config.errors import ConfigError
from ensio.config.load import from_plain
from ensio.config.workflow import SlurmSection, WorkflowSection, parse_duration
from ensio.workflow.records import (
    RecordTail,
    append_record,
    cycle_summaries,
    mean_std,
    read_records,
)

ISSUE_EXAMPLE = """
workflow:
  backend: local             # local | slurm
  jobs: 4                    # N_j
  time_limit: "00:20:00"     # per job
  member_command: "python -m mymodel --init {analysis} --out {forecast}"
  analysis_ranks: 2
  retries: 1
  min_members: 40
  task_estimate: "00:01:00"  # used until records give a better estimate
  slurm: {partition: null, account: null, extra: []}
"""


def load(text: str) -> WorkflowSection:
    return from_plain(WorkflowSection, yaml.safe_load(text)["workflow"], "workflow")


def test_issue_example_loads():
    wf = load(ISSUE_EXAMPLE)
    assert wf.backend == "local" and wf.jobs == 4 and wf.analysis_ranks == 2
    assert wf.time_limit_seconds == 1200 and wf.task_estimate_seconds == 60
    assert wf.retries == 1 and wf.min_members == 40 and wf.slurm == SlurmSection()
    wf = load("workflow: {member_command: m, time_limit: 1:00:00, "
              "slurm: {partition: p, extra: --qos=debug}}")
    assert wf.time_limit_seconds == 3600  # YAML 1.1 reads 1:00:00 as the integer 3600
    assert wf.slurm.extra == ("--qos=debug",) and wf.min_members is None
    assert wf.lease_seconds == 60  # the default lease: a minute
    assert load("workflow: {member_command: m, lease: '00:00:10'}").lease_seconds == 10


@pytest.mark.parametrize("text, seconds", [
    ("00:20:00", 1200), ("1-02:03:04", 93784), ("2-0", 172800), ("1-00:30", 88200),
    ("90", 90), ("05:30", 330), ("0:0:1.5", 1.5), (45, 45), (2.5, 2.5),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "20 min", "1:2:3:4", "00:61:00", "-5", "x-01:00:00",
                                  "0", "00:00:00", "1::2", True, -3])
def test_bad_durations(text):
    with pytest.raises(ConfigError, match="^workflow.time_limit: "):
        parse_duration(text, "workflow.time_limit")


@pytest.mark.parametrize("body, key", [
    ("{member_command: m, backend: pbs}", "workflow.backend: 'pbs' is not one of local | slurm"),
    ("{member_command: m, jobs: 0}", "workflow.jobs: must be at least 1"),
    ("{member_command: m, time_limit: soon}", "workflow.time_limit: expected HH:MM:SS"),
    ("{member_command: m, task_estimate: '00:30:00'}", "workflow.task_estimate: "),
    ("{member_command: 'm {member.x}'}", "workflow.member_command: placeholder"),
    ("{member_command: 'm {members}'}", "workflow.member_command: unknown placeholder"),
    ("{member_command: m, retries: -1}", "workflow.retries: must be >= 0"),
    ("{member_command: m, lease: 0}", "workflow.lease: must be a positive duration"),
    ("{member_command: m, lease: 0.5}", "workflow.lease: must be at least 1 second"),
    ("{member_command: m, lease: soon}", "workflow.lease: expected HH:MM:SS"),
    ("{member_command: m, min_members: 0}", "workflow.min_members: must be at least 1"),
    ("{member_command: m, analysis_ranks: 0}", "workflow.analysis_ranks: must be at least 1"),
    ("{member_command: m, slurm: {partition: 'a b'}}", "workflow.slurm.partition: "),
    ("{member_command: m, slurm: {extra: [qos]}}", "workflow.slurm.extra[0]: "),
    ("{member_command: m, slurm: {qos: x}}", "workflow.slurm.qos: unknown config key"),
    ("{jobs: 2}", "workflow.member_command: required config key is missing"),
])
def test_errors_name_the_key(body, key):
    with pytest.raises(ConfigError) as err:
        load(f"workflow: {body}")
    assert str(err.value).startswith(key), str(err.value)


# ---------------------------------------------------------------------- records
APPENDER = LIGHT + r"""
import sys
from ensio.workflow.records import append_record
path, who = sys.argv[1], sys.argv[2]
for i in range(150):
    append_record(path, {"kind": "member", "who": who, "i": i, "pad": "x" * 3000})
"""


def test_appends_from_many_processes_stay_whole_lines(tmp_path):
    path = tmp_path / "records.jsonl"
    procs = [subprocess.Popen([PY, "-c", APPENDER, str(path), str(w)]) for w in range(4)]
    assert all(p.wait(60) == 0 for p in procs)
    lines = path.read_bytes().splitlines()
    assert len(lines) == 600 and len(read_records(path)) == 600
    for w in range(4):
        assert [r["i"] for r in read_records(path) if r["who"] == str(w)] == list(range(150))


def test_record_tail_reads_increments_and_skips_torn_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    tail = RecordTail(path, keep=3, skip_owner="me")
    tail.refresh()  # no file yet
    assert tail.estimate("member", 9.0) == 9.0
    for d, owner in ((1.0, "a"), (4.0, "me"), (2.0, "b")):
        append_record(path, {"kind": "member", "status": "done", "started": 0, "ended": d,
                             "owner": owner})
    with open(path, "ab") as f:
        f.write(b'{"kind": "member", "status": "done", "sta')  # being written
    tail.refresh()
    assert tail.durations["member"] == [1.0, 2.0]
    with open(path, "ab") as f:
        f.write(b'rted": 0, "ended": 3.0}\n')
    tail.refresh()
    tail.note("member", 0.5)
    tail.note("analysis", 7.0)
    assert tail.durations["member"] == [2.0, 3.0, 0.5]  # keeps the last 3
    assert tail.estimate("member", 9.0) == 3.0 and tail.estimate("analysis", 1.0) == 7.0


def test_cycle_summaries():
    recs = [
        {"kind": "member", "cycle": 1, "submitted": 100.0, "started": 110.0, "ended": 119.0,
         "finished": 120.0, "status": "done", "io_seconds": 1.5},
        {"kind": "member", "cycle": 1, "submitted": 101.0, "started": 112.0, "ended": 117.0,
         "finished": 118.0, "status": "interrupted", "io_seconds": None},
        {"kind": "analysis", "cycle": 1, "submitted": 100.0, "started": 121.0, "ended": 129.0,
         "finished": 130.0, "status": "done", "io_seconds": 2.0},
        {"kind": "job", "job": "x", "started": 1.0, "finished": 2.0},
        {"kind": "member", "cycle": 2, "submitted": None, "started": 200.0, "ended": 204.0,
         "finished": 205.0, "status": "failed"},
    ]
    c1, c2 = cycle_summaries(recs)
    assert (c1.cycle, c1.queuing, c1.running, c1.total, c1.io) == (1, 10.0, 20.0, 30.0, 3.5)
    assert (c1.tasks, c1.failed, c1.interrupted, c1.task_seconds) == (2, 0, 1, 17.0)
    assert c2.queuing is None and c2.total == c2.running == 5.0 and c2.tasks == 0
    assert json.loads(json.dumps(c1.as_dict()))["running"] == 20.0
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(2 ** 0.5)) and mean_std([4.0]) == (4.0, 0)


def test_empty_records(tmp_path):
    assert read_records(tmp_path / "none.jsonl") == [] and cycle_summaries([]) == []
    assert not (tmp_path / "none.jsonl").exists()  # reading never creates the file
    (tmp_path / "empty.jsonl").write_text("")
    assert read_records(tmp_path / "empty.jsonl") == []


def test_reconcile_restores_exactly_the_lost_done_records(tmp_path):
    """A worker killed between committing a task and writing its record loses the record;
    the driver restores it from the list once, and never duplicates a present one."""
    from ensio.workflow.records import read_records, reconcile_done

    path = tmp_path / "records.jsonl"
    append_record(path, {"kind": "member", "task": "mem001", "member": 1, "cycle": 2,
                         "status": "done", "started": 1.0, "ended": 2.0, "finished": 2.5})
    append_record(path, {"kind": "member", "task": "mem002", "member": 2, "cycle": 1,
                         "status": "done", "started": 1.0, "ended": 2.0, "finished": 2.5})
    append_record(path, {"kind": "member", "task": "mem002", "member": 2, "cycle": 2,
                         "status": "failed", "started": 1.0, "ended": 2.0, "finished": 2.5})
    done = [
        {"id": "mem001", "kind": "member", "member": 1, "done_at": 3.0, "done_by": "a",
         "done_token": 4},
        {"id": "mem002", "kind": "member", "member": 2, "done_at": 5.0, "done_by": "b",
         "done_token": 7},
        {"id": "analysis", "kind": "analysis", "member": None, "done_at": 6.0, "done_by": "b",
         "done_token": 8},
    ]
    assert reconcile_done(path, 2, done) == 2
    assert reconcile_done(path, 2, done) == 0
    recs = [r for r in read_records(path) if r["cycle"] == 2 and r["status"] == "done"]
    assert sorted(r["task"] for r in recs) == ["analysis", "mem001", "mem002"]
    restored = {r["task"]: r for r in recs if r.get("recovered")}
    assert set(restored) == {"mem002", "analysis"}
    assert restored["mem002"]["token"] == 7 and restored["mem002"]["finished"] == 5.0
    assert restored["mem002"]["owner"] == "b" and restored["mem002"]["started"] is None


def test_reconcile_waits_for_a_live_committer_of_this_host(tmp_path):
    """A job of a killed driver may have committed the task and not yet written its record:
    while it lives here, the driver waits for the record instead of restoring a second."""
    import os
    import socket
    import subprocess
    import sys
    import threading

    from ensio.workflow.records import owner_alive, read_records, reconcile_done

    path = tmp_path / "records.jsonl"
    child = subprocess.Popen(  # the committer: writes its record when told, then exits
        [sys.executable, "-c", "import sys, json\nsys.stdin.readline()\n"
         f"open({str(path)!r}, 'a').write(json.dumps({{'kind': 'analysis', 'task': "
         "'analysis', 'cycle': 3, 'status': 'done'}) + '\\n')\n"], stdin=subprocess.PIPE)
    owner = f"local-1-1@{socket.gethostname()}:{child.pid}"
    assert owner_alive(owner)
    done = [{"id": "analysis", "kind": "analysis", "member": None, "done_at": 1.0,
             "done_by": owner, "done_token": 9}]
    result, asked = [], threading.Event()

    def alive(who: str) -> bool:  # the real check, noting that the driver is waiting
        asked.set()
        return owner_alive(who)

    waiter = threading.Thread(
        target=lambda: result.append(reconcile_done(path, 3, done, alive=alive)))
    waiter.start()
    assert asked.wait(30)  # it found the record missing and its committer alive
    child.stdin.write(b"go\n")
    child.stdin.close()
    child.wait(30)
    waiter.join(60)
    assert result == [0]  # the job's own record, not a restored one
    assert [r.get("recovered") for r in read_records(path)] == [None]
    assert not owner_alive(owner)  # exited
    assert not owner_alive(f"local-1-1@another-host:{os.getpid()}")  # elsewhere: unknown
    assert owner_alive(f"x@{socket.gethostname()}:{os.getpid()}")
