"""The filter side of the online mode: the offline analysis, on blocks gathered in memory.

The P filter ranks (the ranks of member 1) hold, after the gather along the
coupled communicators, exactly the rows ``block_distribution(N_x, P, p)`` of
all members that rank p of an offline run with P ranks would have read from
the files. From there :func:`run_filter` does what
:func:`ensio.offline.run_analysis` does after its read: the same analysis step
(:func:`ensio.analysis.inputs.assimilate_block`: observation handling and
:func:`~ensio.analysis.pipeline.analyse_rows`) and the same writers of the
analysis members and products (:func:`ensio.io.products.products.write_member_copies`,
:func:`ensio.io.products.products.write_products`). So the online and offline analyses
agree to rounding (the distributed analysis does not depend on the number of
ranks) and their files differ only in the ``history`` attribute.

Imports: ``online/`` may import ``parallel`` and ``analysis`` (DESIGN.md); the
writers in ``io/`` are imported inside :func:`run_filter` only, because the
model side never writes files.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..analysis.inputs import assimilate_block, observation_sizes, observation_sources
from ..analysis.obsdiag import gathered_tables
from ..analysis.result import AnalysisResult
from ..config.schema import Config, ConfigError
from ..layout.block import EnsembleBlock
from ..layout.state import StateLayout

__all__ = ["run_filter"]


def run_filter(
    config: Config,
    comm: MPI.Comm,
    layout: StateLayout,
    start: int,
    X: np.ndarray,
    *,
    cycle: int,
    template: Path | None,
) -> tuple[AnalysisResult, dict[str, float]]:
    """Collective over the filter communicator: analyse, write members and products.

    Parameters
    ----------
    config : Config
        Of this cycle: ``observations``, ``analysis``, ``io``, ``output`` as
        for ``ensio analyse``.
    comm : MPI.Comm
        The filter communicator (P ranks).
    layout : StateLayout
    start : int
        First row of this filter rank.
    X : ndarray, shape (N_e, count)
        The prior rows of all members, member-major.
    cycle : int
        Keys the random streams, as ``ensio analyse --cycle``.
    template : Path or None
        A member-shaped file for members that have no file of their own
        (see :func:`_copy_sources`) and for the product files.

    Returns
    -------
    (AnalysisResult, dict)
        The analysis of this rank's rows, and seconds per phase
        (``obs``, ``analysis``, ``write``, ``products``), maximum over ranks.
    """
    from ..io.products.obsdiag import diagnostics_path, write_run_diagnostics
    from ..io.products.products import product_paths, write_member_copies, write_products

    if config.analysis is None:
        raise ConfigError("analysis: section required (at least analysis.filter)")
    seconds: dict[str, float] = {}
    prior = EnsembleBlock(layout, start, X.shape[1], X)
    obs_files = observation_sources(config.observations, config.resolve)
    result = assimilate_block(prior, obs_files, config.analysis, comm, cycle=cycle, seconds=seconds)
    diag_path = diagnostics_path(config.output, config.base_dir, cycle)
    if diag_path is not None:  # as ensio analyse: O-B, O-A, spreads per observation
        names = [v.name for v in layout.variables]
        tables = gathered_tables(result.observations, names,
                                 observation_sizes(obs_files, comm), comm)
        write_run_diagnostics(diag_path, tables, comm, cycle=cycle, members=X.shape[0],
                              command="ensio online")  # fmt: skip
    t = time.perf_counter()
    if not config.io.in_place:
        assert config.output.members is not None
        rows = result.ensemble
        block = EnsembleBlock(layout, start, rows.shape[1], rows)
        sources = _copy_sources(config, template)
        write_member_copies(config.io, comm, block, sources, config.output_member_paths())
    seconds["write"] = time.perf_counter() - t
    t = time.perf_counter()
    first = config.output_member_paths()[0]
    product_template = first if first.exists() else template
    write_products(
        comm, layout, result.ensemble, product_template, "ensio online",
        product_paths(config.output, config.base_dir), config.ensemble.coordinates,
    )  # fmt: skip
    seconds["products"] = time.perf_counter() - t
    seconds = {k: float(comm.allreduce(v, op=MPI.MAX)) for k, v in seconds.items()}
    return result, seconds


def _copy_sources(config: Config, template: Path | None) -> list[Path]:
    """The file each analysis member is a copy of: its member file, else ``template``.

    Online the model may not have written member files (its state lives in
    memory), so a missing one is replaced by the template.
    """
    sources = [p if p.exists() else template for p in config.member_paths()]
    missing = [i + 1 for i, p in enumerate(sources) if p is None]
    if missing:
        raise ConfigError(
            f"output.members: member files {missing[:5]} do not exist and the Ensemble has "
            "no template file to copy"
        )
    return sources  # type: ignore[return-value]
