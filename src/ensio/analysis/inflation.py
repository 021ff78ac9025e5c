"""Covariance inflation: forgetting factor, RTPP, RTPS, posterior, adaptive (Miyoshi 2011).

The multiplicative prior inflation (forgetting factor ρ, PDAF convention:
``P ← P/ρ``) is applied inside the transforms (:mod:`ensio.analysis.transforms`)
because it changes the gain, not just the spread. The relaxation schemes and
the multiplicative posterior inflation (DAPPER's ``infl``: analysis anomalies
× a after the update) act on the analysis afterwards, row by row, so they
need nothing but the prior and analysis values of the row and are
independent of how rows are split over ranks. The adaptive scheme estimates
ρ per grid point from the innovations.

The two multiplicative conventions are not the same filter: inflating the
prior by a changes the gain of this cycle; inflating the posterior by a
leaves this cycle's gain alone and enters the next cycle's prior only after
the model has acted on the inflated anomalies. Comparisons with DAPPER need
``posterior``, not ``forget = 1/a²``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "forget_from_factor",
    "inflate_anomalies",
    "rtpp",
    "rtps",
    "adaptive_inflation_update",
]


def forget_from_factor(factor: float) -> float:
    """Forgetting factor ρ equivalent to inflating the *prior* anomalies by ``factor``.

    Multiplying the prior anomalies by ``factor`` multiplies P by ``factor²``,
    i.e. ``ρ = 1/factor²``. DAPPER's ``infl`` multiplies the *analysis*
    anomalies instead: that is ``analysis.inflation.posterior``
    (:func:`inflate_anomalies`), not this.
    """
    return 1.0 / factor**2


def inflate_anomalies(analysis: np.ndarray, factor: float) -> np.ndarray:
    """Multiplicative posterior inflation: ``X'a ← a X'a`` per row, mean unchanged.

    DAPPER's ``post_process(E, infl, rot)`` convention (applied after the
    analysis). ``factor == 1`` returns ``analysis`` itself, untouched, so the
    default costs nothing and changes no bit.

    Parameters
    ----------
    analysis : ndarray, shape (k, n)
    factor : float > 0
    """
    if factor == 1.0:
        return analysis
    ma = analysis.mean(axis=0)
    return ma + factor * (analysis - ma)


def rtpp(prior: np.ndarray, analysis: np.ndarray, alpha: float) -> np.ndarray:
    """Relaxation to prior perturbations (Zhang, Snyder & Sun 2004).

    ``X'a ← (1 − α) X'a + α X'b``, mean unchanged. Keeps some of the prior's
    structure where observations collapsed the spread.

    Parameters
    ----------
    prior, analysis : ndarray, shape (k, n)
    alpha : float in [0, 1]
    """
    ma = analysis.mean(axis=0)
    mb = prior.mean(axis=0)
    relaxed = ma + (1.0 - alpha) * (analysis - ma) + alpha * (prior - mb)
    return _unchanged_kept(prior, analysis, relaxed)


def rtps(prior: np.ndarray, analysis: np.ndarray, alpha: float) -> np.ndarray:
    """Relaxation to prior spread (Whitaker & Hamill 2012).

    Per row, ``X'a ← X'a (α (σb − σa)/σa + 1)``: the analysis spread is pulled
    back towards the prior spread by the fraction α, without changing the
    shape of the analysis anomalies. Rows with zero analysis spread are left
    unchanged.

    Parameters
    ----------
    prior, analysis : ndarray, shape (k, n)
    alpha : float in [0, 1]
    """
    ma = analysis.mean(axis=0)
    sa = analysis.std(axis=0, ddof=1)
    sb = prior.std(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(sa > 0, alpha * (sb - sa) / sa + 1.0, 1.0)
    return _unchanged_kept(prior, analysis, ma + factor * (analysis - ma))


def _unchanged_kept(prior: np.ndarray, analysis: np.ndarray, relaxed: np.ndarray) -> np.ndarray:
    """``relaxed`` with the rows the analysis left as the prior, bit for bit, kept so.

    Relaxing such a row is the identity, but ``x̄ + 1·(x − x̄)`` rounds to
    another last bit: an analysis no observation reached must leave the
    member files byte-identical. Shapes (k, n).
    """
    same = (analysis == prior).all(axis=0)
    if same.any():
        relaxed[:, same] = prior[:, same]
    return relaxed


def adaptive_inflation_update(
    inflation: np.ndarray,
    dRd: np.ndarray,
    trace_hph_r: np.ndarray,
    weight_sum: np.ndarray,
    *,
    sigma: float = 0.04,
    minimum: float = 1.0,
) -> np.ndarray:
    """Adaptive multiplicative inflation of Miyoshi (2011), per point.

    Miyoshi, T. (2011): The Gaussian approach to adaptive covariance
    inflation and its implementation with the local ensemble transform Kalman
    filter. MWR 139, 1519–1535. With localization weights ρ_i on R⁻¹,
    ``E[Σ ρ_i d_i²/σ_i²] = α Σ ρ_i (HPHᵀ)_ii/σ_i² + Σ ρ_i`` gives the
    observation estimate ``α^o = (dRd − Σρ)/tr``; it is combined with the
    prior estimate α^b (the previous cycle's value, Gaussian with standard
    deviation ``sigma``) by a scalar Kalman update, the variance of α^o being
    ``σ_o² = (2/Σρ) ((α^b tr + Σρ)/tr)²``:

    ``α^a = α^b + σ²/(σ² + σ_o²) (α^o − α^b)``.

    α multiplies the prior covariance (the transforms use ``ρ = 1/α``). As in
    Miyoshi's LETKF the estimate uses the innovations of the current cycle and
    is applied from the next one; points without observations keep α^b.
    Results are clipped to ``α ≥ minimum`` (default 1: no deflation).

    Parameters
    ----------
    inflation : ndarray, shape (p,)
        Prior estimate α^b per point.
    dRd : ndarray, shape (p,)
        ``Σ_i ρ_i d_i² / σ_i²``.
    trace_hph_r : ndarray, shape (p,)
        ``Σ_i ρ_i (HPHᵀ)_ii / σ_i²`` with the un-inflated sample variance.
    weight_sum : ndarray, shape (p,)
        ``Σ_i ρ_i``.
    sigma : float
        Standard deviation of the prior inflation estimate.
    minimum : float
        Lower bound of the result.

    Returns
    -------
    ndarray, shape (p,)
    """
    a_b = np.asarray(inflation, dtype=float)
    dRd, tr, n = (np.asarray(v, dtype=float) for v in (dRd, trace_hph_r, weight_sum))
    ok = (n > 0) & (tr > 0)
    safe_tr = np.where(ok, tr, 1.0)
    safe_n = np.where(ok, n, 1.0)
    a_o = (dRd - safe_n) / safe_tr
    var_o = 2.0 / safe_n * ((a_b * safe_tr + safe_n) / safe_tr) ** 2
    gain = sigma**2 / (sigma**2 + var_o)
    a_a = np.where(ok, a_b + gain * (a_o - a_b), a_b)
    return np.maximum(a_a, minimum)
