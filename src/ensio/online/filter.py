"""The filter side of the online mode: the offline analysis, on blocks gathered in memory.

The P filter ranks (the ranks of member 1) hold, after the gather along the
coupled communicators, exactly the rows ``block_distribution(N_x, P, p)`` of
all members that rank p of an offline run with P ranks would have read from
the files. From there :func:`run_filter` does what
:func:`ensio.offline.run_analysis` does after its read: the same observation
handling (:func:`ensio.offline.load_observations`), the same
:func:`~ensio.analysis.distributed.analyse_rows`, the same member writer
(:func:`ensio.io.ensemble.write_ensemble`) and the same product files. So the
online and offline analyses agree to rounding (the distributed analysis does
not depend on the number of ranks).

Imports: ``online/`` may import ``parallel`` and ``analysis`` (DESIGN.md). The
observation loading lives in ``offline.py`` and the writers in ``io/``; they
are imported inside :func:`run_filter` only (the model side never needs them),
until ``load_observations``/``state_grid``/``_row_lonlat`` move to a module
both modes may import.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..analysis.distributed import DistributedAssimilation
from ..config.schema import Config, ConfigError
from ..layout.state import StateLayout
from ..parallel.agree import all_call, root_call
from ..parallel.distribution import block_distribution

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
) -> tuple[DistributedAssimilation, dict[str, float]]:
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
        (see :func:`write_members`) and for the product files.

    Returns
    -------
    (DistributedAssimilation, dict)
        The analysis of this rank's rows, and seconds per phase
        (``obs``, ``analysis``, ``write``, ``products``), maximum over ranks.
    """
    from ..offline import assimilate_rows

    if config.analysis is None:
        raise ConfigError("analysis: section required (at least analysis.filter)")
    seconds: dict[str, float] = {}
    result = assimilate_rows(config, comm, layout, X, start, cycle, seconds)
    t = time.perf_counter()
    if not config.io.in_place:
        write_members(config, comm, layout, start, result.ensemble, template)
    seconds["write"] = time.perf_counter() - t
    t = time.perf_counter()
    first = config.output_member_paths()[0]
    write_products(config, comm, layout, result.ensemble, first if first.exists() else template)
    seconds["products"] = time.perf_counter() - t
    seconds = {k: float(comm.allreduce(v, op=MPI.MAX)) for k, v in seconds.items()}
    return result, seconds


def write_members(
    config: Config,
    comm: MPI.Comm,
    layout: StateLayout,
    start: int,
    rows: np.ndarray,
    template: Path | None,
) -> None:
    """Collective: the analysis members at ``output.members``, as ``ensio analyse`` writes them.

    Offline, output member m is a copy of member file m with the state
    variables replaced. Online the model may not have written member files,
    so output member m is a copy of member file m (``ensemble.members``) if
    that file exists, else of ``template``; then the state variables are
    written in place by :func:`~ensio.io.ensemble.write_ensemble` with the
    filter ranks as its ranks (``io.tasks`` is capped at P). Every file is
    complete under a temporary name before it is renamed into place.
    """
    from ..io.ensemble import EnsembleBlock, write_ensemble
    from ..io.products import copy_members

    assert config.output.members is not None
    sources = [p if p.exists() else template for p in config.member_paths()]
    missing = [i + 1 for i, p in enumerate(sources) if p is None]
    if missing:
        raise ConfigError(
            f"output.members: member files {missing[:5]} do not exist and the Ensemble has "
            "no template file to copy"
        )
    pattern = Path(config.output.members)
    partial = str(pattern.parent / f".{pattern.name}.ensio-partial")
    tasks = config.io.tasks
    out_cfg = dataclasses.replace(
        config,
        ensemble=dataclasses.replace(config.ensemble, members=partial),
        io=dataclasses.replace(
            config.io, journal=False, tasks=None if tasks is None else min(tasks, comm.size)
        ),
    )
    finals, temps = config.output_member_paths(), out_cfg.member_paths()
    mine = range(comm.rank, len(finals), comm.size)
    all_call(comm, lambda: copy_members(sources, temps, comm.rank, comm.size))  # type: ignore[arg-type]
    write_ensemble(out_cfg, comm, EnsembleBlock(layout, start, rows.shape[1], rows))
    all_call(comm, lambda: [os.replace(temps[m], finals[m]) for m in mine])


def write_products(
    config: Config,
    comm: MPI.Comm,
    layout: StateLayout,
    rows: np.ndarray,
    template: Path | None,
) -> None:
    """Collective: ``output.mean`` / ``output.spread`` as ``ensio analyse`` writes them."""
    from ..io.products import write_field_file

    out = config.output
    fields = []
    if out.mean is not None:
        fields.append((out.mean, rows.mean(axis=0), "analysis ensemble mean"))
    if out.spread is not None:
        ddof = 1 if rows.shape[0] > 1 else 0
        fields.append((out.spread, rows.std(axis=0, ddof=ddof), "analysis ensemble spread (std)"))
    if fields and template is None:
        raise ConfigError(
            "output.mean/output.spread: no member file to take the structure from; "
            "give the Ensemble a template file"
        )
    n = layout.n_rows
    counts = np.array([block_distribution(n, comm.size, r)[1] for r in range(comm.size)])
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for name, field, what in fields:
        full = np.empty(n) if comm.rank == 0 else None
        comm.Gatherv(
            np.ascontiguousarray(field),
            [full, counts, displs, MPI.DOUBLE] if full is not None else None,
        )
        root_call(
            comm,
            lambda name=name, full=full, what=what: write_field_file(
                config.resolve(name),
                template,
                layout,
                full,
                config.ensemble.coordinates,
                f"ensio online: {what}",
            ),
        )
