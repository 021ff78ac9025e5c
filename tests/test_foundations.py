"""The cross-cutting helpers every room shares: row distribution, durable replace,
fault points, stopwatch, error agreement (serial parts)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ensio import faults
from ensio.durable import atomic_write, replacing
from ensio.parallel.agree import agree, rebuild
from ensio.parallel.distribution import RowDistribution
from ensio.stopwatch import Stopwatch


# ------------------------------------------------------------------ RowDistribution
def reference_blocks(n: int, size: int) -> list[tuple[int, int]]:
    """Independent rule: hand out rows one at a time, round robin, then make blocks."""
    counts = [0] * size
    for i in range(n):
        counts[i % size] += 1
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
    return [(int(s), c) for s, c in zip(starts, counts, strict=True)]


@pytest.mark.parametrize("n", [0, 1, 7, 10, 31, 1000])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_row_distribution_matches_the_rule(n, size):
    ref = reference_blocks(n, size)
    for rank in range(size):
        d = RowDistribution(n, size, rank)
        assert (d.start, d.count) == ref[rank]
        assert d.stop == ref[rank][0] + ref[rank][1]
        assert [d.bounds(r) for r in range(size)] == ref
    if n:
        rows = np.arange(n)
        owner = RowDistribution(n, size).owner(rows)
        for r, (s, c) in enumerate(ref):
            assert np.all(owner[s : s + c] == r)


@pytest.mark.parametrize("n,size", [(10, 4), (11, 5), (3, 6), (100, 7)])
def test_a_span_of_ranks_is_their_rows(n, size):
    ref = reference_blocks(n, size)
    for rank in range(size):
        d = RowDistribution(n, size, rank)
        for first in range(size):
            for stop in range(first + 1, size + 1):
                g = d.span(first, stop)
                assert g.size == stop - first
                assert g.offset == ref[first][0]
                assert g.n_rows == sum(c for _, c in ref[first:stop])
                for q in range(first, stop):
                    assert (g.offset + g.starts[q - first], g.counts[q - first]) == ref[q]
                if first <= rank < stop:
                    assert g.offset + g.start == ref[rank][0]


def test_row_distribution_rejects_a_bad_rank():
    with pytest.raises(ValueError):
        RowDistribution(10, 2, 2)
    with pytest.raises(ValueError):
        RowDistribution(10, 0)


# ---------------------------------------------------------------------- durable
def test_replacing_installs_the_new_file(tmp_path):
    path = tmp_path / "f.nc"
    path.write_bytes(b"old")
    with replacing(path) as tmp:
        assert tmp.parent == path.parent and tmp != path
        tmp.write_bytes(b"new")
        assert path.read_bytes() == b"old"  # not before the block ends
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.nc"]


def test_replacing_leaves_the_old_file_and_no_temporary_on_error(tmp_path):
    path = tmp_path / "f.nc"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"):
        with replacing(path, fsync=True) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("boom")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.nc"]


def test_atomic_write_text_and_bytes(tmp_path):
    atomic_write(tmp_path / "a", "héllo")
    atomic_write(tmp_path / "b", b"\x00\x01", fsync=False)
    assert (tmp_path / "a").read_text() == "héllo"
    assert (tmp_path / "b").read_bytes() == b"\x00\x01"


def test_fault_points_of_a_replace_in_order(tmp_path):
    seen: list[str] = []
    with faults.hooked(seen.append):
        atomic_write(tmp_path / "x", "1", label="todo")
    assert seen == ["todo-written", "todo-synced", "todo-renamed", "todo-dir-synced"]
    assert not faults.active()


def test_a_crash_at_any_point_leaves_old_or_new(tmp_path):
    path = tmp_path / "x"

    class Crash(Exception):
        pass

    for k in range(1, 5):
        atomic_write(path, "old")
        calls = []

        def hook(label, k=k, calls=calls):
            calls.append(label)
            if len(calls) == k:
                raise Crash(label)

        with pytest.raises(Crash), faults.hooked(hook):
            atomic_write(path, "new")
        assert path.read_text() == ("old" if k < 3 else "new"), calls
        assert [p.name for p in tmp_path.iterdir()] == ["x"]


def test_env_kill_at_the_kth_point(tmp_path):
    """ENSIO_FAULT_KILL_AT kills at exactly that point; ENSIO_FAULT_COUNT records the labels."""
    code = (
        "from ensio import faults\n"
        "for i in range(5):\n"
        "    faults.point(f'p{i}')\n"
        "    print(i, flush=True)\n"
    )
    count = tmp_path / "count.jsonl"
    env = {**os.environ, "ENSIO_FAULT_COUNT": str(count)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["0", "1", "2", "3", "4"]
    assert '"labels": ["p0", "p1", "p2", "p3", "p4"]' in count.read_text()
    env = {**os.environ, "ENSIO_FAULT_KILL_AT": "3"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == -9 and out.stdout.split() == ["0", "1"]


# -------------------------------------------------------------------- stopwatch
def test_stopwatch_sums_blocks_laps_and_counts():
    sw = Stopwatch()
    for _ in range(3):
        with sw("a"):
            time.sleep(0.002)
    sw.lap("b")
    sw.add("n", 2)
    sw.add("n", 3)
    assert sw["a"] >= 0.006 and sw["b"] >= sw["a"] and sw["n"] == 5 and sw["never"] == 0.0
    other = Stopwatch()
    other.add("n", 1)
    sw.merge(other)
    sw.merge({"a": 1.0})
    assert sw["n"] == 6 and sw["a"] >= 1.006


def test_stopwatch_from_two_threads_and_disabled():
    sw = Stopwatch()

    def work():
        for _ in range(1000):
            sw.add("x", 1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sw["x"] == 4000
    off = Stopwatch(enabled=False)
    with off("a"):
        pass
    off.lap("b")
    off.add("c", 1)
    assert off.as_dict() == {}


# ------------------------------------------------------------------ agreement
class _Comm:
    """Stands in for a communicator whose other ranks noted ``notes``."""

    def __init__(self, notes):
        self.notes = notes

    def allgather(self, note):
        return self.notes


def test_agree_takes_the_lowest_ranks_note():
    a, b = (ValueError, "first"), (KeyError, "second")
    assert agree(_Comm([None, a, b]), None) == a
    assert agree(_Comm([None, None]), None) is None


def test_rebuild_keeps_the_class_or_falls_back():
    exc = rebuild((ValueError, "bad"))
    assert type(exc) is ValueError and str(exc) == "bad"

    class TwoArgs(Exception):
        def __init__(self, a, b):
            super().__init__(a, b)

    exc = rebuild((TwoArgs, "bad"), fallback=LookupError)
    assert type(exc) is LookupError and str(exc) == "TwoArgs: bad"
