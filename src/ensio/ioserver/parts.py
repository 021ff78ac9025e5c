"""A model rank's part of a domain, and the assembly of parts into global arrays.

Pure (no MPI): the server core, the attached mode and the sync mode all turn
the parts the model ranks declared into one global :class:`DomainGeometry`
per domain, and place each rank's field part into the global field array,
with the same code, so the three modes give identical files.

Local array shapes (C order) of a part ``[jbegin:jbegin+nj, ibegin:ibegin+ni]``:
rectilinear lon ``(ni,)``, lat ``(nj,)``, bounds ``(ni, 2)``/``(nj, 2)``;
curvilinear lon/lat ``(nj, ni)``, bounds ``(nj, ni, 4)``; unstructured
lon/lat ``(ni,)``, bounds ``(ni, nvertex)``; mask (True = valid) and area
``(nj, ni)`` or ``(ni,)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .config import DomainDef
from .protocol import Flags

__all__ = ["Part", "LocalDomain", "make_local_domain", "domain_message", "domain_from_message",
           "assemble_geometry", "place", "local_shape"]

_ARRAYS = ("lon", "lat", "lon_bounds", "lat_bounds", "mask", "area")
#: DOMAIN payload order: flag bit, arrays.
_GROUPS = ((Flags.LONLAT, ("lon", "lat")), (Flags.BOUNDS, ("lon_bounds", "lat_bounds")),
           (Flags.MASK, ("mask",)), (Flags.AREA, ("area",)))


@dataclass(frozen=True)
class Part:
    """Index range of a rank's part (unstructured: ``jbegin == 0``, ``nj == 1``)."""

    ibegin: int = 0
    ni: int = 0
    jbegin: int = 0
    nj: int = 0

    @property
    def size(self) -> int:
        """Horizontal points of the part."""
        return self.ni * self.nj

    def shape(self, domain: DomainDef) -> tuple[int, ...]:
        return (self.ni,) if domain.type == "unstructured" else (self.nj, self.ni)

    def index(self, domain: DomainDef) -> tuple[slice, ...]:
        """The part's horizontal slices into a global array (trailing dimensions)."""
        i = slice(self.ibegin, self.ibegin + self.ni)
        if domain.type == "unstructured":
            return (i,)
        return (slice(self.jbegin, self.jbegin + self.nj), i)


@dataclass(frozen=True)
class LocalDomain:
    """What one model rank declared for one domain (local arrays, shapes above)."""

    domain: DomainDef
    part: Part
    lon: np.ndarray | None = None
    lat: np.ndarray | None = None
    lon_bounds: np.ndarray | None = None
    lat_bounds: np.ndarray | None = None
    mask: np.ndarray | None = None
    area: np.ndarray | None = None


def _shapes(d: DomainDef, p: Part, nvertex: int) -> dict[str, tuple[int, ...]]:
    hor = p.shape(d)
    if d.type == "rectilinear":
        return {"lon": (p.ni,), "lat": (p.nj,), "lon_bounds": (p.ni, 2),
                "lat_bounds": (p.nj, 2), "mask": hor, "area": hor}
    if d.type == "curvilinear":
        return {"lon": hor, "lat": hor, "lon_bounds": (*hor, 4), "lat_bounds": (*hor, 4),
                "mask": hor, "area": hor}
    return {"lon": hor, "lat": hor, "lon_bounds": (p.ni, nvertex),
            "lat_bounds": (p.ni, nvertex), "mask": hor, "area": hor}


def _nvertex(d: DomainDef, lon_bounds: np.ndarray | None) -> int:
    if d.nvertex is not None:
        return d.nvertex
    if lon_bounds is not None and np.ndim(lon_bounds) == 2:
        return int(np.shape(lon_bounds)[1])
    return 0


def make_local_domain(d: DomainDef, ibegin: int, ni: int, jbegin: int = 0, nj: int = 1,
                      **arrays: np.ndarray | None) -> LocalDomain:
    """Check a rank's declaration against the domain; ``ValueError`` naming what is wrong.

    Arrays may be given flat or shaped; they are reshaped to the canonical
    shapes of the module docstring (``mask`` to bool, the others to float64).
    """
    if d.type == "unstructured" and (jbegin, nj) != (0, 1):
        raise ValueError(f"domain {d.id!r} is unstructured: jbegin must be 0 and nj 1")
    if ni < 0 or nj < 0 or ibegin < 0 or jbegin < 0 or ibegin + ni > d.ni_glo or (
            jbegin + nj > d.nj_glo):
        raise ValueError(
            f"domain {d.id!r}: part i {ibegin}+{ni}, j {jbegin}+{nj} is outside "
            f"{d.ni_glo} x {d.nj_glo}")
    part = Part(ibegin, ni, jbegin, nj)
    unknown = set(arrays) - set(_ARRAYS)
    if unknown:
        raise ValueError(f"domain {d.id!r}: unknown arrays {sorted(unknown)}")
    shapes = _shapes(d, part, _nvertex(d, arrays.get("lon_bounds")))
    out: dict[str, np.ndarray | None] = {}
    for name in _ARRAYS:
        value = arrays.get(name)
        if value is None:
            out[name] = None
            continue
        arr = np.asarray(value)
        if arr.size != int(np.prod(shapes[name])):
            raise ValueError(f"domain {d.id!r}: {name} has shape {arr.shape}, expected "
                             f"{shapes[name]} for this rank's part")
        arr = arr.reshape(shapes[name])
        out[name] = arr.astype(bool) if name == "mask" else arr.astype(np.float64)
    for a, b in (("lon", "lat"), ("lon_bounds", "lat_bounds")):
        if (out[a] is None) != (out[b] is None):
            raise ValueError(f"domain {d.id!r}: give both {a} and {b}, or neither")
    return LocalDomain(d, part, **out)


def domain_message(ld: LocalDomain) -> tuple[tuple[int, ...], np.ndarray]:
    """The DOMAIN message's ``a`` words and float64 payload for a declaration."""
    flags = 0
    chunks = []
    for flag, names in _GROUPS:
        values = [getattr(ld, n) for n in names]
        if values[0] is not None:
            flags |= flag
            chunks += [np.asarray(v, dtype=np.float64).reshape(-1) for v in values]
    p = ld.part
    nvertex = _nvertex(ld.domain, ld.lon_bounds)
    a = (p.ibegin, p.ni, p.jbegin, p.nj, nvertex, int(flags), 0)
    payload = np.concatenate(chunks) if chunks else np.empty(0, np.float64)
    return a, payload


def domain_from_message(d: DomainDef, a: Sequence[int], payload: np.ndarray) -> LocalDomain:
    """Inverse of :func:`domain_message`; ``ValueError`` when sizes do not add up."""
    ibegin, ni, jbegin, nj, nvertex, flags = (int(x) for x in a[:6])
    part = Part(ibegin, ni, jbegin, nj)
    shapes = _shapes(d, part, nvertex)
    names = [n for flag, group in _GROUPS if flags & flag for n in group]
    need = sum(int(np.prod(shapes[n])) for n in names)
    if need != payload.size:
        raise ValueError(f"domain {d.id!r}: {payload.size} values for flags {flags} "
                         f"(expected {need})")
    arrays: dict[str, np.ndarray] = {}
    pos = 0
    values = np.asarray(payload, dtype=np.float64)
    for n in names:
        k = int(np.prod(shapes[n]))
        arrays[n] = values[pos:pos + k]
        pos += k
    if "mask" in arrays:
        arrays["mask"] = arrays["mask"] != 0.0
    return make_local_domain(d, ibegin, ni, jbegin, nj, **arrays)


def _global_coord(d: DomainDef, name: str, nvertex: int) -> tuple[np.ndarray, callable]:
    """An empty (NaN) global array for ``name`` and a function giving a part's index."""
    full = Part(0, d.ni_glo, 0, d.nj_glo)
    shape = _shapes(d, full, nvertex)[name]
    if d.type == "rectilinear" and name in ("lon", "lon_bounds"):
        return np.full(shape, np.nan), lambda p: (slice(p.ibegin, p.ibegin + p.ni),)
    if d.type == "rectilinear" and name in ("lat", "lat_bounds"):
        return np.full(shape, np.nan), lambda p: (slice(p.jbegin, p.jbegin + p.nj),)
    return np.full(shape, np.nan), lambda p: p.index(d)


def assemble_geometry(d: DomainDef, parts: Sequence[LocalDomain]) -> dict[str, np.ndarray | None]:
    """Global ``lon, lat, lon_bounds, lat_bounds, area, mask`` from the ranks' parts.

    Points no rank covers are masked (False) and have NaN coordinates; an
    optional array is returned only when every non-empty part gave it
    (``mask``: when some part gave one or some point is uncovered). A
    rectilinear domain whose ranks gave no lon/lat gets a regular global grid
    (cell centres), as XIOS users may omit it; other domain types must send it.
    """
    parts = [p for p in parts if p.part.size > 0]
    nvertex = max([_nvertex(d, p.lon_bounds) for p in parts] + [_nvertex(d, None)])
    out: dict[str, np.ndarray | None] = {}
    for name in ("lon", "lat", "lon_bounds", "lat_bounds", "area"):
        have = [p for p in parts if getattr(p, name) is not None]
        if not have or len(have) != len(parts):
            out[name] = None
            continue
        arr, where = _global_coord(d, name, nvertex)
        for p in have:
            arr[where(p.part)] = getattr(p, name)
        out[name] = arr
    covered = np.zeros(d.shape, bool)
    mask = np.ones(d.shape, bool)
    for p in parts:
        covered[p.part.index(d)] = True
        if p.mask is not None:
            mask[p.part.index(d)] = p.mask
    has_mask = any(p.mask is not None for p in parts) or not covered.all()
    out["mask"] = (mask & covered) if has_mask else None
    if out["lon"] is None:
        if d.type != "rectilinear":
            raise ValueError(f"domain {d.id!r}: the model ranks sent no lon/lat "
                             f"(required for a {d.type} domain)")
        out["lon"] = (np.arange(d.ni_glo) + 0.5) * 360.0 / d.ni_glo
        out["lat"] = -90.0 + (np.arange(d.nj_glo) + 0.5) * 180.0 / d.nj_glo
    return out


def local_shape(d: DomainDef, part: Part | None, levels: int | None) -> tuple[int, ...]:
    """Shape of a field part on a rank: ``(nk, nj, ni)``/``(nj, ni)``/``(nk, ni)``/``(ni,)``."""
    hor = part.shape(d) if part is not None else ((0,) if d.type == "unstructured" else (0, 0))
    return (levels, *hor) if levels is not None else hor


def place(target: np.ndarray, d: DomainDef, part: Part, data: np.ndarray) -> None:
    """Copy a rank's part (flat or shaped, any float dtype) into the global ``target``."""
    idx = (Ellipsis, *part.index(d))
    target[idx] = np.asarray(data).reshape(target[idx].shape)
