"""Lorenz-96 model and the issue-3 acceptance experiments.

Set-up of the experiments (as DAPPER's "Sakov 2008" Lorenz-96 case): 40
variables, F = 8, RK4 with dt = 0.05, every variable observed after every
step with R = I. The truth starts at 8 + N(0, 1) and is spun up for 20 time
units (400 steps); the ensemble starts at truth + N(0, I). The filter then
runs for 20 time units (400 analyses) of burn-in, and the time mean of the
analysis RMSE ``sqrt(mean((mean(E^a) − x)²))`` over the next 1000 analyses is
compared with the acceptance threshold. No random rotation. "Inflation a"
here inflates the *prior* anomalies by a (the forgetting factor ``1/a²``);
DAPPER's ``infl`` inflates the analysis anomalies instead
(``analysis.inflation.posterior``), which tests/test_lorenz96_dapper.py
compares with DAPPER on DAPPER's own set-up.
"""

from __future__ import annotations

import numpy as np
import pytest

from ensio.analysis.filters import assimilate
from ensio.config.analysis import AnalysisSection, InflationSection, LocalizationSection
from ensio.models.lorenz96 import DT, FORCING, Lorenz96, integrate, rk4_step, tendency
from ensio.obs import ObsBatch


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


def run_experiment(
    cfg: AnalysisSection, n_members: int, seed: int, n_burn: int = 400, n_steps: int = 1000
):
    """Time-mean analysis RMSE of a twin experiment (see the module docstring)."""
    nx = 40
    rng = np.random.default_rng(seed)
    model = Lorenz96(nx)
    truth = model(FORCING + rng.standard_normal(nx), 400)
    E = truth + rng.standard_normal((n_members, nx))
    errors = []
    index = np.arange(nx)
    for cycle in range(n_burn + n_steps):
        truth = model(truth, 1)
        E = model(E, 1)
        y = truth + rng.standard_normal(nx)
        obs = ObsBatch(
            values=y, errors=np.ones(nx), lon=np.zeros(nx), lat=np.zeros(nx), index=index
        )
        E = assimilate(E, obs, cfg, cycle=cycle)
        if cycle >= n_burn:
            errors.append(np.sqrt(np.mean((E.mean(axis=0) - truth) ** 2)))
    return float(np.mean(errors))


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
    rmse = run_experiment(cfg, n_members, SEED)
    print(f"Lorenz-96 {name} N={n_members} seed={SEED}: time-mean analysis RMSE {rmse:.4f}")
    assert rmse <= threshold
