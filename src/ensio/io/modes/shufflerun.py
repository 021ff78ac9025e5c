"""``io.mode: shuffle`` as an analysis run: its lock, rerun check and two-phase commit.

The bodies of the run hooks of :class:`~ensio.io.modes.shuffle.ShuffleEnsembleIO`
(the registry's ``shuffle`` entry, a subclass of
:class:`~ensio.io.modes.base.EnsembleIO`) that differ from ``files`` mode,
kept here so that module stays the I/O. The tiles are read and written on
node-local disks, but the run keeps the same guarantees as ``files`` mode,
anchored in the *global directory* (where the member files live on the
global file system, what ``ensio stage in`` copies from;
:func:`global_root`): rank 0 holds its ensemble lock for the whole run; a
rerun whose tiles all still hold this very analysis (the run record,
:mod:`ensio.io.txn.runrecord`, by contents) is "already analysed" and
changes nothing; and the write is one atomic step across every local
directory, a two-phase commit whose decision is the run-record entry
(:class:`~ensio.io.txn.shufflecommit.ShuffleTransaction`). A kill at any
instant leaves every local directory on the same side once the next run or
``ensio recover LOCAL_DIR`` has looked at its journal.

Products (``output.mean``/``spread``, one file per tile) are written by one
rank per tile under the transaction's staged names
(:mod:`ensio.io.products.shuffleproducts`, handed in by the driver), recorded
in the decision's entry and renamed after it by the transaction. A 4-D
analysis (``analysis.time_slots``) is not supported on row sets yet and is
refused before anything is read; so are copies (``io.in_place: false``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from ...config.schema import Config, ConfigError
from ...errors import InputError, file_op
from ...layout.rowsetblock import RowSetBlock
from ...parallel.agree import root_call
from ..tiles.tiled import check_tiled_run
from ..txn import journal, staging
from ..txn.runrecord import find_run, holds, record_line, runs_path
from ..txn.shufflecommit import ShuffleTransaction
from .base import RunCommit

if TYPE_CHECKING:
    from .shuffle import ShuffleEnsembleIO

__all__ = ["already", "check_run", "commit_run", "global_root", "run_root", "tidy_global"]


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


def check_run(config: Config) -> None:
    """Tiled or not (untiled members are one tile each), in place, 3-D only."""
    check_tiled_run(config)
    if not config.io.in_place:
        raise ConfigError("io.in_place: io.mode shuffle writes the tiles in place only")
    if config.analysis is not None and config.analysis.time_slots is not None:
        raise ConfigError("analysis.time_slots: not supported with io.mode shuffle yet; "
                          "use io.mode files for a 4-D analysis")


def run_root(config: Config, comm: MPI.Comm) -> Path:
    """Collective: the global directory (:func:`global_root`), which must exist."""
    root = global_root(config)
    root_call(comm, lambda: _check_global(root))
    return root


def tidy_global(config: Config, comm: MPI.Comm, root: Path) -> None:
    """Collective, under the lock: an interrupted ``files`` run's journal in the global
    directory, a torn record's temporary (before the local journals are recovered)."""
    root_call(comm, lambda: _tidy_global(root, config.io.fsync))


def already(io: ShuffleEnsembleIO, root: Path, keys: tuple[str, str],
            comm: MPI.Comm) -> dict[str, Any] | None:  # fmt: skip
    """Collective: the record of this run if the local tiles still hold its analysis.

    By contents, in file order (:func:`~ensio.io.txn.runrecord.holds`): an
    entry of an ``io.mode: files`` run whose tiles were staged in counts; an
    entry from before contents were recorded: its tiles by ``host:path``.
    Staged products of a decided run are renamed (rolled forward) first.
    """
    entry = root_call(comm, lambda: find_run(root, *keys))
    if entry is None:
        return None
    digests = io.tile_digests()  # in rank order: rank f holds file f (member-major)
    held = holds(entry, list(digests.values()))
    if not (held if held is not None else digests == dict(entry.get("members", {}))):
        return None
    products = dict(entry.get("products", {}))
    lost = root_call(comm, lambda: ShuffleTransaction.publish_recorded(products))
    if lost:
        entry["note"] = f"; note: {', '.join(lost)} changed or removed since"
    return entry


def commit_run(io: ShuffleEnsembleIO, analysis: RowSetBlock, run: RunCommit) -> None:
    """Collective: the products staged, then prepare (every tile written, journaled under
    one transaction), then the run-record entry decides for every local directory, the
    journals go and the products are renamed."""
    config, comm = run.config, run.comm
    t = time.perf_counter()
    for target, write in run.extra:  # before the decision, in place (a rerun rewrites them)
        root_call(comm, lambda p=target, w=write: _rewrite_extra(p, w))
    txn = io.transaction(run)
    with run.bars.phase("products"):  # staged names, renamed after the decision
        products = run.products.write_rows(
            comm, analysis.plan, analysis.layout, io.tile_products(),
            analysis.data, analysis.inactive_rows(),
            run.products.paths(config.output, config.base_dir),
            config.ensemble.coordinates, "ensio analyse", txn.stage,
        )  # fmt: skip
    run.seconds["products"] = time.perf_counter() - t
    t = time.perf_counter()
    with file_op("write"), run.bars.phase("write", config.ensemble.size,
                                          "members") as advance:  # fmt: skip
        io.write(analysis, progress=advance, txn=txn)
    run.seconds["write"] = time.perf_counter() - t
    t = time.perf_counter()
    try:
        digests = io.tile_digests()  # as committed
    except BaseException:  # prepared but undecided: every directory back to the prior
        txn.abort()
        raise
    entry = record_line(run.key, run.cycle, run.command, digests, products,
                        txid=txn.txid) if comm.rank == 0 else None  # fmt: skip
    txn.record(entry, products)
    txn.commit()
    run.seconds["record"] = time.perf_counter() - t


def _rewrite_extra(target: Path, write: Any) -> None:
    """Write an extra file of the run (the diag file) in place, atomically.

    A run killed while writing it left its temporary beside it; under the
    run's lock no other writer of ``target`` lives, so such temporaries are
    the dead run's and go first (the files mode's transaction discards them
    with its staged names).
    """
    staging.remove_temporaries(target)
    write(target)
