"""Tiled members for the tests: cut a member file into tiles (interior + halo).

The reference of every tiled test is the untiled case; these helpers cut its
members into tiles the way a model writes them (one file per sub-domain), with
or without NEMO's ``DOMAIN_*`` global attributes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import netCDF4
import numpy as np

from ensio.layout.tiles import TileBox, TileGeometry

PATTERN = "tiles/mem{member:03d}_{tile:04d}.nc"


def box_with_halo(b: TileBox) -> tuple[slice, slice]:
    return slice(b.y0 - b.hy0, b.y1 + b.hy1), slice(b.x0 - b.hx0, b.x1 + b.hx1)


def nemo_attrs(b: TileBox, count: int, grid: tuple[int, int]) -> dict[str, object]:
    """NEMO's DOMAIN_* attributes of tile ``b`` (our reading: (i, j), 1-based, halo incl.)."""
    return {
        "DOMAIN_number_total": np.int32(count),
        "DOMAIN_number": np.int32(b.index),
        "DOMAIN_dimensions_ids": np.array([2, 1], dtype=np.int32),
        "DOMAIN_size_global": np.array(grid[::-1], dtype=np.int32),
        "DOMAIN_size_local": np.array([b.file_shape[1], b.file_shape[0]], dtype=np.int32),
        "DOMAIN_position_first": np.array([b.x0 - b.hx0 + 1, b.y0 - b.hy0 + 1], dtype=np.int32),
        "DOMAIN_position_last": np.array([b.x1 + b.hx1, b.y1 + b.hy1], dtype=np.int32),
        "DOMAIN_halo_size_start": np.array([b.hx0, b.hy0], dtype=np.int32),
        "DOMAIN_halo_size_end": np.array([b.hx1, b.hy1], dtype=np.int32),
        "DOMAIN_type": "BOX",
    }


def cut(src: Path, dst: Path, b: TileBox, attrs: dict[str, object] | None = None) -> None:
    """Write tile ``b`` (interior + halo) of ``src`` to ``dst``: every lat/lon variable sliced."""
    ys, xs = box_with_halo(b)
    with netCDF4.Dataset(src) as s, netCDF4.Dataset(dst, "w", format=s.data_model) as d:
        for name, dim in s.dimensions.items():
            size = {"lat": b.file_shape[0], "lon": b.file_shape[1]}.get(name, len(dim))
            d.createDimension(name, None if dim.isunlimited() else size)
        for name, var in s.variables.items():
            s.set_auto_maskandscale(False)
            out = d.createVariable(name, var.dtype, var.dimensions)
            out.setncatts({k: var.getncattr(k) for k in var.ncattrs()})
            index = tuple({"lat": ys, "lon": xs}.get(dim, slice(None)) for dim in var.dimensions)
            out.set_auto_maskandscale(False)
            out[...] = var[...][index] if var.dimensions else var[...]
        d.setncatts({k: s.getncattr(k) for k in s.ncattrs()} | (attrs or {}))


def tile_case(case: Path, geo: TileGeometry, members: int, *, nemo: bool = False) -> None:
    (case / "tiles").mkdir(exist_ok=True)
    for m in range(1, members + 1):
        for b in geo.boxes:
            dst = case / PATTERN.format(member=m, tile=b.index)
            cut(
                case / f"mem{m:03d}.nc",
                dst,
                b,
                nemo_attrs(b, geo.count, geo.grid) if nemo else None,
            )


def tile_values(path: Path) -> np.ndarray:
    """The raw stored ``state`` of a tile file (halo included)."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return np.array(ds["state"][...])


def assert_tile_holds(now: np.ndarray, before: np.ndarray, want: np.ndarray, b: TileBox) -> None:
    """Tile ``b``'s values ``now`` hold ``want`` (global grid; NaN: no state row, e.g. land)
    at its interior's state points, and ``before``'s bytes everywhere else (halo, land)."""
    ys, xs = box_with_halo(b)
    iy, ix = b.interior()
    part = want[..., ys, xs]
    inside = np.zeros(now.shape, dtype=bool)
    inside[..., iy, ix] = True
    state = inside & np.isfinite(part)
    np.testing.assert_allclose(now[state], part[state], rtol=0, atol=1e-12)
    assert now[~state].tobytes() == before[~state].tobytes()


def assert_tiles_hold(case: Path, geo: TileGeometry, member: int, want: np.ndarray,
                      before: dict) -> None:
    """Every tile of ``member`` holds ``want`` (global grid) inside, its prior bytes in the halo.

    ``before[member, tile]`` is the tile's content before the write.
    """
    for b in geo.boxes:
        now = tile_values(case / PATTERN.format(member=member, tile=b.index))
        assert_tile_holds(now, before[member, b.index], want, b)


def add_mask(member: Path) -> None:
    """A land/sea mask ``landmask`` (lat, lon) added by NCO's ncap2, as a model's tools would.

    Irregular on purpose: stretches of sea of every length along a line, and
    whole lines of land, so masked runs split and vanish.
    """
    expr = "landmask[$lat,$lon]=int(sin(lat*0.11)+cos(lon*0.23)>-0.2); landmask(3,:)=0"
    if shutil.which("ncap2") is not None:
        subprocess.run(["ncap2", "-O", "-s", expr, str(member), str(member)], check=True)
        return
    with netCDF4.Dataset(member, "a") as ds:  # the same expression without NCO
        lat, lon = np.array(ds["lat"][...]), np.array(ds["lon"][...])
        mask = (np.sin(lat * 0.11)[:, None] + np.cos(lon * 0.23)[None, :] > -0.2).astype("i4")
        mask[3, :] = 0
        ds.createVariable("landmask", "i4", ("lat", "lon"))[...] = mask
