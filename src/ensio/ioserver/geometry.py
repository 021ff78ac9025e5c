"""The global geometry of a domain: coordinates, bounds, cell areas and mask.

The clients send their part of each domain (lon/lat, optional bounds, mask and
area); the server core assembles the parts into one :class:`DomainGeometry`
per domain. The spatial operations (:mod:`.spatial`) and the CF writer
(:mod:`.writer`) read only this object, so they never see a decomposition.

Shapes (C order) per domain type:

=============  ==========  ==========  ====================  ==============
type           lon         lat         lon/lat_bounds        area, mask
=============  ==========  ==========  ====================  ==============
rectilinear    (ni,)       (nj,)       (ni, 2), (nj, 2)      (nj, ni)
curvilinear    (nj, ni)    (nj, ni)    (nj, ni, 4) each      (nj, ni)
unstructured   (ni,)       (ni,)       (ni, nvertex) each    (ni,)
=============  ==========  ==========  ====================  ==============
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import DomainDef

__all__ = ["DomainGeometry", "EARTH_RADIUS", "regular_geometry", "cell_weights"]

#: Sphere radius (m) of the cell areas computed from bounds (as ``io/`` and
#: the localization distances: 6371 km).
EARTH_RADIUS = 6_371_000.0


@dataclass(frozen=True, eq=False)
class DomainGeometry:
    """Global coordinates of one domain (see the module table for the shapes).

    ``mask`` is True where a point is valid; masked points are missing in
    every output. ``area`` (m^2), when given, weights the spatial means; else
    they use exact spherical cell areas from rectilinear bounds, else cos(lat).
    Constructing one checks every shape against ``domain``, so a bad client
    part is reported here, naming the domain, and not deep inside a mean.
    """

    domain: DomainDef
    lon: np.ndarray
    lat: np.ndarray
    lon_bounds: np.ndarray | None = None
    lat_bounds: np.ndarray | None = None
    area: np.ndarray | None = None
    mask: np.ndarray | None = None

    def __post_init__(self) -> None:
        d = self.domain
        horiz = d.shape
        if d.type == "rectilinear":
            want = {"lon": (d.ni_glo,), "lat": (d.nj_glo,),
                    "lon_bounds": (d.ni_glo, 2), "lat_bounds": (d.nj_glo, 2)}
        elif d.type == "curvilinear":
            want = {"lon": horiz, "lat": horiz, "lon_bounds": (*horiz, 4),
                    "lat_bounds": (*horiz, 4)}
        else:
            nv = d.nvertex if d.nvertex is not None else (
                self.lon_bounds.shape[-1] if self.lon_bounds is not None else 0)
            want = {"lon": horiz, "lat": horiz, "lon_bounds": (*horiz, nv),
                    "lat_bounds": (*horiz, nv)}
        want.update(area=horiz, mask=horiz)
        for name, shape in want.items():
            value = getattr(self, name)
            if value is None:
                continue
            arr = np.asarray(value, dtype=bool if name == "mask" else np.float64)
            if arr.shape != shape:
                raise ValueError(
                    f"domain {d.id}: {name} has shape {arr.shape}, expected {shape}"
                )
            object.__setattr__(self, name, arr)
        if (self.lon_bounds is None) != (self.lat_bounds is None):
            raise ValueError(f"domain {d.id}: give both lon and lat bounds or neither")

    @property
    def type(self) -> str:
        return self.domain.type

    @property
    def shape(self) -> tuple[int, ...]:
        """Horizontal shape: ``(nj, ni)`` or ``(ni,)``."""
        return self.domain.shape

    def lat_points(self) -> np.ndarray:
        """Latitude of every point, broadcast to the horizontal shape."""
        if self.type == "rectilinear":
            return np.broadcast_to(self.lat[:, None], self.shape)
        return self.lat

    def lon_points(self) -> np.ndarray:
        """Longitude of every point, broadcast to the horizontal shape."""
        if self.type == "rectilinear":
            return np.broadcast_to(self.lon[None, :], self.shape)
        return self.lon


def regular_geometry(domain: DomainDef, *, bounds: bool = True) -> DomainGeometry:
    """A regular global lon/lat grid of ``domain`` (rectilinear; cell centres).

    lon = (i + 1/2)·360/ni, lat = −90 + (j + 1/2)·180/nj, with their cell
    bounds. The default geometry of a rectilinear domain whose clients send no
    coordinates, and the grid of the tests.
    """
    if domain.type != "rectilinear":
        raise ValueError(f"domain {domain.id}: a regular grid is rectilinear, not {domain.type}")
    ni, nj = domain.ni_glo, domain.nj_glo
    lon_edges = np.linspace(0.0, 360.0, ni + 1)
    lat_edges = np.linspace(-90.0, 90.0, nj + 1)
    lon = 0.5 * (lon_edges[:-1] + lon_edges[1:])
    lat = 0.5 * (lat_edges[:-1] + lat_edges[1:])
    if not bounds:
        return DomainGeometry(domain, lon, lat)
    return DomainGeometry(
        domain, lon, lat,
        lon_bounds=np.stack([lon_edges[:-1], lon_edges[1:]], axis=1),
        lat_bounds=np.stack([lat_edges[:-1], lat_edges[1:]], axis=1),
    )


def cell_weights(geometry: DomainGeometry) -> np.ndarray:
    """Area weights of the points, 0 where masked; shape = horizontal shape.

    ``geometry.area`` if given; else, on a rectilinear grid with bounds, the
    exact spherical cell area R²·Δλ·(sin φ₂ − sin φ₁); else cos(lat) (the
    area of equal-angle cells up to a constant — the means are ratios, so the
    constant cancels; on an irregular grid without areas or bounds it is the
    only weight the geometry allows, and it is documented as such).
    """
    g = geometry
    if g.area is not None:
        w = np.array(g.area, dtype=np.float64)
    elif g.type == "rectilinear" and g.lon_bounds is not None:
        dlon = np.deg2rad(np.abs(g.lon_bounds[:, 1] - g.lon_bounds[:, 0]))
        lat_b = np.deg2rad(np.clip(g.lat_bounds, -90.0, 90.0))
        dsin = np.abs(np.sin(lat_b[:, 1]) - np.sin(lat_b[:, 0]))
        w = EARTH_RADIUS**2 * dsin[:, None] * dlon[None, :]
    else:
        w = np.array(np.cos(np.deg2rad(g.lat_points())), dtype=np.float64)
        w = np.clip(w, 0.0, None)
    if g.mask is not None:
        w = np.where(g.mask, w, 0.0)
    return w
