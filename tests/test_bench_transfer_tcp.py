"""The stream-only time of a sync two-namespace run (ensio.bench.transfer_tcp)."""

from __future__ import annotations

import json
import random

import pytest
from seeds import draw_seed

from ensio.bench.transfer_tcp import sync_stream_seconds


def test_sync_stream_seconds_sums_the_producers_closes(tmp_path):
    rng = random.Random(draw_seed("close times"))
    starts = sorted(rng.uniform(0.0, 100.0) for _ in range(8))
    lengths = [rng.uniform(0.001, 0.5) for _ in starts]
    closes = [starts[i] + lengths[i] for i in range(len(starts))]
    (tmp_path / "producer.json").write_text(json.dumps(
        {"t0": 0.0, "close_calls": starts, "closes": closes}))
    assert sync_stream_seconds(tmp_path) == pytest.approx(sum(lengths), rel=1e-9)


def test_sync_stream_seconds_refuses_unpaired_times(tmp_path):
    (tmp_path / "producer.json").write_text(json.dumps({"close_calls": [1.0, 2.0],
                                                        "closes": [1.5]}))
    with pytest.raises(ValueError):
        sync_stream_seconds(tmp_path)
