"""What the analysis of a rank's rows needs besides the rows: observations and geometry.

Both the offline analysis (:mod:`ensio.offline`) and the filter side of the
online mode (:mod:`ensio.online.filter`) analyse a block of rows of the
ensemble matrix the same way; :func:`assimilate_rows` is that shared step, so
the two modes cannot drift apart. It lives here and not in ``offline.py``
because ``online/`` may import ``analysis`` but not a sibling top room.

This is the one place in ``analysis/`` that touches files: it reads the
observation files, and only through ``ensio.obs`` (DESIGN.md, "analysis knows
no files", refined in docs/design-notes.md item 10). It never reads or writes
member files.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ..config.schema import Config, ConfigError
from ..errors import InputError
from ..layout.state import StateLayout
from ..obs import ObsBatch, RegularGrid, build_operator, read_obs_netcdf
from ..obs.read import PARTIAL_READ_BYTES, obs_count
from ..parallel.agree import all_call, root_call
from .distributed import (
    DistributedAssimilation,
    analyse_rows,
    localization_coords,
    observation_owners,
    observations_near,
)
from .filters import localization_from_config

__all__ = ["assimilate_rows", "load_observations", "lonlat_of_rows", "state_grid"]


def load_observations(
    config: Config,
    comm: MPI.Comm,
    layout: StateLayout,
    start: int,
    count: int,
    row_lonlat: np.ndarray | None,
) -> ObsBatch:
    """Collective: the observations this rank needs, with global ids.

    Global filters need every observation on every rank. A local filter
    keeps only those within the support radius of its rows plus those it
    owns (for the global counts). Files up to ``PARTIAL_READ_BYTES`` are read
    once by rank 0 and broadcast; larger files are read by every rank, the
    locations in full and the values and errors of its selection only.
    Files after the first get ids offset by the sizes before them, so the
    EnKF perturbation streams are keyed by a global number.

    Parameters
    ----------
    config : Config
        ``observations`` (the files) and ``analysis`` (the localization).
    comm : MPI.Comm
        The filter communicator.
    layout : StateLayout
    start, count : int
        This rank's rows ``[start, start + count)``.
    row_lonlat : ndarray, shape (count, 2), or None
        Lon/lat in degrees of this rank's rows (:func:`lonlat_of_rows`).

    Returns
    -------
    ObsBatch
        The selected observations of all files, concatenated.
    """
    if not config.observations:
        raise ConfigError("observations: at least one observation file is needed for an analysis")
    assert config.analysis is not None
    paths = [config.resolve(e.file) for e in config.observations]

    def sizes() -> list[tuple[int, int]]:
        out = []
        for p in paths:
            if not p.exists():
                raise InputError(f"{p}: observation file not found")
            out.append((obs_count(p), p.stat().st_size))
        return out

    info = root_call(comm, sizes)
    local = config.analysis.localization is not None
    grid = state_grid(layout)
    batches, offset = [], 0
    for path, (n, nbytes) in zip(paths, info, strict=True):
        if local and comm.size > 1 and nbytes > PARTIAL_READ_BYTES:
            where = all_call(comm, lambda p=path, o=offset: read_obs_netcdf(p, o, values=False))
            sel = _needed(where, config, comm, layout.n_rows, start, count, row_lonlat, grid)
            batch = all_call(comm, lambda p=path, o=offset, s=sel: read_obs_netcdf(p, o, select=s))
        else:
            batch = root_call(comm, lambda p=path, o=offset: read_obs_netcdf(p, o))
            if local and comm.size > 1:
                batch = batch.subset(
                    _needed(batch, config, comm, layout.n_rows, start, count, row_lonlat, grid)
                )
        batches.append(batch)
        offset += n
    return ObsBatch.concat(batches)


def _needed(obs, config, comm, n_rows, start, count, row_lonlat, grid) -> np.ndarray:
    """Positions (within ``obs``) of the observations this rank needs: near or owned."""
    op, inside = build_operator(obs, n_rows, grid)
    owners = observation_owners(op, inside, obs.ids, n_rows, comm.size)
    row_coords, obs_coords = localization_coords(config.analysis, start, count, row_lonlat, obs)
    geometry = localization_from_config(config.analysis.localization).geometry
    near = observations_near(
        geometry, row_coords, obs_coords, config.analysis.localization.support_radius
    )
    return np.flatnonzero(near | (owners == comm.rank))


def state_grid(layout: StateLayout) -> RegularGrid | None:
    """The regular lon/lat grid of the first state variable, for bilinear H (if it has one).

    Observations without an ``index`` are interpolated bilinearly, which needs
    a regular grid: only a 2-D, unmasked first variable stored as (lat, lon)
    with 1-D coordinates qualifies; otherwise ``None`` (index H only).
    """
    lon, lat = layout.coords.get("lon"), layout.coords.get("lat")
    if lon is None or lat is None or len(lon[0]) != 1 or len(lat[0]) != 1:
        return None
    v = layout.variables[0]
    if v.active is not None or v.dims[-2:] != (lat[0][0], lon[0][0]) or len(v.dims) != 2:
        return None
    return RegularGrid(lon=lon[1], lat=lat[1], offset=v.offset)


def lonlat_of_rows(layout: StateLayout, start: int, count: int) -> np.ndarray | None:
    """Lon/lat of the rows ``[start, start + count)``, for localization and obs selection.

    Returns
    -------
    ndarray, shape (count, 2), or None
        Columns lon, lat in degrees; ``None`` if the layout has no lon/lat
        coordinates (then localization uses row indices).
    """
    if "lon" not in layout.coords or "lat" not in layout.coords:
        return None
    c = layout.coordinates(start, start + count)
    return np.stack([c["lon"], c["lat"]], axis=1)


def assimilate_rows(
    config: Config,
    comm: MPI.Comm,
    layout: StateLayout,
    X: np.ndarray,
    start: int,
    cycle: int,
    seconds: dict[str, float],
) -> DistributedAssimilation:
    """Collective: load this rank's observations and analyse its rows ``X``.

    Shared by the offline path and the online filter, so both run exactly the
    same analysis.

    Parameters
    ----------
    config : Config
        ``observations`` and ``analysis`` (must be set).
    comm : MPI.Comm
        The filter communicator.
    layout : StateLayout
    X : ndarray, shape (N_e, count)
        The prior rows ``[start, start + count)`` of all members, member-major.
    start : int
        First row of this rank.
    cycle : int
        Keys the random streams (``ensio analyse --cycle``).
    seconds : dict
        Receives ``obs`` (reading, H, the HX exchange, QC) and ``analysis``
        (the filter), this rank's seconds.

    Returns
    -------
    DistributedAssimilation
        The analysis of this rank's rows (``ensemble``: shape (N_e, count)).
    """
    assert config.analysis is not None
    count = X.shape[1]
    t = time.perf_counter()
    row_lonlat = lonlat_of_rows(layout, start, count)
    obs = load_observations(config, comm, layout, start, count, row_lonlat)
    t_load = time.perf_counter() - t
    timings: dict[str, float] = {}
    t = time.perf_counter()
    result = analyse_rows(
        X,
        start,
        layout.n_rows,
        row_lonlat,
        obs,
        config.analysis,
        comm,
        grid=state_grid(layout),
        cycle=cycle,
        timings=timings,
    )
    seconds["obs"] = t_load + timings.get("obs", 0.0)
    seconds["analysis"] = time.perf_counter() - t - timings.get("obs", 0.0)
    return result
