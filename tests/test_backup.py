"""Asynchronous per-cycle backup and ``ensio recover --from-backup``.

The one property the kill tests check: a backup directory with a completion
marker holds, durable and intact, every file of the cycle the marker names
(all of the ensemble's files, with the sha256 of their source) — whatever
instant a worker is killed at.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from cases import EnsembleCase, VarCase, write_observations
from kill_support import KILLED, Kill, kill_in_window
from mpi4py import MPI
from stage_support import ensio, make_case, sha, tree

from ensio import faults
from ensio.config.load import config_from_dict
from ensio.errors import EnsioError, InputError
from ensio.io.node.backup import (
    backup_cycles,
    backup_dir_for,
    find_backup,
    restore_from_backup,
    start_backup,
    start_cycle_backup,
)
from ensio.io.node.backupworker import MARKER_NAME, BackupAttempt, data_dir, run_job
from ensio.offline import run_analysis

SELF = MPI.COMM_SELF
HOST = "nodeA"
CHILD = Path(__file__).with_name("backup_kill_child.py")


def assert_truthful(backup: Path, sources: dict[tuple[int, int], Path]) -> bool:
    """If ``backup`` claims completeness, it is complete; returns whether it claims it."""
    marker = BackupAttempt.completed(backup)
    if marker is None:
        return False
    files = {(f["member"], f["tile"]): f for f in marker["files"]}
    assert set(files) == set(sources)
    for key, f in files.items():
        stored = backup / marker["data"] / f["path"]
        assert f["sha256"] == sha(stored) == sha(sources[key]), key
        assert f["size"] == stored.stat().st_size
    return True


def test_backup_of_a_cycle_and_restore(tmp_path, rng):
    case = make_case(tmp_path, rng)
    handle = start_cycle_backup(case.config, SELF, 4, host=HOST)
    marker_path = handle.wait()
    backup = tmp_path / "backup" / "c004"
    assert marker_path == backup / MARKER_NAME
    assert assert_truthful(backup, case.files)
    assert BackupAttempt.completed(backup)["cycle"] == 4
    originals = {k: p.read_bytes() for k, p in case.files.items()}
    case.files[2, 1].write_bytes(b"broken")  # the working files are damaged
    case.files[1, 0].unlink()
    cycle, report = restore_from_backup(case.config, SELF, host=HOST)
    assert (cycle, report.copied, report.skipped) == (4, 2, 4)
    assert {k: p.read_bytes() for k, p in case.files.items()} == originals
    again = ensio("recover", "--from-backup", str(_yaml(case)), env_extra={"ENSIO_HOST": HOST})
    assert again.returncode == 0, again.stderr
    assert "restored cycle 4 from backup: 6 files on 1 node(s): 0 copied" in again.stdout


def _yaml(case) -> Path:
    cfg = case.root / "ensio.yaml"
    cfg.write_text(json.dumps({
        "ensemble": {"members": "glob/mem{member:03d}_{tile:04d}.nc", "size": case.n_e,
                     "variables": ["x"], "tiles": {"count": case.n_tiles,
                                                   "layout": [case.n_tiles, 1]}},
        "io": {"backup_dir": "backup/c{cycle:03d}"}}))
    return cfg


def test_restore_chooses_the_newest_complete_backup_and_refuses_incomplete(tmp_path, rng):
    case = make_case(tmp_path, rng)
    contents = {}
    for cycle in (1, 2, 3):
        for p in case.files.values():
            p.write_bytes(rng.bytes(int(rng.integers(100, 3000))))
        contents[cycle] = {k: p.read_bytes() for k, p in case.files.items()}
        start_cycle_backup(case.config, SELF, cycle, host=HOST).wait()
    (tmp_path / "backup" / "c003" / MARKER_NAME).unlink()  # cycle 3 never completed
    (tmp_path / "backup" / "c010").mkdir()  # nor did 10
    assert find_backup(case.config)[0] == 2
    cfg = _yaml(case)
    before = tree(tmp_path)
    bad = ensio("recover", "--from-backup", "--cycle", "3", str(cfg))
    assert bad.returncode == 2
    assert bad.stderr.strip() == (f"ensio: error: {tmp_path}/backup/c003: backup of cycle 3 is "
                                  "incomplete (no COMPLETE marker); refusing to restore it")
    assert tree(tmp_path) == before
    cycle, _ = restore_from_backup(case.config, SELF, host=HOST)
    assert cycle == 2
    assert {k: p.read_bytes() for k, p in case.files.items()} == contents[2]
    restore_from_backup(case.config, SELF, host=HOST, cycle=1)
    assert {k: p.read_bytes() for k, p in case.files.items()} == contents[1]


def test_restore_refuses_a_corrupt_backup_file_and_modifies_nothing(tmp_path, rng):
    case = make_case(tmp_path, rng)
    start_cycle_backup(case.config, SELF, 0, host=HOST).wait()
    backup = tmp_path / "backup" / "c000"
    stored = backup / BackupAttempt.completed(backup)["data"] / case.files[3, 0].name
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 1
    stored.write_bytes(bytes(data))
    for p in case.files.values():
        p.write_bytes(b"damaged")
    before = tree(tmp_path)
    with pytest.raises(InputError, match=rf"^{stored}: sha256 [0-9a-f]{{64}} is not the"):
        restore_from_backup(case.config, SELF, host=HOST, cycle=0)
    assert tree(tmp_path) == before


def test_restore_refuses_a_backup_of_another_ensemble(tmp_path, rng):
    case = make_case(tmp_path, rng)
    start_cycle_backup(case.config, SELF, 5, host=HOST).wait()
    raw = {"ensemble": {"members": "glob/mem{member:03d}_{tile:04d}.nc", "size": 4,
                        "variables": ["x"], "tiles": {"count": 2, "layout": [2, 1]}},
           "io": {"backup_dir": "backup/c{cycle:03d}"}}
    bigger = config_from_dict(raw, base_dir=tmp_path)
    with pytest.raises(InputError, match="has no member 4 tile 0 of this ensemble"):
        restore_from_backup(bigger, SELF, host=HOST)


def test_a_new_attempt_keeps_the_complete_backup_and_clears_dead_attempts(tmp_path, rng):
    case = make_case(tmp_path, rng)
    backup = backup_dir_for(case.config, 7)
    first = start_cycle_backup(case.config, SELF, 7, host=HOST)
    first.wait()
    dead = data_dir(backup, "deadbeef0000")  # what a killed attempt leaves
    dead.mkdir()
    (dead / "mem001_0000.nc").write_bytes(b"partial")
    case.files[1, 1].write_bytes(b"analysis of a rerun")
    second = start_cycle_backup(case.config, SELF, 7, host=HOST)
    assert not dead.exists()
    assert data_dir(backup, first.token).exists()  # still named by the marker until replaced
    second.wait()
    assert BackupAttempt.completed(backup)["token"] == second.token
    assert assert_truthful(backup, case.files)


def test_source_changed_while_copied_fails_the_attempt(tmp_path, rng):
    case = make_case(tmp_path, rng)
    backup = tmp_path / "bk"
    backup.mkdir()
    data_dir(backup, "t0").mkdir()
    items = [{"src": str(p), "path": p.name, "member": m, "tile": t, "rank": 0}
             for (m, t), p in case.files.items()]
    job = {"cycle": 1, "token": "t0", "backup_dir": str(backup), "node": 0, "n_nodes": 1,
           "expected": len(items), "threads": 1, "fsync": True, "items": items}
    victim = case.files[2, 0]

    def touch(label: str) -> None:
        if label == "backup-written":
            with open(victim, "ab") as f:
                f.write(b"x")  # the next cycle writes while the copy runs

    with faults.hooked(touch), pytest.raises(InputError, match="changed while it was copied"):
        run_job(job)
    assert BackupAttempt.completed(backup) is None
    assert not [p for p in backup.rglob("*") if ".ensio-tmp." in p.name]


def _jobs(case, backup: Path, token: str) -> list[Path]:
    """Two nodes' job files: node 0 has members 1-2, node 1 member 3."""
    data_dir(backup, token).mkdir(parents=True)
    paths = []
    for node, members in ((0, (1, 2)), (1, (3,))):
        items = [{"src": str(p), "path": p.name, "member": m, "tile": t, "rank": 2 * m + t - 2}
                 for (m, t), p in case.files.items() if m in members]
        job = {"cycle": 9, "token": token, "backup_dir": str(backup), "node": node,
               "n_nodes": 2, "expected": len(case.files), "threads": 2, "fsync": True,
               "items": items}
        path = backup / f"job{node}.json"
        path.write_text(json.dumps(job))
        paths.append(path)
    return paths


def _worker(job: Path, **env_extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENSIO_FAULT_")}
    env.update(env_extra)
    proc = subprocess.Popen([sys.executable, str(CHILD), str(job)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout.readline() == b"ready\n"
    return proc


def _finish(proc: subprocess.Popen) -> int:
    proc.communicate()  # the worker's last line, then its exit
    return proc.returncode


def test_kill_a_node_worker_at_every_kind_of_step(tmp_path, rng):
    case = make_case(tmp_path / "case", rng)
    backup = tmp_path / "count"
    j0, j1 = _jobs(case, backup, "c0")
    assert _finish(_worker(j0)) == 0
    count = tmp_path / "count.jsonl"
    assert _finish(_worker(j1, ENSIO_FAULT_COUNT=str(count))) == 0
    labels = json.loads(count.read_text())["labels"]
    assert assert_truthful(backup, case.files)
    marker_at = labels.index("backup-marker-renamed") + 1  # first k with a marker
    ks = {1, marker_at - 1, marker_at, len(labels)} | set(
        rng.integers(1, len(labels) + 1, 6).tolist())
    for k in sorted(ks):
        backup = tmp_path / f"k{k}"
        j0, j1 = _jobs(case, backup, "a1")
        assert not run_job(json.loads(j0.read_text()))  # node 0 done: only node 1 missing
        assert BackupAttempt.completed(backup) is None
        assert _finish(_worker(j1, ENSIO_FAULT_KILL_AT=str(k))) == -signal.SIGKILL
        assert assert_truthful(backup, case.files) == (k >= marker_at), k
        assert run_job(json.loads(j1.read_text()))  # the node's job runs again: complete
        assert assert_truthful(backup, case.files)


def test_external_sigkill_at_random_moments(tmp_path, rng):
    """SIGKILL from outside at a point-reported moment; every kill is proven to land.

    The worker reports its fault points (copy threads included); the parent kills
    it right after the k-th, so the signal lands anywhere between two points.
    Five kills are drawn over the copy, before the marker (counted only if the
    worker died without reporting the marker's rename: no completeness may be
    claimed, and the job run again completes the backup); one right after the
    marker's rename (counted only if the worker died after reporting it: the
    claim is there and true). A miss is drawn again; kill_support.MAX_MISSES
    misses in a row fail.
    """
    case = make_case(tmp_path / "case", rng, n_e=6, n_tiles=3)
    backup = tmp_path / "count"
    (job,) = _jobs_one(case, backup, "t")
    count = tmp_path / "count.jsonl"
    assert _finish(_worker(job, ENSIO_FAULT_COUNT=str(count))) == 0
    labels = json.loads(count.read_text())["labels"]
    assert assert_truthful(backup, case.files)
    renamed = labels.index("backup-marker-renamed") + 1  # from this k on the marker exists
    trial, draws, claimed, lasts = 0, 0, [], []

    def start() -> subprocess.Popen:
        nonlocal backup, job, trial
        trial += 1
        backup = tmp_path / f"r{trial}"
        (job,) = _jobs_one(case, backup, "r")
        return _worker(job, ENSIO_TEST_REPORT_POINTS="1")

    def before_marker(kill: Kill) -> bool:
        return kill.returncode == KILLED and "backup-marker-renamed" not in kill.labels

    def after_marker(kill: Kill) -> bool:
        return kill.returncode == KILLED and "backup-marker-renamed" in kill.labels

    windows = [(before_marker, 1, renamed - 1, "the copy (before the marker's rename)")] * 5 + [
        (after_marker, renamed, renamed, "the end (after the marker's rename)")]
    for landed, low, high, what in windows:
        kill, n = kill_in_window(start, lambda lo=low, hi=high: int(rng.integers(lo, hi + 1)),
                                 landed, what)
        draws += n
        lasts.append(kill.last)
        assert not Counter(kill.labels) - Counter(labels), kill  # the counted run's points
        claimed.append(assert_truthful(backup, case.files))
        if landed is after_marker:
            assert claimed[-1], kill
            continue
        if kill.last != "backup-marker-synced":  # only then can the rename have happened
            assert not claimed[-1], kill
        assert run_job(json.loads(job.read_text()))  # the job run again: complete
        assert assert_truthful(backup, case.files)
    print(f"{draws} draws for {len(windows)} kills in their windows; last points {lasts}; "
          f"complete after kill: {claimed}")


def _jobs_one(case, backup: Path, token: str) -> list[Path]:
    data_dir(backup, token).mkdir(parents=True)
    items = [{"src": str(p), "path": p.name, "member": m, "tile": t, "rank": 0}
             for (m, t), p in case.files.items()]
    job = {"cycle": 1, "token": token, "backup_dir": str(backup), "node": 0, "n_nodes": 1,
           "expected": len(items), "threads": 2, "fsync": True, "items": items}
    path = backup / "job.json"
    path.write_text(json.dumps(job))
    return [path]


def test_killed_worker_through_start_backup_reports_and_never_claims(tmp_path, rng, monkeypatch):
    case = make_case(tmp_path, rng)
    items = [{"src": str(p), "path": p.name, "member": m, "tile": t, "rank": 0}
             for (m, t), p in case.files.items()]
    monkeypatch.setenv("ENSIO_FAULT_KILL_AT", "3")  # the worker inherits it, this process not
    handle = start_backup(items, tmp_path / "b", 2, SELF, host=HOST)
    with pytest.raises(EnsioError, match=r"backup of cycle 2 to .* failed \(exit -9\)"):
        handle.wait()
    assert BackupAttempt.completed(tmp_path / "b") is None
    monkeypatch.delenv("ENSIO_FAULT_KILL_AT")
    start_backup(items, tmp_path / "b", 2, SELF, host=HOST).wait()
    assert assert_truthful(tmp_path / "b", case.files)
    assert len(list((tmp_path / "b").glob("data-*"))) == 1  # the dead attempt's is gone


def test_offline_analysis_backs_up_what_it_wrote(tmp_path):
    """``io.backup_dir`` set: the committed analysis members are backed up for the cycle."""
    case = EnsembleCase(members=4, nlat=5, nlon=8, variables=[VarCase("state", ("lat", "lon"))],
                        seed=5)
    paths = case.write(tmp_path)
    obs = write_observations(tmp_path / "obs.nc", np.array([10.0, 100.0]),
                             np.array([0.0, 20.0]), np.array([1.0, -1.0]),
                             np.array([0.5, 0.5]), np.array([3, 17]))
    raw = case.config(tmp_path)
    raw["io"]["backup_dir"] = "bk/cycle{cycle}"
    raw["observations"] = [{"file": obs.name}]
    raw["analysis"] = {"filter": "etkf"}
    prior = [sha(p) for p in paths]
    report = run_analysis(config_from_dict(raw, base_dir=tmp_path), SELF, cycle=12)
    assert report.backup is not None
    assert any(ln.startswith("backup: copying cycle 12 to ") for ln in report.lines())
    report.backup.wait()
    posterior = {(i + 1, None): p for i, p in enumerate(paths)}
    assert [sha(p) for p in paths] != prior  # the analysis changed the members
    assert assert_truthful(tmp_path / "bk" / "cycle12", posterior)
    # a rerun changes nothing and backs nothing up again while the backup is complete ...
    config = config_from_dict(raw, base_dir=tmp_path)
    again = run_analysis(config, SELF, cycle=12)
    assert again.already is not None and again.backup is None
    # ... but makes the backup that is missing (its start failed, or it was killed)
    (tmp_path / "bk" / "cycle12" / MARKER_NAME).unlink()
    healed = run_analysis(config, SELF, cycle=12)
    assert healed.already is not None and healed.backup is not None
    assert healed.lines()[-1].startswith("backup: copying cycle 12 to ")
    healed.backup.wait()
    assert assert_truthful(tmp_path / "bk" / "cycle12", posterior)


def test_backup_cycles_of_a_nested_pattern(tmp_path, rng):
    case = make_case(tmp_path, rng, backup="bk/{cycle:04d}/files")
    for name in ("0002", "0010", "abcd", "0003x"):
        (tmp_path / "bk" / name / "files").mkdir(parents=True)
    assert backup_cycles(case.config) == [(10, tmp_path / "bk" / "0010" / "files"),
                                          (2, tmp_path / "bk" / "0002" / "files")]
    assert backup_dir_for(case.config, 7) == tmp_path / "bk" / "0007" / "files"
