"""An independent LETKF on clean numpy arrays: the expectation of the real-file tests.

Written from the papers and the documented conventions, sharing no code with
ensio (no import of ``ensio`` at all):

* Hunt, Kostelich & Szunyogh (2007), steps 4–8, point by point, symmetric
  square root; multiplicative inflation ``forget`` = ρ with P → P/ρ;
* R-localization with Gaspari & Cohn (1999) eq. 4.10, half-width c = radius/2
  (``radius`` is the SUPPORT radius: weight 0 at and beyond it, README
  "Analysis" and DESIGN.md "Localization convention");
* great-circle distance (haversine) on a 6371 km sphere, horizontal only: a
  row of a 3-D variable is placed at the lon/lat of its column;
* H: bilinear interpolation written here on a regular lon/lat grid (periodic
  in longitude when the axis covers the circle, ascending or descending
  latitude), linear between two levels for 3-D variables, identity for an
  ``index``; inactive points take no part: an inactive row is not updated and
  an observation whose H reads an inactive point (any of its 4 corners) is
  dropped.

State vector: the clean arrays of the state variables, each flattened in C
order, concatenated in config order; for masked variables only the active
points (in C order) are rows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EARTH_KM", "bilinear", "gaspari_cohn", "great_circle_km", "letkf", "level_weights",
           "kalman_mean"]  # fmt: skip

EARTH_KM = 6371.0


def great_circle_km(lon1, lat1, lon2, lat2) -> np.ndarray:
    """Haversine distance in km, broadcasting (degrees)."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dl, dp = np.radians(np.subtract(lon2, lon1)), p2 - p1
    h = np.sin(dp / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 2 * EARTH_KM * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))


def gaspari_cohn(z: np.ndarray, c: float) -> np.ndarray:
    """Gaspari & Cohn (1999) eq. 4.10 with half-width ``c``: 1 at 0, 0 from 2c on."""
    r = np.asarray(z, dtype=float) / c
    out = np.zeros_like(r)
    a = r <= 1.0
    b = (r > 1.0) & (r < 2.0)
    ra, rb = r[a], r[b]
    out[a] = -(ra**5) / 4 + ra**4 / 2 + 5 * ra**3 / 8 - 5 * ra**2 / 3 + 1
    out[b] = rb**5 / 12 - rb**4 / 2 + 5 * rb**3 / 8 + 5 * rb**2 / 3 - 5 * rb + 4 - 2 / (3 * rb)
    return out


def _lon_neighbours(axis: np.ndarray, x: float) -> tuple[int, int, float] | None:
    """Indices of the two longitudes around ``x`` and the fraction towards the second."""
    step = np.diff(np.sort(np.mod(axis, 360.0)))
    periodic = np.allclose(step, step[0]) and abs(step[0] * axis.size - 360.0) < 1e-6
    if periodic:
        east = np.mod(x - axis, 360.0)  # distance going east from each grid longitude to x
        i0 = int(np.argmin(east))
        west = np.mod(axis - x, 360.0)
        west[i0] = np.inf if west[i0] == 0.0 else west[i0]
        i1 = int(np.argmin(west))
        return i0, i1, float(east[i0] / (east[i0] + west[i1]))
    lo, hi = axis.min(), axis.max()
    x = lo + np.mod(x - lo, 360.0)
    if x > hi:
        return None
    below = np.where(axis <= x, axis, -np.inf)
    above = np.where(axis > x, axis, np.inf)
    i0, i1 = int(np.argmax(below)), int(np.argmin(above))
    return i0, i1, float((x - axis[i0]) / (axis[i1] - axis[i0]))


def _lat_neighbours(axis: np.ndarray, y: float) -> tuple[int, int, float] | None:
    if not axis.min() <= y <= axis.max():
        return None
    below = np.where(axis <= y, axis, -np.inf)
    above = np.where(axis > y, axis, np.inf)
    j0 = int(np.argmax(below))
    if not np.isfinite(above).any():  # y is the largest latitude
        return j0, j0, 0.0
    j1 = int(np.argmin(above))
    return j0, j1, float((y - axis[j0]) / (axis[j1] - axis[j0]))


def bilinear(lon_axis: np.ndarray, lat_axis: np.ndarray, lon: float, lat: float):
    """Bilinear weights of a location on a (lat, lon) grid stored lat-major.

    Returns ``(flat, weights)``, 4 flat indices into ``(nlat, nlon)`` and
    their weights, or ``None`` outside the grid.
    """
    ix = _lon_neighbours(np.asarray(lon_axis, float), float(lon))
    jy = _lat_neighbours(np.asarray(lat_axis, float), float(lat))
    if ix is None or jy is None:
        return None
    (i0, i1, tx), (j0, j1, ty) = ix, jy
    n = len(lon_axis)
    flat = np.array([j0 * n + i0, j0 * n + i1, j1 * n + i0, j1 * n + i1])
    w = np.array([(1 - tx) * (1 - ty), tx * (1 - ty), (1 - tx) * ty, tx * ty])
    return flat, w


def level_weights(levels: np.ndarray, level: float):
    """Linear interpolation between the two levels around ``level``: ``[(k, w), ...]`` or None."""
    levels = np.asarray(levels, float)
    if not levels.min() <= level <= levels.max():
        return None
    for k in range(levels.size - 1):
        a, b = levels[k], levels[k + 1]
        if min(a, b) <= level <= max(a, b):
            t = (level - a) / (b - a)
            return [(k, 1.0 - t), (k + 1, t)]
    raise AssertionError("unreachable")


def letkf(
    X: np.ndarray,
    row_lonlat: np.ndarray,
    active: np.ndarray,
    H: np.ndarray,
    y: np.ndarray,
    sigma: np.ndarray,
    obs_lonlat: np.ndarray,
    radius_km: float,
    forget: float = 1.0,
) -> np.ndarray:
    """Point-by-point LETKF (Hunt et al. 2007) with R-localization.

    Parameters
    ----------
    X : (k, n) prior members in state-vector order (inactive rows: any value)
    row_lonlat : (n, 2) lon, lat of every row (degrees)
    active : (n,) bool; inactive rows are returned unchanged
    H : (m, n) linear observation operator; must be 0 on inactive rows
    y, sigma : (m,) observed values and error standard deviations
    obs_lonlat : (m, 2)
    radius_km : support radius of the Gaspari–Cohn taper
    forget : ρ ∈ (0, 1], P → P/ρ

    Returns
    -------
    (k, n) analysis members.
    """
    assert not np.any(H[:, ~active]), "H reads an inactive row"
    k = X.shape[0]
    Xc = np.where(active[None, :], X, 0.0)  # inactive values (fill, NaN) never enter H
    HX = Xc @ H.T  # (k, m)
    ybar = HX.mean(axis=0)
    Yb = (HX - ybar).T  # (m, k)
    d = y - ybar
    dist = great_circle_km(row_lonlat[:, None, 0], row_lonlat[:, None, 1],
                           obs_lonlat[None, :, 0], obs_lonlat[None, :, 1])  # fmt: skip
    taper = gaspari_cohn(dist, radius_km / 2.0)
    out = X.copy()
    for i in np.flatnonzero(active):
        sel = taper[i] > 0
        rinv = taper[i, sel] / sigma[sel] ** 2
        Ys = Yb[sel]
        A = (k - 1) * forget * np.eye(k) + Ys.T @ (rinv[:, None] * Ys)
        evals, evecs = np.linalg.eigh(A)
        Pa = (evecs / evals) @ evecs.T
        W = (evecs * np.sqrt((k - 1) / evals)) @ evecs.T  # symmetric sqrt((k-1) Pa)
        wbar = Pa @ (Ys.T @ (rinv * d[sel]))
        xbar = X[:, i].mean()
        out[:, i] = xbar + (X[:, i] - xbar) @ (wbar[:, None] + W)
    return out


def kalman_mean(X: np.ndarray, H: np.ndarray, y: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """The Kalman filter mean x̄ + P Hᵀ (H P Hᵀ + R)⁻¹ (y − H x̄) with P the ensemble covariance.

    The LETKF mean without localization (radius ∞) and ρ = 1 equals it: a
    check of :func:`letkf` that shares none of its algebra.
    """
    xbar = X.mean(axis=0)
    P = np.cov(X.T, ddof=1)
    S = H @ P @ H.T + np.diag(sigma**2)
    return xbar + P @ H.T @ np.linalg.solve(S, y - H @ xbar)
