"""What a shuffle rank learns from its own tile file, and member 1's geometry from them.

Split from :mod:`ensio.io.modes.shuffle` (which opens the object) to keep
that module to the I/O: :func:`tile_digest` is read by every rank from its
own local tile before the decomposition is known; :func:`describe` turns
member 1's P digests (gathered on rank 0) into the tile geometry and the
global layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np

from ...config.schema import EnsembleSection
from ...errors import InputError
from ...layout.state import StateLayout
from ...layout.tiles import TileGeometry, declared_geometry
from ..formats.open import open_member
from ..formats.store import VarInfo
from ..tiles.tiled import global_layout, tile_geometry

__all__ = ["TileDigest", "describe", "tile_digest"]


@dataclass
class TileDigest:
    """What a rank learns from its own tile file before the geometry is known."""

    source: str
    infos: dict[str, VarInfo]
    attrs: dict[str, object]
    small: dict[str, np.ndarray]  # whole non-state variables no larger than one level


def tile_digest(path: Path, names: list[str], keep_small: bool,
            masks: Sequence[str] = ()) -> TileDigest:  # fmt: skip
    """What ``path`` holds; with ``keep_small`` also its small variables and ``masks`` whole."""
    if not path.is_file():
        raise InputError(f"{path}: tile file not found")
    with open_member(path) as store:
        infos = dict(store.variables())
        for name in names:
            if name not in infos:
                raise InputError(f"{path}: state variable '{name}' not found")
        shape = infos[names[0]].shape
        if len(shape) < 2:
            raise InputError(f"{path}: state variable '{names[0]}' has no (lat, lon) dims to tile")
        level = shape[-2] * shape[-1]
        small = {}
        if keep_small:
            for n, info in infos.items():
                if n not in names and (info.size <= level or n in masks):
                    small[n] = np.asarray(store.read_elements(n, 0, info.size)).reshape(info.shape)
    with netCDF4.Dataset(path) as ds:
        attrs = {k: ds.getncattr(k) for k in ds.ncattrs()}
    return TileDigest(str(path), infos, attrs, small)


def describe(ens: EnsembleSection, digests: list[TileDigest]) -> tuple[TileGeometry, StateLayout]:
    """Geometry and global layout from member 1's P tile digests (rank 0).

    Untiled members (no ``{tile}``) are one tile each (P = 1): the whole grid,
    no halo, so rank m reads member m's file, as the placement rule places it.
    """
    names = [v.name for v in ens.variables]
    paths = [Path(d.source) for d in digests]
    shapes = [d.infos[names[0]].shape[-2:] for d in digests]
    if ens.tiled:
        geo = tile_geometry(ens, paths, shapes, [d.attrs for d in digests])
    else:
        geo = declared_geometry(tuple(shapes[0]), 1, (1, 1), 0)

    def read_tile_var(t: int, name: str) -> np.ndarray:
        if name not in digests[t].small:
            raise InputError(f"{digests[t].source}: variable '{name}' is larger than one "
                             "level and cannot be a tile coordinate")  # fmt: skip
        return digests[t].small[name]

    return geo, global_layout(ens, geo, digests[0].infos, read_tile_var, digests[0].source)
