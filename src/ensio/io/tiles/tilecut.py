"""Cut a member file into tile files, the way a model writes one restart per process.

Used by ``ensio bench shuffle`` to make the tiled synthetic case (the tests
keep their own independent cutter, tests/tiles_support.py). Every variable
with the (lat, lon) dims of the state is sliced to the tile's interior plus
halo; the others are copied whole; with ``nemo`` the tile gets NEMO's
``DOMAIN_*`` global attributes. The file format of the source is kept.
"""

from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np

from ...layout.tiles import TileBox, TileGeometry

__all__ = ["cut_member", "cut_tile"]


def _nemo_attrs(b: TileBox, count: int, grid: tuple[int, int]) -> dict[str, object]:
    """NEMO's DOMAIN_* attributes of ``b``: (i, j) pairs, 1-based, halo included."""
    return {
        "DOMAIN_number_total": np.int32(count),
        "DOMAIN_number": np.int32(b.index),
        "DOMAIN_size_global": np.array(grid[::-1], dtype=np.int32),
        "DOMAIN_position_first": np.array([b.x0 - b.hx0 + 1, b.y0 - b.hy0 + 1], dtype=np.int32),
        "DOMAIN_position_last": np.array([b.x1 + b.hx1, b.y1 + b.hy1], dtype=np.int32),
        "DOMAIN_halo_size_start": np.array([b.hx0, b.hy0], dtype=np.int32),
        "DOMAIN_halo_size_end": np.array([b.hx1, b.hy1], dtype=np.int32),
    }


def cut_tile(src: Path, dst: Path, b: TileBox, dims: tuple[str, str] = ("lat", "lon"),
             attrs: dict[str, object] | None = None) -> None:
    """Write tile ``b`` (interior + halo) of ``src`` to ``dst``."""
    ys = slice(b.y0 - b.hy0, b.y1 + b.hy1)
    xs = slice(b.x0 - b.hx0, b.x1 + b.hx1)
    sizes = dict(zip(dims, b.file_shape, strict=True))
    cut = dict(zip(dims, (ys, xs), strict=True))
    with netCDF4.Dataset(src) as s, netCDF4.Dataset(dst, "w", format=s.data_model) as d:
        s.set_auto_maskandscale(False)
        for name, dim in s.dimensions.items():
            d.createDimension(name, None if dim.isunlimited() else sizes.get(name, len(dim)))
        for name, var in s.variables.items():
            out = d.createVariable(name, var.dtype, var.dimensions)
            out.setncatts({k: var.getncattr(k) for k in var.ncattrs()})
            out.set_auto_maskandscale(False)
            index = tuple(cut.get(dim, slice(None)) for dim in var.dimensions)
            out[...] = var[...][index] if var.dimensions else var[...]
        d.setncatts({k: s.getncattr(k) for k in s.ncattrs()} | (attrs or {}))


def cut_member(src: Path, pattern: str, member: int, geo: TileGeometry, *,
               nemo: bool = False) -> list[Path]:
    """Every tile of member file ``src``: ``pattern.format(member=, tile=)``; their paths."""
    out = []
    for b in geo.boxes:
        dst = Path(pattern.format(member=member, tile=b.index))
        dst.parent.mkdir(parents=True, exist_ok=True)
        cut_tile(src, dst, b, attrs=_nemo_attrs(b, geo.count, geo.grid) if nemo else None)
        out.append(dst)
    return out
