"""The grid cell around each observation and its bilinear weights.

Two kinds of horizontal grid (:class:`~ensio.layout.coords.HorizontalGrid`):

* rectilinear, 1-D ``lon(x)`` and ``lat(y)``: each axis is searched on its
  own (ascending or descending; longitudes in any 360° convention, periodic
  when equally spaced around the whole circle, a regional grid may cross the
  date line); bilinear in (lon, lat).
* curvilinear, 2-D ``lon(y, x)``, ``lat(y, x)``: a k-d tree on unit vectors
  gives the nearest grid points; the cells having one of them as a corner
  are tried in a fixed order, each by solving the inverse bilinear map of the
  cell (Newton's method) in the gnomonic projection centred on the
  observation, where the cell's edges are nearly straight; the first cell
  whose index-space coordinates ``(s, t)`` lie in [0, 1]² holds the
  observation, and the weights are bilinear in ``(s, t)``: index space.

Both return, per observation, the (y, x) indices of the 4 corners in the
order (j0, i0), (j0, i1), (j1, i0), (j1, i1), their weights and whether the
observation lies inside the grid. Fractions within :data:`SNAP` of 0 or 1
are snapped, so a corner the observation does not touch has weight exactly
0 on either kind of grid (and cannot reject it). Pure functions of arrays.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..layout.coords import HorizontalGrid, unit_vectors

__all__ = [
    "SNAP",
    "Cells",
    "curvilinear_cells",
    "lon_periodic",
    "rectilinear_cells",
    "snap_fraction",
]


class Cells(NamedTuple):
    """Corners and weights of the cell around each of m observations."""

    j: np.ndarray  # (m, 4) y index of each corner
    i: np.ndarray  # (m, 4) x index of each corner
    w: np.ndarray  # (m, 4) bilinear weights (0 where not inside)
    inside: np.ndarray  # (m,) bool


#: Cell fractions within this of 0 or 1 are exactly 0 or 1. Why: an
#: observation exactly on a grid point (or edge) of a curvilinear grid gets
#: its fractions from Newton's method in a projection, about 1e-16 off, so the
#: corners it does not touch got weights of 1e-16 — and a land corner with
#: such a weight rejected an ocean observation next to the coast. The inverse
#: map is accurate to a few 1e-16 of a cell; 1e-12 of a cell moves H by less
#: than the rounding of the state's values.
SNAP = 1e-12


def snap_fraction(t: np.ndarray) -> np.ndarray:
    """``t`` with values within :data:`SNAP` of 0 or 1 set to exactly 0 or 1."""
    t = np.where(np.abs(t) <= SNAP, 0.0, t)
    return np.where(np.abs(1.0 - t) <= SNAP, 1.0, t)


def _corners(j0, j1, i0, i1, tx, ty, inside) -> Cells:
    """The 4 corners and their bilinear weights; a weight zero to rounding is exactly 0."""
    tx, ty = snap_fraction(tx), snap_fraction(ty)
    j = np.stack([j0, j0, j1, j1], axis=1)
    i = np.stack([i0, i1, i0, i1], axis=1)
    w = np.stack([(1 - tx) * (1 - ty), tx * (1 - ty), (1 - tx) * ty, tx * ty], axis=1)
    w = np.where(inside[:, None], w, 0.0)
    return Cells(j.astype(np.int64), i.astype(np.int64), w, inside)


def lon_periodic(lon: np.ndarray) -> bool:
    """True when 1-D longitudes are equally spaced around the whole circle."""
    rel = np.mod(lon - lon[0], 360.0)
    step = rel[1]
    return bool(
        step > 0 and np.allclose(np.diff(rel), step) and abs(step * lon.size - 360.0) < 1e-6
    )


def _axis_lon(glon: np.ndarray, lon: np.ndarray):
    """Left index, right index, fraction and inside-flag along longitude."""
    n = glon.size
    finite = np.isfinite(lon)
    lon = np.where(finite, lon, glon[0])
    if lon_periodic(glon):
        step = np.mod(glon[1] - glon[0], 360.0)
        rel = np.mod(lon - glon[0], 360.0) / step
        i0 = np.minimum(np.floor(rel).astype(np.int64), n - 1)
        return i0, (i0 + 1) % n, rel - i0, finite
    # a regional grid may cross the date line (170 .. 180, -179 .. -170): unwrap it
    unwrapped = glon[0] + np.mod(glon - glon[0], 360.0)
    if np.all(np.diff(unwrapped) > 0):
        glon = unwrapped
    order = np.argsort(glon)
    gl = glon[order]
    x = gl[0] + np.mod(lon - gl[0], 360.0)  # each observation in [gl[0], gl[0] + 360)
    inside = finite & (x <= gl[-1])
    j = np.clip(np.searchsorted(gl, x, side="right") - 1, 0, n - 2)
    t = (x - gl[j]) / (gl[j + 1] - gl[j])
    return order[j], order[j + 1], t, inside


def rectilinear_cells(
    glon: np.ndarray, glat: np.ndarray, lon: np.ndarray, lat: np.ndarray
) -> Cells:
    """Bilinear cells on a rectilinear grid.

    Parameters
    ----------
    glon : ndarray, shape (nx,)
    glat : ndarray, shape (ny,)
        Monotonic (ascending or descending).
    lon, lat : ndarray, shape (m,)
        Observation locations in degrees; outside the latitude range (e.g.
        beyond the last latitude next to a pole) or, for a regional grid,
        the longitude range: not inside (no extrapolation).
    """
    lon = np.asarray(lon, dtype=float)
    lat = np.asarray(lat, dtype=float)
    i0, i1, tx, inside = _axis_lon(glon, lon)
    order = np.argsort(glat)
    gl = glat[order]
    inside = inside & np.isfinite(lat) & (lat >= gl[0]) & (lat <= gl[-1])
    lat = np.where(np.isfinite(lat), lat, gl[0])
    j = np.clip(np.searchsorted(gl, lat, side="right") - 1, 0, gl.size - 2)
    ty = (lat - gl[j]) / (gl[j + 1] - gl[j])
    return _corners(order[j], order[j + 1], i0, i1, tx, ty, inside)


def _periodic_x(P: np.ndarray) -> bool:
    """Whether the last column of a curvilinear grid neighbours the first (global in x)."""
    if P.shape[1] < 3:
        return False
    step = np.median(np.linalg.norm(P[:, 1:] - P[:, :-1], axis=-1))
    gap = np.median(np.linalg.norm(P[:, 0] - P[:, -1], axis=-1))
    return bool(gap < 1.5 * step)


def _gnomonic(q: np.ndarray):
    """East/north basis of the tangent plane at unit vectors ``q`` (m, 3)."""
    axis = np.where(np.abs(q[:, 2:3]) < 0.9, [[0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0]])
    e = np.cross(axis, q)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    return e, np.cross(q, e)


def _project(p: np.ndarray, q, e, n) -> tuple[np.ndarray, np.ndarray]:
    """Gnomonic coordinates of points ``p`` (m, 3) about ``q``; NaN beyond 80°."""
    d = np.einsum("mk,mk->m", p, q)
    with np.errstate(divide="ignore", invalid="ignore"):
        far = d < np.cos(np.radians(80.0))
        x = np.where(far, np.nan, np.einsum("mk,mk->m", p, e) / d)
        y = np.where(far, np.nan, np.einsum("mk,mk->m", p, n) / d)
    return x, y


def _inverse_bilinear(A, B, C, D, iterations: int = 30):
    """(s, t) with (1-s)(1-t)A + s(1-t)B + (1-s)tC + stD = 0 for 2-D corners (m, 2).

    Newton's method from the centre; NaN where it does not converge.
    """
    m = A.shape[0]
    s = np.full(m, 0.5)
    t = np.full(m, 0.5)
    scale = np.max(np.abs(np.stack([B - A, C - A, D - A])), axis=(0, 2))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(iterations):
            F = ((1 - s) * (1 - t))[:, None] * A + (s * (1 - t))[:, None] * B
            F += ((1 - s) * t)[:, None] * C + (s * t)[:, None] * D
            Fs = (1 - t)[:, None] * (B - A) + t[:, None] * (D - C)
            Ft = (1 - s)[:, None] * (C - A) + s[:, None] * (D - B)
            det = Fs[:, 0] * Ft[:, 1] - Fs[:, 1] * Ft[:, 0]
            ds = (F[:, 0] * Ft[:, 1] - F[:, 1] * Ft[:, 0]) / det
            dt = (Fs[:, 0] * F[:, 1] - Fs[:, 1] * F[:, 0]) / det
            s, t = s - ds, t - dt
        F = ((1 - s) * (1 - t))[:, None] * A + (s * (1 - t))[:, None] * B
        F += ((1 - s) * t)[:, None] * C + (s * t)[:, None] * D
        bad = ~(np.linalg.norm(F, axis=1) <= 1e-9 * scale)
    s[bad] = np.nan
    t[bad] = np.nan
    return s, t


def curvilinear_cells(grid: HorizontalGrid, lon: np.ndarray, lat: np.ndarray) -> Cells:
    """Bilinear cells, in index space, on a curvilinear grid (see the module docstring).

    Parameters
    ----------
    grid : HorizontalGrid
        With 2-D ``lon(y, x)``, ``lat(y, x)``; periodic in x when its last
        column neighbours the first.
    lon, lat : ndarray, shape (m,)
    """
    lon = np.asarray(lon, dtype=float)
    lat = np.asarray(lat, dtype=float)
    m = lon.size
    ny, nx = grid.shape
    P = grid.points()
    periodic = _periodic_x(P)
    finite = np.isfinite(lon) & np.isfinite(lat)
    found = np.zeros(m, dtype=bool)
    cj = np.zeros(m, np.int64)
    ci = np.zeros(m, np.int64)
    st = np.zeros((m, 2))
    if finite.any() and ny > 1 and nx > 1:
        todo = np.flatnonzero(finite)
        q = unit_vectors(lon[todo], lat[todo])
        e, n = _gnomonic(q)
        nj, ni = grid.nearest(lon[todo], lat[todo], k=min(4, ny * nx))
        for slot in range(nj.shape[1]):
            for dj, di in ((-1, -1), (-1, 0), (0, -1), (0, 0)):
                j0 = nj[:, slot] + dj
                i0 = ni[:, slot] + di
                if periodic:
                    i0 = np.mod(i0, nx)
                ok = ~found[todo] & (j0 >= 0) & (j0 < ny - 1) & (i0 >= 0)
                ok &= i0 < (nx if periodic else nx - 1)
                if not ok.any():
                    continue
                k = np.flatnonzero(ok)
                a, b = j0[k], i0[k]
                b1 = (b + 1) % nx
                corners = [P[a, b], P[a, b1], P[a + 1, b], P[a + 1, b1]]
                xy = [np.stack(_project(c, q[k], e[k], n[k]), axis=1) for c in corners]
                s, t = _inverse_bilinear(*xy)
                tol = 1e-9
                hit = (s >= -tol) & (s <= 1 + tol) & (t >= -tol) & (t <= 1 + tol)
                rows = todo[k[hit]]
                found[rows] = True
                cj[rows], ci[rows] = a[hit], b[hit]
                st[rows, 0] = np.clip(s[hit], 0.0, 1.0)
                st[rows, 1] = np.clip(t[hit], 0.0, 1.0)
    inside = found
    return _corners(cj, cj + 1, ci, (ci + 1) % nx, st[:, 0], st[:, 1], inside)
