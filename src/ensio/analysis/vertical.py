"""Levels of rows and observations, for vertical localization.

With ``analysis.localization.vertical`` the analysis places every row and
every observation at a level as well as a horizontal location: the level
column that :class:`~ensio.analysis.localization.Localization` expects last
in the coordinates. Selection of observations (which rank needs which,
which are near a rank's rows) stays horizontal: the vertical taper only
lowers weights, so the horizontal selection is still a superset.

Levels are values of the state's level coordinate (``ensemble.coordinates.level``):

* a row of a 3-D variable: the level of its layer; a row of a 2-D variable
  (or of one without a level coordinate): none;
* an observation: its ``level`` value, else the level coordinate at its
  ``level_index``, else (an ``index``) the level of the row it observes;
  none for an observation of a 2-D variable, whatever its file says.

"None" is NaN here; it means vertical weight 1 against everything.
Pure functions of the layout and the arrays, so a row or an observation has
the same level on every rank.
"""

from __future__ import annotations

import numpy as np

from ..config.analysis import AnalysisSection
from ..layout.block import EnsembleBlock
from ..layout.state import StateLayout
from ..obs import ObsBatch
from .placement import runs_of

__all__ = [
    "levels_of_rows",
    "observation_levels",
    "row_levels",
    "split_given",
    "vertical_on",
    "with_level",
]


def vertical_on(cfg: AnalysisSection) -> bool:
    """Whether ``cfg`` asks for vertical localization."""
    return cfg.localization is not None and cfg.localization.vertical is not None


def split_given(
    cfg: AnalysisSection, coords: np.ndarray | None
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A caller's row coordinates (the in-memory API's) as ``(horizontal, levels)``.

    With vertical localization the caller's coordinates end with the level
    column; otherwise they are all horizontal (levels ``None``).
    """
    if coords is None or not vertical_on(cfg):
        return coords, None
    c = np.asarray(coords, dtype=float)
    if c.ndim != 2 or c.shape[1] < 2:
        raise ValueError(
            "analysis.localization.vertical: coords must end with a level column, "
            f"got shape {c.shape}"
        )
    return c[:, :-1], c[:, -1]


#: Rows between two wanted ones below which :func:`levels_of_rows` spans the gap
#: in one :meth:`StateLayout.coordinates` call (a call costs about as much as
#: the coordinates of a few hundred rows).
SPAN_GAP = 256


def levels_of_rows(layout: StateLayout, rows: np.ndarray) -> np.ndarray:
    """Level of each of the increasing state ``rows`` (NaN: none), shape (len(rows),).

    One :meth:`StateLayout.coordinates` call per run of rows, runs less than
    :data:`SPAN_GAP` apart joined (scattered observed rows: few calls).
    """
    rows = np.asarray(rows, dtype=np.int64)
    out = np.full(rows.size, np.nan)
    if layout.geometry is None or rows.size == 0:
        return out
    starts, stops = runs_of(rows)
    join = starts[1:] - stops[:-1] < SPAN_GAP
    first = np.concatenate([[0], np.flatnonzero(~join) + 1])
    last = np.concatenate([np.flatnonzero(~join), [starts.size - 1]])
    for a, b in zip(starts[first], stops[last], strict=True):
        lev = layout.coordinates(int(a), int(b)).get("level")
        if lev is not None:
            sel = slice(*np.searchsorted(rows, [a, b]))
            out[sel] = lev[rows[sel] - a]
    return out


def _block_levels(block: EnsembleBlock) -> np.ndarray:
    """Levels of a block's rows (contiguous or a row set)."""
    if getattr(block, "plan", None) is None:
        rows = np.arange(block.start, block.start + block.count, dtype=np.int64)
    else:
        rows = block.rows
    return levels_of_rows(block.layout, rows)


def observation_levels(obs: ObsBatch, layout: StateLayout) -> np.ndarray:
    """Level of each observation (module docstring), shape (m,); NaN: none."""
    m = len(obs)
    out = np.full(m, np.nan)
    geo = layout.geometry
    index = np.full(m, -1, np.int64) if obs.index is None else obs.index
    by_index = index >= 0
    if by_index.any():
        idx = index[by_index]
        inside = idx < layout.n_rows
        uniq, inv = np.unique(idx[inside], return_inverse=True)
        lev = np.full(idx.size, np.nan)
        lev[inside] = levels_of_rows(layout, uniq)[inv.ravel()]
        out[by_index] = lev
    if geo is None:  # no layout geometry (the in-memory API): the files' level values
        if obs.level is not None:
            out[~by_index] = obs.level[~by_index]
        return out
    var = np.zeros(m, np.int64) if obs.variable is None else np.maximum(obs.variable, 0)
    value = np.full(m, np.nan) if obs.level is None else obs.level
    li = np.full(m, -1, np.int64) if obs.level_index is None else obs.level_index
    for k in np.unique(var[~by_index]):
        ax = geo.axes[int(k)] if k < len(geo.axes) else None
        if ax is None or ax.level is None or ax.vertical is None:
            continue  # a 2-D variable (or no level coordinate): no level
        sel = ~by_index & (var == k)
        levels = np.asarray(ax.level.values, dtype=float)
        lev = np.where(np.isfinite(value[sel]), value[sel], np.nan)
        use_li = (li[sel] >= 0) & (li[sel] < levels.size)
        lev[use_li] = levels[li[sel][use_li]]
        if levels.size == 1:  # one level: H reads it whatever the file says
            lev[:] = levels[0]
        out[sel] = lev
    return out


def with_level(coords: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """``coords`` (n, d) with ``levels`` (n,) as one more, last column."""
    c = np.asarray(coords, dtype=float)
    # (n, d) as given; a 1-D array is one coordinate per row (n = 0: no observation)
    c = c[:, None] if c.ndim == 1 else c.reshape(c.shape[0], int(np.prod(c.shape[1:])))
    return np.concatenate([c, np.asarray(levels, dtype=float)[:, None]], axis=1)


def row_levels(block: EnsembleBlock, given: np.ndarray | None) -> np.ndarray:
    """Levels of the block's rows: the caller's, else the layout's."""
    return np.asarray(given, dtype=float) if given is not None else _block_levels(block)
