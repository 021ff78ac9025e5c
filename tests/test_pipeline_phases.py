"""The phases ``analyse_rows`` reports are disjoint: none reaches back over another.

Kernels time their phases by laps, the first lap from the stopwatch's start.
The obs phase is made long here (its observation selection delayed by 0.3 s,
a known duration, not a synchronisation), so a first lap that reached back over
it would count those 0.3 s twice and the phases would add up to more than the
call took. One thread: disjoint intervals of one call never sum to more than it.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import ensio.analysis.pipeline as pipeline
from ensio.analysis.api import analyse
from ensio.config.analysis import AnalysisSection, LocalizationSection, WeightInterpolationSection
from ensio.obs import ObsBatch, RegularGrid

DELAY = 0.3
SKIP = ("_flops", "_count", "_bytes")


@pytest.mark.parametrize("stride", [1, 2])
def test_phases_do_not_count_the_obs_phase_twice(stride, rng, monkeypatch):
    lon, lat = np.arange(0.0, 360.0, 20.0), np.arange(-80.0, 81.0, 20.0)
    n, m = lon.size * lat.size, 40
    obs = ObsBatch(values=rng.standard_normal(m), errors=np.ones(m),
                   lon=rng.uniform(0, 360, m), lat=rng.uniform(-80, 80, m))  # fmt: skip
    cfg = AnalysisSection(filter="letkf", localization=LocalizationSection(radius_km=3000.0),
                          weight_interpolation=WeightInterpolationSection(stride))  # fmt: skip
    near = pipeline.observations_near

    def slow_near(*args, **kwargs):
        time.sleep(DELAY)
        return near(*args, **kwargs)

    monkeypatch.setattr(pipeline, "observations_near", slow_near)
    X = rng.standard_normal((6, n))
    t0 = time.perf_counter()
    res = analyse(X, obs, cfg, grid=RegularGrid(lon, lat))
    wall = time.perf_counter() - t0
    phases = {p: v for p, v in res.timings.items() if not p.endswith(SKIP)}
    assert phases["obs"] >= DELAY
    assert sum(phases.values()) <= wall
