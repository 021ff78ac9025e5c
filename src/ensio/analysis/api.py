"""The in-memory analysis API on one process: :func:`analyse`, :func:`assimilate`.

A thin wrapper over the one pipeline, :func:`~ensio.analysis.pipeline.analyse_rows`
on ``MPI.COMM_SELF``: the whole ensemble is one block of rows. It sits above
the pipeline (which builds its filter with
:func:`~ensio.analysis.filters.make_filter`), so the filters module no longer
imports the pipeline back; ``ensio.assimilate`` loads it on first use.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..config.analysis import AnalysisSection
from ..layout.block import EnsembleBlock
from ..layout.state import StateLayout
from ..obs import ObsBatch, RegularGrid
from .pipeline import AnalysisSettings, analyse_rows
from .result import AnalysisResult
from .stoo import SlotPrior

__all__ = ["analyse", "assimilate"]


def _row_coords(cfg: AnalysisSection, n: int, coords, grid: RegularGrid | None):
    loc = cfg.localization
    if loc is None:
        return None
    if coords is not None:
        c = np.asarray(coords, dtype=float)
        if c.shape[0] != n:
            raise ValueError(f"coords has {c.shape[0]} rows, the ensemble {n}")
        return c
    if loc.periodic is not None:
        return np.arange(n, dtype=float)
    if grid is not None and grid.offset == 0 and grid.size == n:
        return grid.coords()
    raise ValueError("a local filter needs coords= (the location of every state row)")


def analyse(
    ensemble: np.ndarray,
    observations: ObsBatch,
    config: AnalysisSection,
    *,
    coords: np.ndarray | None = None,
    grid: RegularGrid | None = None,
    cycle: int = 0,
    inflation: np.ndarray | float | None = None,
    timings: dict[str, float] | None = None,
    hx: np.ndarray | None = None,
) -> AnalysisResult:
    """In-memory analysis on one process: H, quality control, filter.

    The whole ensemble is one block of rows analysed by
    :func:`~ensio.analysis.pipeline.analyse_rows` on ``MPI.COMM_SELF``.

    Parameters
    ----------
    ensemble : ndarray, shape (k, n)
        Prior ensemble, member-major (member j is ``ensemble[j]``).
    observations : ObsBatch
    config : AnalysisSection
    coords : ndarray, shape (n, d), optional
        Row locations: (lon, lat) degrees for ``radius_km``; the grid index
        for ``periodic`` (default ``0..n-1``); any coordinates otherwise
        (observations then sit at the coordinates of the row they index).
        Defaults to ``grid.coords()`` when the grid covers the whole state.
        With ``analysis.localization.vertical`` one more, last column: the
        row's level (NaN: none); observations take the level of the row they
        index, else their ``level`` (NaN or none: vertical weight 1).
    grid : RegularGrid, optional
        For observations without an index (bilinear H).
    cycle : int
        Cycle number (random streams).
    inflation : float or ndarray, shape (n,), optional
        Previous adaptive inflation estimate.
    timings : dict, optional
        Seconds per phase are added to it (``obs`` for H and quality control,
        the filter's phases, ``posterior``); also in ``result.timings``.
    hx : ndarray, shape (k, m), optional
        Precomputed HX of the observations, used instead of H applied to
        ``ensemble``: in a 4-D analysis member j observed at each
        observation's time slot (NaN: rejected as ``bad_prior``). H is still
        built from ``observations`` (and ``grid``) for quality control,
        localization and the posterior statistics (H of the analysis).
    """
    X = np.asarray(ensemble, dtype=float)
    if X.ndim != 2:
        raise ValueError(f"ensemble must be (members, rows), got shape {X.shape}")
    n = X.shape[1]
    settings = AnalysisSettings(
        config,
        coords=_row_coords(config, n, coords, grid),
        grid=grid,
        cycle=cycle,
        inflation=inflation,
        obs_at_rows=config.localization is not None and config.localization.radius_km is None,
    )
    block = EnsembleBlock(StateLayout((), n), 0, n, X)
    prior = None
    if hx is not None:
        prior = SlotPrior(np.asarray(hx, dtype=float), np.ones(len(observations), dtype=bool))
    res = analyse_rows(block, observations, settings, MPI.COMM_SELF, prior)
    if timings is not None:
        for name, value in res.timings.items():
            timings[name] = timings.get(name, 0.0) + value
    return res


def assimilate(
    ensemble: np.ndarray,
    observations: ObsBatch,
    config: AnalysisSection,
    *,
    coords: np.ndarray | None = None,
    grid: RegularGrid | None = None,
    cycle: int = 0,
    inflation: np.ndarray | float | None = None,
    hx: np.ndarray | None = None,
) -> np.ndarray:
    """Analysis ensemble ``(k, n)`` (member-major); arguments as for :func:`analyse`."""
    res = analyse(
        ensemble, observations, config, coords=coords, grid=grid, cycle=cycle,
        inflation=inflation, hx=hx,
    )  # fmt: skip
    return res.ensemble
