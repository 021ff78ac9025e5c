"""Inflation: relaxation schemes and the Miyoshi (2011) adaptive estimate."""

from __future__ import annotations

import numpy as np
import pytest

from ensio.analysis.inflation import (
    adaptive_inflation_update,
    forget_from_factor,
    rtpp,
    rtps,
)


def test_forget_factor():
    assert forget_from_factor(1.06) == pytest.approx(1 / 1.06**2)


def test_rtpp_blends_the_anomalies(rng):
    Xb = rng.standard_normal((7, 4)) + 3.0
    Xa = rng.standard_normal((7, 4)) * 0.3
    out = rtpp(Xb, Xa, 0.4)
    assert np.allclose(out.mean(0), Xa.mean(0))
    assert np.allclose(out - out.mean(0), 0.6 * (Xa - Xa.mean(0)) + 0.4 * (Xb - Xb.mean(0)))


def test_rtps_relaxes_the_spread_row_by_row(rng):
    Xb = rng.standard_normal((9, 6)) * 2.0
    Xa = rng.standard_normal((9, 6)) * 0.5
    Xa[:, 0] = 1.0  # zero analysis spread: left alone
    out = rtps(Xb, Xa, 0.7)
    sb, sa = Xb.std(0, ddof=1), Xa.std(0, ddof=1)
    so = out.std(0, ddof=1)
    assert np.allclose(so[1:], (0.3 * sa + 0.7 * sb)[1:])
    assert np.all(out[:, 0] == 1.0)
    assert np.allclose(out.mean(0), Xa.mean(0))
    # the shape of the anomalies is kept
    for j in range(1, 6):
        a, o = Xa[:, j] - Xa[:, j].mean(), out[:, j] - out[:, j].mean()
        assert abs(np.corrcoef(a, o)[0, 1] - 1.0) < 1e-12


@pytest.mark.parametrize("relax", [rtps, rtpp])
def test_rows_the_analysis_left_alone_stay_bit_for_bit(rng, relax):
    """Relaxing an unchanged row is the identity; x̄ + 1·(x − x̄) would round it."""
    Xb = rng.standard_normal((9, 40)) * 1e3 + 0.1
    Xa = rng.standard_normal((9, 40)) * 0.5
    Xa[:, ::3] = Xb[:, ::3]  # rows no observation reached
    out = relax(Xb, Xa, 0.6)
    assert np.array_equal(out[:, ::3], Xb[:, ::3])
    ma = Xa.mean(0)
    plain = relax(Xb + 0.0, Xa + 0.0, 0.6)[:, 1]
    assert np.allclose(plain.mean(), ma[1])  # the other rows are relaxed as before
    naive = Xb.mean(0) + (Xb - Xb.mean(0))  # the rounding the rule avoids
    assert not np.array_equal(naive[:, ::3], Xb[:, ::3])


def test_adaptive_update_formula(rng):
    m = 30
    rho = rng.uniform(0, 1, m)
    d = rng.standard_normal(m)
    s2 = rng.uniform(0.5, 2, m)
    hph = rng.uniform(0.1, 1, m)
    a_b = 1.3
    # Miyoshi (2011): observation estimate, its variance, scalar Kalman update
    dRd = np.sum(rho * d**2 / s2)
    tr = np.sum(rho * hph / s2)
    p = np.sum(rho)
    a_o = (dRd - p) / tr
    v_o = 2.0 / p * ((a_b * tr + p) / tr) ** 2
    expected = a_b + 0.04**2 / (0.04**2 + v_o) * (a_o - a_b)
    got = adaptive_inflation_update(np.array([a_b]), [dRd], [tr], [p], sigma=0.04, minimum=0.0)
    assert got[0] == pytest.approx(expected, rel=1e-13)
    # no observations: unchanged; lower bound applied
    assert adaptive_inflation_update(np.array([1.7]), [0.0], [0.0], [0.0])[0] == 1.7
    assert adaptive_inflation_update(np.array([1.0]), [0.0], [10.0], [50.0])[0] == 1.0


def test_adaptive_inflation_finds_the_missing_variance(rng):
    """Innovations drawn with the prior variance under-estimated by a factor 2:
    repeated estimates converge to about 2."""
    m = 400
    hph = rng.uniform(0.5, 1.5, m)
    alpha = np.array([1.0])
    history = []
    for _ in range(600):
        d = rng.standard_normal(m) * np.sqrt(2.0 * hph + 1.0)
        alpha = adaptive_inflation_update(alpha, [np.sum(d**2)], [np.sum(hph)], [m], sigma=0.1)
        history.append(alpha[0])
    assert abs(np.mean(history[300:]) - 2.0) < 0.1
