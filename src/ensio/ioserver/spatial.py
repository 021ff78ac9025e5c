"""Spatial operations of the output graph: lon/lat box extraction, area-weighted means.

Pure functions on numpy arrays (no MPI, no I/O). A field's array has the
levels first and the horizontal dimensions last: ``(nk, nj, ni)`` / ``(nj, ni)``
on a rectilinear or curvilinear domain, ``(nk, ni)`` / ``(ni,)`` on an
unstructured one; NaN is a missing value and is excluded from every mean.

Extraction is a plan (:func:`plan_extract`), built once per file field from
the domain's geometry — the index sets never change during a run — and
applied to every record; :func:`extract` is the one-shot form.

Weights (see :func:`~.geometry.cell_weights`): the domain's cell areas if the
clients sent them, else exact spherical areas from rectilinear bounds, else
cos(latitude). Zonal means of a curvilinear or unstructured domain average
over latitude bands: ``nj_glo`` equal bands from −90° to 90° on a curvilinear
domain, 180 bands of 1° on an unstructured one; a point belongs to the band
holding its centre.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import Box, DomainDef
from .geometry import DomainGeometry, cell_weights

__all__ = ["Extraction", "plan_extract", "extract", "global_mean", "zonal_mean", "zonal_bands",
           "region_reduce"]

_TOL = 1e-9


def _lon_offsets(lon: np.ndarray, box: Box) -> tuple[np.ndarray, float] | None:
    """East offsets of ``lon`` from the box's west edge and the box width (degrees).

    None when the box spans every longitude. A box whose east edge is below
    its west edge (``[350, 10]``) crosses the 0°/360° meridian, as does
    ``[-30, 30]`` on a 0..360 grid: offsets are taken modulo 360, so a grid in
    −180..180 or 0..360 selects the same points.
    """
    w, e = box.lon
    if e - w >= 360.0 - _TOL:
        return None
    width = (e - w) % 360.0 if e < w else e - w
    return np.mod(lon - w, 360.0), width


def _lat_inside(lat: np.ndarray, box: Box) -> np.ndarray:
    s, n = box.lat
    return (lat >= s - _TOL) & (lat <= n + _TOL)


@dataclass(frozen=True, eq=False)
class Extraction:
    """A box extraction planned on one domain: ``apply(data)`` → the box's data.

    ``geometry`` is the extracted domain (same id, the box's sizes). On a
    rectilinear domain the box is an index product (longitudes re-expressed
    from the box's west edge, so they increase across the meridian); on a
    curvilinear one it is the bounding index box of the points inside, with
    the points outside set missing (and masked in ``geometry``); on an
    unstructured one it is the cells inside.
    """

    geometry: DomainGeometry
    rows: np.ndarray | slice
    cols: np.ndarray | slice
    outside: np.ndarray | None

    def apply(self, data: np.ndarray) -> np.ndarray:
        """``data`` (..., *horizontal) → float64 (..., *box horizontal), a new array."""
        data = np.asarray(data, dtype=np.float64)
        if self.geometry.type == "unstructured":
            out = data[..., self.cols]
        else:
            out = data[..., self.rows, :][..., self.cols]
        out = np.array(out, dtype=np.float64)
        if self.outside is not None:
            out[..., self.outside] = np.nan
        return out


def _sub(g: DomainGeometry, ni: int, nj: int, **arrays: np.ndarray | None) -> DomainGeometry:
    d = g.domain
    dom = DomainDef(id=d.id, type=d.type, ni_glo=ni, nj_glo=nj, nvertex=d.nvertex)
    return DomainGeometry(dom, **arrays)


def _take(a: np.ndarray | None, index: tuple) -> np.ndarray | None:
    return None if a is None else np.array(a[index])


def plan_extract(geometry: DomainGeometry, box: Box) -> Extraction:
    """Plan the extraction of ``box`` (degrees, inclusive) from ``geometry``.

    Raises ValueError naming the domain when no point lies in the box.
    """
    g = geometry
    if g.type == "rectilinear":
        plan = _plan_rectilinear(g, box)
    else:
        inside = _lat_inside(g.lat, box)
        off = _lon_offsets(g.lon, box)
        if off is not None:
            inside &= off[0] <= off[1] + _TOL
        if g.mask is not None:
            inside &= g.mask
        if not inside.any():
            plan = None
        elif g.type == "unstructured":
            (idx,) = np.nonzero(inside)
            sel = (idx,)
            plan = Extraction(
                _sub(g, idx.size, 1, lon=g.lon[idx], lat=g.lat[idx],
                     lon_bounds=_take(g.lon_bounds, sel), lat_bounds=_take(g.lat_bounds, sel),
                     area=_take(g.area, sel), mask=None),
                slice(None), idx, None)
        else:
            jj = np.nonzero(inside.any(axis=1))[0]
            ii = np.nonzero(inside.any(axis=0))[0]
            rows, cols = slice(jj[0], jj[-1] + 1), slice(ii[0], ii[-1] + 1)
            sel = (rows, cols)
            sub_inside = inside[sel]
            plan = Extraction(
                _sub(g, cols.stop - cols.start, rows.stop - rows.start,
                     lon=g.lon[sel], lat=g.lat[sel], lon_bounds=_take(g.lon_bounds, sel),
                     lat_bounds=_take(g.lat_bounds, sel), area=_take(g.area, sel),
                     mask=sub_inside),
                rows, cols, None if sub_inside.all() else ~sub_inside)
    if plan is None:
        raise ValueError(
            f"domain {g.domain.id}: no point in the extract box lon {list(box.lon)} "
            f"lat {list(box.lat)}"
        )
    return plan


def _plan_rectilinear(g: DomainGeometry, box: Box) -> Extraction | None:
    (jj,) = np.nonzero(_lat_inside(g.lat, box))
    off = _lon_offsets(g.lon, box)
    if off is None:
        ii = np.arange(g.lon.size)
        lon = g.lon
    else:
        offsets, width = off
        (ii,) = np.nonzero(offsets <= width + _TOL)
        ii = ii[np.argsort(offsets[ii], kind="stable")]
        lon = box.lon[0] + offsets
    if jj.size == 0 or ii.size == 0:
        return None
    lon_b = None
    if g.lon_bounds is not None:
        lon_b = g.lon_bounds[ii] + (lon[ii] - g.lon[ii])[:, None]
    sel = np.ix_(jj, ii)
    geo = _sub(g, ii.size, jj.size, lon=lon[ii], lat=g.lat[jj], lon_bounds=lon_b,
               lat_bounds=_take(g.lat_bounds, (jj,)), area=_take(g.area, sel),
               mask=_take(g.mask, sel))
    return Extraction(geo, jj, ii, None)


def extract(data: np.ndarray, geometry: DomainGeometry, box: Box
            ) -> tuple[np.ndarray, DomainGeometry]:
    """Extract ``box`` from ``data`` (..., *horizontal): (box data, box geometry)."""
    plan = plan_extract(geometry, box)
    return plan.apply(data), plan.geometry


def _weighted(data: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per point: (w·data, w) with missing points (NaN or zero weight) set to 0."""
    data = np.asarray(data, dtype=np.float64)
    valid = ~np.isnan(data) & (w > 0)
    wv = np.where(valid, w, 0.0)
    return np.where(valid, data, 0.0) * wv, wv


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def global_mean(data: np.ndarray, geometry: DomainGeometry,
                weights: np.ndarray | None = None) -> np.ndarray:
    """Area-weighted mean over the valid points of each level.

    ``data`` (nk, *horizontal) or (*horizontal,) → float64 (nk,) or ();
    NaN where a level has no valid point. ``weights`` (horizontal shape)
    defaults to :func:`~.geometry.cell_weights` (pass it to compute it once).
    """
    w = cell_weights(geometry) if weights is None else weights
    h = len(geometry.shape)
    wd, wv = _weighted(data, w)
    axes = tuple(range(-h, 0))
    return np.asarray(_ratio(wd.sum(axis=axes), wv.sum(axis=axes)))


def zonal_bands(geometry: DomainGeometry) -> tuple[np.ndarray, np.ndarray | None]:
    """Latitudes (nb,) and bounds (nb, 2) of the zonal-mean output.

    A rectilinear domain keeps its own latitudes (bounds if known); other
    domains use equal bands: ``nj_glo`` (curvilinear) or 180 (unstructured).
    """
    if geometry.type == "rectilinear":
        return geometry.lat, geometry.lat_bounds
    nb = geometry.domain.nj_glo if geometry.type == "curvilinear" else 180
    edges = np.linspace(-90.0, 90.0, nb + 1)
    return 0.5 * (edges[:-1] + edges[1:]), np.stack([edges[:-1], edges[1:]], axis=1)


def zonal_mean(data: np.ndarray, geometry: DomainGeometry,
               weights: np.ndarray | None = None) -> np.ndarray:
    """Area-weighted mean along longitude for each latitude (row or band).

    Rectilinear: ``data`` (nk, nj, ni) / (nj, ni) → (nk, nj) / (nj,).
    Curvilinear / unstructured: → (nk, nb) / (nb,) over the bands of
    :func:`zonal_bands`. NaN where a row or band has no valid point.
    """
    w = cell_weights(geometry) if weights is None else weights
    wd, wv = _weighted(data, w)
    if geometry.type == "rectilinear":
        return _ratio(wd.sum(axis=-1), wv.sum(axis=-1))
    lat, _ = zonal_bands(geometry)
    nb = lat.size
    band = np.clip(np.floor((geometry.lat.ravel() + 90.0) / 180.0 * nb), 0, nb - 1)
    band = band.astype(np.intp)
    npts = band.size
    lead = wd.shape[: wd.ndim - len(geometry.shape)]
    nlead = int(np.prod(lead, dtype=np.int64))
    idx = (band[None, :] + nb * np.arange(nlead)[:, None]).ravel()
    num = np.bincount(idx, weights=wd.reshape(nlead * npts), minlength=nlead * nb)
    den = np.bincount(idx, weights=np.broadcast_to(wv, wd.shape).reshape(nlead * npts),
                      minlength=nlead * nb)
    return _ratio(num, den).reshape(*lead, nb)


def region_reduce(data: np.ndarray, masks: np.ndarray, op: str,
                  weights: np.ndarray) -> np.ndarray:
    """One value per region: ``data`` (..., *horizontal) → float64 (..., nregion).

    ``masks`` (nregion, *horizontal) bool selects each region's points (regions
    may overlap); missing points (NaN, zero weight) are left out. ``op``:
    ``mean`` (weighted by ``weights``, the cell areas of
    :func:`~.geometry.cell_weights`), ``sum`` (plain sum of the values), ``min``,
    ``max``. NaN for a region without a valid point.
    """
    data = np.asarray(data, dtype=np.float64)
    h = masks.ndim - 1
    lead = data.shape[: data.ndim - h]
    x = data.reshape(*lead, -1)                                # (..., npts)
    m = masks.reshape(masks.shape[0], -1)                      # (nr, npts)
    w = np.broadcast_to(weights, masks.shape[1:]).reshape(-1)
    valid = ~np.isnan(x) & (w > 0)
    xv = np.where(valid, x, 0.0)
    if op in ("mean", "sum"):
        mw = m * (w if op == "mean" else (w > 0))               # (nr, npts)
        num = xv @ mw.T                                        # (..., nr)
        den = valid.astype(np.float64) @ mw.T
        if op == "sum":
            return np.where(den > 0, num, np.nan)
        return _ratio(num, den)
    fill = np.inf if op == "min" else -np.inf
    fold = np.min if op == "min" else np.max
    out = np.empty((*lead, m.shape[0]))
    for r in range(m.shape[0]):
        sel = np.where(valid & m[r], x, fill)
        red = fold(sel, axis=-1)
        out[..., r] = np.where(np.isinf(red) & (red == fill), np.nan, red)
    return out
