"""Regions of the state a rank's rows cover, extended by the localization support radius.

With the regional distribution of the observations (too many for every rank
to hold their locations), each observation must reach every rank whose rows
lie within the support radius of it. Testing that exactly needs the other
ranks' rows; instead every rank describes its rows by a few **boxes** (a
handful of numbers each, cheap to all-gather), extended by the radius so that
every point within the radius of a row lies in one of its boxes. A box is
conservative: it may contain observations no row needs (the receiving rank
drops them with the exact test), never miss one.

A box has one interval per coordinate, linear ``[lo, hi]`` or circular
(start, width on a circle of a given period: longitude, a periodic 1-D
domain). The geometries are those of :mod:`ensio.analysis.localization`:

* ``lonlat``: (lon, lat) in degrees, great-circle distance on a sphere of
  radius :data:`EARTH_RADIUS_KM` km; longitude is circular (the dateline
  needs no special case), and a box whose extension reaches a pole covers
  every longitude;
* ``periodic``: one coordinate on a circle of circumference ``period``;
* ``euclidean``: any number of linear coordinates.

Pure numpy, no MPI: the exchange lives in :mod:`ensio.obs.exchange`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EARTH_RADIUS_KM", "Boxes", "circular_cover", "cover", "normalize_lonlat", "runs"]

#: Must equal :data:`ensio.analysis.localization.EARTH_RADIUS_KM` (obs/ may not import analysis/).
EARTH_RADIUS_KM = 6371.0

#: Relative and absolute widening of every extension: absorbs the rounding of
#: the exact test (chord embedding) and of the degree/radian conversions.
_REL, _ABS = 1e-6, 1e-7


@dataclass(frozen=True, eq=False)
class Boxes:
    """Boxes in a coordinate space, each tagged with the rank it belongs to.

    Attributes
    ----------
    lo, hi : ndarray, shape (b, d)
        Per box and coordinate: a linear interval ``[lo, hi]``, or for a
        circular coordinate the start ``lo`` and the width ``hi`` (``hi >=
        period``: the whole circle).
    period : ndarray, shape (d,)
        Circumference of each circular coordinate; 0 for a linear one.
    rank : ndarray of int, shape (b,)
    """

    lo: np.ndarray
    hi: np.ndarray
    period: np.ndarray
    rank: np.ndarray

    @property
    def size(self) -> int:
        return int(self.rank.size)

    def contains(self, points: np.ndarray) -> np.ndarray:
        """Which box contains which point: boolean ``(m, b)``; non-finite points are in none."""
        return self._contains(_as2d(points))

    def pairs(self, points: np.ndarray, chunk: int = 1 << 18) -> tuple[np.ndarray, np.ndarray]:
        """(point, box) index pairs of every containment, ``chunk`` tests at a time.

        The memory stays bounded by ``chunk`` whatever the number of points
        and boxes (the full ``(m, b)`` matrix of :meth:`contains` would not).
        """
        pts = _as2d(points)
        step = max(1, chunk // max(self.size, 1))
        got_p, got_b = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        for s in range(0, pts.shape[0], step):
            p, b = np.nonzero(self._contains(pts[s : s + step]))
            got_p.append(p.astype(np.int64) + s)
            got_b.append(b.astype(np.int64))
        return np.concatenate(got_p), np.concatenate(got_b)

    def _contains(self, pts: np.ndarray) -> np.ndarray:
        inside = np.ones((pts.shape[0], self.size), dtype=bool)
        for k, per in enumerate(self.period):
            x = pts[:, k : k + 1]
            lo, hi = self.lo[None, :, k], self.hi[None, :, k]
            if per > 0:
                with np.errstate(invalid="ignore"):
                    ok = (np.mod(x - lo, per) <= hi) | ((hi >= per) & np.isfinite(x))
            else:
                ok = (x >= lo) & (x <= hi)
            inside &= ok
        return inside

    @staticmethod
    def concat(parts: list[Boxes]) -> Boxes:
        """All boxes of ``parts`` (e.g. every rank's, after an all-gather)."""
        period = parts[0].period
        return Boxes(
            np.concatenate([p.lo for p in parts]),
            np.concatenate([p.hi for p in parts]),
            period,
            np.concatenate([p.rank for p in parts]),
        )


def _as2d(a: np.ndarray) -> np.ndarray:
    """Points as a float ``(m, d)`` array (a 1-D array: one coordinate per point)."""
    v = np.asarray(a, dtype=float)
    return v[:, None] if v.ndim == 1 else v


def normalize_lonlat(coords: np.ndarray) -> np.ndarray:
    """(lon, lat) of the same points on the sphere with lat in [-90, 90].

    A latitude beyond a pole (e.g. 95) names the point the unit-vector
    embedding of the exact test puts it at (lat 85, lon + 180); non-finite
    coordinates stay non-finite. Longitudes are left unwrapped.
    """
    c = np.array(coords, dtype=float, copy=True).reshape(len(coords), 2)
    bad = np.abs(c[:, 1]) > 90.0
    if bad.any():
        lon, lat = np.radians(c[bad, 0]), np.radians(c[bad, 1])
        x, y, z = np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)
        c[bad, 0] = np.degrees(np.arctan2(y, x))
        c[bad, 1] = np.degrees(np.arctan2(z, np.hypot(x, y)))  # well conditioned at the poles
    return c


def circular_cover(x: np.ndarray, period: float) -> tuple[float, float]:
    """The shortest arc (start, width) of a circle of circumference ``period`` holding all ``x``.

    The complement of the largest gap between neighbours, so points on both
    sides of the dateline (lon 179 and -179) give a 2° arc, not 358°.
    """
    v = np.sort(np.mod(np.asarray(x, dtype=float), period))
    if v.size == 0:
        return 0.0, -1.0
    gaps = np.diff(np.concatenate([v, [v[0] + period]]))
    g = int(np.argmax(gaps))
    start = v[(g + 1) % v.size]
    return float(start), float(period - gaps[g])


def runs(coords: np.ndarray, max_runs: int = 8) -> list[np.ndarray]:
    """Split rows (in state order) into at most ``max_runs`` runs, each covered by one box.

    A run ends where the last coordinate (latitude; the only one of a
    periodic domain) steps against its main direction: a block of a
    lat-major variable is one run, one spanning two levels or two variables
    is two. Beyond
    ``max_runs``, consecutive runs are merged (fewer, larger boxes: still
    correct, less tight).

    Returns
    -------
    list of ndarray of int
        Positions into ``coords``, consecutive, covering every row.
    """
    n = coords.shape[0]
    if n == 0:
        return []
    step = np.sign(np.diff(coords[:, -1]))
    main = 1.0 if (step > 0).sum() >= (step < 0).sum() else -1.0
    cuts = np.flatnonzero(step == -main)  # a step against the main direction starts a run
    bounds = np.concatenate([[0], cuts + 1, [n]])
    if bounds.size - 1 > max_runs:
        pick = np.linspace(0, bounds.size - 1, max_runs + 1).round().astype(int)
        bounds = bounds[pick]
    return [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def cover(
    coords: np.ndarray,
    kind: str,
    radius: float,
    rank: int,
    period: float | None = None,
    max_boxes: int = 8,
) -> Boxes:
    """Boxes holding every point within ``radius`` of one of the rows at ``coords``.

    Parameters
    ----------
    coords : ndarray, shape (n, d)
        The rows' coordinates, in state order (``lonlat``: lon, lat in degrees).
    kind : {"lonlat", "periodic", "euclidean"}
    radius : float
        Support radius (km for ``lonlat``); ``inf``: everything.
    rank : int
        Tag of the boxes.
    period : float, optional
        Circumference of the ``periodic`` domain.
    max_boxes : int
        At most this many boxes (:func:`runs`).

    Returns
    -------
    Boxes
        No box for no rows.
    """
    c = _as2d(coords)
    c = c[np.all(np.isfinite(c), axis=1)]
    if kind == "lonlat":
        per = np.array([360.0, 0.0])
    elif kind == "periodic":
        per = np.array([float(period)])  # type: ignore[arg-type]
    else:
        per = np.zeros(c.shape[1])
    lo, hi = [], []
    for run in runs(c, max_boxes):
        a, b = _box(c[run], kind, float(radius), per)
        lo.append(a)
        hi.append(b)
    d = per.size
    lo_a = np.array(lo, dtype=float).reshape(-1, d)
    hi_a = np.array(hi, dtype=float).reshape(-1, d)
    return Boxes(lo_a, hi_a, per, np.full(lo_a.shape[0], rank, dtype=np.int64))


def _box(c: np.ndarray, kind: str, radius: float, per: np.ndarray) -> tuple[list, list]:
    """One extended box around the points ``c`` (see :func:`cover`)."""
    if kind == "lonlat":
        return _lonlat_box(c, radius)
    lo, hi = [], []
    r = radius * (1.0 + _REL) + _ABS
    for k, p in enumerate(per):
        if p > 0:
            start, width = circular_cover(c[:, k], p)
            lo.append(start - r)
            hi.append(width + 2.0 * r)
        else:
            lo.append(c[:, k].min() - r)
            hi.append(c[:, k].max() + r)
    return lo, hi


def _lonlat_box(c: np.ndarray, radius_km: float) -> tuple[list, list]:
    """Latitude band ± δ and longitude arc ± Δλ on the sphere.

    A point within angular distance δ of a point Q at latitude φ differs from
    it by at most δ in latitude and, when the cap around Q does not reach a
    pole (sin δ < cos φ), by at most asin(sin δ / cos φ) in longitude (the
    meridians tangent to the cap). The box's largest |φ| gives the widest
    Δλ; a cap reaching a pole covers every longitude.
    """
    full = [0.0, -90.0], [720.0, 90.0]
    delta = radius_km / EARTH_RADIUS_KM
    if not np.isfinite(delta) or delta >= 0.5 * np.pi:
        return full
    d_deg = np.degrees(delta) * (1.0 + _REL) + _ABS
    lat_lo, lat_hi = float(c[:, 1].min()), float(c[:, 1].max())
    lat_lo = max(lat_lo - d_deg, -90.0)
    lat_hi = min(lat_hi + d_deg, 90.0)
    phi = np.radians(max(abs(c[:, 1].min()), abs(c[:, 1].max())))
    s = np.sin(delta * (1.0 + _REL)) / np.cos(phi) if phi < 0.5 * np.pi else np.inf
    if s >= 1.0 or lat_lo <= -90.0 or lat_hi >= 90.0:
        return [0.0, lat_lo], [720.0, lat_hi]
    dlon = np.degrees(np.arcsin(s)) * (1.0 + _REL) + _ABS
    start, width = circular_cover(c[:, 0], 360.0)
    width += 2.0 * dlon
    if width >= 360.0:
        return [0.0, lat_lo], [720.0, lat_hi]
    return [start - dlon, lat_lo], [width, lat_hi]
