"""The regional distribution of the observations: no rank holds the list of all locations.

With more observations than a rank can hold (``analysis.observations``,
:class:`~ensio.config.analysis.ObsDistributionSection`), each rank

1. reads one contiguous slice of every observation file (a hyperslab per
   variable, :func:`~ensio.obs.read.read_obs_file` with ``part``);
2. finds, for each observation of its slice, the ranks that need it: those
   whose rows' region extended by the support radius contains it (every
   rank's few boxes, :mod:`ensio.obs.regions`, all-gathered once) and its
   owner (:func:`~ensio.analysis.distributed.observation_owners`, which
   counts it);
3. sends the records there with one ``Alltoallv`` (:func:`ensio.obs.exchange.route`),
   and keeps, of what it receives, exactly what the replicated path keeps
   (near its rows, or owned), sorted by global id.

So a rank holds its slice plus the observations near its rows, and the
analysis gets the same observations in the same order as with the
replicated path: the same result to the bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from ..config.analysis import AnalysisSection
from ..layout.block import EnsembleBlock
from ..obs import Locator, ObsBatch, ObsSource, build_operator, read_source
from ..obs.exchange import route, slice_of
from ..obs.regions import Boxes, cover, normalize_lonlat
from ..parallel.agree import all_call
from .distributed import RowPlan, observation_owners, observations_near, row_plan
from .filters import localization_from_config
from .placement import block_row_coordinates, obs_coordinates, state_grid
from .winterp import selection_radius, weight_grid

__all__ = ["load_regional", "rank_boxes", "regional_wanted"]


def regional_wanted(analysis: AnalysisSection, comm: MPI.Comm, n_obs: int) -> bool:
    """Whether ``analysis.observations`` asks for the regional path for ``n_obs`` observations."""
    mode = analysis.observations.distribution
    if mode == "auto":
        local = analysis.localization is not None
        return local and comm.size > 1 and n_obs > analysis.observations.regional_above
    return mode == "regional"


def rank_boxes(analysis: AnalysisSection, block: EnsembleBlock, comm: MPI.Comm) -> Boxes:
    """Collective: every rank's boxes (its rows' region extended by the support radius)."""
    loc = analysis.localization
    assert loc is not None
    geometry = localization_from_config(loc).geometry

    def mine() -> Boxes:
        rows = block_row_coordinates(analysis, block)
        assert rows is not None
        radius = selection_radius(loc.support_radius, weight_grid(analysis, block.layout))
        return cover(rows, geometry.kind, radius, comm.rank, geometry.period)

    return Boxes.concat(comm.allgather(all_call(comm, mine)))


#: Observations per call of the operator and selection code: their temporaries
#: (about 0.7 kB per observation for bilinear H on a state grid) stay bounded.
CHUNK = 1 << 14


def _destinations(
    batch: ObsBatch,
    analysis: AnalysisSection,
    boxes: Boxes,
    dist: RowPlan,
    grid: Locator | None,
    kind: str,
) -> tuple[np.ndarray, np.ndarray]:
    """(observation, rank) pairs: every rank whose box holds it, and its owner."""
    obs_parts, dest_parts = [], []
    for s in range(0, len(batch), CHUNK):
        part = batch.subset(np.arange(s, min(s + CHUNK, len(batch))))
        op, inside = build_operator(part, dist.n_rows, grid)
        owner = observation_owners(op, inside, part.ids, dist)
        del op
        coords = obs_coordinates(analysis, part)
        if kind == "lonlat":
            coords = normalize_lonlat(coords)
        obs, box = boxes.pairs(coords)
        obs_parts += [obs + s, np.arange(s, s + len(part), dtype=np.int64)]
        dest_parts += [boxes.rank[box], owner.astype(np.int64)]
    if not obs_parts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(obs_parts), np.concatenate(dest_parts)


def _kept(
    got: ObsBatch,
    analysis: AnalysisSection,
    block: EnsembleBlock,
    dist: RowPlan,
    grid: Locator | None,
    comm: MPI.Comm,
) -> np.ndarray:
    """Positions in ``got`` this rank keeps: near its rows, or owned by it.

    The rule of the replicated path (``ensio.analysis.inputs._needed``),
    with the k-d tree of the rows built once and H built chunk by chunk so
    the memory stays bounded; ``tests/mpi/test_obs_regional_mpi.py`` checks
    that both paths keep the same observations.
    """
    loc = analysis.localization
    assert loc is not None
    geometry = localization_from_config(loc).geometry
    rows = block_row_coordinates(analysis, block)
    assert rows is not None
    radius = selection_radius(loc.support_radius, weight_grid(analysis, block.layout))
    near = observations_near(geometry, rows, obs_coordinates(analysis, got), radius)
    for s in range(0, len(got), CHUNK):
        part = got.subset(np.arange(s, min(s + CHUNK, len(got))))
        op, inside = build_operator(part, dist.n_rows, grid)
        near[s : s + len(part)] |= observation_owners(op, inside, part.ids, dist) == comm.rank
    return np.flatnonzero(near)


def load_regional(
    sources: Sequence[ObsSource],
    counts: Sequence[int],
    analysis: AnalysisSection,
    block: EnsembleBlock,
    comm: MPI.Comm,
) -> ObsBatch:
    """Collective: the observations this rank needs, read and routed regionally.

    Parameters
    ----------
    sources : sequence of ObsSource
        The observation files, in config order.
    counts : sequence of int
        Number of observations of each file (ids are offset by the files before).
    analysis : AnalysisSection
        A local filter (its localization decides who needs what).
    block : EnsembleBlock
        This rank's rows.
    comm : MPI.Comm
        The filter communicator.

    Returns
    -------
    ObsBatch
        This rank's observations of all files, sorted by global id.

    Raises
    ------
    InputError
        On every rank, the lowest rank's error about a file (unknown
        variable, missing variable, levels), as the replicated path.
    """
    layout = block.layout
    grid = state_grid(layout)
    dist = row_plan(block, comm)
    boxes = rank_boxes(analysis, block, comm)
    assert analysis.localization is not None
    kind = localization_from_config(analysis.localization).geometry.kind
    batches, offset = [], 0
    for src, n in zip(sources, counts, strict=True):
        part = slice_of(n, comm)
        mine = all_call(comm, lambda s=src, o=offset, p=part: read_source(s, layout, o, part=p))
        obs, dest = all_call(
            comm, lambda b=mine: _destinations(b, analysis, boxes, dist, grid, kind)
        )
        got = route(mine, obs, dest, comm)
        del mine, obs, dest
        keep = all_call(comm, lambda g=got: _kept(g, analysis, block, dist, grid, comm))
        batches.append(got.subset(keep))
        offset += n
    return ObsBatch.concat(batches)
