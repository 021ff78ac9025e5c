"""Full analyses through ``ensio.analysis.api.analyse`` against independent references.

Every reference here is written from the papers, point by point, with numpy
and scipy only: it shares no code with ensio's kernels (no batched GEMM, no
eigendecomposition of ensio's, its own distances, taper and square root).
What ensio is trusted for is only the public interface: the config sections,
``ObsBatch``, and — for the stochastic filter — the documented perturbation
streams (``obs_perturbations``), so that both sides perturb the same way.

Conventions the references follow (README "Analysis" and DESIGN.md):

* ``radius``/``radius_km`` is the *support* radius, the Gaspari–Cohn half-width
  is ``c = radius / 2`` and the taper multiplies R⁻¹ (R-localization);
* ``forget`` ρ inflates the prior covariance to P/ρ (Hunt et al.'s ρ_H = 1/ρ);
* distances: periodic index distance on a ring of ``periodic`` points, or
  great-circle distance on a 6371 km sphere (haversine here).

Inputs are random but seeded; every assertion message names the seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg

from ensio.analysis.api import analyse
from ensio.analysis.transforms import obs_perturbations
from ensio.config.analysis import AnalysisSection, InflationSection, LocalizationSection
from ensio.obs.batch import ObsBatch

TOL = 1e-10
EARTH_KM = 6371.0


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference relative to the largest reference value."""
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(b)))


# ------------------------------------------------------------------ geometry


def gaspari_cohn(z: float, c: float) -> float:
    """Gaspari & Cohn (1999) eq. 4.10, half-width ``c`` (0 from ``2c`` on)."""
    r = z / c
    if r <= 1.0:
        return -(r**5) / 4 + r**4 / 2 + 5 * r**3 / 8 - 5 * r**2 / 3 + 1
    if r < 2.0:
        return r**5 / 12 - r**4 / 2 + 5 * r**3 / 8 + 5 * r**2 / 3 - 5 * r + 4 - 2 / (3 * r)
    return 0.0


def haversine_km(p: np.ndarray, q: np.ndarray) -> float:
    lon1, lat1 = np.radians(p)
    lon2, lat2 = np.radians(q)
    h = (
        math.sin((lat2 - lat1) / 2) ** 2
        + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    )
    return 2 * EARTH_KM * math.asin(math.sqrt(min(1.0, h)))


def ring_distance(a: float, b: float, period: int) -> float:
    d = abs(a - b) % period
    return min(d, period - d)


def taper_matrix(case: Case, radius: float) -> np.ndarray:
    """Weights ``(n, m)``: Gaspari–Cohn of every (row, observation) distance, support ``radius``."""
    n, m = case.X.shape[1], case.idx.size
    w = np.empty((n, m))
    for i in range(n):
        for o in range(m):
            if case.lonlat is None:
                z = ring_distance(float(i), float(case.idx[o]), n)
            else:
                z = haversine_km(case.lonlat[i], case.lonlat[case.idx[o]])
            w[i, o] = gaspari_cohn(z, radius / 2)
    return w


# --------------------------------------------------------------------- cases


class Case:
    """Prior ``X`` (k, n), observations of rows ``idx`` with errors ``sigma``, values ``y``.

    ``lonlat`` is None for a ring of n points (coordinate = row index), else the
    (n, 2) lon/lat of the rows (scattered points of a small region).
    """

    def __init__(
        self,
        seed: int,
        *,
        k: int = 8,
        n: int = 40,
        m: int = 18,
        lonlat: bool = False,
        spread: float = 1.0,
        bias: float = 0.0,
    ) -> None:
        rng = np.random.default_rng(seed)
        self.seed = seed
        # correlated prior: a smooth truth plus member noise, so the update is not trivial
        base = np.sin(2 * np.pi * np.arange(n) / n) * 3.0
        self.X = base + spread * rng.standard_normal((k, n))
        self.idx = np.sort(rng.choice(n, m, replace=False))
        self.sigma = rng.uniform(0.4, 1.2, m)
        self.y = self.X.mean(0)[self.idx] + bias + self.sigma * rng.standard_normal(m)
        self.lonlat = None
        if lonlat:
            self.lonlat = np.stack([rng.uniform(0.0, 40.0, n), rng.uniform(-20.0, 20.0, n)], 1)

    @property
    def obs(self) -> ObsBatch:
        if self.lonlat is None:
            lon = lat = np.zeros(self.idx.size)
        else:
            lon, lat = self.lonlat[self.idx, 0], self.lonlat[self.idx, 1]
        return ObsBatch(values=self.y, errors=self.sigma, lon=lon, lat=lat, index=self.idx)

    def localization(self, radius: float, regulated: bool = False) -> LocalizationSection:
        if self.lonlat is None:
            return LocalizationSection(radius=radius, periodic=self.X.shape[1], regulated=regulated)
        return LocalizationSection(radius_km=radius, regulated=regulated)

    def run(self, cfg: AnalysisSection, **kw):
        coords = None if self.lonlat is None else self.lonlat
        return analyse(self.X, self.obs, cfg, coords=coords, **kw)

    def msg(self, what: str) -> str:
        return f"{what} (seed={self.seed})"


# ------------------------------------------------------- square-root filters


def hunt_letkf_point(xrow, Yb, d, rinv, forget):
    """Hunt, Kostelich & Szunyogh (2007), steps 4–8, for one state row.

    ``xrow`` (k,) prior members, ``Yb`` (l, k) observed anomalies, ``d`` (l,)
    innovations ``y − ȳ``, ``rinv`` (l,) localized R⁻¹ diagonal; inflation
    ρ_H = 1/forget. Returns the k analysis members.
    """
    k = xrow.size
    xbar = xrow.mean()
    xp = xrow - xbar
    Rinv = np.diag(rinv)
    Pa = scipy.linalg.inv((k - 1) * np.eye(k) * forget + Yb.T @ Rinv @ Yb)
    wbar = Pa @ Yb.T @ Rinv @ d
    W = np.real(scipy.linalg.sqrtm((k - 1) * Pa))
    W = 0.5 * (W + W.T)
    return xbar + xp @ (wbar[:, None] + W)


def nerger_projection(k: int) -> np.ndarray:
    """T (k × (k−1)) of Nerger et al. (2012), eq. 13."""
    T = np.empty((k, k - 1))
    for i in range(k):
        for j in range(k - 1):
            if i < k - 1:
                T[i, j] = (1.0 if i == j else 0.0) - 1.0 / k / (1.0 / math.sqrt(k) + 1.0)
            else:
                T[i, j] = -1.0 / math.sqrt(k)
    return T


def nerger_lestkf_point(xrow, Yb, d, rinv, forget):
    """Nerger et al. (2012) ESTKF for one row: error subspace L = X'T, HL = Y T.

    ``Ã⁻¹ = ρ(k−1) I + (HL)ᵀ R⁻¹ HL``, ``w = Ã (HL)ᵀ R⁻¹ d``,
    ``Xa = x̄ + L (w 1ᵀ + sqrt((k−1) Ã) Tᵀ)`` (symmetric square root).
    """
    k = xrow.size
    T = nerger_projection(k)
    xbar = xrow.mean()
    L = (xrow - xbar) @ T
    HL = Yb @ T
    Rinv = np.diag(rinv)
    A = scipy.linalg.inv(forget * (k - 1) * np.eye(k - 1) + HL.T @ Rinv @ HL)
    w = A @ HL.T @ Rinv @ d
    S = np.real(scipy.linalg.sqrtm((k - 1) * A))
    S = 0.5 * (S + S.T)
    return xbar + L @ (w[:, None] + S @ T.T)


def reference_analysis(case: Case, weights: np.ndarray, forget, point=hunt_letkf_point):
    """Point by point with R⁻¹ localized by ``weights`` (n, m); ``forget`` scalar or (n,)."""
    X, idx = case.X, case.idx
    hx = X[:, idx]
    ybar = hx.mean(0)
    Yall = (hx - ybar).T  # (m, k)
    forget = np.broadcast_to(np.asarray(forget, dtype=float), (X.shape[1],))
    out = np.empty_like(X)
    for i in range(X.shape[1]):
        sel = weights[i] > 0
        rinv = weights[i, sel] / case.sigma[sel] ** 2
        out[:, i] = point(X[:, i], Yall[sel], case.y[sel] - ybar[sel], rinv, forget[i])
    return out


def mean_cov(E: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return E.mean(0), np.cov(E.T, ddof=1)


GEOMETRIES = [pytest.param(False, 7.3, id="ring"), pytest.param(True, 1800.0, id="lonlat")]


@pytest.mark.parametrize("kernel", ["batched", "pointwise"])
@pytest.mark.parametrize(("lonlat", "radius"), GEOMETRIES)
@pytest.mark.parametrize("seed", [11, 12])
def test_letkf_full_analysis_equals_hunt_point_by_point(seed, lonlat, radius, kernel):
    case = Case(seed, lonlat=lonlat)
    forget = 0.92
    cfg = AnalysisSection(
        filter="letkf",
        localization=case.localization(radius),
        inflation=InflationSection(forget=forget),
        kernel=kernel,
    )
    res = case.run(cfg)
    w = taper_matrix(case, radius)
    expected = reference_analysis(case, w, forget)
    assert rel(res.ensemble, expected) <= TOL, case.msg("LETKF vs Hunt et al. 2007")
    np.testing.assert_array_equal(res.n_obs, (w > 0).sum(1), err_msg=case.msg("n_obs"))
    # the case is informative: some rows are updated, some have no observation in reach
    assert rel(res.ensemble, case.X) > 1e-3, case.msg("no update")


@pytest.mark.parametrize("kernel", ["batched", "pointwise"])
@pytest.mark.parametrize(("lonlat", "radius"), GEOMETRIES)
@pytest.mark.parametrize("seed", [21, 22])
def test_lestkf_full_analysis_equals_nerger_projection(seed, lonlat, radius, kernel):
    """Nerger et al. (2012): with a symmetric square root the (L)ESTKF analysis — mean
    and covariance — is the (L)ETKF's; here both references are computed and compared,
    and ensio's LESTKF is compared with the projection form member by member."""
    case = Case(seed, lonlat=lonlat)
    forget = 0.95
    cfg = AnalysisSection(
        filter="lestkf",
        localization=case.localization(radius),
        inflation=InflationSection(forget=forget),
        kernel=kernel,
    )
    res = case.run(cfg)
    w = taper_matrix(case, radius)
    estkf = reference_analysis(case, w, forget, point=nerger_lestkf_point)
    etkf = reference_analysis(case, w, forget)
    assert rel(res.ensemble, estkf) <= TOL, case.msg("LESTKF vs Nerger projection")
    (m1, c1), (m2, c2) = mean_cov(estkf), mean_cov(etkf)
    assert rel(m1, m2) <= TOL, case.msg("ESTKF mean != ETKF mean")
    assert rel(c1, c2) <= TOL, case.msg("ESTKF covariance != ETKF covariance")


@pytest.mark.parametrize("seed", [31, 32])
def test_regulated_localization_equals_nerger_weights(seed):
    """Nerger, Janjić, Schröter & Hiller (2012): R⁻¹ weight
    ``ρ_reg = ρ σ_o² / (σ_o² + (1 − ρ) σ_b²)`` with σ_b² the mean observed
    (inflated) prior variance of the observations in reach of the point."""
    case = Case(seed, spread=2.0)
    radius, forget = 9.5, 0.9
    cfg = AnalysisSection(
        filter="letkf",
        localization=case.localization(radius, regulated=True),
        inflation=InflationSection(forget=forget),
    )
    res = case.run(cfg)
    taper = taper_matrix(case, radius)
    var = case.X[:, case.idx].var(axis=0, ddof=1) / forget  # inflated HPHᵀ diagonal
    err2 = case.sigma**2
    reg = np.zeros_like(taper)
    for i in range(taper.shape[0]):
        inside = taper[i] > 0
        if inside.any():
            sb2 = var[inside].mean()
            reg[i] = taper[i] * err2 / (err2 + (1.0 - taper[i]) * sb2)
    expected = reference_analysis(case, reg, forget)
    assert rel(res.ensemble, expected) <= TOL, case.msg("regulated LETKF")
    plain = reference_analysis(case, taper, forget)
    assert rel(expected, plain) > 1e-6, case.msg("regulation changed nothing: weak case")


# ------------------------------------------------------------- stochastic EnKF


def perturbed_obs(case: Case, seed: int, cycle: int) -> np.ndarray:
    """ε (k, m): the documented streams, centred over the members, times σ_o."""
    k, m = case.X.shape[0], case.idx.size
    z = obs_perturbations(seed, cycle, np.arange(k), np.arange(m))
    return (z - z.mean(0)) * case.sigma


def kalman_gain_update(case: Case, weights: np.ndarray, eps: np.ndarray, forget: float):
    """Per row: ``x_j^a = x̄ + x'_j/√ρ + K_l (y + ε_j − H x_j^ρ)`` with the observation-space
    gain ``K_l = P_xy (P_yy + R_l)⁻¹``, ``R_l = diag(σ_o²/w)`` over the observations of
    non-zero weight, and the prior inflated to P/ρ (members ``x̄ + x'/√ρ``)."""
    X, idx = case.X, case.idx
    k = X.shape[0]
    s = 1.0 / math.sqrt(forget)
    hx = X[:, idx]
    hx_infl = hx.mean(0) + s * (hx - hx.mean(0))
    out = np.empty_like(X)
    for i in range(X.shape[1]):
        xbar = X[:, i].mean()
        xi = xbar + s * (X[:, i] - xbar)
        sel = weights[i] > 0
        if not sel.any():
            out[:, i] = xi
            continue
        Yp = hx_infl[:, sel] - hx_infl[:, sel].mean(0)
        xp = xi - xi.mean()
        Pxy = xp @ Yp / (k - 1)
        Pyy = Yp.T @ Yp / (k - 1)
        K = scipy.linalg.solve(Pyy + np.diag(case.sigma[sel] ** 2 / weights[i, sel]), Pxy)
        innov = case.y[sel][None, :] + eps[:, sel] - hx_infl[:, sel]
        out[:, i] = xi + innov @ K
    return out


@pytest.mark.parametrize("seed", [41, 42])
def test_finite_radius_lenkf_equals_the_kalman_gain_update(seed):
    case = Case(seed, k=10)
    radius, forget, aseed, cycle = 8.5, 0.93, 17, 4
    cfg = AnalysisSection(
        filter="lenkf",
        localization=case.localization(radius),
        seed=aseed,
        inflation=InflationSection(forget=forget),
    )
    res = case.run(cfg, cycle=cycle)
    eps = perturbed_obs(case, aseed, cycle)
    expected = kalman_gain_update(case, taper_matrix(case, radius), eps, forget)
    (m1, c1), (m2, c2) = mean_cov(res.ensemble), mean_cov(expected)
    assert rel(m1, m2) <= TOL, case.msg("LEnKF mean")
    assert rel(c1, c2) <= TOL, case.msg("LEnKF covariance")
    assert rel(res.ensemble, expected) <= TOL, case.msg("LEnKF members")


@pytest.mark.parametrize("seed", [51, 52])
def test_global_enkf_is_the_perturbed_observation_kalman_update(seed):
    """Burgers et al. (1998) with the full ensemble gain: the centred perturbations make
    the analysis mean exactly the Kalman mean of the prior ensemble."""
    case = Case(seed, k=12, n=15, m=9)
    aseed, cycle = 3, 2
    res = case.run(AnalysisSection(filter="enkf", seed=aseed), cycle=cycle)
    ones = np.ones((case.X.shape[1], case.idx.size))
    eps = perturbed_obs(case, aseed, cycle)
    expected = kalman_gain_update(case, ones, eps, 1.0)
    assert rel(res.ensemble, expected) <= TOL, case.msg("EnKF members")
    n = case.X.shape[1]
    H = np.eye(n)[case.idx]
    P = np.cov(case.X.T, ddof=1)
    K = P @ H.T @ np.linalg.inv(H @ P @ H.T + np.diag(case.sigma**2))
    xb = case.X.mean(0)
    assert rel(res.ensemble.mean(0), xb + K @ (case.y - H @ xb)) <= TOL, case.msg("Kalman mean")


# ------------------------------------------------------------------ inflation


def rtpp_reference(prior, post, alpha):
    """Zhang, Snyder & Sun (2004): x'_a ← (1 − α) x'_a + α x'_b."""
    ma = post.mean(0)
    return ma + (1 - alpha) * (post - ma) + alpha * (prior - prior.mean(0))


def rtps_reference(prior, post, alpha):
    """Whitaker & Hamill (2012): x'_a ← x'_a (α (σ_b − σ_a)/σ_a + 1), per row."""
    ma = post.mean(0)
    sa, sb = post.std(0, ddof=1), prior.std(0, ddof=1)
    return ma + (post - ma) * (alpha * (sb - sa) / sa + 1.0)


RELAX = {"rtpp": rtpp_reference, "rtps": rtps_reference}


@pytest.mark.parametrize("scheme", sorted(RELAX))
@pytest.mark.parametrize("filt", ["etkf", "letkf"])
@pytest.mark.parametrize("seed", [61])
def test_relaxation_after_the_reference_analysis(seed, filt, scheme):
    case = Case(seed)
    alpha, forget, radius = 0.6, 0.97, 9.1
    loc = case.localization(radius) if filt == "letkf" else None
    infl = InflationSection(forget=forget, **{scheme: alpha})
    res = case.run(AnalysisSection(filter=filt, localization=loc, inflation=infl))
    w = taper_matrix(case, radius) if loc else np.ones((case.X.shape[1], case.idx.size))
    post = reference_analysis(case, w, forget)
    expected = RELAX[scheme](case.X, post, alpha)
    assert rel(res.ensemble, expected) <= TOL, case.msg(f"{filt} + {scheme}")
    assert rel(expected, post) > 1e-3, case.msg("relaxation changed nothing: weak case")


def miyoshi_update(alpha_b, d, var, sigma, weights, sd):
    """Miyoshi (2011) eqs. 4–9 with R⁻¹ localization weights, for one point.

    ``α^o = (Σw d²/σ² − Σw) / Σw (HPHᵀ)_ii/σ²``; its variance
    ``σ_o² = (2/Σw) ((α^b Σw HPH/σ² + Σw) / Σw HPH/σ²)²``; then the scalar
    Kalman update with prior variance ``sd²``; no deflation below 1.
    """
    if weights.sum() == 0:
        return max(alpha_b, 1.0)
    tr = np.sum(weights * var / sigma**2)
    nw = weights.sum()
    a_o = (np.sum(weights * d**2 / sigma**2) - nw) / tr
    v_o = 2.0 / nw * ((alpha_b * tr + nw) / tr) ** 2
    return max(alpha_b + sd**2 / (sd**2 + v_o) * (a_o - alpha_b), 1.0)


@pytest.mark.parametrize("filt", ["etkf", "letkf"])
@pytest.mark.parametrize("seed", [71, 72])
def test_adaptive_inflation_estimate_and_analysis(seed, filt):
    # innovations biased by 2.5 σ-ish: the estimate moves well away from its prior value
    case = Case(seed, spread=0.7, bias=2.0)
    n, m = case.X.shape[1], case.idx.size
    radius, sd = 8.7, 0.3
    rng = np.random.default_rng(seed + 1000)
    alpha_b = rng.uniform(1.05, 1.5, n) if filt == "letkf" else np.full(n, 1.2)
    loc = case.localization(radius) if filt == "letkf" else None
    infl = InflationSection(adaptive=True, adaptive_sigma=sd, adaptive_initial=1.1)
    cfg = AnalysisSection(filter=filt, localization=loc, inflation=infl)
    res = case.run(cfg, inflation=alpha_b)
    w = taper_matrix(case, radius) if loc else np.ones((n, m))
    hx = case.X[:, case.idx]
    d = case.y - hx.mean(0)
    var = hx.var(0, ddof=1)  # un-inflated sample HPHᵀ diagonal
    want = np.array([miyoshi_update(alpha_b[i], d, var, case.sigma, w[i], sd) for i in range(n)])
    assert res.inflation is not None
    assert rel(res.inflation, want) <= TOL, case.msg(f"{filt} adaptive estimate")
    assert np.max(np.abs(want - alpha_b)) > 0.05, case.msg("estimate did not move: weak case")
    # the analysis of this cycle used the previous estimate (P·α^b, i.e. forget = 1/α^b)
    expected = reference_analysis(case, w, 1.0 / alpha_b)
    assert rel(res.ensemble, expected) <= TOL, case.msg(f"{filt} adaptive analysis")
    # without a previous estimate the first cycle starts from adaptive_initial
    first = case.run(cfg)
    want0 = [miyoshi_update(1.1, d, var, case.sigma, w[i], sd) for i in range(n)]
    assert rel(first.inflation, np.array(want0)) <= TOL, case.msg("adaptive_initial")
