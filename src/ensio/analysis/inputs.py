"""What the analysis of a rank's rows needs besides the rows: the observations.

Both the offline analysis (:mod:`ensio.offline`) and the filter side of the
online mode (:mod:`ensio.online.filter`) analyse a block of rows of the
ensemble matrix the same way; :func:`assimilate_block` is that shared step
(read the observations this rank needs, then the one pipeline
:func:`~ensio.analysis.pipeline.analyse_rows`), so the two modes cannot drift
apart. It lives here and not in ``offline.py`` because ``online/`` may import
``analysis`` but not a sibling top room.

This is the one place in ``analysis/`` that touches files: it reads the
observation files, and only through ``ensio.obs`` (DESIGN.md, "analysis knows
no files", refined in docs/design-notes.md item 10). It never reads or writes
member files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..config.analysis import AnalysisSection, ObservationFile
from ..config.errors import ConfigError
from ..errors import InputError
from ..layout.block import EnsembleBlock
from ..layout.rowsetblock import RowSetBlock
from ..obs import Locator, ObsBatch, ObsSource, build_operator, read_source
from ..obs.read import PARTIAL_READ_BYTES, obs_count
from ..parallel.agree import all_call, root_call
from ..parallel.distribution import RowDistribution
from ..parallel.rowsets import RowSets
from ..stopwatch import Stopwatch
from .distributed import observation_owners, observations_near, row_plan
from .filters import localization_from_config
from .pipeline import AnalysisSettings, analyse_rows
from .placement import block_row_coordinates, obs_coordinates, state_grid
from .regional_obs import load_regional, regional_wanted
from .regroup import location_plan, move_columns
from .result import AnalysisResult
from .stoo import SlotPrior, SlotReader, slot_prior
from .winterp import selection_radius, weight_grid

__all__ = [
    "PARTIAL_READ_BYTES",
    "assimilate_block",
    "load_observations",
    "observation_sizes",
    "observation_sources",
]


def observation_sources(entries: Sequence[ObservationFile], resolve) -> list[ObsSource]:
    """The ``observations:`` entries as sources (paths resolved by ``resolve``)."""
    return [ObsSource(resolve(e.file), e.variable, e.level, e.level_index) for e in entries]


def load_observations(
    paths: Sequence[Path | ObsSource],
    analysis: AnalysisSection,
    block: EnsembleBlock,
    comm: MPI.Comm,
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
    paths : sequence of Path or ObsSource
        The observation files (``observations``, resolved; a plain path
        observes the first state variable, levels only from the file).
    analysis : AnalysisSection
        The localization decides what a rank needs.
    block : EnsembleBlock
        This rank's rows (their layout places them).
    comm : MPI.Comm
        The filter communicator.

    Returns
    -------
    ObsBatch
        The selected observations of all files, concatenated.
    """

    sources = [ObsSource.of(p) for p in paths]
    info = _file_info(sources, comm)
    if regional_wanted(analysis, comm, sum(n for n, _ in info)):  # analysis.observations
        return load_regional(sources, [n for n, _ in info], analysis, block, comm)
    files = _read_files(sources, analysis, block, comm, info)
    return ObsBatch.concat([batch for _, _, batch in files])


def observation_sizes(sources: Sequence[ObsSource], comm: MPI.Comm) -> list[tuple[str, int]]:
    """Collective: the name and observation count of every file (the global ids are
    numbered across them in this order; the diagnostics file breaks them down by file)."""
    return [(s.path.name, n) for s, (n, _) in zip(sources, _file_info(sources, comm),
                                                   strict=True)]  # fmt: skip


def _file_info(sources: Sequence[ObsSource], comm: MPI.Comm) -> list[tuple[int, int]]:
    """Collective: (observation count, bytes) of every file, read by rank 0."""

    def sizes() -> list[tuple[int, int]]:
        out = []
        for s in sources:
            if not s.path.exists():
                raise InputError(f"{s.path}: observation file not found")
            out.append((obs_count(s.path), s.path.stat().st_size))
        return out

    return root_call(comm, sizes)


def _read_files(
    paths: Sequence[Path | ObsSource],
    analysis: AnalysisSection,
    block: EnsembleBlock,
    comm: MPI.Comm,
    info: list[tuple[int, int]] | None = None,
) -> list[tuple[ObsBatch, np.ndarray, ObsBatch]]:
    """Collective, per file: every observation's location, the positions this rank needs, those.

    The first item holds every observation of the file on every rank (with
    values for files read by rank 0, NaN values for large files): the
    4-D observation operator applies H to all of them
    (:func:`~ensio.analysis.stoo.slot_prior`). With ``analysis.time_slots``
    each file must have a ``time`` variable unless there is one slot and no
    window.
    """
    sources = [ObsSource.of(p) for p in paths]
    layout = block.layout
    if info is None:
        info = _file_info(sources, comm)
    local = analysis.localization is not None and comm.size > 1
    grid = state_grid(layout)
    timed = analysis.edges is not None
    out, offset = [], 0
    for src, (n, nbytes) in zip(sources, info, strict=True):
        if local and nbytes > PARTIAL_READ_BYTES:
            where = all_call(comm, lambda s=src, o=offset: _read(s, layout, o, timed, False))
            sel = _needed(where, analysis, block, grid, comm)
            batch = all_call(comm, lambda s=src, o=offset, x=sel: read_source(s, layout, o, x))
        else:
            where = root_call(comm, lambda s=src, o=offset: _read(s, layout, o, timed, True))
            sel = _needed(where, analysis, block, grid, comm) if local else np.arange(n)
            batch = where.subset(sel) if local else where
        out.append((where, sel, batch))
        offset += n
    return out


def _read(src: ObsSource, layout, offset: int, timed: bool, values: bool) -> ObsBatch:
    """One file (all observations); ``timed``: its ``time`` variable is required."""
    batch = read_source(src, layout, offset, values=values)
    if timed and batch.time is None:
        raise InputError(
            f"{src.path}: variable 'time' missing in observation file (analysis.time_slots "
            "bins the observations by time)"
        )
    return batch


def _needed(
    obs: ObsBatch,
    analysis: AnalysisSection,
    block: EnsembleBlock,
    grid: Locator | None,
    comm: MPI.Comm,
) -> np.ndarray:
    """Positions (within ``obs``) of the observations this rank needs: near or owned."""
    assert analysis.localization is not None
    dist = row_plan(block, comm)
    op, inside = build_operator(obs, dist.n_rows, grid)
    owners = observation_owners(op, inside, obs.ids, dist)
    rows = block_row_coordinates(analysis, block)
    geometry = localization_from_config(analysis.localization).geometry
    radius = selection_radius(analysis.localization.support_radius,
                              weight_grid(analysis, block.layout))  # fmt: skip
    near = observations_near(geometry, rows, obs_coordinates(analysis, obs), radius)
    return np.flatnonzero(near | (owners == comm.rank))


def assimilate_block(
    block: EnsembleBlock,
    observation_files: Sequence[Path | ObsSource],
    analysis: AnalysisSection,
    comm: MPI.Comm,
    *,
    cycle: int,
    seconds: dict[str, float],
    slots: SlotReader | None = None,
) -> AnalysisResult:
    """Collective: load this rank's observations and analyse its rows.

    Shared by the offline path and the online filter, so both run exactly the
    same analysis.

    Parameters
    ----------
    block : EnsembleBlock
        The prior rows ``[start, start + count)`` of all members (``data``:
        shape (N_e, count), member-major).
    observation_files : sequence of Path or ObsSource
        ``observations`` (:func:`observation_sources`); at least one.
    analysis : AnalysisSection
    comm : MPI.Comm
        The filter communicator.
    cycle : int
        Keys the random streams (``ensio analyse --cycle``).
    seconds : dict
        Receives ``obs`` (reading, H, the HX exchange, QC) and ``analysis``
        (the filter), this rank's seconds.
    slots : SlotReader, optional
        The members' states at the time slots of ``analysis.time_slots``
        (required with it): a 4-D analysis whose HX comes from the parallel
        observation operator (:mod:`~ensio.analysis.stoo`).

    Returns
    -------
    AnalysisResult
        The analysis of this rank's rows (``ensemble``: shape (N_e, count)).
    """
    if not observation_files:
        raise ConfigError("observations: at least one observation file is needed for an analysis")
    if analysis.time_slots is not None and slots is None:
        raise ConfigError(
            "analysis.time_slots: this mode does not read the members' slot states "
            "(ensemble.slots); only ensio analyse runs a 4-D analysis"
        )
    sw = Stopwatch()
    plan = None if slots is not None or getattr(block, "plan", None) is not None else \
        location_plan(block.layout, comm)
    given = block
    if plan is not None:  # each transform once: the same locations of every variable
        with sw("rows"):
            block = _grouped(block, plan, comm)
    with sw("load"):
        prior = None
        if slots is None:
            obs = load_observations(observation_files, analysis, block, comm)
        else:
            obs, prior = _slot_observations(observation_files, analysis, block, slots, comm)
    with sw("rows"):
        result = analyse_rows(block, obs, AnalysisSettings(analysis, cycle=cycle), comm, prior)
        if plan is not None:
            result = _ungrouped(result, given, plan, comm)
    in_rows = result.timings.get("obs", 0.0)
    seconds["obs"] = sw["load"] + in_rows
    seconds["analysis"] = sw["rows"] - in_rows
    return result


def _grouped(block: EnsembleBlock, plan: RowSets, comm: MPI.Comm) -> RowSetBlock:
    """Collective: ``block`` (this rank's rows of the block distribution) as ``plan``'s rows."""
    dist = RowDistribution.of(block.layout.n_rows, comm)
    data = move_columns(np.asarray(block.data, dtype=np.float64), block.rows, plan.rows,
                        dist.owner, plan.owner, comm)
    inactive = None
    if comm.allreduce(block.inactive is not None, op=MPI.LOR):
        flags = np.zeros(block.count) if block.inactive is None else block.inactive
        inactive = move_columns(np.asarray(flags, dtype=np.float64)[None], block.rows,
                                plan.rows, dist.owner, plan.owner, comm)[0] > 0.5
    return RowSetBlock.of(block.layout, plan, data, inactive)


def _ungrouped(result: AnalysisResult, block: EnsembleBlock, plan: RowSets,
               comm: MPI.Comm) -> AnalysisResult:
    """Collective: the per-row parts of ``result`` (``plan``'s rows) back on ``block``'s rows."""
    dist = RowDistribution.of(block.layout.n_rows, comm)

    def back(values: np.ndarray) -> np.ndarray:
        return move_columns(values, plan.rows, block.rows, plan.owner, dist.owner, comm)

    def row(values: np.ndarray | None) -> np.ndarray | None:
        if not comm.allreduce(values is not None, op=MPI.LAND):
            return None
        assert values is not None
        return back(np.asarray(values, dtype=np.float64)[None])[0].astype(values.dtype)

    return dataclasses.replace(
        result, ensemble=back(result.ensemble), n_obs=row(result.n_obs),
        inflation=row(result.inflation), dRd=row(result.dRd), trace=row(result.trace),
        weight_sum=row(result.weight_sum))


def _slot_observations(
    observation_files: Sequence[Path | ObsSource],
    analysis: AnalysisSection,
    block: EnsembleBlock,
    slots: SlotReader,
    comm: MPI.Comm,
) -> tuple[ObsBatch, SlotPrior]:
    """Collective: this rank's observations and their 4-D HX from the slot states."""
    files = _read_files(observation_files, analysis, block, comm)
    every = ObsBatch.concat([where for where, _, _ in files])
    starts = np.cumsum([0] + [len(where) for where, _, _ in files])[:-1]
    wanted = np.concatenate([np.zeros(0, np.int64)]
                            + [a + sel for a, (_, sel, _) in zip(starts, files, strict=True)])
    obs = ObsBatch.concat([batch for _, _, batch in files])
    prior = slot_prior(
        every, wanted, block.data.shape[0], analysis.edges, analysis.n_slots,
        block.layout.n_rows, state_grid(block.layout), slots, comm,
    )  # fmt: skip
    return obs, prior
