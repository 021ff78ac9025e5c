"""The one analysis pipeline: a block of rows and observations in, the analysis out.

:func:`analyse_rows` is what every path into the analysis runs: the in-memory
API (:func:`~ensio.analysis.api.analyse`, the whole state on
``MPI.COMM_SELF``), the offline and online drivers (through
:func:`~ensio.analysis.inputs.assimilate_block`) and ``ensio bench analysis``.
Per call:

1. ``obs``: H for this rank's observations (the rows they read fetched from
   their owners, :mod:`~ensio.analysis.distributed`), quality control, the
   observations within the support radius of the rows;
2. the filter (:mod:`~ensio.analysis.filters`), one BLAS thread per rank, on
   the active rows: an inactive row (``block.inactive``, or a non-finite value
   in any member) is passed through unchanged, and observations whose operator
   reads one are rejected (``missing_state``);
3. ``posterior``: H of the analysis and the innovation statistics, summed
   over the observations' owners.

The result does not depend on the number of ranks (DESIGN.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_limits

from ..config.analysis import AnalysisSection
from ..layout.block import EnsembleBlock
from ..obs import ObsBatch, ObsOperator, QCCounts, RegularGrid, build_operator, quality_flags
from ..stopwatch import Stopwatch
from . import vertical
from .distributed import (
    RowPlan,
    innovation_stats,
    observation_owners,
    observations_near,
    observe,
    row_plan,
    sum_counts,
)
from .filters import localization_from_config, make_filter
from .localization import as_coords
from .obsdiag import observation_diagnostics
from .obsspace import ObsSpace
from .placement import block_row_coordinates, obs_coordinates, state_grid
from .result import AnalysisResult
from .stoo import SlotPrior
from .winterp import WeightGrid, selection_radius, weight_grid

__all__ = ["AnalysisSettings", "analyse_rows"]


@dataclass(frozen=True, eq=False)
class AnalysisSettings:
    """Everything :func:`analyse_rows` needs besides the rows, the observations and the ranks.

    Attributes
    ----------
    analysis : AnalysisSection
        The filter and its hyper-parameters, quality control, localization.
    coords : ndarray, shape (count, d), optional
        Location of the block's rows in the localization geometry. Default:
        the row index for ``periodic``, else lon/lat from the block's layout.
    grid : RegularGrid, optional
        For observations without an index (bilinear H). Default: the
        layout's grid (:func:`~ensio.analysis.placement.state_grid`).
    cycle : int
        Keys the random streams (EnKF perturbations, rotation).
    inflation : float or ndarray, shape (count,), optional
        Previous adaptive inflation estimate of the rows.
    obs_at_rows : bool
        Observations sit at the ``coords`` of the row they index (a
        ``radius`` in coordinate units; ``coords`` must cover the whole
        state): the in-memory API's rule. Otherwise they sit at their
        lon/lat (at their index for ``periodic``).
    """

    analysis: AnalysisSection
    coords: np.ndarray | None = None
    grid: RegularGrid | None = None
    cycle: int = 0
    inflation: np.ndarray | float | None = None
    obs_at_rows: bool = False


class _Observed(NamedTuple):
    """The observations of one rank after H and quality control."""

    op: ObsOperator
    ok: np.ndarray  # accepted, over this rank's observations
    own: np.ndarray  # owned by this rank, over this rank's observations
    flags: np.ndarray  # quality-control codes (QC_FLAGS), over this rank's observations
    hx_all: np.ndarray  # (k, m) H of the prior, over this rank's observations
    observations: ObsBatch  # this rank's observations
    own_ok: np.ndarray  # owned by this rank, over the accepted ones
    own_counts: QCCounts  # quality control of the owned observations
    accepted: ObsBatch
    hx: np.ndarray  # (k, accepted)
    space: ObsSpace  # accepted and within the radius of the rows
    row_coords: np.ndarray | None


def _observed(
    X: np.ndarray,
    block: EnsembleBlock,
    dist: RowPlan,
    observations: ObsBatch,
    settings: AnalysisSettings,
    comm: MPI.Comm,
    inactive: np.ndarray,
    prior: SlotPrior | None = None,
    wgrid: WeightGrid | None = None,
) -> _Observed:
    """Collective: H (or the 4-D ``prior``), quality control and the selection near the rows."""
    cfg = settings.analysis
    grid = settings.grid if settings.grid is not None else state_grid(block.layout)
    op, inside = build_operator(observations, dist.n_rows, grid)
    hx = observe(X, dist, op, comm) if prior is None else _given(prior, X.shape[0], len(op))
    in_window = None if prior is None else prior.in_window
    missing = _reads_inactive(inactive, dist, op, comm)
    if missing is not None:
        hx[:, missing] = np.nan
    own = observation_owners(op, inside, observations.ids, dist) == comm.rank
    flags = quality_flags(
        observations.values,
        observations.errors,
        hx,
        max_sigma=cfg.qc.max_sigma,
        inside=inside,
        missing=missing,
        in_window=in_window,
    )
    ok = flags == 0
    own_counts = QCCounts.of_flags(flags[own])
    obs = observations.subset(ok)
    hx_ok = hx[:, ok]
    given, given_levels = vertical.split_given(cfg, settings.coords)
    rows = block_row_coordinates(cfg, block, given)
    obs_coords = obs_coordinates(cfg, obs, rows, settings.obs_at_rows)
    if cfg.localization is None:
        keep = np.ones(len(obs), dtype=bool)
    else:
        geometry = localization_from_config(cfg.localization).geometry
        rows = as_coords(rows, geometry)
        radius = selection_radius(cfg.localization.support_radius, wgrid)
        keep = observations_near(geometry, rows, obs_coords, radius)  # horizontal
    if vertical.vertical_on(cfg):  # coordinates end with the level from here on
        obs_levels = (
            given_levels[obs.index]  # type: ignore[index]
            if settings.obs_at_rows and given_levels is not None
            else vertical.observation_levels(obs, block.layout)
        )
        rows = vertical.with_level(rows, vertical.row_levels(block, given_levels))
        obs_coords = vertical.with_level(obs_coords, obs_levels)
    space = ObsSpace(
        hx=hx_ok[:, keep],
        values=obs.values[keep],
        errors=obs.errors[keep],
        coords=obs_coords[keep],
        ids=obs.ids[keep],
    )
    return _Observed(op, ok, own, flags, hx, observations, own[ok], own_counts, obs, hx_ok,
                     space, rows)


def _given(prior: SlotPrior, k: int, m: int) -> np.ndarray:
    """The precomputed HX (a copy: quality control marks it), shape-checked."""
    if prior.hx.shape != (k, m) or prior.in_window.shape != (m,):
        raise ValueError(
            f"precomputed HX has shape {prior.hx.shape} (in_window {prior.in_window.shape}), "
            f"expected ({k}, {m}) for {k} members and {m} observations"
        )
    return np.array(prior.hx, dtype=float)


def _reads_inactive(
    inactive: np.ndarray, dist: RowPlan, op: ObsOperator, comm: MPI.Comm
) -> np.ndarray | None:
    """Collective: which observations read an inactive row (``None``: no row is inactive).

    H of a row that is NaN where inactive and 0 elsewhere: the rows an
    observation reads come from their owners exactly as for HX.
    """
    if not comm.allreduce(bool(inactive.any()), op=MPI.LOR):
        return None
    flag = np.where(inactive, np.nan, 0.0)[None, :]
    return ~np.isfinite(observe(flag, dist, op, comm)[0])


def _filter_rows(
    X: np.ndarray,
    seen: _Observed,
    settings: AnalysisSettings,
    inactive: np.ndarray,
    sw: Stopwatch,
    wgrid: WeightGrid | None = None,
) -> AnalysisResult:
    """The filter on the active rows; inactive rows pass through unchanged.

    NaN rows must never reach a kernel (the batched local kernel builds one
    basis per tile), so the filter sees only the active columns of ``X``;
    its per-row outputs are spread back (0 observations at inactive rows,
    their prior inflation kept).
    """
    cfg, cycle = settings.analysis, settings.cycle
    flt = make_filter(cfg)
    if wgrid is not None:  # analysis.weight_interpolation
        flt = dataclasses.replace(flt, weight_grid=wgrid)
    if not inactive.any():
        return flt.analyse(
            X, seen.row_coords, seen.space, cycle=cycle, inflation=settings.inflation, stopwatch=sw
        )
    act = np.flatnonzero(~inactive)
    n = X.shape[1]
    prior_infl = settings.inflation
    infl = prior_infl[act] if np.ndim(prior_infl) > 0 else prior_infl  # type: ignore[index]
    part = None
    if act.size:
        coords = None if seen.row_coords is None else seen.row_coords[act]
        part = flt.analyse(X[:, act], coords, seen.space, cycle=cycle, inflation=infl, stopwatch=sw)
    ens = X.copy()
    n_obs = np.zeros(n, dtype=np.int64)
    inflation = None
    if cfg.inflation.adaptive:  # inactive rows keep their previous estimate
        base = 1.0 if prior_infl is None else prior_infl
        inflation = np.broadcast_to(np.asarray(base, dtype=float), (n,)).copy()
    if part is None:
        return AnalysisResult(ensemble=ens, n_obs=n_obs, inflation=inflation)
    ens[:, act] = part.ensemble
    n_obs[act] = part.n_obs
    if inflation is not None and part.inflation is not None:
        inflation[act] = part.inflation

    def spread(values: np.ndarray | None) -> np.ndarray | None:
        if values is None:
            return None
        out = np.zeros(n)
        out[act] = values
        return out

    return dataclasses.replace(
        part,
        ensemble=ens,
        n_obs=n_obs,
        inflation=inflation if part.inflation is not None else None,
        dRd=spread(part.dRd),
        trace=spread(part.trace),
        weight_sum=spread(part.weight_sum),
    )


def analyse_rows(
    block: EnsembleBlock,
    observations: ObsBatch,
    settings: AnalysisSettings,
    comm: MPI.Comm,
    prior: SlotPrior | None = None,
) -> AnalysisResult:
    """Collective: analyse this rank's rows of a row-distributed ensemble.

    Parameters
    ----------
    block : EnsembleBlock
        This rank's prior rows ``[start, start + count)`` (member-major
        ``data``, shape (k, count)) under the block distribution of
        ``block.layout.n_rows`` rows over ``comm``.
    observations : ObsBatch
        All observations, or (local filters) at least those within the
        support radius of this rank's rows and those it owns
        (:func:`~ensio.analysis.distributed.observation_owners`); ids must
        be global.
    settings : AnalysisSettings
    comm : MPI.Comm
        The filter communicator (``MPI.COMM_SELF`` for one process).
    prior : SlotPrior, optional
        Precomputed HX of ``observations`` (4-D: each member at each
        observation's time slot, :mod:`~ensio.analysis.stoo`) used instead
        of H applied to ``block``. The posterior statistics still apply H to
        the analysis at the analysis time.

    Returns
    -------
    AnalysisResult
        This rank's analysis rows; ``qc``, ``prior``, ``posterior`` over all
        observations (the same on every rank); ``timings`` of this rank:
        ``obs`` (H, row exchange, QC, selection), the filter's phases,
        ``posterior``.
    """
    sw = Stopwatch()
    dist = row_plan(block, comm)
    X = np.asarray(block.data, dtype=np.float64)
    inactive = block.inactive_rows()
    wgrid = weight_grid(settings.analysis, block.layout, settings.grid, settings.coords)
    with sw("obs"):
        seen = _observed(X, block, dist, observations, settings, comm, inactive, prior, wgrid)
    cfg = settings.analysis
    # One BLAS thread per rank: ranks already fill the cores, and the many small
    # k×k eigendecompositions of a local analysis run ~4× slower threaded.
    limit = 1 if (comm.size > 1 or cfg.localization is not None) else None
    # the filter's own stopwatch: kernels time phases by laps, the first from the
    # stopwatch's start, which must not reach back over the obs phase
    fsw = Stopwatch()
    with threadpool_limits(limits=limit, user_api="blas"):
        res = _filter_rows(X, seen, settings, inactive, fsw, wgrid)
    sw.merge(fsw)
    with sw("posterior"):
        hx_all = observe(res.ensemble, dist, seen.op, comm)
        hx_post = hx_all[:, seen.ok]
        values = seen.accepted.values
        prior = innovation_stats(values, seen.hx, seen.own_ok, comm)
        posterior = innovation_stats(values, hx_post, seen.own_ok, comm)
        own = seen.own
        diagnostics = observation_diagnostics(
            seen.observations.subset(own), seen.flags[own], seen.hx_all[:, own],
            hx_all[:, own], [v.offset for v in block.layout.variables],
        )
    return dataclasses.replace(
        res,
        qc=sum_counts(seen.own_counts, comm),
        prior=prior,
        posterior=posterior,
        n_local_obs=len(seen.space),
        timings=sw.as_dict(),
        observations=diagnostics,
    )
