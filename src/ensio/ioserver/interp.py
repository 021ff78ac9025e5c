"""Interpolation kernels of the output graph: lon/lat grids (bilinear, conservative), levels.

Pure functions on numpy arrays (no MPI, no I/O). Weights are computed once,
when a file's layout is built (:mod:`.cflayout`), as a ``scipy.sparse`` matrix
``W`` (target points × source points), and applied to every record with one
sparse product — a record costs ``nnz(W)`` multiply-adds per level.

Both horizontal methods are *separable* on rectilinear lon/lat grids, which is
why they are small exact kernels here rather than a general remapping library:

* **bilinear**: ``W = W_lat ⊗ W_lon`` with the 1-D linear weights of each
  target latitude (longitude) between the two source centres around it.
  Longitudes are periodic when the source cells span 360°. A target inside the
  outermost source *cell* but beyond its centre (near a pole) takes that row's
  value; a target outside every source cell is missing.
* **conservative** (first order): the weight of source cell ``s`` in target
  cell ``t`` is the fraction of ``t``'s spherical area that ``s`` covers. On a
  sphere a lon/lat cell's area is ``R² Δλ Δ(sin φ)``, so the overlap area is
  the product of the longitude overlap and the ``sin(latitude)`` overlap:
  ``W = W_lat ⊗ W_lon`` again, with 1-D overlap fractions. Summed over the
  targets, the overlaps of a source cell give back its area, so the
  area-weighted global integral is preserved exactly (to rounding) when the
  target cells cover the source cells.

Missing source points (NaN: the model's missing values and masked points) are
left out: with ``renormalize`` the result is ``Σ w f / Σ w`` over the valid
sources (XIOS's ``renormalize``: the mean over the covered part); without it
``Σ w f`` (missing counted as 0, as XIOS). A target with no valid source
(``Σ w = 0``) is missing.

Vertical interpolation is linear in the level values, column by column; a
target level outside the source levels' range is missing, and a target level
whose two bracketing source values are not both valid is missing (no
renormalisation along a column).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .geometry import DomainGeometry

__all__ = ["HorizontalInterp", "VerticalInterp", "edges_from_centres", "lon_bilinear",
           "lat_bilinear", "overlap_fractions", "horizontal_weights", "vertical_weights",
           "apply_weights"]

_TOL = 1e-9


def edges_from_centres(centres: np.ndarray, *, lat: bool) -> np.ndarray:
    """Cell bounds (n, 2) from 1-D centres: midpoints; the outer edges half a cell out.

    Latitudes are clipped to ±90. One centre gets a 1° cell (there is no spacing).
    """
    c = np.asarray(centres, dtype=np.float64)
    if c.size == 1:
        b = np.array([[c[0] - 0.5, c[0] + 0.5]])
    else:
        mid = 0.5 * (c[:-1] + c[1:])
        lo = np.concatenate([[c[0] - (mid[0] - c[0])], mid])
        hi = np.concatenate([mid, [c[-1] + (c[-1] - mid[-1])]])
        b = np.stack([lo, hi], axis=1)
    return np.clip(b, -90.0, 90.0) if lat else b


def _sorted_bounds(b: np.ndarray) -> np.ndarray:
    b = np.asarray(b, dtype=np.float64)
    return np.stack([b.min(axis=1), b.max(axis=1)], axis=1)


def _is_periodic(lon_bounds: np.ndarray) -> bool:
    """The cells span every longitude (their widths add up to 360°)."""
    w = np.abs(lon_bounds[:, 1] - lon_bounds[:, 0])
    return abs(w.sum() - 360.0) < 1e-6


def _linear_1d(src: np.ndarray, tgt: np.ndarray, period: float | None,
               src_bounds: np.ndarray) -> sp.csr_matrix:
    """1-D linear weights (nt, ns) of ``tgt`` between the ``src`` centres around it.

    ``period``: 360 for periodic longitudes (wrap around), else None; then a
    target beyond the outermost centre but inside its cell (``src_bounds``)
    takes that centre's value and a target outside every cell gets no weight.
    """
    src = np.asarray(src, dtype=np.float64)
    tgt = np.asarray(tgt, dtype=np.float64)
    order = np.argsort(src, kind="stable")
    s = src[order]
    ns, nt = s.size, tgt.size
    if period is not None:
        x = np.mod(tgt - s[0], period) + s[0]          # in [s0, s0 + period)
        ext = np.concatenate([s, [s[0] + period]])
        k = np.clip(np.searchsorted(ext, x, side="right") - 1, 0, ns - 1)
        x0, x1 = ext[k], ext[k + 1]
        t = (x - x0) / (x1 - x0)
        rows = np.repeat(np.arange(nt), 2)
        cols = np.stack([order[k], order[(k + 1) % ns]], axis=1).ravel()
        vals = np.stack([1.0 - t, t], axis=1).ravel()
    else:
        b = _sorted_bounds(src_bounds)[order]
        lo_edge, hi_edge = b[0, 0], b[-1, 1]
        rows_l, cols_l, vals_l = [], [], []
        for i, x in enumerate(tgt):
            if x < lo_edge - _TOL or x > hi_edge + _TOL:
                continue                                  # outside every cell: missing
            if ns == 1 or x <= s[0]:
                rows_l.append(i), cols_l.append(order[0]), vals_l.append(1.0)
            elif x >= s[-1]:
                rows_l.append(i), cols_l.append(order[-1]), vals_l.append(1.0)
            else:
                k = int(np.searchsorted(s, x, side="right") - 1)
                t = (x - s[k]) / (s[k + 1] - s[k])
                rows_l += [i, i]
                cols_l += [order[k], order[k + 1]]
                vals_l += [1.0 - t, t]
        rows, cols, vals = np.array(rows_l, int), np.array(cols_l, int), np.array(vals_l)
    m = sp.csr_matrix((vals, (rows, cols)), shape=(nt, ns))
    m.eliminate_zeros()
    return m


def lon_bilinear(src_lon: np.ndarray, src_bounds: np.ndarray, tgt_lon: np.ndarray
                 ) -> sp.csr_matrix:
    """Linear weights (nt, ns) in longitude; periodic when the source cells span 360°."""
    b = _sorted_bounds(src_bounds)
    return _linear_1d(src_lon, tgt_lon, 360.0 if _is_periodic(b) else None, b)


def lat_bilinear(src_lat: np.ndarray, src_bounds: np.ndarray, tgt_lat: np.ndarray
                 ) -> sp.csr_matrix:
    """Linear weights (nt, ns) in latitude (never periodic)."""
    return _linear_1d(src_lat, tgt_lat, None, src_bounds)


def overlap_fractions(src_b: np.ndarray, tgt_b: np.ndarray, *, period: float | None
                      ) -> sp.csr_matrix:
    """Fraction (nt, ns) of each target interval covered by each source interval.

    Intervals are rows ``[lo, hi]`` of (n, 2) arrays (either order). With
    ``period`` (360 for longitudes) they live on a circle: both are moved to
    start in ``[0, period)`` and the overlaps with the source shifted by
    ``-period, 0, +period`` are added. A target of zero width gets no weight.
    """
    s = _sorted_bounds(src_b)
    t = _sorted_bounds(tgt_b)
    if period is not None:
        s = s - (np.floor(s[:, :1] / period) * period)
        t = t - (np.floor(t[:, :1] / period) * period)
        shifts = (-period, 0.0, period)
    else:
        shifts = (0.0,)
    over = np.zeros((t.shape[0], s.shape[0]))
    for sh in shifts:
        lo = np.maximum(t[:, :1], s[None, :, 0] + sh)
        hi = np.minimum(t[:, 1:], s[None, :, 1] + sh)
        over += np.clip(hi - lo, 0.0, None)
    width = t[:, 1] - t[:, 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(width[:, None] > 0, over / np.where(width > 0, width, 1.0)[:, None], 0.0)
    return sp.csr_matrix(frac)


def horizontal_weights(src: DomainGeometry, tgt: DomainGeometry, method: str
                       ) -> sp.csr_matrix:
    """``W`` (nt_points, ns_points) from a rectilinear source to a rectilinear target.

    Points are in C order of ``(nj, ni)``. Bounds missing from a geometry are
    taken as midpoints (:func:`edges_from_centres`). ``method`` is
    ``bilinear`` or ``conservative``.
    """
    for g in (src, tgt):
        if g.type != "rectilinear":
            raise ValueError(f"domain {g.domain.id}: interpolation needs a rectilinear "
                             f"domain, not {g.type}")
    slon_b = src.lon_bounds if src.lon_bounds is not None else edges_from_centres(
        src.lon, lat=False)
    slat_b = src.lat_bounds if src.lat_bounds is not None else edges_from_centres(
        src.lat, lat=True)
    if method == "bilinear":
        w_lon = lon_bilinear(src.lon, slon_b, tgt.lon)
        w_lat = lat_bilinear(src.lat, slat_b, tgt.lat)
    elif method == "conservative":
        tlon_b = tgt.lon_bounds if tgt.lon_bounds is not None else edges_from_centres(
            tgt.lon, lat=False)
        tlat_b = tgt.lat_bounds if tgt.lat_bounds is not None else edges_from_centres(
            tgt.lat, lat=True)
        periodic = _is_periodic(_sorted_bounds(slon_b)) or _is_periodic(_sorted_bounds(tlon_b))
        w_lon = overlap_fractions(slon_b, tlon_b, period=360.0 if periodic else None)
        sin_s = np.sin(np.deg2rad(np.clip(slat_b, -90.0, 90.0)))
        sin_t = np.sin(np.deg2rad(np.clip(tlat_b, -90.0, 90.0)))
        w_lat = overlap_fractions(sin_s, sin_t, period=None)
    else:
        raise ValueError(f"unknown interpolation method {method!r}")
    w = sp.kron(w_lat, w_lon, format="csr")
    w.eliminate_zeros()
    return w


def apply_weights(w: sp.csr_matrix, data: np.ndarray, h_ndim: int, out_hshape: tuple[int, ...],
                  *, renormalize: bool) -> np.ndarray:
    """Interpolate ``data`` (..., *source horizontal) → float64 (..., *out_hshape).

    ``h_ndim`` trailing dimensions of ``data`` are the source points (C order,
    the columns of ``w``). NaN = missing (see the module docstring).
    """
    data = np.asarray(data, dtype=np.float64)
    lead = data.shape[: data.ndim - h_ndim]
    x = data.reshape(-1, w.shape[1]).T                  # (ns, nlead)
    valid = ~np.isnan(x)
    num = w @ np.where(valid, x, 0.0)
    den = w @ valid.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        if renormalize:
            out = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
        else:
            out = np.where(den > 0, num, np.nan)
    return np.ascontiguousarray(out.T).reshape(*lead, *out_hshape)


def vertical_weights(src: np.ndarray, tgt: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    """Linear weights (nt, ns) in the level values and the targets outside the source range.

    ``src`` must be strictly monotonic (either direction). Returns ``(W, outside)``
    with ``outside`` (nt,) bool.
    """
    src = np.asarray(src, dtype=np.float64)
    tgt = np.asarray(tgt, dtype=np.float64)
    d = np.diff(src)
    if src.size > 1 and not (np.all(d > 0) or np.all(d < 0)):
        raise ValueError("source level values must be strictly monotonic")
    lo, hi = src.min(), src.max()
    outside = (tgt < lo) | (tgt > hi)
    inside = np.nonzero(~outside)[0]
    b = np.stack([src, src], axis=1)
    w = _linear_1d(src, tgt[inside], None, b)            # (n_inside, ns)
    sel = sp.csr_matrix((np.ones(inside.size), (inside, np.arange(inside.size))),
                        shape=(tgt.size, inside.size))
    full = (sel @ w).tocsr()
    full.eliminate_zeros()
    return full, outside


@dataclass(frozen=True, eq=False)
class HorizontalInterp:
    """A planned horizontal interpolation: ``apply(data)`` per record."""

    weights: sp.csr_matrix
    src_shape: tuple[int, ...]
    tgt_shape: tuple[int, ...]
    renormalize: bool

    @classmethod
    def plan(cls, src: DomainGeometry, tgt: DomainGeometry, method: str,
             renormalize: bool) -> HorizontalInterp:
        return cls(horizontal_weights(src, tgt, method), src.shape, tgt.shape, renormalize)

    def apply(self, data: np.ndarray) -> np.ndarray:
        """(..., *src_shape) → (..., *tgt_shape), float64, NaN = missing."""
        return apply_weights(self.weights, data, len(self.src_shape), self.tgt_shape,
                             renormalize=self.renormalize)


@dataclass(frozen=True, eq=False)
class VerticalInterp:
    """A planned vertical interpolation: ``apply(data)`` with levels first."""

    weights: sp.csr_matrix
    outside: np.ndarray

    @classmethod
    def plan(cls, src: np.ndarray, tgt: np.ndarray) -> VerticalInterp:
        w, outside = vertical_weights(src, tgt)
        return cls(w, outside)

    def apply(self, data: np.ndarray) -> np.ndarray:
        """(nk_src, *h) → (nk_tgt, *h), float64; NaN where a bracketing level is missing."""
        data = np.asarray(data, dtype=np.float64)
        x = data.reshape(data.shape[0], -1)
        out = self.weights @ x                      # NaN propagates from the levels used
        out[self.outside, :] = np.nan
        return out.reshape(self.weights.shape[0], *data.shape[1:])
