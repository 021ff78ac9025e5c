"""What an ``io.mode`` offers: the ensemble I/O and the hooks of the one analysis driver.

:class:`EnsembleIO` is the base of every mode's class. Its abstract part is
the ensemble I/O itself (``read`` the prior into this rank's rows, ``write``
the analysis back, ``close``). Its *run hooks* are what
:func:`ensio.offline.run_analysis` asks instead of asking which mode it has:
what a run checks before it locks anything (:meth:`~EnsembleIO.check_run`),
where its lock and run record live (:meth:`~EnsembleIO.run_root`), how the
object is opened under that lock (:meth:`~EnsembleIO.open_run`), which files
the run record hashes (:meth:`~EnsembleIO.member_files`), whether they already
hold this analysis (:meth:`~EnsembleIO.already`), the transaction
(:meth:`~EnsembleIO.transaction`) and the commit of members, copies,
products and the record together under it (:meth:`~EnsembleIO.commit`).

The defaults are ``files`` mode's: member files on the global file system,
one :class:`~ensio.io.txn.commit.RunTransaction` in the members' directory.
A mode that keeps them (tiled files, a test's toy mode) overrides only what
differs; ``shuffle`` (:class:`~ensio.io.modes.shuffle.ShuffleEnsembleIO`,
hook bodies in :mod:`ensio.io.modes.shufflerun`) overrides the lock root,
the rerun check, the transaction and the commit (its
:class:`~ensio.io.txn.shufflecommit.ShuffleTransaction` across node-local
directories). Every commit is a :class:`~ensio.io.txn.transaction.Transaction`.

The product writers live in ``io/products``, a room above this one (it opens
ensemble-I/O objects to write copies), so the driver hands them to the hooks
as a :class:`ProductWriters` instead of this room importing them.
"""

from __future__ import annotations

import abc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpi4py import MPI

from ...config.schema import Config, EnsembleSection, IOSection
from ...errors import file_op
from ...layout.block import EnsembleBlock
from ...layout.state import StateLayout
from ...parallel.agree import root_call
from ...progress import Advance, PhaseProgress, no_progress
from ..scan.memberfiles import member_files
from ..scan.members import MemberMeta
from ..tiles.tiled import check_tiled_run
from ..tiles.tileproducts import TileProducts, tile_paths
from ..txn.commit import RunTransaction
from ..txn.journal import journal_root
from ..txn.runrecord import file_digests, find_run, holds, record_line, runs_path, staged_runs
from ..txn.transaction import Staging, Transaction
from .stats import IOStats

__all__ = ["EnsembleIO", "ProductWriters", "RunCommit"]


@dataclass(frozen=True)
class ProductWriters:
    """The writers of ``io/products`` a mode's commit calls (see the module docstring).

    ``paths``: :func:`ensio.io.products.products.product_paths`;
    ``write``: :func:`~ensio.io.products.products.write_products`;
    ``member_copies``: :func:`~ensio.io.products.products.write_member_copies`;
    ``write_rows``: the row-set products of
    :mod:`ensio.io.products.shuffleproducts` (staged by one rank per tile under
    the shuffle transaction's names, renamed by its commit).
    """

    paths: Callable[..., dict[str, Path]]
    write: Callable[..., Any]
    member_copies: Callable[..., IOStats | None]
    write_rows: Callable[..., dict[str, str]]


@dataclass
class RunCommit:
    """What a mode's :meth:`EnsembleIO.commit` needs of the driver's run."""

    config: Config
    comm: MPI.Comm
    root: Path  # the run root (:meth:`EnsembleIO.run_root`)
    key: str  # the run record's key
    cycle: int
    command: str
    products: ProductWriters
    seconds: dict[str, float]  # the phases' seconds, filled in
    bars: PhaseProgress
    #: Files of the run besides members and products (the observation-space diagnostics):
    #: ``(target, write)``; ``write(path)`` runs on rank 0 and writes the file at ``path``,
    #: the target's staged name, so the file commits (or rolls back) with the run.
    extra: Sequence[tuple[Path, Callable[[Path], None]]] = ()


class EnsembleIO(abc.ABC):
    """The ensemble-I/O object of one ``io.mode``, and its analysis-run hooks."""

    layout: StateLayout
    n_io: int
    stats: IOStats | None

    # ------------------------------------------------------------------ the I/O
    @abc.abstractmethod
    def read(
        self, out: EnsembleBlock | None = None, *, overlap: bool = True,
        progress: Advance = no_progress,
    ) -> EnsembleBlock:
        """Collective: this rank's rows of every member (``progress()`` per member)."""

    @abc.abstractmethod
    def write(
        self, block: EnsembleBlock, *, overlap: bool = True, journal: bool | None = None,
        progress: Advance = no_progress,
    ) -> IOStats:
        """Collective: the rows back into the members (``progress()`` per member)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Collective: free the object's communicators."""

    def __enter__(self) -> EnsembleIO:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ opening a run
    @classmethod
    def check_run(cls, config: Config) -> None:
        """What this mode cannot do with ``config``: refused before anything is locked."""
        check_tiled_run(config)

    @classmethod
    def run_root(cls, config: Config, comm: MPI.Comm) -> Path:
        """Collective: the directory of the run's lock and run record (the members')."""
        return journal_root(member_files(config.ensemble, config.base_dir)[0])

    @classmethod
    @abc.abstractmethod
    def open_run(cls, config: Config, comm: MPI.Comm, root: Path) -> EnsembleIO:
        """Collective, under the lock of ``root``: the object for the analysis of ``config``."""

    @classmethod
    def from_paths(cls, paths: Sequence[Path], layout: StateLayout | EnsembleSection,
                   io: IOSection, comm: MPI.Comm, *, private: bool = False,
                   copies_of: Sequence[MemberMeta] | None = None) -> EnsembleIO:
        """Collective: the object for these member files (:func:`~.ensemble.open_ensemble`).

        The default is a constructor of ``files`` mode's signature; a mode
        that reads something else (``shuffle``: node-local tiles) refuses.
        ``private``, ``copies_of``: the files are the run's staged copies (see
        ``files`` mode).
        """
        return cls(paths, layout, io, comm, private=private,  # type: ignore[call-arg]
                   copies_of=copies_of)

    def checked_metas(self) -> Sequence[MemberMeta] | None:
        """Collective: the checked metadata of the member files, current, if this mode
        keeps it (byte copies of them need not be checked again); None by default."""
        return None

    # ------------------------------------------------------- what a run leaves
    def member_files(self, config: Config) -> list[Path]:
        """The member files (every tile), as the run record names them."""
        return [Path(os.path.abspath(p)) for p in member_files(config.ensemble, config.base_dir)]

    def copy_targets(self, config: Config) -> list[Path]:
        """``output.members`` resolved: one copy per member file."""
        return config.output_member_paths()

    def tile_products(self) -> TileProducts | None:
        """The tile structure of the products (None: one file per product)."""
        return None

    def write_output_members(self, config: Config, comm: MPI.Comm, analysis: EnsembleBlock,
                             stage: Staging, products: ProductWriters,
                             advance: Advance = no_progress) -> IOStats | None:
        """Collective: the analysis as copies at ``output.members`` (staged names)."""
        paths = self.copy_targets(config)
        stats = products.member_copies(config.io, comm, analysis, config.member_paths(), paths,
                                       stage, copies_of=self.checked_metas())  # fmt: skip
        advance(len(paths))
        return stats

    def held_files(self, config: Config) -> list[Path]:
        """The files an analysis leaves, in the record's ``contents`` order: members
        (each member's tiles), then the copies of ``output.members``."""
        copies = [] if config.io.in_place else self.copy_targets(config)
        return [*self.member_files(config), *copies]

    # --------------------------------------------------------- rerun, commit
    def already(self, config: Config, root: Path, keys: tuple[str, str], comm: MPI.Comm,
                products: ProductWriters) -> dict[str, Any] | None:  # fmt: skip
        """Collective: the record of this run if the files still hold its analysis.

        By contents (:func:`~ensio.io.txn.runrecord.holds`), whatever mode or
        paths wrote the entry; an entry from before contents were recorded:
        its members by path.
        """
        entry = root_call(comm, lambda: find_run(root, *keys))
        if entry is None:
            return None
        members, prods = dict(entry.get("members", {})), dict(entry.get("products", {}))
        names = [*self.held_files(config), *prods] if "contents" in entry \
            else [*members, *prods]
        digests = file_digests(names, comm, missing_ok=True)
        n = len(names) - len(prods)
        held = holds(entry, digests[:n])
        if not (held if held is not None else digests[:n] == list(members.values())):
            return None
        changed = [p for p, d in zip(prods, digests[n:], strict=True) if d != prods[p]]
        if changed:
            entry["note"] = f"; note: {', '.join(changed)} changed or removed since"
        return entry

    def transaction(self, run: RunCommit, targets: Sequence[Path]) -> Transaction:
        """Collective: the transaction this mode's :meth:`commit` writes under.

        ``files`` mode's: one :class:`~ensio.io.txn.commit.RunTransaction` in the
        run root, ``targets`` (copies, products, extra files, the run record)
        written under its staged names. A mode with another commit (``shuffle``:
        its two-phase commit across local directories) returns its own
        :class:`~ensio.io.txn.transaction.Transaction`.
        """
        return RunTransaction(run.root, run.comm, targets, fsync=run.config.io.fsync)

    def commit(self, analysis: EnsembleBlock, run: RunCommit) -> IOStats | None:
        """Collective: members, products, copies and the run record, committed together.

        Returns the statistics of the member write (``clipped``: values
        clipped when packing).
        """
        config, comm, root = run.config, run.comm, run.root
        members = self.member_files(config)
        products = run.products.paths(config.output, config.base_dir)
        tiles = self.tile_products()
        product_files = [p for pattern in products.values()
                         for p in (tile_paths(pattern, tiles.geometry.count) if tiles
                                   else [pattern])]  # fmt: skip
        copies = [] if config.io.in_place else self.copy_targets(config)
        runs = runs_path(root)
        extra = [target for target, _ in run.extra]
        with self.transaction(run, [*copies, *product_files, *extra, runs]) as txn:
            t = time.perf_counter()
            with file_op("write"), run.bars.phase("write", config.ensemble.size,
                                                  "members") as advance:  # fmt: skip
                if config.io.in_place:
                    written: IOStats | None = self.write(analysis, progress=advance)
                else:
                    written = self.write_output_members(config, comm, analysis, txn.stage,
                                                        run.products, advance)
            txn.checkpoint()
            run.seconds["write"] = time.perf_counter() - t
            t = time.perf_counter()
            template = txn.stage(copies[0]) if copies else members[0]
            with run.bars.phase("products"):
                run.products.write(
                    comm, analysis.layout, analysis.data, template, "ensio analyse",
                    products, config.ensemble.coordinates, stage=txn.stage,
                    inactive=analysis.inactive_rows(), tiles=tiles,
                )  # fmt: skip
            for target, write in run.extra:
                root_call(comm, lambda p=target, w=write: w(txn.stage(p)))
            txn.checkpoint()
            run.seconds["products"] = time.perf_counter() - t
            t = time.perf_counter()
            files = [*members, *copies]  # as committed: copies and products at staged names
            stored = [*members, *map(txn.stage, copies), *map(txn.stage, product_files)]
            digests = file_digests(stored, comm)
            entry = record_line(
                run.key, run.cycle, run.command,
                {os.path.abspath(p): d for p, d in zip(files, digests[: len(files)],
                                                       strict=True)},
                {os.path.abspath(p): d for p, d in zip(product_files, digests[len(files):],
                                                       strict=True)},
            )  # fmt: skip
            root_call(comm, lambda: staged_runs(root, entry, txn.stage(runs)))
            txn.commit()
            run.seconds["record"] = time.perf_counter() - t
        return written
