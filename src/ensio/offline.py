"""The offline analysis: read the members, assimilate, write the analysis back.

``ensio analyse CONFIG`` (under ``mpiexec -n N`` or alone) calls
:func:`run_analysis`. It composes the parallel ensemble I/O (``io``) and the
distributed analysis (``analysis``); neither knows the other. The analysis
step (:func:`ensio.analysis.inputs.assimilate_block`) and the writers of the
analysis members and products (:mod:`ensio.io.products.products`) are shared with the
filter side of the online mode, so both modes produce the same files.

A run is exactly-once and all-or-nothing (:mod:`ensio.io.txn.commit`): it holds
the ensemble lock, skips an analysis the members already hold (the run
record, :mod:`ensio.io.txn.runrecord`; ``force`` assimilates again), and commits
the members, the products, the copies and the run record at one point.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mpi4py import MPI

from .analysis.inputs import assimilate_block, observation_sources
from .config.schema import Config, ConfigError
from .errors import file_op
from .io.modes.ensemble import EnsembleIO, IOStats, open_ensemble
from .io.modes.tiledio import TiledEnsembleIO, copy_targets
from .io.node.backup import start_cycle_backup
from .io.products.products import Stage, product_paths, write_member_copies, write_products
from .io.scan.memberfiles import member_files
from .io.scan.slotstates import SlotStates
from .io.tiles.tiled import check_tiled_run
from .io.tiles.tileproducts import TileProducts, tile_paths
from .io.txn.commit import RunTransaction, ensemble_lock
from .io.txn.journal import journal_root
from .io.txn.runrecord import (
    file_digests,
    find_run,
    holds,
    record_line,
    run_keys,
    runs_path,
    staged_runs,
)
from .layout.block import EnsembleBlock
from .offline_report import AnalysisReport, already_report
from .offline_shuffle import run_shuffle_analysis
from .parallel.agree import root_call
from .progress import Advance, PhaseProgress, no_progress

__all__ = ["run_analysis"]


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
    if config.io.mode == "shuffle":  # local tiles, committed through the global record
        return run_shuffle_analysis(config, comm, cycle=cycle, force=force, command=command,
                                    progress=progress)
    t0 = time.perf_counter()
    seconds: dict[str, float] = {}
    bars = progress or PhaseProgress(enabled=False)
    n_e = config.ensemble.size
    obs_sources = observation_sources(config.observations, config.resolve)
    obs_files = [s.path for s in obs_sources]
    check_tiled_run(config)
    root = journal_root(member_files(config.ensemble, config.base_dir)[0])
    with ensemble_lock(root, comm, command) as lock:
        took_over = root_call(comm, lambda: lock.taken_over and lock.taken_over.describe())
        # Built once for the read and the write of this analysis; freed on any error.
        with _opened(config, comm) as ens:
            key, by_path = root_call(comm, lambda: run_keys(config, obs_files, cycle))
            held = _held_files(config, ens)
            done = None if force else _already(root, (key, by_path), comm, held)
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
            analysis = EnsembleBlock(block.layout, block.start, block.count, result.ensemble,
                                     inactive=block.inactive)
            written = _commit_run(
                config, comm, ens, analysis, (key, cycle, command), seconds, bars
            )
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
    )


def _opened(config: Config, comm: MPI.Comm) -> EnsembleIO:
    with file_op("open"):
        if config.ensemble.tiled:
            return TiledEnsembleIO(config.ensemble, config.base_dir, config.io, comm)
        return open_ensemble(config.member_paths(), config.ensemble, config.io, comm)


def _slot_states(config: Config, block: EnsembleBlock) -> SlotStates | None:
    """The members' states at the time slots of a 4-D analysis (None: 3-D)."""
    an = config.analysis
    if an is None or an.time_slots is None:
        return None
    return SlotStates(config.ensemble, config.base_dir, block.layout, an.n_slots)


def _held_files(config: Config, ens: EnsembleIO) -> list[Path]:
    """The files an analysis leaves, in the record's ``contents`` order: members (each
    member's tiles), then the copies of ``output.members``."""
    members = [Path(os.path.abspath(p)) for p in member_files(config.ensemble, config.base_dir)]
    return [*members, *([] if config.io.in_place else _copy_paths(config, ens))]


def _already(root: Path, keys: tuple[str, str], comm: MPI.Comm,
             files: list[Path]) -> dict[str, Any] | None:  # fmt: skip
    """Collective: the record of this run if ``files`` still hold its analysis.

    By contents (:func:`~ensio.io.txn.runrecord.holds`), whatever mode or
    paths wrote the entry; an entry from before contents were recorded: its
    members by path.
    """
    entry = root_call(comm, lambda: find_run(root, *keys))
    if entry is None:
        return None
    members, products = dict(entry.get("members", {})), dict(entry.get("products", {}))
    names = [*files, *products] if "contents" in entry else [*members, *products]
    digests = file_digests(names, comm, missing_ok=True)
    n = len(names) - len(products)
    held = holds(entry, digests[:n])
    if not (held if held is not None else digests[:n] == list(members.values())):
        return None
    changed = [p for p, d in zip(products, digests[n:], strict=True) if d != products[p]]
    if changed:
        entry["note"] = f"; note: {', '.join(changed)} changed or removed since"
    return entry


def _commit_run(
    config: Config, comm: MPI.Comm, ens: EnsembleIO, analysis: EnsembleBlock,
    run: tuple[str, int, str], seconds: dict[str, float], bars: PhaseProgress,
) -> IOStats | None:
    """Collective: members, products, copies and the run record, committed together.

    Returns the statistics of the member write (``clipped``: values clipped
    when packing).
    """
    key, cycle, command = run
    members = [Path(os.path.abspath(p)) for p in member_files(config.ensemble, config.base_dir)]
    root = journal_root(members[0])
    products = product_paths(config.output, config.base_dir)
    tiles = _tile_products(ens)
    product_files = [p for pattern in products.values()
                     for p in (tile_paths(pattern, tiles.geometry.count) if tiles else [pattern])]
    copies = [] if config.io.in_place else _copy_paths(config, ens)
    runs = runs_path(root)
    targets = [*copies, *product_files, runs]
    with RunTransaction(root, comm, targets, fsync=config.io.fsync) as txn:
        t = time.perf_counter()
        n_e = config.ensemble.size
        with file_op("write"), bars.phase("write", n_e, "members") as advance:
            written = _write_members(config, comm, ens, analysis, txn.path, advance)
        txn.checkpoint()
        seconds["write"] = time.perf_counter() - t
        t = time.perf_counter()
        template = txn.path(copies[0]) if copies else members[0]
        with bars.phase("products"):
            write_products(
                comm, analysis.layout, analysis.data, template, "ensio analyse",
                products, config.ensemble.coordinates, stage=txn.path,
                inactive=analysis.inactive_rows(), tiles=tiles,
            )  # fmt: skip
        txn.checkpoint()
        seconds["products"] = time.perf_counter() - t
        t = time.perf_counter()
        files = [*members, *copies]  # as committed: copies and products at their staged names
        stored = [*members, *map(txn.path, copies), *map(txn.path, product_files)]
        digests = file_digests(stored, comm)
        entry = record_line(
            key, cycle, command,
            {os.path.abspath(p): d for p, d in zip(files, digests[: len(files)], strict=True)},
            {os.path.abspath(p): d for p, d in zip(product_files, digests[len(files):],
                                                   strict=True)},
        )  # fmt: skip
        root_call(comm, lambda: staged_runs(root, entry, txn.path(runs)))
        txn.commit()
        seconds["record"] = time.perf_counter() - t
    return written


def _copy_paths(config: Config, ens: EnsembleIO) -> list[Path]:
    """``output.members`` resolved: one file per member, or per member and tile."""
    if not isinstance(ens, TiledEnsembleIO):
        return config.output_member_paths()
    assert config.output.members is not None
    return copy_targets(config.output.members, config.ensemble, ens.tiled.geometry.count,
                        config.resolve)  # fmt: skip


def _tile_products(ens: EnsembleIO) -> TileProducts | None:
    """Tile structure for the products of a tiled ensemble (None: one file per product)."""
    if not isinstance(ens, TiledEnsembleIO):
        return None
    return TileProducts(ens.tiled.geometry, ens.tiled.paths[0])


def _write_members(
    config: Config, comm: MPI.Comm, ens: EnsembleIO, analysis: EnsembleBlock, stage: Stage,
    advance: Advance = no_progress,
) -> IOStats | None:
    """Collective: the analysis in place (journaled, through ``ens``) or as staged copies."""
    if config.io.in_place:
        return ens.write(analysis, progress=advance)
    if isinstance(ens, TiledEnsembleIO):
        return ens.write_copies(analysis, [stage(p) for p in _copy_paths(config, ens)], advance)
    paths = config.output_member_paths()
    stats = write_member_copies(config.io, comm, analysis, config.member_paths(), paths, stage)
    advance(len(paths))
    return stats
