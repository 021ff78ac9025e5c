"""Distances, localization tapers and regulated localization.

Every taper here is parameterized by its **support radius** (DESIGN.md,
"Localization convention"): the weight is exactly 0 at and beyond the radius,
so "the observations that influence a point" and "the observations within the
radius of a point" are the same set. That is what lets each rank hold only the
observations within the radius of its rows, and what lets a tile of points
select its candidate observations by distance alone.

Coordinates are ``(n, d)`` float arrays whose meaning depends on the geometry:

* ``lonlat``: columns (lon, lat) in degrees; great-circle distance on a sphere
  of radius :data:`EARTH_RADIUS_KM`, in km.
* ``periodic``: one column, a position on a circle of circumference ``period``
  (e.g. the grid index of a Lorenz-96 variable with period 40).
* ``euclidean``: any number of columns, straight-line distance.

With vertical localization (:class:`VerticalLocalization`) the coordinates
carry one more column, the **last**: the level, in the units of the level
coordinate (e.g. metres of depth). The horizontal geometry never sees it;
the vertical taper of ``|level_a - level_b|`` multiplies the horizontal one.
A non-finite level (a 2-D variable's row, a surface observation of one)
means "no level": its vertical weight is 1 against everything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = [
    "EARTH_RADIUS_KM",
    "GeometryKind",
    "TaperName",
    "Geometry",
    "Localization",
    "VerticalLocalization",
    "as_coords",
    "unit_vectors",
    "distances",
    "prepare",
    "prepared_distances",
    "gaspari_cohn",
    "gaussian_taper",
    "exponential_taper",
    "step_taper",
    "TAPERS",
    "regulate",
]

EARTH_RADIUS_KM = 6371.0

GeometryKind = Literal["lonlat", "periodic", "euclidean"]
TaperName = Literal["gaspari-cohn", "gaussian", "exponential", "step"]

# GC(c) / GC(0) at half the support radius (r = 1 in eq. 4.10): 5/24.
_GC_AT_HALF = 5.0 / 24.0


@dataclass(frozen=True)
class Geometry:
    """How distances between coordinates are measured.

    Attributes
    ----------
    kind : {"lonlat", "periodic", "euclidean"}
    period : float or None
        Circumference of the 1-D periodic domain (``kind == "periodic"`` only).
    """

    kind: GeometryKind = "lonlat"
    period: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("lonlat", "periodic", "euclidean"):
            raise ValueError(f"unknown geometry {self.kind!r}")
        if self.kind == "periodic" and not (self.period is not None and self.period > 0):
            raise ValueError("a periodic geometry needs a period > 0")


@dataclass(frozen=True)
class VerticalLocalization:
    """The vertical taper, multiplied with the horizontal one.

    Attributes
    ----------
    taper : {"gaspari-cohn", "gaussian", "exponential", "step"}
    radius : float
        Support radius in the units of the level coordinate (metres for a
        depth in metres): weight 0 at and beyond it, as horizontally.
    """

    taper: TaperName = "gaspari-cohn"
    radius: float = np.inf

    def __post_init__(self) -> None:
        if not self.radius > 0:
            raise ValueError(f"vertical localization radius must be > 0, got {self.radius}")
        if self.taper not in TAPERS:
            raise ValueError(f"unknown taper {self.taper!r}")

    def weights(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Vertical weights ``(p, c)`` of levels ``a`` (p,) against levels ``b`` (c,).

        1 where either level is non-finite (no level). Each pair's weight is
        a function of the two levels alone (the taper of their distinct values,
        then gathered: levels repeat, pairs of levels are few), so it does not
        depend on which other points or observations are in the call.
        """
        ua, ia = np.unique(a, return_inverse=True)
        ub, ib = np.unique(b, return_inverse=True)
        dz = np.abs(np.subtract.outer(ua, ub))
        none = ~np.isfinite(dz)  # either level missing (NaN or inf)
        dz[none] = 0.0
        table = TAPERS[self.taper](dz, self.radius)
        table[none] = 1.0
        return table[ia.ravel()][:, ib.ravel()]


@dataclass(frozen=True)
class Localization:
    """Observation localization: geometry, taper and support radius.

    Attributes
    ----------
    geometry : Geometry
    taper : {"gaspari-cohn", "gaussian", "exponential", "step"}
    radius : float
        Support radius in the geometry's distance unit (km for lon/lat). The
        taper is 0 at and beyond it. ``inf`` means no localization (weight 1
        for every observation), which makes LETKF identical to ETKF.
    regulated : bool
        Use the regulated weights of Nerger et al. (2012), see :func:`regulate`.
    vertical : VerticalLocalization or None
        Vertical taper; coordinates then end with a level column (module
        docstring). ``None``: horizontal only.
    """

    geometry: Geometry = Geometry()
    taper: TaperName = "gaspari-cohn"
    radius: float = np.inf
    regulated: bool = False
    vertical: VerticalLocalization | None = None

    def __post_init__(self) -> None:
        if not self.radius > 0:
            raise ValueError(f"localization radius must be > 0, got {self.radius}")
        if self.taper not in TAPERS:
            raise ValueError(f"unknown taper {self.taper!r}")

    def weights(self, dist: np.ndarray) -> np.ndarray:
        """Taper weights in [0, 1] for distances ``dist`` (any shape)."""
        return TAPERS[self.taper](dist, self.radius)

    def coords(self, coords: np.ndarray) -> np.ndarray:
        """:func:`as_coords` of coordinates with the level column when :attr:`vertical`.

        The level column's non-finite values become ``inf`` (NaN never equals
        itself, so rows without a level would not share an analysis point).
        """
        if self.vertical is None:
            return as_coords(coords, self.geometry)
        c = np.array(coords, dtype=float)
        if c.ndim != 2 or c.shape[1] < 2:
            raise ValueError(f"coordinates with a level column must be (n, d + 1), got {c.shape}")
        as_coords(c[:, :-1], self.geometry)
        lev = c[:, -1]
        lev[~np.isfinite(lev)] = np.inf
        return c

    def split(self, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(horizontal (n, d), levels (n,) or None)`` of coordinates from :meth:`coords`."""
        if self.vertical is None:
            return coords, None
        return coords[:, :-1], coords[:, -1]


def as_coords(coords: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Return ``coords`` as a float ``(n, d)`` array checked against ``geometry``.

    A 1-D array is read as one coordinate per point (periodic/euclidean 1-D).
    """
    c = np.asarray(coords, dtype=float)
    if c.ndim == 1:
        c = c[:, None]
    if c.ndim != 2:
        raise ValueError(f"coordinates must be (n, d), got shape {c.shape}")
    if geometry.kind == "lonlat" and c.shape[1] != 2:
        raise ValueError(f"lon/lat coordinates must be (n, 2), got shape {c.shape}")
    if geometry.kind == "periodic" and c.shape[1] != 1:
        raise ValueError(f"periodic coordinates must be (n,) or (n, 1), got {c.shape}")
    return c


def unit_vectors(coords: np.ndarray) -> np.ndarray:
    """Unit vectors ``(n, 3)`` on the sphere for (lon, lat) degrees ``(n, 2)``."""
    lon = np.deg2rad(coords[:, 0])
    lat = np.deg2rad(coords[:, 1])
    cl = np.cos(lat)
    return np.stack([cl * np.cos(lon), cl * np.sin(lon), np.sin(lat)], axis=1)


def _outer_sq_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances ``(na, nb)`` of rows of a and b, element by element."""
    out = np.subtract.outer(a[:, 0], b[:, 0])
    out *= out
    if a.shape[1] > 1:
        tmp = np.empty_like(out)
        for j in range(1, a.shape[1]):
            np.subtract.outer(a[:, j], b[:, j], out=tmp)
            tmp *= tmp
            out += tmp
    return out


def prepare(geometry: Geometry, coords: np.ndarray) -> np.ndarray:
    """Coordinates in the form :func:`prepared_distances` works on.

    Unit vectors ``(n, 3)`` for lon/lat (the trigonometry is done once per
    point, not once per pair), the ``(n, d)`` coordinates otherwise.
    """
    c = as_coords(coords, geometry)
    return unit_vectors(c) if geometry.kind == "lonlat" else c


def prepared_distances(geometry: Geometry, pa: np.ndarray, pb: np.ndarray) -> np.ndarray:
    """:func:`distances` for coordinates already passed through :func:`prepare`."""
    if geometry.kind == "lonlat":
        out = _outer_sq_dist(pa, pb)
        np.sqrt(out, out=out)
        out *= 0.5
        np.minimum(out, 1.0, out=out)
        np.arcsin(out, out=out)
        out *= 2.0 * EARTH_RADIUS_KM
        return out
    if geometry.kind == "periodic":
        p = float(geometry.period)  # type: ignore[arg-type]
        d = np.abs(np.subtract.outer(pa[:, 0], pb[:, 0])) % p
        return np.minimum(d, p - d, out=d)
    out = _outer_sq_dist(pa, pb)
    return np.sqrt(out, out=out)


def distances(geometry: Geometry, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance matrix between point sets.

    Computed element by element (no dot-product GEMM) so the distance of a
    pair does not depend on which other points are in the call: the batched
    and pointwise paths and every rank decomposition see the same numbers.
    Great-circle distances come from the chord between unit vectors,
    ``2R asin(chord/2)``, which stays accurate for nearby points (the arccos
    of a dot product loses half the digits there).

    Parameters
    ----------
    geometry : Geometry
    a : ndarray, shape (na, d)
    b : ndarray, shape (nb, d)

    Returns
    -------
    ndarray, shape (na, nb)
        km for ``lonlat``, coordinate units otherwise.
    """
    return prepared_distances(geometry, prepare(geometry, a), prepare(geometry, b))


def gaspari_cohn(dist: np.ndarray, radius: float) -> np.ndarray:
    """Gaspari & Cohn (1999, QJRMS 125, eq. 4.10) fifth-order piecewise rational taper.

    The half-width is ``c = radius / 2``: the function is 1 at 0, ``5/24`` at
    ``c`` and 0 at and beyond ``2c = radius``. Tiny negative values from
    rounding close to the radius are clipped to 0.

    Parameters
    ----------
    dist : ndarray
        Non-negative distances.
    radius : float
        Support radius (``inf`` gives weight 1 everywhere).
    """
    dist = np.asarray(dist, dtype=float)
    r = dist * (2.0 / radius)
    # both branches on the whole array (in place), then select: cheaper than
    # boolean gathers for the dense tiles of the batched kernel
    inner = -0.25 * r
    for c in (0.5, 0.625, -5.0 / 3.0):
        inner += c
        inner *= r
    inner *= r
    inner += 1.0
    outer = r / 12.0
    for c in (-0.5, 0.625, 5.0 / 3.0, -5.0):
        outer += c
        outer *= r
    outer += 4.0
    with np.errstate(divide="ignore", invalid="ignore"):
        outer -= (2.0 / 3.0) / r
    w = np.where(r <= 1.0, inner, outer)
    w[~(dist < radius)] = 0.0
    return np.maximum(w, 0.0, out=w)


def gaussian_taper(dist: np.ndarray, radius: float) -> np.ndarray:
    """Gaussian ``exp(-d^2 / (2 L^2))`` truncated to 0 at the support radius.

    A Gaussian has no compact support; its length scale is fixed by making it
    equal Gaspari–Cohn at half the support radius (``5/24`` at ``d = radius/2``),
    so ``L = radius / (2 sqrt(2 ln(24/5))) ≈ 0.2823 radius``. It is 0 at and
    beyond ``radius``, where the untruncated value would be
    ``(5/24)^4 ≈ 1.9e-3`` (the size of the jump).
    """
    dist = np.asarray(dist, dtype=float)
    if np.isinf(radius):
        return np.ones_like(dist)
    half = 0.5 * radius
    w = _GC_AT_HALF ** ((dist / half) ** 2)
    return np.where(dist < radius, w, 0.0)


def exponential_taper(dist: np.ndarray, radius: float) -> np.ndarray:
    """Exponential ``exp(-d / L)`` truncated to 0 at the support radius.

    As for :func:`gaussian_taper`, ``L`` makes the taper equal Gaspari–Cohn at
    half the radius: ``L = radius / (2 ln(24/5)) ≈ 0.3188 radius``. The
    untruncated value at the radius is ``(5/24)^2 ≈ 0.043`` (the jump).
    """
    dist = np.asarray(dist, dtype=float)
    if np.isinf(radius):
        return np.ones_like(dist)
    w = _GC_AT_HALF ** (dist / (0.5 * radius))
    return np.where(dist < radius, w, 0.0)


def step_taper(dist: np.ndarray, radius: float) -> np.ndarray:
    """1 strictly inside the support radius, 0 at and beyond it."""
    dist = np.asarray(dist, dtype=float)
    return np.where(dist < radius, 1.0, 0.0)


TAPERS: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "gaspari-cohn": gaspari_cohn,
    "gaussian": gaussian_taper,
    "exponential": exponential_taper,
    "step": step_taper,
}


def regulate(taper: np.ndarray, obs_var: np.ndarray, state_var: np.ndarray) -> np.ndarray:
    """Regulated localization weights (Nerger, Janjić, Schröter & Hiller 2012).

    Localizing R⁻¹ with a taper ρ damps an observation less than localizing
    the covariance with the same ρ would. For a single observation the two
    gains agree when the R⁻¹ weight is

    ``ρ_reg = ρ σ_o² / (σ_o² + (1 − ρ) σ_b²)``,

    with σ_b² the observed prior variance (HPHᵀ). This is what Nerger et al.
    (2012, QJRMS 138, 802–812) use, with σ_b² the mean observed ensemble
    variance of the local analysis domain (ensio: of the observations inside
    the support radius of the point). ``ρ_reg ≤ ρ``, equal at ρ ∈ {0, 1}.

    Parameters
    ----------
    taper : ndarray, shape (p, m)
        Taper weights ρ of m observations for p points.
    obs_var : ndarray, shape (m,)
        Observation error variances σ_o².
    state_var : ndarray, shape (p,) or (p, m)
        σ_b² for each point (mean over its local observations) or per pair.

    Returns
    -------
    ndarray, shape (p, m)
    """
    sv = np.asarray(state_var, dtype=float)
    if sv.ndim == 1:
        sv = sv[:, None]
    return taper * obs_var / (obs_var + (1.0 - taper) * sv)
