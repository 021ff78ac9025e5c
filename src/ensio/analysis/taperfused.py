"""The batched kernel's commonest weights in three passes: lon/lat distances, Gaspari–Cohn, R⁻¹.

:func:`~ensio.analysis.tiles.tile_weights` computes, for every (point,
candidate observation) pair of a tile, the great-circle distance, the taper
and its product with R⁻¹ — some twenty numpy passes over a (p, c) array. On
a full-rank case that was 15 % of the analysis. Here the arithmetic before
the arcsine and everything after it are each one compiled loop, and the
arcsine stays numpy's (vectorized; a scalar libm call in the loop would cost
seven times as much). Every operation is the one, in the order, of
:func:`~ensio.analysis.localization.prepared_distances` and
:func:`~ensio.analysis.localization.gaspari_cohn`, so the weights are those
of the numpy path bit for bit, and of the pointwise kernel.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .localization import EARTH_RADIUS_KM

__all__ = ["lonlat_gc_weights"]


def lonlat_gc_weights(
    pts: np.ndarray, obs: np.ndarray, rinv: np.ndarray, radius: float, out: np.ndarray,
    n_obs: np.ndarray, used: np.ndarray,
) -> None:  # fmt: skip
    """GC weights × R⁻¹ of unit vectors ``pts`` (p, 3) against ``obs`` (c, 3), into ``out``.

    ``out`` (p, c) gets ``taper · rinv``; ``n_obs`` (p,) the non-zero
    tapers per point; ``used`` (c,) is or-ed with "non-zero at some point".
    """
    _half_chords(pts, np.ascontiguousarray(obs.T), out)
    np.arcsin(out, out=out)
    _finish(out, rinv, 2.0 * EARTH_RADIUS_KM, float(radius), n_obs, used)


@njit(cache=True, nogil=True, error_model="numpy")
def _half_chords(a, bT, out):  # pragma: no cover (compiled)
    """``min(|a_i - b_j| / 2, 1)`` (the squares summed x, y, z, as ``_outer_sq_dist`` does).

    ``bT`` is (3, c): the candidates' coordinates as three contiguous rows,
    so the inner loop vectorizes (from (c, 3) it ran 4× slower).
    """
    bx, by, bz = bT[0], bT[1], bT[2]
    for i in range(a.shape[0]):
        a0, a1, a2 = a[i, 0], a[i, 1], a[i, 2]
        row = out[i]
        for j in range(bx.shape[0]):
            d = a0 - bx[j]
            s = d * d
            d = a1 - by[j]
            s += d * d
            d = a2 - bz[j]
            s += d * d
            h = np.sqrt(s) * 0.5
            row[j] = h if h < 1.0 else 1.0


@njit(cache=True, nogil=True)
def _finish(out, rinv, scale, radius, n_obs, used):  # pragma: no cover (compiled)
    """Arcsines → distances → Gaspari–Cohn (the numpy expression's order) × R⁻¹, counted."""
    k = 2.0 / radius
    for i in range(out.shape[0]):
        row = out[i]
        cnt = 0
        for j in range(out.shape[1]):
            dist = row[j] * scale
            r = dist * k
            if not dist < radius:
                w = 0.0
            elif r <= 1.0:
                w = -0.25 * r
                w += 0.5
                w *= r
                w += 0.625
                w *= r
                w += -5.0 / 3.0
                w *= r
                w *= r
                w += 1.0
            else:
                w = r / 12.0
                w += -0.5
                w *= r
                w += 0.625
                w *= r
                w += 5.0 / 3.0
                w *= r
                w += -5.0
                w *= r
                w += 4.0
                w -= (2.0 / 3.0) / r
            if w > 0.0:
                cnt += 1
                used[j] = True
                row[j] = w * rinv[j]
            else:
                row[j] = 0.0 * rinv[j]
        n_obs[i] = cnt
