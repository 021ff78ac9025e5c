"""The offline analysis: read the members, assimilate, write the analysis back.

``ensio analyse CONFIG`` (under ``mpiexec -n N`` or alone) calls
:func:`run_analysis`, the one driver of every ``io.mode``. It composes the
parallel ensemble I/O (``io``) and the distributed analysis (``analysis``);
neither knows the other. The analysis step
(:func:`ensio.analysis.inputs.assimilate_block`) and the writers of the
analysis members and products (:mod:`ensio.io.products`) are shared with the
filter side of the online mode, so both modes produce the same files.

The driver never asks which mode it has: the class registered for
``io.mode`` (:func:`ensio.io.modes.ensemble.mode_of`) says what a run checks
first, where its lock and run record live, how it is opened, which files the
record hashes, whether they already hold this analysis, and how members,
products and the record are committed
(:class:`~ensio.io.modes.base.EnsembleIO`'s run hooks).

A run is exactly-once and all-or-nothing (:mod:`ensio.io.txn.commit`): it holds
the ensemble lock, skips an analysis the members already hold (the run
record, :mod:`ensio.io.txn.runrecord`, by contents; ``force`` assimilates
again), and commits the members, the products, the copies and the run record
at one point.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from mpi4py import MPI

from .analysis.inputs import assimilate_block, observation_sizes, observation_sources
from .analysis.obsdiag import gathered_tables
from .analysis.result import AnalysisResult
from .config.schema import Config, ConfigError
from .errors import file_op
from .io.modes.base import ProductWriters, RunCommit
from .io.modes.ensemble import mode_of
from .io.node.backup import start_cycle_backup
from .io.products.obsdiag import diagnostics_path, write_diagnostics
from .io.products.products import product_paths, write_member_copies, write_products
from .io.products.shuffleproducts import write_shuffle_products
from .io.scan.slotstates import SlotStates
from .io.txn.commit import ensemble_lock
from .io.txn.runrecord import run_keys
from .layout.block import EnsembleBlock
from .offline_report import AnalysisReport, already_report
from .parallel.agree import root_call
from .progress import PhaseProgress

__all__ = ["PRODUCTS", "run_analysis"]

#: The product writers a mode's commit calls (io/products sits above io/modes).
PRODUCTS = ProductWriters(
    paths=product_paths, write=write_products, member_copies=write_member_copies,
    write_rows=write_shuffle_products,
)


def run_analysis(
    config: Config, comm: MPI.Comm, *, cycle: int = 0, force: bool = False,
    command: str = "ensio analyse", progress: PhaseProgress | None = None,
) -> AnalysisReport:
    """Collective: the whole offline analysis of one cycle, exactly once, all or nothing.

    Under the ensemble lock: recovers an interrupted earlier run, returns at
    once (``already``) if the run record shows the members hold this very
    analysis (unless ``force``), else reads the members (N_io I/O tasks) and
    the observations, analyses every rank's rows and commits, in one
    transaction, the analysis in place (journaled) or as copies at
    ``output.members``, ``output.mean`` / ``output.spread`` and the run record.
    ``command`` names the run in the lock and the record; ``progress`` shows
    the phases (:meth:`PhaseProgress.for_rank`), none by default.
    """
    if config.analysis is None:
        raise ConfigError("analysis: section required (at least analysis.filter)")
    mode = mode_of(config.io)
    mode.check_run(config)
    t0 = time.perf_counter()
    seconds: dict[str, float] = {}
    bars = progress or PhaseProgress(enabled=False)
    n_e = config.ensemble.size
    obs_sources = observation_sources(config.observations, config.resolve)
    obs_files = [s.path for s in obs_sources]
    root = mode.run_root(config, comm)
    with ensemble_lock(root, comm, command) as lock:
        took_over = root_call(comm, lambda: lock.taken_over and lock.taken_over.describe())
        # Built once for the read and the write of this analysis; freed on any error.
        with file_op("open"):
            opened = mode.open_run(config, comm, root)
        with opened as ens:
            keys = root_call(comm, lambda: run_keys(config, obs_files, cycle,
                                                    members=ens.member_files(config)))
            done = None if force else ens.already(config, root, keys, comm, PRODUCTS)
            if done is not None:
                return already_report(config, comm, cycle, done, took_over)
            with file_op("read"), bars.phase("read", n_e, "members") as advance:
                block = ens.read(progress=advance)
            inactive = ens.stats.inactive if ens.stats is not None else {}
            seconds["read"] = time.perf_counter() - t0
            with bars.phase("analysis"):
                result = assimilate_block(
                    block, obs_sources, config.analysis, comm, cycle=cycle, seconds=seconds,
                    slots=_slot_states(config, block),
                )
            diag_path = diagnostics_path(config.output, config.base_dir, cycle)
            extra = _diagnostics(diag_path, result, block, config, comm, cycle, command)
            analysis = dataclasses.replace(block, data=result.ensemble)
            written = ens.commit(analysis, RunCommit(
                config, comm, root, keys[0], cycle, command, PRODUCTS, seconds, bars, extra))
    seconds["total"] = time.perf_counter() - t0
    seconds = {k: float(comm.allreduce(v, op=MPI.MAX)) for k, v in seconds.items()}
    # committed and unlocked: copy the files to io.backup_dir in the background
    backup = start_cycle_backup(config, comm, cycle) if config.io.backup_dir else None
    assert result.qc is not None
    return AnalysisReport(
        result=result,
        seconds=seconds,
        n_obs_read=result.qc.total,
        took_over=took_over,
        inactive=inactive,
        clipped=written.clipped if written is not None else {},
        four_d=config.analysis.n_slots > 1,
        backup=backup,
        diagnostics=diag_path,
    )


def _diagnostics(
    path: Path | None, result: AnalysisResult, block: EnsembleBlock, config: Config,
    comm: MPI.Comm, cycle: int, command: str,
) -> tuple[tuple[Path, Callable[[Path], None]], ...]:  # fmt: skip
    """Collective: the observation-space diagnostics gathered on rank 0, as the commit's extra
    file (written into the run's transaction: it commits, or rolls back, with the members)."""
    if path is None:
        return ()
    names = [v.name for v in block.layout.variables]
    files = observation_sizes(observation_sources(config.observations, config.resolve), comm)
    tables = gathered_tables(result.observations, names, files, comm)
    assert config.analysis is not None
    four_d = config.analysis.n_slots > 1

    def write(at: Path) -> None:
        write_diagnostics(path, tables, at=at, cycle=cycle, members=config.ensemble.size,
                          command=command, four_d=four_d)  # fmt: skip

    return ((path, write),)


def _slot_states(config: Config, block: EnsembleBlock) -> SlotStates | None:
    """The members' states at the time slots of a 4-D analysis (None: 3-D)."""
    an = config.analysis
    if an is None or an.time_slots is None:
        return None
    return SlotStates(config.ensemble, config.base_dir, block.layout, an.n_slots)
