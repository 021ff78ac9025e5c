"""``ensio bench transfer``: one tiny run through the CLI, the case rules and the ratios.

The run is checked for what a user relies on (exit code, the JSON keys, finite
ratios, the plot) and for the data: in every measured case the consumer read
exactly the arrays the producer wrote (checked here against arrays generated
independently from the seed), the direct case from the daemon's memory and never
from disk, the file cases from files. Nothing is asserted about the times (this
machine is shared).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from transfer_support import SRC, interposer_cache_fixture  # noqa: F401  (a fixture)

from ensio.bench.transfer import TransferBenchSettings, summary
from ensio.bench.transfer_cases import CASES, unavailable

FILES, SIZE_MB, FIELDS = 3, 0.05, 2
KEYS = ("speedup_fsync", "speedup_pagecache", "memcpy_fraction", "limit_ratio",
        "async_after_close_ratio")
LAUNCHES = 3


@pytest.fixture(scope="module")
def bench(interposer_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("bench-transfer")
    env = dict(os.environ, PYTHONPATH=str(SRC), XDG_CACHE_HOME=str(interposer_cache))
    env.pop("LD_PRELOAD", None)
    argv = [sys.executable, "-m", "ensio", "bench", "transfer", "--files", str(FILES),
            "--size-mb", str(SIZE_MB), "--fields", str(FIELDS), "--repeat", "1",
            "--workdir", str(tmp / "work"), "--json", str(tmp / "out" / "t.json"),
            "--plot", str(tmp / "t.png"), "--launches", str(LAUNCHES)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((tmp / "out" / "t.json").read_text()), tmp


def test_run_writes_the_keys_and_the_plot(bench):
    data, tmp = bench
    for key in KEYS[:4]:
        assert math.isfinite(data[key]) and data[key] > 0, key
    assert data["statistic"] == "median"
    assert len(data["launch_ms_all"]) == LAUNCHES
    assert data["launch_ms"] == pytest.approx(float(np.median(data["launch_ms_all"])))
    assert data["launch_ms"] > 0
    rows = {r["case"]: r for r in data["rows"]}
    two_ns = [rows[n]["measured"] for n in ("direct-2ns", "direct-2ns-async")]
    assert (data["tcp_fraction"] is not None) == any(two_ns)
    assert len(data["raw_tcp_seconds"]) == (1 if any(two_ns) else 0)
    if any(two_ns):
        assert math.isfinite(data["tcp_fraction"]) and data["tcp_fraction"] > 0
    # huge pages: said by the daemon, seen by every one-host direct consumer
    assert data["huge_pages"] == ("transparent huge pages" in data["memory"])
    assert data["memory_backings"] == (["tmpfs-huge"] if data["huge_pages"] else ["memfd"])
    assert list(rows) == list(CASES)
    measured_async = rows["direct-async"]["measured"]
    assert (data["async_after_close_ratio"] is None) == (not measured_async)
    for r in rows.values():
        assert r["measured"] == (r["reason"] is None), r
    for name in ("pagecache", "fsync", "pagecache-poll", "fsync-poll", "direct"):
        assert rows[name]["measured"], rows[name]["reason"]
        for who in ("producer", "consumer"):  # CPU of the timed window, below its wall
            cpu = rows[name][f"{who}_cpu_seconds"]
            assert 0 < cpu < 2 * max(rows[name]["all_seconds"]) + 0.05, (name, who, cpu)
    assert data["verified"] is True
    assert data["settings"]["bytes_total"] == FILES * data["settings"]["bytes_per_file"]
    assert (tmp / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _expected_sums(seed: int, shape: tuple[int, int]) -> list[list[str]]:
    """The producer's arrays, generated here from the seed: SHA-256 of each variable."""
    out = []
    for i in range(FILES):
        rng = np.random.default_rng([seed, i])
        out.append([hashlib.sha256(rng.random(shape, dtype=np.float32).tobytes()).hexdigest()
                    for _ in range(FIELDS)])
    return out


def test_every_consumer_read_what_the_producer_wrote(bench):
    data, _ = bench
    st = data["settings"]
    shape = tuple(st["shape"])
    want = _expected_sums(st["seed"], shape)
    assert st["bytes_per_file"] == 4 * FIELDS * shape[0] * shape[1]
    for row in data["rows"]:
        if not row["measured"]:
            continue
        run = Path(row["run_dir"])
        cons = json.loads((run / "consumer.json").read_text())
        prod = json.loads((run / "producer.json").read_text())
        assert cons["sha256"] == want == prod["sha256"], row["case"]
        assert cons["bytes"] == st["bytes_total"]
        assert row["verified"] is True
        direct = CASES[row["case"]].exchange == "direct"
        assert set(cons["sources"]) == {"memory" if direct else "file"}, row["case"]
        if direct and row["hosts"] == 1:
            assert set(cons["backings"]) == set(data["memory_backings"]), row["case"]
        assert row["read_from"] == ("memory" if direct else "file")
        if direct:
            assert cons["on_disk"] == []
        assert len(prod["closes"]) == len(prod["close_calls"]) == len(cons["opened"]) == FILES
        assert row["seconds"] > 0 and row["producer_seconds"] > 0
        if not direct:  # a plain file is opened only once complete (and fsync'd)
            assert all(o >= c for o, c in zip(cons["opened"], prod["closes"], strict=True))
        assert not (run / "data").exists()  # removed after the run: nothing left behind


class _Host:
    def __init__(self, features=(), error=None):
        self.features, self.error = frozenset(features), error


def test_which_cases_can_be_measured(monkeypatch):
    from ensio.bench import transfer_cases as tc

    assert unavailable(CASES["fsync"], None) is None
    assert unavailable(CASES["direct"], None) is not None  # no daemon: nothing direct runs
    assert unavailable(CASES["direct"], _Host()) is None
    assert unavailable(CASES["direct"], _Host(error="no C compiler")) == "no C compiler"
    # a daemon advertising async: measured; two hosts need the namespaces as well
    assert unavailable(CASES["direct-async"], _Host(["async"])) is None
    monkeypatch.setattr("ensio.bench.transfer_netns.netns_unavailable", lambda: "no root")
    assert unavailable(CASES["direct-2ns"], _Host(["tcp"])) == "no root"
    monkeypatch.setattr("ensio.bench.transfer_netns.netns_unavailable", lambda: None)
    assert unavailable(CASES["direct-2ns"], _Host(["tcp"])) is None
    assert unavailable(CASES["direct-2ns-async"], _Host(["tcp", "async"])) is None
    # a config refusing the keys: the reason names the config's error
    monkeypatch.setattr(tc, "_config_error", lambda **k: "hosts: unknown config key")
    assert "hosts: unknown config key" in unavailable(CASES["direct-2ns"], _Host())
    assert "refuses mode async" in unavailable(CASES["direct-async"], _Host())


def test_summary_ratios_are_of_medians_and_take_the_faster_file_exchange():
    names = ("pagecache", "fsync", "pagecache-poll", "fsync-poll", "direct", "direct-async",
             "direct-2ns", "direct-2ns-async")
    st = TransferBenchSettings(files=2, size_mb=1.0, fields=1, cases=names)

    def run(seconds, after=0.1, backing="file"):
        one = {"producer_seconds": seconds - after, "last_close_seconds": 0.01,
               "verified": True, "sources": ["file"], "backings": [backing]}
        return [{**one, "seconds": seconds, "after_close_seconds": after, "run_dir": "x",
                 "producer_cpu_seconds": 0.5, "consumer_cpu_seconds": None},
                {**one, "seconds": seconds * 2, "after_close_seconds": after * 3,
                 "run_dir": "y", "producer_cpu_seconds": 0.1, "consumer_cpu_seconds": None},
                {**one, "seconds": seconds * 8, "after_close_seconds": after * 5,
                 "run_dir": "z", "producer_cpu_seconds": 0.3}]

    runs = {"pagecache": run(4.0), "pagecache-poll": run(3.0), "fsync": run(10.0),
            "fsync-poll": run(12.0), "direct": run(1.0, after=0.3, backing="tmpfs-huge"),
            "direct-async": run(0.9, after=0.1, backing="tmpfs-huge"),
            "direct-2ns": run(2.0, after=0.4), "direct-2ns-async": run(1.5, after=0.1)}
    # medians: pagecache-poll 6, fsync 20, direct 2, direct-2ns-async 3 (the faster)
    res = summary(st, runs, {}, 0.25, {}, fresh_s=[0.5, 1.0, 9.0], tcp_s=[0.6, 0.9, 1.2],
                  launch_s=[0.05, 0.02, 0.5])
    assert res["speedup_pagecache"] == pytest.approx(6.0 / 2.0)
    assert res["speedup_fsync"] == pytest.approx(20.0 / 2.0)
    assert res["memcpy_fraction"] == pytest.approx(0.25 / 2.0)
    assert res["limit_ratio"] == pytest.approx(2.0 / 1.0)
    assert res["tcp_fraction"] == pytest.approx(0.9 / 3.0)
    assert res["stream_fraction"] is None  # no stream_seconds in these runs
    runs["direct-2ns"] = [{**r, "stream_seconds": t} for r, t in
                          zip(runs["direct-2ns"], (0.3, 1.8, 1.1), strict=True)]
    assert summary(st, runs, {}, 0.25, {}, tcp_s=[0.6, 0.9, 1.2])["stream_fraction"] == \
        pytest.approx(0.9 / 1.1)
    assert res["raw_tcp_gb_per_s"] == pytest.approx(st.files * st.bytes_per_file / 0.9 / 1e9)
    assert res["launch_ms"] == pytest.approx(50.0)
    assert res["huge_pages"] is True and res["memory_backings"] == ["tmpfs-huge"]
    assert res["async_after_close_ratio"] == pytest.approx(0.1 / 0.4)  # two namespaces
    assert [r["producer_cpu_seconds"] for r in res["rows"]] == [pytest.approx(0.3)] * 8
    assert [r["consumer_cpu_seconds"] for r in res["rows"]] == [None] * 8  # not reported
    runs["direct-async"] = run(0.9, backing="memfd")
    res = summary(st, runs, {}, 0.25, {})
    assert res["huge_pages"] is False
    assert res["memory_backings"] == ["memfd", "tmpfs-huge"]
    assert res["limit_ratio"] is None and res["tcp_fraction"] is None
    assert res["launch_ms"] is None
    skipped = {"direct-async": "not supported", "direct-2ns-async": "no",
               "direct-2ns": "no"}
    kept = {k: v for k, v in runs.items() if k not in skipped}
    res = summary(st, kept, skipped, 0.25, {}, tcp_s=[1.0])
    assert res["async_after_close_ratio"] is None and res["tcp_fraction"] is None
    assert [(r["case"], r["reason"]) for r in res["rows"] if not r["measured"]] == [
        (n, skipped[n]) for n in names if n in skipped]
