"""Exactly once (issue 10, item 6): kill `ensio analyse` anywhere, rerun, one analysis.

Every test compares with a *reference run* on a fresh copy of the same prior
(tests/safety_support.py), whose member files differ from the prior's.

* SIGKILL at a fault point drawn uniformly over all the points of a whole
  run (lock, journal, member writes, library-path rewrites, products, run
  record, commit, renames), serially and under ``mpiexec -n 2``; then
  (sometimes) ``ensio recover`` — members all prior and no products, or all
  analysis and both products, as the COMMITTED marker says — and always the
  same ``ensio analyse`` again: the members hold exactly the reference
  analysis (never two), products exist, nothing temporary is left.
* After a commit, a rerun says "already analysed" and touches nothing (mtime
  and hash); ``--force`` assimilates again; a member modified since is
  analysed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import netCDF4
import numpy as np
import pytest
from matrix import draws
from safety_support import (
    ENSIO,
    analyse,
    copy_setup,
    env,
    leftovers,
    member_digests,
    prior_and_reference,
    same_fields,
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Prior, reference analysis, and the fault points of a whole run (1 and 2 ranks)."""
    root = tmp_path_factory.mktemp("once")
    prior, ref = prior_and_reference(root)
    counts = {}
    for ranks in (1, 2):
        work = copy_setup(prior, root / f"count{ranks}")
        count_file = root / f"count{ranks}.jsonl"
        proc = analyse(work, ranks=ranks, extra_env={"ENSIO_FAULT_COUNT": str(count_file)})
        assert proc.returncode == 0, proc.stderr
        assert member_digests(work) == member_digests(ref)  # independent of N_mpi
        lines = [json.loads(x) for x in count_file.read_text().splitlines()]
        counts[ranks] = {r["rank"]: r["labels"] for r in lines}
    return prior, ref, counts


def _recover(s) -> bool | None:
    """``ensio recover``: all prior without products, or all analysis with both.

    Returns whether the killed run had committed: its journal holds the
    ``COMMITTED`` marker, or was already retired (renamed to a trash name,
    marker inside) when the kill came; ``None`` when no journal is left (killed
    before the first write or after the journal was deleted: either is whole).
    """
    journals = [j for j in (s.root / ".ensio-journal", *s.root.glob(".ensio-journal.trash-*"))
                if j.is_dir()]
    committed = any((j / "COMMITTED").exists() for j in journals) if journals else None
    out = subprocess.run([*ENSIO, "recover", str(s.root)], capture_output=True, text=True,
                         timeout=60, env=env())
    assert out.returncode == 0, out.stderr
    return committed


@pytest.mark.parametrize("ranks", [1, 2])
def test_sigkill_anywhere_then_rerun_gives_one_analysis(reference, tmp_path, rng, ranks):
    prior, ref, counts = reference
    # both recovery paths (recover first, or the rerun alone) at least twice each;
    # ENSIO_TEST_FULL: 14 and 6 draws
    trials = draws(4, 14) if ranks == 1 else draws(4, 6)
    outcomes = []
    for i in range(trials):
        rank = int(rng.integers(0, ranks))
        labels = counts[ranks][rank]
        k = int(rng.integers(1, len(labels) + 1))
        s = copy_setup(prior, tmp_path / f"t{i}")
        killed = analyse(s, ranks=ranks, extra_env={
            "ENSIO_FAULT_KILL_AT": str(k), "ENSIO_FAULT_RANK": str(rank)})
        assert killed.returncode != 0, f"trial {i}: not killed at point {k} ({labels[k - 1]})"
        if i % 2 == 0:  # the operator's way: recover first, then rerun
            committed = _recover(s)
            state = member_digests(s)
            assert state in (member_digests(prior), member_digests(ref)), f"mix after {k}"
            analysed = state == member_digests(ref)
            assert committed is None or analysed == committed, (k, labels[k - 1])
            assert all(p.exists() == analysed for p in s.products), (k, labels[k - 1])
            assert leftovers(s.root, s.out) == []
            outcomes.append(labels[k - 1] + (" (committed)" if analysed else ""))
        proc = analyse(s, ranks=ranks)  # the same command again (takes over the dead lock)
        assert proc.returncode == 0, proc.stderr
        assert member_digests(s) == member_digests(ref), (
            f"trial {i}: killed at point {k} ({labels[k - 1]}) on rank {rank}: "
            "members do not hold exactly one analysis")
        for a, b in zip(s.products, ref.products, strict=True):
            assert same_fields(a, b)
        assert leftovers(s.root, s.out) == []
    print("recovered after:", outcomes)


def _stamps(paths) -> list[tuple[int, str]]:
    return [(os.stat(p).st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) for p in paths]


def test_rerun_after_commit_does_nothing_and_force_assimilates_again(reference, tmp_path):
    prior, ref, _ = reference
    s = copy_setup(prior, tmp_path / "w")
    assert analyse(s).returncode == 0
    files = [*s.members, *s.products, s.root / ".ensio-runs.jsonl"]
    before = _stamps(files)
    again = analyse(s)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines() == [again.stdout.strip()]  # one line
    assert again.stdout.startswith("already analysed:") and "--force" in again.stdout
    assert _stamps(files) == before  # untouched: content and mtime
    forced = analyse(s, "--force")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.startswith("observations:")
    after = member_digests(s)
    assert after != member_digests(ref) and after != member_digests(prior)
    records = (s.root / ".ensio-runs.jsonl").read_text().splitlines()
    assert len(records) == 2 and json.loads(records[1])["members"][str(s.members[0])] == after[0]
    assert analyse(s).stdout.startswith("already analysed:")  # the forced run is recorded


def test_member_modified_since_is_analysed_again(reference, tmp_path):
    prior, ref, _ = reference
    s = copy_setup(prior, tmp_path / "w")
    assert analyse(s).returncode == 0
    with netCDF4.Dataset(s.members[1], "a") as ds:  # e.g. a new forecast of one member
        ds["state"][0, 0] = np.float64(ds["state"][0, 0]) + 1.0
    proc = analyse(s)
    assert proc.returncode == 0 and proc.stdout.startswith("observations:"), proc.stdout
    assert member_digests(s)[0] != member_digests(ref)[0]  # analysed a second time


def test_other_observations_are_a_new_analysis(reference, tmp_path):
    prior, ref, _ = reference
    s = copy_setup(prior, tmp_path / "w")
    assert analyse(s).returncode == 0
    with netCDF4.Dataset(s.root / "obs.nc", "a") as ds:
        ds["value"][0] = np.float64(ds["value"][0]) + 0.5
    proc = analyse(s)
    assert proc.returncode == 0 and proc.stdout.startswith("observations:"), proc.stdout
    assert member_digests(s) != member_digests(ref)
