"""Products of a tiled ensemble: one mean (spread) file per tile, shaped like the member's tiles.

A model that writes one restart per process reads one per process too, so
the analysis mean of a tiled ensemble (``output.mean: "mean_{tile:04d}.nc"``)
is written the same way: tile t of the product takes its structure (dims,
its own coordinates, attributes) from tile t of the first member, and its
values, halo included, from the analysis field on the global grid — a halo
point is an interior point of a neighbouring tile, so it gets that tile's
value, which is what the model's own halo exchange would give. Nothing of
the member's tile is copied into a state variable of the product.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...config.errors import ConfigError
from ...layout.state import StateLayout
from ...layout.tiles import TileBox, TileGeometry

__all__ = ["TileProducts", "check_product_patterns", "tile_paths"]


def tile_paths(pattern: Path, count: int) -> list[Path]:
    """The ``count`` files of a product pattern with ``{tile}`` (``{tile:04d}`` formats)."""
    return [Path(str(pattern).format(tile=t)) for t in range(count)]


def check_product_patterns(products: dict[str, str | None], tiled: bool) -> None:
    """Raise ConfigError unless each output pattern has ``{tile}`` exactly when the members do.

    ``products``: ``output.<key>`` → pattern (None: not written). A tiled
    output written to one name would overwrite itself P times; an untiled
    one with ``{tile}`` in its name is a typo waiting to happen.
    """
    for key, pattern in products.items():
        if pattern is None:
            continue
        has = "{tile" in pattern
        if tiled and not has:
            raise ConfigError(
                f"output.{key}: tiled members ({{tile}}) are written one file per tile; "
                f"put {{tile}} in output.{key} (e.g. {key}_{{tile:04d}}.nc)"
            )
        if not tiled and has:
            raise ConfigError(f"output.{key}: has {{tile}} but ensemble.members has no {{tile}}")
        try:
            pattern.format(tile=0, member=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"output.{key}: pattern {pattern!r}: {exc}") from None


@dataclass(frozen=True)
class TileProducts:
    """Where the tiles of a product come from: the decomposition and member 1's tiles.

    Attributes
    ----------
    geometry : TileGeometry
    templates : sequence of Path
        Tile t of the first member (structure and coordinates of product tile t).
    """

    geometry: TileGeometry
    templates: Sequence[Path]

    def layout(self, layout: StateLayout, box: TileBox) -> StateLayout:
        """The state variables as tile ``box``'s file holds them (halo included)."""
        out, offset = [], 0
        for v in layout.variables:
            shape = (*v.shape[:-2], *box.file_shape)
            size = int(np.prod(shape, dtype=np.int64))
            out.append(dataclasses.replace(v, shape=shape, offset=offset, size=size, active=None))
            offset += size
        return StateLayout(tuple(out), offset)

    def rows(self, layout: StateLayout, box: TileBox) -> np.ndarray:
        """The global state row of every point of tile ``box``'s file (:meth:`layout` order).

        The file's points are the global rows ``[y0 - hy0, y1 + hy1)`` and
        columns ``[x0 - hx0, x1 + hx1)`` (halos lie inside the grid: NEMO's
        attributes and declared halos clipped at the edge both say so); a
        point outside the grid or outside a variable's mask has no row: -1.
        """
        gy, gx = self.geometry.grid
        ys = np.arange(box.y0 - box.hy0, box.y1 + box.hy1)
        xs = np.arange(box.x0 - box.hx0, box.x1 + box.hx1)
        inside = ((ys >= 0) & (ys < gy))[:, None] & ((xs >= 0) & (xs < gx))[None, :]
        plane = np.clip(ys, 0, gy - 1)[:, None] * gx + np.clip(xs, 0, gx - 1)[None, :]
        parts = []
        for v in layout.variables:
            n_lead = int(np.prod(v.shape[:-2], dtype=np.int64))
            elems = (np.arange(n_lead, dtype=np.int64)[:, None, None] * (gy * gx)
                     + plane[None]).ravel()  # fmt: skip
            ok = np.broadcast_to(inside, (n_lead, *inside.shape)).ravel().copy()
            if v.active is None:
                idx = elems
            else:
                idx = np.searchsorted(v.active, elems)
                ok &= idx < v.active.size
                ok[ok] &= v.active[idx[ok]] == elems[ok]
            parts.append(np.where(ok, v.offset + idx, -1))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def cut(self, layout: StateLayout, full: np.ndarray, box: TileBox) -> np.ndarray:
        """Tile ``box``'s values of the global field ``full`` (N_x,), in :meth:`layout` order.

        Points without a state row (:meth:`rows`) are NaN, written as the fill value.
        """
        rows = self.rows(layout, box)
        return np.where(rows >= 0, full[np.maximum(rows, 0)], np.nan)
