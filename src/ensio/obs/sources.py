"""An observation file with what the config says about it: variable and level.

Where the observed variable and level come from (README, "Observations"):

* ``variable``: the config entry's ``variable``, else the file's global
  attribute ``variable``, else the first state variable (both given and
  different: an error naming both);
* the level on a 3-D variable: per observation, the file's ``level`` or
  ``level_index`` variables (dimension ``obs``), or for the whole file the
  config entry's ``level`` / ``level_index`` (both a file variable and a
  config key: an error, the level would be ambiguous).

Checked against the state layout when the file is read, so a wrong name is
one line naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..layout.state import StateLayout
from .batch import ObsBatch
from .read import read_obs_file

__all__ = ["ObsSource", "read_source"]


@dataclass(frozen=True)
class ObsSource:
    """One observation file and its ``observations[]`` entry keys (resolved path)."""

    path: Path
    variable: str | None = None
    level: float | None = None
    level_index: int | None = None

    @classmethod
    def of(cls, source: Path | str | ObsSource) -> ObsSource:
        return source if isinstance(source, ObsSource) else cls(Path(source))


def read_source(
    source: ObsSource,
    layout: StateLayout,
    id_offset: int = 0,
    select: np.ndarray | None = None,
    values: bool = True,
    part: tuple[int, int] | None = None,
) -> ObsBatch:
    """Read one observation file with its observed variable and levels resolved.

    Parameters and the file format as :func:`~ensio.obs.read.read_obs_netcdf`
    (``part``: a contiguous slice, the regional distribution's parallel read);
    ``layout`` gives the state variables the names refer to.

    Raises
    ------
    InputError
        The file cannot be read, names an unknown variable, or its levels are
        ambiguous, missing for a 3-D variable or given for a 2-D one.
    """
    batch, attr = read_obs_file(source.path, id_offset, select, values=values, part=part)
    path = source.path
    names = [v.name for v in layout.variables]
    name = source.variable or attr or (names[0] if names else None)
    if source.variable and attr and source.variable != attr:
        raise InputError(
            f"{path}: observations[].variable '{source.variable}' differs from the file's "
            f"attribute variable = '{attr}'"
        )
    if name not in names:
        raise InputError(
            f"{path}: observed variable '{name}' (observations[].variable) is not a state "
            f"variable (ensemble.variables: {', '.join(names)})"
        )
    k = names.index(name)
    in_file = [n for n in ("level", "level_index") if getattr(batch, n) is not None]
    in_config = [n for n in ("level", "level_index") if getattr(source, n) is not None]
    if in_file and in_config:
        raise InputError(
            f"{path}: the file has per-observation '{in_file[0]}' and the config gives "
            f"observations[].{in_config[0]}: give the level in one place"
        )
    m = len(batch)
    level, level_index = batch.level, batch.level_index
    if source.level is not None:
        level = np.full(m, float(source.level))
    if source.level_index is not None:
        level_index = np.full(m, int(source.level_index), np.int64)
    _check_levels(path, layout, k, batch, level is not None or level_index is not None)
    return ObsBatch(
        values=batch.values,
        errors=batch.errors,
        lon=batch.lon,
        lat=batch.lat,
        index=batch.index,
        ids=batch.ids,
        variable=np.full(m, k, np.int64),
        level=level,
        level_index=level_index,
        time=batch.time,
    )


def _check_levels(path: Path, layout: StateLayout, k: int, batch: ObsBatch, leveled: bool):
    """A 3-D variable needs a level, a 2-D one takes none (observations without index only)."""
    geo = layout.geometry
    if geo is None or (batch.index is not None and np.all(batch.index >= 0)):
        return
    geo.horizontal(k)  # no lon/lat: say so (naming the key) before judging levels
    v = layout.variables[k]
    ax = geo.axes[k]
    nz = 1 if ax.vertical is None else v.shape[ax.vertical]
    if nz > 1 and not leveled:
        raise InputError(
            f"{path}: observed variable '{v.name}' is 3-D ({v.dims[ax.vertical]}={nz}): give "
            "observations[].level or level_index, or a 'level' variable in the file"
        )
    if ax.vertical is None and leveled:
        raise InputError(
            f"{path}: observed variable '{v.name}' has no vertical dimension, but the "
            "observations give a level"
        )
