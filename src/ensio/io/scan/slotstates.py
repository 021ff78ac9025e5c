"""The members' states at the time slots of a 4-D analysis, read row by row for H.

The parallel observation operator (:mod:`ensio.analysis.stoo`) asks the rank
holding a (member, slot) pair for the state rows its observations read; this
is the reader it is given (the analysis room never opens a member file).
The state of member ``m`` at slot ``s`` is the file ``ensemble.slots`` with
``{member}`` = m and ``{slot}`` = s + 1 (1-based, slot 1 the earliest), or,
for a single slot without that key, the member file itself (the 4-D analysis
then equals the 3-D one).

Each slot file is checked against the state layout (variables, shapes,
dtypes, coordinates: :func:`~ensio.io.scan.members.check_member`) before a value
is used, and its own packing and missing-value attributes decode it, so a
history file written with another ``scale_factor`` reads right.

Tiled members may keep their slot states tiled too: ``{tile}`` in
``ensemble.slots`` names tile t's file (0-based, as in ``members``), cut
like the members' tiles (the geometry the caller read from them, or the
declared ``ensemble.tiles``). A row is read from the tile whose interior
holds its (lat, lon) point; each slot tile is checked for its state
variables and its box's shape before a value is used.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...config.schema import ConfigError, EnsembleSection
from ...errors import InputError
from ...layout.state import StateLayout, VariableLayout
from ...layout.tiles import TileGeometry, declared_geometry
from ..formats.open import open_member
from ..formats.store import VarInfo
from .members import check_member

__all__ = ["SlotStates"]


class SlotStates:
    """``reader(j, s, rows)`` of :data:`ensio.analysis.stoo.SlotReader` over the slot files.

    Parameters
    ----------
    ensemble : EnsembleSection
        ``slots`` (the pattern), ``members`` and the member numbers.
    base : Path
        Directory relative patterns are resolved against.
    layout : StateLayout
        The state the rows refer to (from the member files).
    n_slots : int
        ``analysis.n_slots``.
    geometry : TileGeometry, optional
        The members' tiles (tiled members): how ``{tile}`` slot files cut the
        grid; without it the declared ``ensemble.tiles``.
    """

    def __init__(self, ensemble: EnsembleSection, base: Path, layout: StateLayout,
                 n_slots: int, *, geometry: TileGeometry | None = None) -> None:
        if ensemble.slots is None and n_slots > 1:
            raise ConfigError(f"ensemble.slots: required for {n_slots} time slots")
        if ensemble.slots is None and ensemble.tiled:
            raise ConfigError(
                "ensemble.slots: required with tiled members ({tile}): the states at the "
                "slot are read from whole-domain files"
            )
        self.ensemble = ensemble
        self.base = Path(base)
        self.layout = layout
        self.n_slots = n_slots
        tiled_slots = ensemble.slots is not None and "{tile" in ensemble.slots
        self.tiles = _slot_geometry(ensemble, layout, geometry) if tiled_slots else None

    def tile_path(self, j: int, s: int, t: int) -> Path:
        """Tile ``t`` of member column ``j`` at slot ``s`` (all 0-based)."""
        assert self.ensemble.slots is not None
        p = Path(self.ensemble.slots.format(member=self.ensemble.numbers[j], slot=s + 1, tile=t))
        return p if p.is_absolute() else self.base / p

    def path(self, j: int, s: int) -> Path:
        """File of member column ``j`` (0-based) at slot ``s`` (0-based)."""
        member = self.ensemble.numbers[j]
        if self.ensemble.slots is None:
            return self.ensemble.member_path(member, self.base)
        return self.ensemble.slot_path(member, s + 1, self.base)

    def __call__(self, j: int, s: int, rows: np.ndarray) -> np.ndarray:
        """Physical values (NaN where missing) of the sorted state ``rows``."""
        if self.tiles is not None:
            return self._from_tiles(j, s, np.asarray(rows, dtype=np.int64))
        path = self.path(j, s)
        meta = check_member(path, self.layout)
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty(rows.size)
        with open_member(path) as store:
            for v in self.layout.variables:
                a, b = np.searchsorted(rows, [v.offset, v.offset + v.size])
                if a == b:
                    continue
                lo, hi = int(rows[a]), int(rows[b - 1]) + 1
                buf = np.empty(hi - lo)
                info = meta.infos[v.name]
                for seg in self.layout.segments(lo, hi):
                    raw = store.read_elements(v.name, seg.elem_lo, seg.elem_hi)
                    part = raw if seg.select is None else raw[seg.select]
                    info.encoding.decode(part, buf[seg.row_lo - lo: seg.row_hi - lo])
                out[a:b] = buf[rows[a:b] - lo]
        return out

    def _from_tiles(self, j: int, s: int, rows: np.ndarray) -> np.ndarray:
        """:meth:`__call__` from the slot's tile files: each row from its point's tile."""
        assert self.tiles is not None
        out = np.empty(rows.size)
        checked: dict[int, dict[str, VarInfo]] = {}
        for v in self.layout.variables:
            a, b = np.searchsorted(rows, [v.offset, v.offset + v.size])
            if a == b:
                continue
            tile, local = _tile_elements(v, rows[a:b] - v.offset, self.tiles)
            for t in np.unique(tile).tolist():
                path = self.tile_path(j, s, t)
                if t not in checked:
                    checked[t] = _check_slot_tile(path, self.layout, self.tiles, t)
                pick = np.flatnonzero(tile == t)
                lo, hi = int(local[pick].min()), int(local[pick].max()) + 1
                with open_member(path) as store:
                    raw = np.asarray(store.read_elements(v.name, lo, hi)).ravel()
                buf = np.empty(hi - lo)
                checked[t][v.name].encoding.decode(raw, buf)
                out[a + pick] = buf[local[pick] - lo]
        return out


def _slot_geometry(ens: EnsembleSection, layout: StateLayout,
                   geometry: TileGeometry | None) -> TileGeometry:
    """How ``{tile}`` slot files cut the grid: the members' tiles'; ConfigError if unknown."""
    if not ens.tiled:
        raise ConfigError("ensemble.slots: {tile} in the pattern needs tiled members "
                          "({tile} in ensemble.members)")
    if geometry is not None:
        return geometry
    if ens.tiles is None:
        raise ConfigError("ensemble.slots: {tile} slot files need the members' decomposition; "
                          "declare ensemble.tiles")
    grid = layout.variables[0].shape[-2:]
    return declared_geometry((int(grid[0]), int(grid[1])), ens.tiles.count, ens.tiles.layout,
                             ens.tiles.halo)


def _tile_elements(v: VariableLayout, k: np.ndarray,
                   geo: TileGeometry) -> tuple[np.ndarray, np.ndarray]:
    """(tile, element index in that tile's file) of ``v``'s state rows ``k`` (0-based in v)."""
    elem = k if v.active is None else np.asarray(v.active)[k]
    ny, nx = v.shape[-2], v.shape[-1]
    level, yx = np.divmod(elem, ny * nx)
    y, x = np.divmod(yx, nx)
    tile = np.full(k.size, -1, dtype=np.int64)
    local = np.zeros(k.size, dtype=np.int64)
    for box in geo.boxes:  # interiors do not overlap: each point has one tile
        inside = (y >= box.y0) & (y < box.y1) & (x >= box.x0) & (x < box.x1)
        fy, fx = box.file_shape
        tile[inside] = box.index
        local[inside] = (level[inside] * fy + (y[inside] - box.y0 + box.hy0)) * fx \
            + (x[inside] - box.x0 + box.hx0)
    if (tile < 0).any():  # pragma: no cover - a geometry covers its grid
        raise AssertionError(f"{v.name}: grid points outside every tile")
    return tile, local


def _check_slot_tile(path: Path, layout: StateLayout, geo: TileGeometry,
                     t: int) -> dict[str, VarInfo]:
    """Tile ``t``'s slot file holds every state variable with its box's shape; its infos."""
    if not path.is_file():
        raise InputError(f"{path}: slot tile file not found (ensemble.slots, tile {t})")
    with open_member(path) as store:
        infos = dict(store.variables())
    box = geo.boxes[t]
    for v in layout.variables:
        if v.name not in infos:
            raise InputError(f"{path}: state variable '{v.name}' not found")
        want = (*v.shape[:-2], *box.file_shape)
        if tuple(infos[v.name].shape) != want:
            raise InputError(f"{path}: state variable '{v.name}' has shape "
                             f"{tuple(infos[v.name].shape)}, tile {t} needs {want}")
    return infos
