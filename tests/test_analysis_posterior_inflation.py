"""``analysis.inflation.posterior``: DAPPER's ``infl``, the analysis anomalies × a.

Checked against an independent ETKF written out here (DAPPER's symmetric
square-root form), against the un-inflated analysis of every filter and
kernel, composed with the prior inflation and the relaxation schemes, and
through the YAML loader.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from ensio.analysis.api import assimilate
from ensio.analysis.filters import FILTERS
from ensio.analysis.inflation import inflate_anomalies, rtpp
from ensio.config.analysis import AnalysisSection, InflationSection, LocalizationSection
from ensio.config.load import from_plain
from ensio.config.schema import ConfigError
from ensio.obs import ObsBatch


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _case(rng: np.random.Generator, n: int = 24, k: int = 8, m: int = 14):
    X = rng.standard_normal((k, n)) * 1.5 + 2.0
    idx = np.sort(rng.choice(n, m, replace=False))
    sigma = rng.uniform(0.5, 1.5, m)
    y = X.mean(0)[idx] + rng.standard_normal(m)
    obs = ObsBatch(values=y, errors=sigma, lon=np.zeros(m), lat=np.zeros(m), index=idx)
    return X, idx, sigma, y, obs


def _section(name: str, n: int, **inflation) -> AnalysisSection:
    loc = LocalizationSection(radius=7.0, periodic=n) if name.startswith("l") else None
    return AnalysisSection(filter=name, localization=loc, inflation=InflationSection(**inflation),
                           seed=4)


def test_etkf_with_posterior_inflation_equals_dappers_formula(rng):
    """E^a = μ + w A + T A, then μ^a + a (E^a − μ^a), all written out (DAPPER's ``Sqrt``)."""
    X, idx, sigma, y, obs = _case(rng)
    k = X.shape[0]
    a = 1.07
    got = assimilate(X, obs, AnalysisSection(filter="etkf",
                                             inflation=InflationSection(posterior=a)))
    mu = X.mean(0)
    A = X - mu
    Y = A[:, idx] / sigma  # whitened observed anomalies, (k, m)
    dy = (y - mu[idx]) / sigma
    d, V = np.linalg.eigh(Y @ Y.T + (k - 1) * np.eye(k))
    T = (V * d**-0.5) @ V.T * np.sqrt(k - 1)
    Pw = (V * d**-1.0) @ V.T
    Ea = mu + dy @ Y.T @ Pw @ A + T @ A
    ma = Ea.mean(0)
    want = ma + a * (Ea - ma)
    assert rel(got, want) <= 1e-10
    # the anomalies are a times the un-inflated ones, the mean is untouched
    assert rel(got.std(0, ddof=1), a * Ea.std(0, ddof=1)) <= 1e-10


#: every filter; the local ones with both kernels (small tiles: several per case)
FILTER_KERNELS = [
    (name, kernel)
    for name in sorted(FILTERS)
    for kernel in (("batched", "pointwise") if name.startswith("l") else ("batched",))
]


@pytest.mark.parametrize(("name", "kernel"), FILTER_KERNELS)
def test_every_filter_scales_its_analysis_anomalies(name, kernel, rng):
    X, idx, sigma, y, obs = _case(rng)
    n = X.shape[1]
    base = dataclasses.replace(_section(name, n, forget=0.9), kernel=kernel, tile_points=5)
    a = 1.04
    inflated = dataclasses.replace(base, inflation=InflationSection(forget=0.9, posterior=a))
    plain = assimilate(X, obs, base, cycle=3)
    got = assimilate(X, obs, inflated, cycle=3)
    mean = plain.mean(0)
    assert np.allclose(got.mean(0), mean, rtol=0, atol=1e-12)
    assert rel(got - got.mean(0), a * (plain - mean)) <= 1e-12


def test_posterior_composes_after_relaxation(rng):
    X, idx, sigma, y, obs = _case(rng)
    n = X.shape[1]
    relaxed = assimilate(X, obs, _section("letkf", n, forget=0.95, rtpp=0.5))
    both = assimilate(X, obs, _section("letkf", n, forget=0.95, rtpp=0.5, posterior=1.1))
    # independent of the order inside ensio: relax first (on the analysis), then scale
    plain = assimilate(X, obs, _section("letkf", n, forget=0.95))
    want = rtpp(X, plain, 0.5)
    want = want.mean(0) + 1.1 * (want - want.mean(0))
    assert rel(relaxed, rtpp(X, plain, 0.5)) <= 1e-12
    assert rel(both, want) <= 1e-12


def test_posterior_is_not_the_forgetting_factor(rng):
    """infl = a on the analysis is a different filter from forget = 1/a² on the prior."""
    X, idx, sigma, y, obs = _case(rng)
    post = assimilate(X, obs, AnalysisSection(filter="etkf",
                                              inflation=InflationSection(posterior=1.2)))
    prior = assimilate(X, obs, AnalysisSection(filter="etkf",
                                               inflation=InflationSection(forget=1 / 1.2**2)))
    assert not np.allclose(post.mean(0), prior.mean(0))  # prior inflation changes the gain


def test_inflate_anomalies_unit_factor_is_the_identity(rng):
    Xa = rng.standard_normal((5, 7))
    assert inflate_anomalies(Xa, 1.0) is Xa
    out = inflate_anomalies(Xa, 0.5)
    assert np.allclose(out.mean(0), Xa.mean(0))
    assert np.allclose(out.std(0), 0.5 * Xa.std(0))


def test_yaml_key_loads_and_composes():
    data = yaml.safe_load("filter: letkf\nlocalization: {radius: 5, periodic: 40}\n"
                          "inflation: {forget: 0.95, rtps: 0.3, posterior: 1.02}\n")
    sec = from_plain(AnalysisSection, data, "analysis")
    assert sec.inflation == InflationSection(forget=0.95, rtps=0.3, posterior=1.02)
    assert AnalysisSection(filter="etkf").inflation.posterior == 1.0


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "much"])
def test_bad_posterior_names_the_key(value):
    with pytest.raises(ConfigError) as err:
        from_plain(AnalysisSection, {"filter": "etkf", "inflation": {"posterior": value}},
                   "analysis")
    assert str(err.value).startswith("analysis.inflation.posterior:"), str(err.value)
