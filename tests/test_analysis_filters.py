"""Filter front end: dispatch, the in-memory API, decomposition independence."""

from __future__ import annotations

import typing

import numpy as np
import pytest

from ensio.analysis.api import analyse, assimilate
from ensio.analysis.filters import (
    ETKF,
    FILTERS,
    LETKF,
    EnKF,
    GlobalFilter,
    LEnKF,
    LocalFilter,
    make_filter,
)
from ensio.analysis.local import KERNELS, ObsSpace
from ensio.analysis.localization import Geometry, Localization
from ensio.analysis.variants import VARIANTS, Variant, register
from ensio.config.analysis import (
    AnalysisSection,
    FilterName,
    InflationSection,
    KernelName,
    LocalizationSection,
    QCSection,
)
from ensio.obs import ObsBatch, RegularGrid


def rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def test_dispatch_covers_every_filter_name():
    assert set(FILTERS) == set(typing.get_args(FilterName))
    loc = LocalizationSection(radius_km=1000.0)
    for name, cls in FILTERS.items():
        cfg = AnalysisSection(filter=name, localization=loc if name.startswith("l") else None)
        f = make_filter(cfg)
        assert type(f) is cls
    f = make_filter(
        AnalysisSection(filter="letkf", localization=LocalizationSection(radius=5, periodic=40))
    )
    assert f.localization.geometry == Geometry("periodic", 40.0) and f.localization.radius == 5.0


def index_case(rng, n=15, k=8, m=9):
    X = rng.standard_normal((k, n)) * 1.5 + 2.0
    idx = np.sort(rng.choice(n, m, replace=False))
    sigma = rng.uniform(0.5, 1.5, m)
    y = X.mean(0)[idx] + rng.standard_normal(m)
    obs = ObsBatch(values=y, errors=sigma, lon=np.zeros(m), lat=np.zeros(m), index=idx)
    return X, idx, sigma, y, obs


@pytest.mark.parametrize("name", ["etkf", "estkf"])
def test_global_square_root_filters_through_the_api_are_kalman(name, rng):
    X, idx, sigma, y, obs = index_case(rng)
    Xa = assimilate(X, obs, AnalysisSection(filter=name))
    k, n = X.shape
    H = np.eye(n)[idx]
    A = (X - X.mean(0)).T
    P = A @ A.T / (k - 1)
    K = P @ H.T @ np.linalg.inv(H @ P @ H.T + np.diag(sigma**2))
    xa = X.mean(0) + K @ (y - H @ X.mean(0))
    Aa = (Xa - Xa.mean(0)).T
    assert rel(Xa.mean(0), xa) <= 1e-10
    assert rel(Aa @ Aa.T / (k - 1), (np.eye(n) - K @ H) @ P) <= 1e-10


def test_letkf_infinite_radius_through_the_api_equals_etkf(rng):
    X, idx, sigma, y, obs = index_case(rng)
    inf = LocalizationSection(radius=float("inf"), periodic=X.shape[1])
    infl = InflationSection(forget=0.9)
    a = assimilate(X, obs, AnalysisSection(filter="letkf", localization=inf, inflation=infl))
    b = assimilate(X, obs, AnalysisSection(filter="etkf", inflation=infl))
    assert rel(a, b) <= 1e-10


def grid_case(rng, k=10):
    grid = RegularGrid(np.arange(0.0, 360.0, 10.0), np.linspace(-85, 85, 18))
    X = rng.standard_normal((k, grid.size)) + np.linspace(0, 5, grid.size)
    m = 120
    lon = rng.uniform(-180, 180, m)
    lat = rng.uniform(-89, 89, m)  # some beyond the last grid latitude
    values = rng.standard_normal(m) + 2.5
    values[3] = np.nan
    lat[3] = 0.0  # counted as a bad value, not as outside
    return grid, X, ObsBatch(values=values, errors=np.full(m, 0.8), lon=lon, lat=lat)


def test_letkf_on_a_grid_with_bilinear_observations(rng):
    grid, X, obs = grid_case(rng)
    loc = LocalizationSection(radius_km=3000.0)
    res = {}
    for kernel in ("batched", "pointwise"):
        cfg = AnalysisSection(
            filter="letkf", localization=loc, kernel=kernel, qc=QCSection(max_sigma=4.0)
        )
        res[kernel] = analyse(X, obs, cfg, grid=grid)
    a, b = res["batched"], res["pointwise"]
    tm: dict[str, float] = {}
    cfg = AnalysisSection(filter="lenkf", localization=loc, kernel="batched")
    analyse(X, obs, cfg, grid=grid, timings=tm)
    assert {"obs", "perturb", "weights", "gemm", "transform", "update", "relax"} <= set(tm)
    assert rel(a.ensemble, b.ensemble) <= 1e-10
    outside = int(np.sum(np.abs(obs.lat) > 85))
    assert a.qc.bad_value == 1 and a.qc.outside == outside
    assert a.qc.accepted == len(obs) - a.qc.rejected
    assert a.prior.count == a.qc.accepted
    assert a.posterior.rms < a.prior.rms


def test_stochastic_filters_do_not_depend_on_the_row_split(rng):
    """Rows split over "ranks", each with the observations it needs: same LEnKF."""
    n, k = 60, 12
    X = rng.standard_normal((k, n))
    idx = np.sort(rng.choice(n, 40, replace=False))
    coords = np.arange(n, dtype=float)
    space = ObsSpace(X[:, idx] * 0.9, rng.standard_normal(40), np.ones(40), coords[idx], idx)
    loc = Localization(Geometry("periodic", float(n)), "gaspari-cohn", 10.0)
    f = LEnKF(localization=loc, seed=4, inflation=InflationSection(forget=0.95))
    full = f.analyse(X, coords, space, cycle=3).ensemble
    parts = []
    for rows in np.array_split(np.arange(n), 4):
        d = np.abs(coords[idx][None, :] - coords[rows][:, None])
        near = (np.minimum(d, n - d) < 10.0).any(axis=0)
        sub = ObsSpace(
            space.hx[:, near],
            space.values[near],
            space.errors[near],
            space.coords[near],
            space.ids[near],
        )
        parts.append(f.analyse(X[:, rows], coords[rows], sub, cycle=3).ensemble)
    assert rel(np.hstack(parts), full) <= 1e-12
    # another cycle draws other perturbations
    assert rel(f.analyse(X, coords, space, cycle=4).ensemble, full) > 1e-6


def test_global_enkf_does_not_depend_on_observation_order(rng):
    X = rng.standard_normal((10, 20))
    m = 15
    hx = X[:, :m] + 0.5
    y, s = rng.standard_normal(m), rng.uniform(0.5, 1, m)
    ids = np.arange(m) + 100
    p = rng.permutation(m)
    f = EnKF(seed=9)
    a = f.analyse(X, None, ObsSpace(hx, y, s, np.zeros((m, 2)), ids), cycle=1).ensemble
    b = f.analyse(
        X, None, ObsSpace(hx[:, p], y[p], s[p], np.zeros((m, 2)), ids[p]), cycle=1
    ).ensemble
    assert rel(a, b) <= 1e-12


def test_rotation_keeps_mean_and_covariance(rng):
    X, idx, sigma, y, obs = index_case(rng)
    a = assimilate(X, obs, AnalysisSection(filter="etkf"))
    b = assimilate(X, obs, AnalysisSection(filter="etkf", rotate=True, seed=2), cycle=5)
    assert np.allclose(a.mean(0), b.mean(0), atol=1e-12)
    assert np.allclose(np.cov(a.T), np.cov(b.T), atol=1e-12)
    assert not np.allclose(a, b)


def test_relaxation_is_applied_after_the_analysis(rng):
    X, idx, sigma, y, obs = index_case(rng)
    plain = assimilate(X, obs, AnalysisSection(filter="etkf"))
    relaxed = assimilate(
        X, obs, AnalysisSection(filter="etkf", inflation=InflationSection(rtps=1.0))
    )
    assert np.allclose(relaxed.std(0, ddof=1), X.std(0, ddof=1))
    assert np.allclose(relaxed.mean(0), plain.mean(0))


def test_adaptive_inflation_is_estimated_per_point_and_carried_over(rng):
    n, k = 40, 10
    X = rng.standard_normal((k, n))
    idx = np.arange(0, 20)  # no observations near 30
    obs = ObsBatch(
        # innovations of ±5 against a prior spread of ~1 and σ_o = 1: far more
        # than the spread explains, whatever the random prior (d² ≈ 25 ≫ 2)
        values=X.mean(0)[idx] + 5.0 * np.where(idx % 2 == 0, 1.0, -1.0),
        errors=np.ones(20),
        lon=np.zeros(20),
        lat=np.zeros(20),
        index=idx,
    )
    cfg = AnalysisSection(
        filter="letkf",
        localization=LocalizationSection(radius=6.0, periodic=n),
        inflation=InflationSection(adaptive=True, adaptive_initial=1.2),
    )
    r = analyse(X, obs, cfg)
    assert r.inflation.shape == (n,)
    assert r.inflation[30] == 1.2
    assert np.all(r.inflation[5:15] > 1.2)  # innovations larger than the spread explains
    r2 = analyse(r.ensemble, obs, cfg, inflation=r.inflation)
    assert r2.inflation[30] == 1.2
    g = analyse(X, obs, AnalysisSection(filter="etkf", inflation=cfg.inflation))
    assert np.all(g.inflation == g.inflation[0])


def test_api_errors(rng):
    X, idx, sigma, y, obs = index_case(rng)
    cfg = AnalysisSection(filter="letkf", localization=LocalizationSection(radius_km=100.0))
    with pytest.raises(ValueError, match="coords"):
        assimilate(X, obs, cfg)
    with pytest.raises(ValueError, match="members, rows"):
        assimilate(X[0], obs, AnalysisSection(filter="etkf"))
    with pytest.raises(ValueError, match="coordinates"):
        LETKF().analyse(
            X, None, ObsSpace(X[:, :2], np.zeros(2), np.ones(2), np.zeros((2, 2)), np.arange(2))
        )
    assert isinstance(make_filter(AnalysisSection(filter="etkf")), ETKF)


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_without_observations_the_analysis_is_the_prior(name, rng):
    X = rng.standard_normal((5, 30))
    none = ObsBatch(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), index=np.zeros(0, int))
    loc = LocalizationSection(radius=3.0, periodic=30) if name.startswith("l") else None
    assert np.allclose(assimilate(X, none, AnalysisSection(filter=name, localization=loc)), X)
    with pytest.raises(ValueError, match="at least 2 members"):
        assimilate(X[:1], none, AnalysisSection(filter=name, localization=loc))


def test_filters_are_siblings_around_one_variant_each():
    """ETKF, ESTKF and EnKF (and their local filters) share a driver, not each other."""
    globals_ = [FILTERS[n] for n in ("etkf", "estkf", "enkf")]
    locals_ = [FILTERS[n] for n in ("letkf", "lestkf", "lenkf")]
    for group, driver in ((globals_, GlobalFilter), (locals_, LocalFilter)):
        for a in group:
            assert a.__bases__ == (driver,), a
            assert all(a is b or not issubclass(a, b) for b in group)
    assert {f.variant for f in globals_} == {f.variant for f in locals_} == set(VARIANTS.values())
    assert [type(f.variant).__name__ for f in (ETKF, EnKF)] == ["ETKFVariant", "EnKFVariant"]
    assert set(KERNELS) == set(typing.get_args(KernelName))


def test_a_variant_must_be_listed_with_the_config_names():
    class Unlisted(Variant):
        name = "unlisted"
        title = "Unlisted"

        def transforms(self, C, rhs, rho, k, T):
            raise NotImplementedError

        def global_transform(self, obs, rho):
            raise NotImplementedError

    with pytest.raises(RuntimeError, match="VARIANT_NAMES"):
        register(Unlisted)
    assert "unlisted" not in VARIANTS
