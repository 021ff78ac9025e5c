"""Tile geometry: the horizontal sub-domains of a member split over P files.

Many models write one restart file per process (NEMO's ``_0000.nc``, MOM and
FV3 tiles, NICAM regions). Each such *tile* file holds a rectangular block of
the global (lat, lon) grid, its *interior*, surrounded by up to ``halo``
points of its neighbours that the model keeps for its stencils. The state
vector stays global (rows in C order of the global variables); this module
says, for one tile, which runs of global elements are its interior and where
they sit in the tile file. It is pure (no I/O, no MPI) so that both the
``files`` reader and a per-rank shuffle can use it.

Conventions: ``y`` is the latitude (j) axis, ``x`` the longitude (i) axis;
ranges are 0-based and half-open; a variable's horizontal dims are its last
two, (y, x), as in NEMO and the synthetic members.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..parallel.distribution import block_distribution

__all__ = ["TileBox", "TileGeometry", "declared_geometry", "nemo_box", "NEMO_KEYS"]

#: The NEMO (IOIPSL/XIOS) global attributes a tile file must carry.
NEMO_KEYS = (
    "DOMAIN_number_total",
    "DOMAIN_size_global",
    "DOMAIN_position_first",
    "DOMAIN_position_last",
    "DOMAIN_halo_size_start",
    "DOMAIN_halo_size_end",
)


@dataclass(frozen=True)
class TileBox:
    """One tile: its interior in the global grid and its halo widths in the file.

    Attributes
    ----------
    index : int
        The tile number t (0-based, the ``{tile}`` of the file name).
    y0, y1, x0, x1 : int
        Interior rows ``[y0, y1)`` and columns ``[x0, x1)`` of the global grid.
    hy0, hy1, hx0, hx1 : int
        Halo points in the file before/after the interior along y and x.
    """

    index: int
    y0: int
    y1: int
    x0: int
    x1: int
    hy0: int = 0
    hy1: int = 0
    hx0: int = 0
    hx1: int = 0

    @property
    def ny(self) -> int:
        return self.y1 - self.y0

    @property
    def nx(self) -> int:
        return self.x1 - self.x0

    @property
    def file_shape(self) -> tuple[int, int]:
        """(y, x) shape of the tile's variables in its file, halo included."""
        return self.hy0 + self.ny + self.hy1, self.hx0 + self.nx + self.hx1

    def interior(self) -> tuple[slice, slice]:
        """(y, x) slices of the interior inside the tile file's arrays."""
        return slice(self.hy0, self.hy0 + self.ny), slice(self.hx0, self.hx0 + self.nx)

    def runs(
        self, shape: tuple[int, ...], grid: tuple[int, int]
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Contiguous runs of the interior: global and tile flat element starts.

        Parameters
        ----------
        shape : tuple of int
            Global shape of the variable, ``(..., ny, nx)``.
        grid : (int, int)
            The global (ny, nx).

        Returns
        -------
        (global_starts, tile_starts, length)
            Two int64 arrays of shape (n_lead * self.ny,), one run per interior
            latitude line of each leading index (level, ...), in increasing
            global order; every run is ``length = self.nx`` elements long. Run
            k is global elements ``[g[k], g[k] + length)`` of the variable and
            elements ``[t[k], t[k] + length)`` of the tile's variable.
        """
        gy, gx = grid
        n_lead = int(np.prod(shape[:-2], dtype=np.int64))
        fy, fx = self.file_shape
        lead = np.arange(n_lead, dtype=np.int64)[:, None]
        j = np.arange(self.ny, dtype=np.int64)[None, :]
        g = ((lead * gy + self.y0 + j) * gx + self.x0).ravel()
        t = ((lead * fy + self.hy0 + j) * fx + self.hx0).ravel()
        return g, t, self.nx


@dataclass(frozen=True)
class TileGeometry:
    """A decomposition of the (ny, nx) grid into tiles that cover it exactly once.

    Attributes
    ----------
    grid : (int, int)
        Global (ny, nx).
    boxes : tuple of TileBox
        Tile t is ``boxes[t]``.
    """

    grid: tuple[int, int]
    boxes: tuple[TileBox, ...]

    @property
    def count(self) -> int:
        return len(self.boxes)

    def check(self, sources: Sequence[str] | None = None) -> None:
        """Raise InputError unless the interiors cover every grid point exactly once.

        ``sources`` (one name per tile, e.g. its file) go into the message so
        that the user knows which tiles overlap or where the gap is.
        """
        names = list(sources) if sources is not None else [f"tile {b.index}" for b in self.boxes]
        ny, nx = self.grid
        owner = np.full((ny, nx), -1, dtype=np.int64)
        for b, name in zip(self.boxes, names, strict=True):
            if not (0 <= b.y0 < b.y1 <= ny and 0 <= b.x0 < b.x1 <= nx):
                raise InputError(
                    f"{name}: tile interior y[{b.y0}:{b.y1}] x[{b.x0}:{b.x1}] is empty or "
                    f"outside the global grid {ny}x{nx}"
                )
            taken = owner[b.y0 : b.y1, b.x0 : b.x1]
            if (taken >= 0).any():
                other = names[int(taken[taken >= 0][0])]
                raise InputError(f"{name}: tile interior overlaps that of {other}")
            taken[...] = b.index
        gap = np.argwhere(owner < 0)
        if gap.size:
            j, i = (int(v) for v in gap[0])
            raise InputError(
                f"{names[0]}: the tiles leave {len(gap)} grid points uncovered "
                f"(first at y={j}, x={i})"
            )


def declared_geometry(
    grid: tuple[int, int], count: int, layout: tuple[int, int], halo: int
) -> TileGeometry:
    """The ``ensemble.tiles`` decomposition: px × py blocks, lon blocks fastest.

    Tile t is block ``(t mod px, t div px)``; block sizes are those of
    :func:`~ensio.parallel.distribution.block_distribution` (the first
    ``n mod p`` blocks one larger). A tile's halo is ``halo`` points on each
    side, clipped at the edge of the global grid (what cutting a global file
    with ``ncks -d`` gives).
    """
    px, py = layout
    ny, nx = grid
    if px * py != count:
        raise InputError(f"ensemble.tiles.layout: {px} x {py} is not count {count}")
    if px > nx or py > ny:
        raise InputError(f"ensemble.tiles.layout: {px} x {py} blocks for a {ny}x{nx} grid")
    boxes = []
    for t in range(count):
        x0, cx = block_distribution(nx, px, t % px)
        y0, cy = block_distribution(ny, py, t // px)
        x1, y1 = x0 + cx, y0 + cy
        boxes.append(
            TileBox(t, y0, y1, x0, x1,
                    min(halo, y0), min(halo, ny - y1), min(halo, x0), min(halo, nx - x1))
        )  # fmt: skip
    return TileGeometry(grid, tuple(boxes))


def nemo_box(attrs: Mapping[str, object], index: int, source: str) -> tuple[TileBox, int, tuple]:
    """One tile's box from NEMO's ``DOMAIN_*`` global attributes.

    Our reading of the attributes (IOIPSL ``flio_dom_set``, as ``rebuild_nemo``
    uses them): all are (i, j) pairs, i along x (lon), j along y (lat);
    ``DOMAIN_position_first``/``_last`` are the 1-based global indices of the
    first and last point *stored in the file*, halo included;
    ``DOMAIN_halo_size_start``/``_end`` are how many of the stored points at
    the start/end of each axis are halo. The interior is what remains.

    Returns
    -------
    (box, number_total, size_global)
        ``size_global`` as (ny, nx).

    Raises
    ------
    InputError
        A missing or malformed attribute, naming the file and the attribute.
    """
    vals: dict[str, np.ndarray] = {}
    for key in NEMO_KEYS:
        if key not in attrs:
            raise InputError(f"{source}: global attribute {key} missing (tiles from attributes)")
        v = np.atleast_1d(np.asarray(attrs[key]))
        want = 1 if key == "DOMAIN_number_total" else 2
        if v.size < want or v.dtype.kind not in "iu":
            raise InputError(f"{source}: global attribute {key} = {attrs[key]!r} is not "
                             f"{want} integer(s)")  # fmt: skip
        vals[key] = v.astype(np.int64)
    (fi, fj), (li, lj) = vals["DOMAIN_position_first"][:2], vals["DOMAIN_position_last"][:2]
    (si, sj), (ei, ej) = vals["DOMAIN_halo_size_start"][:2], vals["DOMAIN_halo_size_end"][:2]
    gi, gj = (int(v) for v in vals["DOMAIN_size_global"][:2])
    box = TileBox(index, int(fj - 1 + sj), int(lj - ej), int(fi - 1 + si), int(li - ei),
                  int(sj), int(ej), int(si), int(ei))  # fmt: skip
    if min(box.hy0, box.hy1, box.hx0, box.hx1) < 0 or box.ny <= 0 or box.nx <= 0:
        raise InputError(
            f"{source}: DOMAIN_position_first/last and DOMAIN_halo_size_start/end "
            "give an empty interior or a negative halo"
        )
    return box, int(vals["DOMAIN_number_total"][0]), (gj, gi)
