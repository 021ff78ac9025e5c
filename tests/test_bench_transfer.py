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
KEYS = ("speedup_fsync", "speedup_pagecache", "memcpy_fraction", "async_after_close_ratio")


@pytest.fixture(scope="module")
def bench(interposer_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("bench-transfer")
    env = dict(os.environ, PYTHONPATH=str(SRC), XDG_CACHE_HOME=str(interposer_cache))
    env.pop("LD_PRELOAD", None)
    argv = [sys.executable, "-m", "ensio", "bench", "transfer", "--files", str(FILES),
            "--size-mb", str(SIZE_MB), "--fields", str(FIELDS), "--repeat", "1",
            "--workdir", str(tmp / "work"), "--json", str(tmp / "out" / "t.json"),
            "--plot", str(tmp / "t.png")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((tmp / "out" / "t.json").read_text()), tmp


def test_run_writes_the_keys_and_the_plot(bench):
    data, tmp = bench
    for key in KEYS[:3]:
        assert math.isfinite(data[key]) and data[key] > 0, key
    rows = {r["case"]: r for r in data["rows"]}
    assert list(rows) == list(CASES)
    measured_async = rows["direct-async"]["measured"]
    assert (data["async_after_close_ratio"] is None) == (not measured_async)
    for r in rows.values():
        assert r["measured"] == (r["reason"] is None), r
    for name in ("pagecache", "fsync", "pagecache-poll", "fsync-poll", "direct"):
        assert rows[name]["measured"], rows[name]["reason"]
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


def test_summary_ratios_take_the_faster_file_exchange():
    names = ("pagecache", "fsync", "pagecache-poll", "fsync-poll", "direct", "direct-async")
    st = TransferBenchSettings(files=2, size_mb=1.0, fields=1, cases=names)

    def run(seconds, after=0.1):
        return [{"seconds": seconds, "producer_seconds": seconds - after,
                 "after_close_seconds": after, "last_close_seconds": 0.01, "run_dir": "x",
                 "verified": True, "sources": ["file"]},
                {"seconds": seconds * 2, "producer_seconds": seconds - after,
                 "after_close_seconds": after * 3, "last_close_seconds": 0.01, "run_dir": "y",
                 "verified": True, "sources": ["file"]}]

    runs = {"pagecache": run(4.0), "pagecache-poll": run(3.0), "fsync": run(10.0),
            "fsync-poll": run(12.0), "direct": run(1.0, after=0.3),
            "direct-async": run(0.9, after=0.1)}
    res = summary(st, runs, {}, 0.25, {})
    assert res["speedup_pagecache"] == pytest.approx(3.0)
    assert res["speedup_fsync"] == pytest.approx(10.0)
    assert res["memcpy_fraction"] == pytest.approx(0.25)
    assert res["async_after_close_ratio"] == pytest.approx(0.1 / 0.3)
    skipped = {"direct-async": "not supported"}
    res = summary(st, {k: v for k, v in runs.items() if k != "direct-async"}, skipped, 0.25, {})
    assert res["async_after_close_ratio"] is None
    assert [(r["case"], r["reason"]) for r in res["rows"] if not r["measured"]] == [
        ("direct-async", "not supported")]
    assert res["rows"][0]["direct_speedup"] == pytest.approx(4.0)
    assert res["rows"][0]["median_seconds"] == pytest.approx(6.0)  # of 4 and 8


@pytest.mark.parametrize(("args", "message"), [
    (["--cases", "pagecache,nope"], "argument --cases: unknown case 'nope'"),
    (["--files", "0"], "argument --files: must be positive, got '0'"),
    (["--size-mb", "x"], "argument --size-mb: expected a number, got 'x'"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, args, message):
    p = subprocess.run([sys.executable, "-m", "ensio", "bench", "transfer", *args,
                        "--workdir", str(tmp_path / "w")], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(SRC)), timeout=60)
    assert p.returncode == 2 and message in p.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "w").exists()  # nothing was run or written
