"""Lorenz-96 model and the issue-3 acceptance experiments.

One experiment set-up for every Lorenz-96 filter check: DAPPER's
``mods/Lorenz96/sakov2008`` (:class:`ensio.bench.lorenz96_dapper.Sakov2008`: 40
variables, F = 8, RK4 with dt = 0.05, every variable observed after every
step with R = I, 1001 analyses scored after t = 20, truth and members drawn
around ``e_0``). Here the filters run with *prior* inflation ("inflation a":
the forgetting factor ``1/a²``) on one fixed seed, and the time-mean analysis
RMSE ``sqrt(mean((mean(E^a) − x)²))`` must stay within the issue-3 acceptance
thresholds; tests/test_lorenz96_dapper.py runs the same set-up with DAPPER's
*posterior* inflation ``infl`` over many seeds against DAPPER's own figures.
(This file ran its own 1400-cycle set-up before; merged so the experiment is
defined once and each check runs once.) No random rotation.
"""

from __future__ import annotations

import numpy as np
import pytest

from ensio.bench.lorenz96_dapper import analysis_rmse
from ensio.config.analysis import AnalysisSection, InflationSection, LocalizationSection
from ensio.models.lorenz96 import DT, FORCING, Lorenz96, integrate, rk4_step, tendency


def test_tendency_matches_the_definition(rng):
    n = 11
    x = rng.standard_normal(n) * 3
    expected = np.array([(x[(i + 1) % n] - x[i - 2]) * x[i - 1] - x[i] + FORCING for i in range(n)])
    assert np.allclose(tendency(x), expected, rtol=1e-14)


def test_rk4_step_is_fourth_order_and_vectorized(rng):
    x = integrate(8.0 + rng.standard_normal(40), 200)  # on the attractor
    # against 256 small steps: halving the step divides the error by ~2^4
    fine = integrate(x, 256, DT / 256)
    e1 = np.abs(rk4_step(x, DT) - fine).max()
    e2 = np.abs(integrate(x, 2, DT / 2) - fine).max()
    e4 = np.abs(integrate(x, 4, DT / 4) - fine).max()
    # one step's error depends on where on the attractor x is: over 400 seeds it reached
    # 1.2e-2, and 1.75e-2 in one CI run (the old bound 1e-2 failed there); the order
    # check below is the property, this bound only catches a wrong scale
    assert e1 < 3e-2
    assert 10.0 < e1 / e2 < 24.0 and 10.0 < e2 / e4 < 24.0
    E = 8.0 + rng.standard_normal((5, 40))
    model = Lorenz96()
    assert np.array_equal(model(E, 3), np.array([model(e, 3) for e in E]))
    with pytest.raises(ValueError):
        model(np.zeros(39))


SEED = 2024

EXPERIMENTS = {
    "enkf": (
        AnalysisSection(filter="enkf", inflation=InflationSection(forget=1 / 1.06**2), seed=SEED),
        40,
        0.25,
    ),
    "etkf": (
        AnalysisSection(filter="etkf", inflation=InflationSection(forget=1 / 1.02**2)),
        24,
        0.215,
    ),
    "letkf": (
        AnalysisSection(
            filter="letkf",
            inflation=InflationSection(forget=1 / 1.04**2),
            localization=LocalizationSection(taper="gaspari-cohn", radius=14.6, periodic=40),
        ),
        10,
        0.22,
    ),
}


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_lorenz96_acceptance(name):
    cfg, n_members, threshold = EXPERIMENTS[name]
    rmse = analysis_rmse(cfg, n_members, SEED)
    print(f"Lorenz-96 sakov2008 {name} N={n_members} seed={SEED}, prior inflation: "
          f"time-mean analysis RMSE {rmse:.4f}")
    assert rmse <= threshold
