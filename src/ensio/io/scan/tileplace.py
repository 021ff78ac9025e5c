"""Every tile of every member must sit where the decomposition puts it.

Why: a tile file carries a block of the global grid, but which block is only
known from the decomposition (``ensemble.tiles``, or NEMO's ``DOMAIN_*``
attributes of member 1's tiles). A tile cut from the wrong place (two tiles
of the same shape swapped, a tile whose longitudes are shifted by a tool, a
tile of another time) has the right shape and was analysed as the block it
is not. So the scan that checks untiled members
(:func:`~ensio.io.scan.consistency.check_coordinates`, the same tolerance and
messages) checks every tile too, in every I/O mode (``files``:
:class:`~ensio.io.scan.tilescan.TileScan`; ``shuffle``: each rank its own
tile):

* **coordinates**: every coordinate variable the layout compares (lon, lat,
  levels: :attr:`~ensio.layout.coords.StateGeometry.checked`) must equal
  tile t's window of the global coordinates, halo included
  (:func:`tile_layouts`). The global coordinates are member 1's tile
  interiors put together, so member 1's halos are compared with their
  neighbours' interiors, and every other member's tile with member 1's;
  time is compared exactly across all tiles of all members
  (:func:`~ensio.io.scan.consistency.check_times`);
* **order**: a rectilinear grid's 1-D ``lon`` (modulo 360) and ``lat``, put
  together from the tiles, must be monotonic: two same-shape tiles of
  member 1 swapped, without halos, leave no other trace (:func:`check_order`);
* **DOMAIN_\\***: when member 1's first tile carries ``DOMAIN_number_total``,
  every tile of every member must carry the attributes, and they must give
  its box of the decomposition, P tiles and the global size; a
  ``DOMAIN_number`` must be the tile's number (:func:`check_domain`).

Cost: the coordinates are a few small variables per tile, read with the
tile's check (as byte ranges by the quick check); the attributes are read
only for NEMO-style tiles. In ``io.mode: shuffle`` every rank holding a
tile checks its own (:func:`check_local_tiles`), once per run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ...errors import InputError
from ...layout.coords import CoordVar, StateGeometry
from ...layout.state import StateLayout
from ...layout.tiles import TileGeometry, nemo_box
from ...parallel.agree import all_call
from ..formats.open import open_member
from .consistency import check_coordinates, check_times
from .members import read_whole

__all__ = ["DOMAIN_FLAG", "check_domain", "check_local_tiles", "check_order",
           "domain_attributes", "tile_layouts"]

#: The attribute whose presence in member 1's first tile makes DOMAIN_* binding.
DOMAIN_FLAG = "DOMAIN_number_total"


def tile_layouts(layout: StateLayout, geometry: TileGeometry,
                 sources: Sequence[str]) -> list[StateLayout]:  # fmt: skip
    """Per tile t: ``layout`` whose checked coordinates are tile t's window of the global ones.

    ``sources[t]`` names member 1's tile t (messages). A coordinate whose
    window would leave the global grid (a halo across a periodic edge) is not
    compared for that tile. Raises :func:`check_order`'s error first.
    """
    geo = layout.geometry
    if geo is None:
        return [layout] * geometry.count
    check_order(geo, geometry, sources)
    ydim, xdim = layout.variables[0].dims[-2:]
    ny, nx = geometry.grid
    out = []
    for b, source in zip(geometry.boxes, sources, strict=True):
        ys, xs = slice(b.y0 - b.hy0, b.y1 + b.hy1), slice(b.x0 - b.hx0, b.x1 + b.hx1)
        inside = ys.start >= 0 and ys.stop <= ny and xs.start >= 0 and xs.stop <= nx
        checked = []
        for c in geo.checked:
            spans = ydim in c.dims or xdim in c.dims
            if spans and not inside:
                continue
            window = tuple({ydim: ys, xdim: xs}.get(d, slice(None)) for d in c.dims)
            checked.append(CoordVar(c.role, c.name, c.dims, c.values[window]))
        place = dataclasses.replace(geo, checked=tuple(checked),
                                    source=f"{source}, as placed in the global grid")
        out.append(dataclasses.replace(layout, geometry=place))
    return out


def check_order(geo: StateGeometry, geometry: TileGeometry, sources: Sequence[str]) -> None:
    """A rectilinear grid's lon (modulo 360) and lat, from member 1's tiles, are monotonic.

    Raises
    ------
    InputError
        Naming member 1's tile where the order breaks, the coordinate and both values.
    """
    grid = geo.grid
    if grid is None or grid.kind != "rectilinear":
        return
    for c, axis in ((grid.lon, "x"), (grid.lat, "y")):
        v = c.values
        if v.ndim != 1 or v.size < 3 or not np.all(np.isfinite(v)):
            continue
        d = np.diff(v)
        if c.role == "lon":
            d = (d + 180.0) % 360.0 - 180.0
        sign = np.sign(d)
        bad = np.flatnonzero(sign != sign[0]) if sign[0] != 0 else np.array([0])
        if bad.size == 0:
            continue
        i = int(bad[0]) + 1
        box = next(b for b in geometry.boxes
                   if (b.x0 <= i < b.x1 if axis == "x" else b.y0 <= i < b.y1))  # fmt: skip
        raise InputError(
            f"{sources[box.index]}: coordinate '{c.name}' is not monotonic across the tiles "
            f"of the first member: {float(v[i - 1]):.9g} then {float(v[i]):.9g} at global "
            f"{axis} = {i} (tile {box.index} starts there): are tiles swapped or misplaced?"
        )


def domain_attributes(path: Path) -> dict[str, object]:
    """The ``DOMAIN_*`` global attributes of one tile file (netCDF library: attributes only)."""
    import netCDF4

    with netCDF4.Dataset(path) as ds:
        return {k: ds.getncattr(k) for k in ds.ncattrs() if k.startswith("DOMAIN_")}


def check_domain(path: Path, index: int, attrs: Mapping[str, object],
                 geometry: TileGeometry) -> None:  # fmt: skip
    """Tile ``index``'s ``DOMAIN_*`` attributes describe its box of ``geometry``.

    Raises
    ------
    InputError
        Naming the file and the attribute (a missing or malformed one by
        :func:`~ensio.layout.tiles.nemo_box`'s message).
    """
    box, total, grid = nemo_box(attrs, index, str(path))
    if total != geometry.count:
        raise InputError(f"{path}: global attribute DOMAIN_number_total {total} is not the "
                         f"{geometry.count} tiles of the decomposition")  # fmt: skip
    if grid != geometry.grid:
        raise InputError(
            f"{path}: global attribute DOMAIN_size_global (i, j) = {grid[1]}, {grid[0]} is not "
            f"the global grid {geometry.grid[1]}, {geometry.grid[0]} of the decomposition"
        )
    want = geometry.boxes[index]
    if box != want:
        raise InputError(
            f"{path}: global attributes DOMAIN_position_first/last and "
            f"DOMAIN_halo_size_start/end give interior y[{box.y0}:{box.y1}] x[{box.x0}:{box.x1}], "
            f"not tile {index}'s y[{want.y0}:{want.y1}] x[{want.x0}:{want.x1}] of the "
            "decomposition (a tile of another place?)"
        )
    if "DOMAIN_number" in attrs:
        number = np.atleast_1d(np.asarray(attrs["DOMAIN_number"])).ravel()
        if number.size != 1 or number.dtype.kind not in "iu" or int(number[0]) != index:
            shown = int(number[0]) if number.size == 1 and number.dtype.kind in "iu" else \
                repr(attrs["DOMAIN_number"])  # fmt: skip
            raise InputError(f"{path}: global attribute DOMAIN_number {shown} is not the "
                             f"tile's number {index} in ensemble.members")  # fmt: skip


def _coordinates(path: Path, layout: StateLayout) -> np.ndarray | None:
    """:func:`check_coordinates` of one tile file against its tile ``layout``; its time."""
    with open_member(path) as store:
        infos = dict(store.variables())

        def read(name: str) -> np.ndarray | None:
            info = infos.get(name)
            return None if info is None else read_whole(store, info)

        return check_coordinates(path, layout, read)


def check_local_tiles(comm: MPI.Comm, path: Path, index: int, layout: StateLayout,
                      geometry: TileGeometry, attrs: Mapping[str, object],
                      holds: bool) -> None:  # fmt: skip
    """Collective (``io.mode: shuffle``): every rank that ``holds`` a tile file checks its place.

    Rank r holds file r (member-major: tile ``index`` of member r div P) at
    ``path``, with global attributes ``attrs``; rank 0 holds tile 0 of member
    1, whose attributes decide whether ``DOMAIN_*`` binds every tile. Raises
    the lowest rank's error on every rank, like :class:`~ensio.io.scan.tilescan.TileScan`.
    """
    domain = comm.bcast(DOMAIN_FLAG in attrs if comm.rank == 0 else None, root=0)
    held = comm.allgather(str(path) if holds else None)
    sources = [p for p in held if p is not None][: geometry.count]

    def mine() -> np.ndarray | None:
        layouts = tile_layouts(layout, geometry, sources)
        if not holds:
            return None
        if domain:
            check_domain(path, index, attrs, geometry)
        return _coordinates(path, layouts[index])

    times = comm.allgather(all_call(comm, mine))
    geo = layout.geometry
    name = next((c.name for c in geo.checked if c.role == "time"), "time") if geo else "time"
    held_paths = [Path(p) for p in held if p is not None]
    check_times(held_paths, [t for t, p in zip(times, held, strict=True) if p is not None], name)
