"""The offline analysis in ``io.mode: shuffle``: local tiles in, the analysis in place.

:func:`ensio.offline.run_analysis` hands a shuffle configuration here. The
tiles are read and written on node-local disks, but the run keeps the same
guarantees as ``files`` mode, anchored in the *global directory* (where the
member files live on the global file system, what ``ensio stage in`` copies
from; :func:`global_root`): rank 0 holds its ensemble lock for the whole
run; a rerun whose tiles all still hold this very analysis (the run record,
:mod:`ensio.io.txn.runrecord`, with each tile's sha256 keyed ``host:path``) is
"already analysed" and changes nothing (``force`` assimilates again); and the
write is one atomic step across every local directory, a two-phase commit
whose decision is the run-record entry (:mod:`ensio.io.txn.shufflecommit`). A
kill at any instant leaves every local directory on the same side once the
next run or ``ensio recover LOCAL_DIR`` has looked at its journal.

Products (``output.mean``/``spread``, one file per tile) are written by one
rank per tile under staged names, recorded in the decision's entry and
renamed after it (:mod:`ensio.io.products.shuffleproducts`). With ``io.backup_dir``
the local files are then copied there in the background
(:func:`ensio.io.node.backup.start_cycle_backup`), as after a ``files`` analysis.
A 4-D analysis (``analysis.time_slots``) is not supported on row sets yet
and is refused before anything is read.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mpi4py import MPI

from .analysis.inputs import assimilate_block, observation_sources
from .config.schema import Config, ConfigError
from .errors import InputError, file_op
from .io.modes.shuffle import ShuffleEnsembleIO
from .io.node.backup import start_cycle_backup
from .io.products.products import product_paths
from .io.products.shuffleproducts import publish, roll_forward, write_shuffle_products
from .io.tiles.tiled import check_tiled_run
from .io.tiles.tileproducts import TileProducts
from .io.txn import journal, staging
from .io.txn.commit import ensemble_lock
from .io.txn.runrecord import find_run, holds, record_line, run_keys, runs_path
from .io.txn.shufflecommit import ShuffleTransaction, commit, roll_back
from .layout.rowsetblock import RowSetBlock
from .offline_report import AnalysisReport, already_report
from .parallel.agree import root_call
from .progress import PhaseProgress

__all__ = ["global_root", "run_shuffle_analysis"]


def global_root(config: Config) -> Path:
    """The global directory of the ensemble: tile 0 of member 1's directory.

    The same rule as ``files`` mode's journal root
    (:func:`ensio.io.txn.journal.journal_root`), so both modes share one lock and
    one run record.
    """
    ens = config.ensemble
    return journal.journal_root(ens.tile_path(ens.numbers[0], 0, config.base_dir))


def _check_global(root: Path) -> None:
    if not root.is_dir():
        raise InputError(f"{root}: global directory of ensemble.members not found (io.mode "
                         "shuffle keeps its lock and run record there)")


def _tidy_global(root: Path, fsync: bool) -> None:
    """Rank 0, under the lock: an interrupted ``files`` run's journal, a torn record's temporary."""
    journal.recover(root, fsync=fsync)
    staging.remove_temporaries(runs_path(root))


def run_shuffle_analysis(
    config: Config, comm: MPI.Comm, *, cycle: int = 0, force: bool = False,
    command: str = "ensio analyse", progress: PhaseProgress | None = None,
) -> AnalysisReport:
    """Collective: lock, recover, read the local tiles, shuffle, analyse, shuffle back, commit.

    Returns ``already`` (nothing read or written) when the run record shows
    every tile holds this analysis, unless ``force``.
    """
    assert config.analysis is not None
    check_tiled_run(config)
    if config.analysis.time_slots is not None:
        raise ConfigError("analysis.time_slots: not supported with io.mode shuffle yet; "
                          "use io.mode files for a 4-D analysis")
    bars = progress or PhaseProgress(enabled=False)
    t0 = time.perf_counter()
    seconds: dict[str, float] = {}
    obs = observation_sources(config.observations, config.resolve)
    obs_files = [s.path for s in obs]
    n_e = config.ensemble.size
    root = global_root(config)
    root_call(comm, lambda: _check_global(root))
    with ensemble_lock(root, comm, command) as lock:
        took_over = root_call(comm, lambda: lock.taken_over and lock.taken_over.describe())
        root_call(comm, lambda: _tidy_global(root, config.io.fsync))
        with file_op("open"):  # recovers every local journal under this lock
            ens = ShuffleEnsembleIO(config.ensemble, config.base_dir, config.io, comm,
                                    locked=root)
        with ens:
            keys = root_call(comm, lambda: run_keys(config, obs_files, cycle,
                                                    members=_member_files(config, ens)))
            key = keys[0]
            done = None if force else _already(root, keys, ens, comm)
            if done is not None:
                return already_report(config, comm, cycle, done, took_over)
            with file_op("read"), bars.phase("read", n_e, "members") as advance:
                block = ens.read(progress=advance)
            seconds["read"] = time.perf_counter() - t0
            flags = block.count_by_variable(block.inactive_rows())
            comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.SUM)
            inactive = {v.name: int(n) for v, n in zip(block.layout.variables, flags, strict=True)}
            with bars.phase("analysis"):
                result = assimilate_block(block, obs, config.analysis, comm, cycle=cycle,
                                          seconds=seconds)  # fmt: skip
            _write_and_commit(config, comm, ens, block.like(result.ensemble),
                              (root, key, cycle, command), seconds, bars)  # fmt: skip
    seconds["total"] = time.perf_counter() - t0
    seconds = {k: float(comm.allreduce(v, op=MPI.MAX)) for k, v in seconds.items()}
    # committed and unlocked: copy the local files to io.backup_dir in the background
    backup = start_cycle_backup(config, comm, cycle) if config.io.backup_dir else None
    assert result.qc is not None
    return AnalysisReport(result=result, seconds=seconds, n_obs_read=result.qc.total,
                          took_over=took_over, inactive=inactive, backup=backup)


def _member_files(config: Config, ens: ShuffleEnsembleIO) -> list[Path]:
    """Every global tile path (P from the local tiles: the global ones need not be readable)."""
    e, p = config.ensemble, len(ens.geometry.boxes)
    return [e.tile_path(m, t, config.base_dir) for m in e.numbers for t in range(p)]


def _already(root: Path, keys: tuple[str, str], ens: ShuffleEnsembleIO,
             comm: MPI.Comm) -> dict[str, Any] | None:  # fmt: skip
    """Collective: the record of this run if the local tiles still hold its analysis.

    By contents, in file order (:func:`~ensio.io.txn.runrecord.holds`): an
    entry of an ``io.mode: files`` run whose tiles were staged in counts; an
    entry from before contents were recorded: its tiles by ``host:path``.
    """
    entry = root_call(comm, lambda: find_run(root, *keys))
    if entry is None:
        return None
    digests = ens.tile_digests()  # in rank order: rank f holds file f (member-major)
    held = holds(entry, list(digests.values()))
    if not (held if held is not None else digests == dict(entry.get("members", {}))):
        return None
    lost = root_call(comm, lambda: roll_forward(dict(entry.get("products", {}))))
    if lost:
        entry["note"] = f"; note: {', '.join(lost)} changed or removed since"
    return entry


def _write_and_commit(
    config: Config, comm: MPI.Comm, ens: ShuffleEnsembleIO, analysis: RowSetBlock,
    run: tuple[Path, str, int, str], seconds: dict[str, float], bars: PhaseProgress,
) -> None:
    """Collective: prepare (write every tile, journaled under one transaction), then the
    run-record entry decides for every local directory, then the journals go."""
    root, key, cycle, command = run
    t = time.perf_counter()
    with bars.phase("products"):  # staged names, published after the decision
        products = write_shuffle_products(
            comm, analysis.plan, analysis.layout, _tile_products(ens),
            analysis.data, analysis.inactive_rows(),
            product_paths(config.output, config.base_dir), config.ensemble.coordinates,
            "ensio analyse",
        )  # fmt: skip
    seconds["products"] = time.perf_counter() - t
    txn = ShuffleTransaction.begin(comm, root, fsync=config.io.fsync)
    t = time.perf_counter()
    with file_op("write"), bars.phase("write", config.ensemble.size, "members") as advance:
        ens.write(analysis, progress=advance, txn=txn)
    seconds["write"] = time.perf_counter() - t
    t = time.perf_counter()
    try:
        digests = ens.tile_digests()  # as committed
    except BaseException:  # prepared but undecided: every directory back to the prior
        roll_back(comm, ens.disk, ens.root, txn, config.io.journal)
        raise
    entry = record_line(key, cycle, command, digests, products, txid=txn.txid) \
        if comm.rank == 0 else None
    commit(comm, ens.disk, ens.root, txn, config.io.journal, entry)
    publish(comm, products)
    seconds["record"] = time.perf_counter() - t


def _tile_products(ens: ShuffleEnsembleIO) -> TileProducts:
    """Tile p's product takes its structure from rank p's own tile (tile p of member 1)."""
    count = len(ens.geometry.boxes)
    return TileProducts(ens.geometry, [ens.path] * count)  # only rank p reads entry p

