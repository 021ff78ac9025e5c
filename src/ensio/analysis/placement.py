"""Where rows and observations are, in the localization geometry.

The rows of a block are placed by the state layout (lon/lat of every row),
by the row index (1-D periodic models whose rows are the grid) or by
coordinates the caller gives; observations by their lon/lat, by the row
they index (``periodic``), or (the in-memory API's ``radius``) at the
coordinates of that row. Pure functions of the layout and the arrays.

A block's rows are a contiguous range or, in the group shuffle, any
increasing set of rows (:class:`~ensio.layout.rowsetblock.RowSetBlock`):
:func:`block_row_coordinates` places either, row by row, so a row has the
same coordinates whichever rank holds it.
"""

from __future__ import annotations

import numpy as np

from ..config.analysis import AnalysisSection
from ..layout.block import EnsembleBlock
from ..layout.state import StateLayout
from ..obs import ObsBatch, StateGrid

__all__ = [
    "block_row_coordinates",
    "lonlat_of_row_set",
    "lonlat_of_rows",
    "obs_coordinates",
    "row_coordinates",
    "runs_of",
    "state_grid",
]


def state_grid(layout: StateLayout) -> StateGrid | None:
    """H of observations without an index on the layout's state (``None``: no files).

    Any state variable (``ObsBatch.variable``), 2-D or 3-D (level), on a
    rectilinear or curvilinear lon/lat grid, masked or not
    (:class:`~ensio.obs.stategrid.StateGrid`). ``None`` for a layout without
    coordinates (the in-memory API: give a :class:`~ensio.obs.RegularGrid`).
    """
    return None if layout.geometry is None else StateGrid(layout)


def lonlat_of_rows(layout: StateLayout, start: int, count: int) -> np.ndarray | None:
    """Lon/lat of the rows ``[start, start + count)``, for localization and obs selection.

    Each row sits at its own grid point (its own variable's; a row of a 3-D
    variable at its horizontal position: its level, for vertical
    localization, is added by :mod:`~ensio.analysis.vertical`).

    Returns
    -------
    ndarray, shape (count, 2), or None
        Columns lon, lat in degrees; ``None`` if the layout has no
        coordinates at all (a layout without files).

    Raises
    ------
    InputError
        The member files have no lon/lat (the message names
        ``ensemble.coordinates.lon``/``lat`` and the file).
    """
    if layout.geometry is None:
        return None
    c = layout.coordinates(start, start + count)
    return np.stack([c["lon"], c["lat"]], axis=1)


def runs_of(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Maximal runs of consecutive rows in increasing ``rows``: (starts, stops), int64."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    cuts = np.flatnonzero(np.diff(rows) != 1) + 1
    first = np.concatenate([[0], cuts])
    last = np.concatenate([cuts, [rows.size]]) - 1
    return rows[first], rows[last] + 1


def lonlat_of_row_set(layout: StateLayout, rows: np.ndarray) -> np.ndarray | None:
    """Lon/lat of any increasing ``rows``, shape (len(rows), 2) (see :func:`lonlat_of_rows`).

    One :meth:`StateLayout.coordinates` call per run of consecutive rows (one
    per latitude line and level of a tile piece), so the values are those of
    a contiguous block, row for row.
    """
    if layout.geometry is None:
        return None
    starts, stops = runs_of(rows)
    parts = [lonlat_of_rows(layout, int(a), int(b - a)) for a, b in zip(starts, stops, strict=True)]
    return np.concatenate(parts) if parts else np.empty((0, 2))  # type: ignore[arg-type]


def block_row_coordinates(
    config: AnalysisSection, block: EnsembleBlock, coords: np.ndarray | None = None
) -> np.ndarray | None:
    """:func:`row_coordinates` of a block's rows, contiguous or a row set."""
    if getattr(block, "plan", None) is None or coords is not None or config.localization is None:
        return row_coordinates(config, block.layout, block.start, block.count, coords)
    rows = block.rows
    if config.localization.periodic is not None:
        return rows.astype(float)[:, None]
    lonlat = lonlat_of_row_set(block.layout, rows)
    if lonlat is None:
        raise ValueError("a local filter needs the lon/lat of the state rows")
    return lonlat


def row_coordinates(
    config: AnalysisSection,
    layout: StateLayout,
    start: int,
    count: int,
    coords: np.ndarray | None = None,
) -> np.ndarray | None:
    """Coordinates of the rows ``[start, start + count)`` in the localization geometry.

    ``coords`` when given; else the row index for ``periodic``; else lon/lat
    of the layout. None for a global filter.
    """
    loc = config.localization
    if loc is None:
        return None
    if coords is not None:
        return np.asarray(coords, dtype=float)
    if loc.periodic is not None:
        return np.arange(start, start + count, dtype=float)[:, None]
    lonlat = lonlat_of_rows(layout, start, count)
    if lonlat is None:
        raise ValueError("a local filter needs the lon/lat of the state rows")
    return lonlat


def obs_coordinates(
    config: AnalysisSection,
    obs: ObsBatch,
    row_coords: np.ndarray | None = None,
    at_rows: bool = False,
) -> np.ndarray:
    """Coordinates of the observations in the localization geometry, shape (m, d).

    lon/lat (degrees) for ``radius_km``, global filters and a Euclidean
    ``radius``; the state row index for ``periodic``. With ``at_rows`` (and
    a ``radius`` in coordinate units) each observation takes the coordinates
    of the row it indexes: ``row_coords`` must then cover the whole state.
    """
    loc = config.localization
    if loc is not None and loc.radius_km is None and at_rows:
        if obs.index is None or np.any(obs.index < 0):
            raise ValueError(
                "analysis.localization.radius: observations in index units need an index"
            )
        assert row_coords is not None
        return np.asarray(row_coords, dtype=float).reshape(row_coords.shape[0], -1)[obs.index]
    if loc is not None and loc.periodic is not None:
        if obs.index is None or np.any(obs.index < 0):
            raise ValueError(
                "analysis.localization.periodic: observations need an index (grid units)"
            )
        return obs.index.astype(float)[:, None]
    return np.stack([obs.lon, obs.lat], axis=1)
