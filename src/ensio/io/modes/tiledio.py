"""Collective read/write of tiled members over a communicator (``{tile}`` patterns).

Every rank owns its contiguous rows of the global state
(:class:`~ensio.parallel.distribution.RowDistribution`) and reads, from each
member's P tile files, only the interior elements of those rows; on write it
pwrites them back in place, journaling their prior bytes in its own undo log.
No scatter is needed: a tile's interior runs (one per latitude line) are the
unit, and ranks with disjoint rows touch disjoint bytes. This is the ``files``
semantics (one matrix, all or nothing, recoverable) for tiles; the group
shuffle of issue 13 item 2 is a different data path over the same geometry.

A :class:`~ensio.io.modes.base.EnsembleIO`: ``files`` mode's
:meth:`~ensio.io.modes.files.FileEnsembleIO.open_run` opens it for a tiled
configuration, and its hooks give the driver the tile copies and products.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
from mpi4py import MPI

from ...config.schema import Config, EnsembleSection, IOSection
from ...layout.block import EnsembleBlock
from ...parallel.agree import all_call, guard, raise_if_any, root_call
from ...parallel.distribution import RowDistribution
from ...progress import Advance, no_progress
from ..scan.tilescan import TileScan
from ..tiles.tiled import TiledEnsemble
from ..tiles.tileproducts import TileProducts
from ..tiles.tilerewrite import library_tiles
from ..txn import journal as journal_mod
from ..txn.commit import journaled_write
from ..txn.transaction import Staging
from .base import EnsembleIO, ProductWriters
from .copies import copy_members
from .stats import IOStats

__all__ = ["TiledEnsembleIO", "copy_targets"]


class TiledEnsembleIO(EnsembleIO):
    """Collective: tiled members ⇄ the row-distributed ensemble matrix.

    Parameters
    ----------
    ens : EnsembleSection
        With ``{tile}`` in ``members`` (and ``tiles`` or NEMO attributes).
    base : Path
        Directory relative patterns resolve against (``config.base_dir``).
    io : IOSection
        ``journal`` and ``fsync``.
    comm : MPI.Comm
        Not freed.

    Raises
    ------
    InputError
        On every rank, from rank 0's validation (:class:`TiledEnsemble`),
        before any file is written.
    """

    mode: ClassVar[str] = "files"

    def __init__(self, ens: EnsembleSection, base: Path, io: IOSection, comm: MPI.Comm) -> None:
        self.io, self.comm = io, comm
        first = ens.tile_path(ens.numbers[0], 0, base)
        self.root = journal_mod.journal_root(first)
        root_call(comm, lambda: journal_mod.recover(self.root))
        self.tiled: TiledEnsemble = root_call(
            comm, lambda: TiledEnsemble(ens, base, check_tiles=False))
        self.layout = self.tiled.layout
        # every tile checked once, spread over the ranks; reads then pread at its offsets
        self.scan = TileScan(self.tiled.paths, self.layout, self.tiled.geometry, comm)
        self.rows = RowDistribution.of(self.layout.n_rows, comm)
        self.n_io = comm.size
        self.stats: IOStats | None = None

    @classmethod
    def open_run(cls, config: Config, comm: MPI.Comm, root: Path) -> TiledEnsembleIO:
        """Collective: the tiled members of ``config`` (``files`` mode's choice for ``{tile}``)."""
        return cls(config.ensemble, config.base_dir, config.io, comm)

    def copy_targets(self, config: Config) -> list[Path]:
        """``output.members`` resolved: one copy per member and tile, member-major."""
        assert config.output.members is not None
        return copy_targets(config.output.members, config.ensemble, self.tiled.geometry.count,
                            config.resolve)  # fmt: skip

    def tile_products(self) -> TileProducts:
        """Products are one file per tile, shaped as member 1's tiles."""
        return TileProducts(self.tiled.geometry, self.tiled.paths[0])

    def write_output_members(self, config: Config, comm: MPI.Comm, analysis: EnsembleBlock,
                             stage: Staging, products: ProductWriters,
                             advance: Advance = no_progress) -> IOStats:
        """Collective: the tile copies of ``output.members`` (:meth:`write_copies`)."""
        return self.write_copies(analysis, [stage(p) for p in self.copy_targets(config)], advance)

    def close(self) -> None:
        """Nothing to free (no communicators are split)."""

    @property
    def n_members(self) -> int:
        return self.tiled.n_members

    def read(
        self, out: EnsembleBlock | None = None, *, overlap: bool = True,
        progress: Advance = no_progress,
    ) -> EnsembleBlock:  # fmt: skip
        """Collective: this rank's rows of every member, shape (N_e, count).

        Tiles that changed since they were checked are checked again first
        (:meth:`TileScan.refresh <ensio.io.scan.tilescan.TileScan.refresh>`: one
        ``stat`` per tile otherwise). ``out``: a block of this rank's rows to
        read into (a cycling filter's previous matrix), else a new one;
        ``overlap`` is accepted for the interface and ignored.
        """
        del overlap
        t0 = time.perf_counter()
        infos = self.scan.refresh()
        shape = (self.n_members, self.rows.count)
        reuse = out is not None and out.start == self.rows.start and out.data.shape == shape \
            and out.data.dtype == np.float64 and out.data.flags.c_contiguous  # fmt: skip
        data = out.data if reuse else np.empty(shape)  # type: ignore[union-attr]
        maybe_nan = [True]

        def read() -> None:
            maybe_nan[0] = self.tiled.read_into(data, self.rows.start, infos)

        raise_if_any(self.comm, guard(read))
        for _ in range(self.n_members):
            progress()
        block = EnsembleBlock(self.layout, self.rows.start, self.rows.count, data)
        # every value decoded finite: no row is inactive (a scan costs as much as the read)
        block.inactive = block.inactive_rows() if maybe_nan[0] else np.zeros(data.shape[1], bool)
        # per variable over every rank, as files mode counts them (the report's missing-data line)
        counts = block.count_by_variable(block.inactive)
        self.comm.Allreduce(MPI.IN_PLACE, counts, op=MPI.SUM)
        inactive = {v.name: int(n) for v, n in zip(self.layout.variables, counts, strict=True)}
        self.stats = _stats(time.perf_counter() - t0, self.comm, inactive)
        return block

    def write(
        self, block: EnsembleBlock, *, overlap: bool = True, journal: bool | None = None,
        progress: Advance = no_progress,
    ) -> IOStats:  # fmt: skip
        """Collective: this rank's rows back into the tiles' interiors, in place, all or nothing.

        Each rank journals the prior bytes of what it writes; if any rank
        fails, every tile is rolled back (:func:`ensio.io.txn.journal.abort`)
        before the error is raised on every rank.
        """
        del overlap
        t0 = time.perf_counter()
        if block.start != self.rows.start or block.data.shape != (self.n_members, self.rows.count):
            raise ValueError(
                f"ensemble block rows [{block.start}, {block.start + block.count}) do not "
                f"match this rank's [{self.rows.start}, {self.rows.stop})"
            )
        infos = self.scan.refresh()
        journaled = self.io.journal if journal is None else journal
        fsync = self.io.fsync
        data = block.to_write()  # inactive rows keep their (prior) bytes
        journaled_write(
            self.comm, self.root, journaled, fsync,
            lambda undo: self.tiled.write_all(self.comm, data, self.rows.start, undo, fsync,
                                              infos)[0])  # fmt: skip
        self.scan.written(library_tiles(infos, self.tiled.names))
        for _ in range(self.n_members):
            progress()
        self.stats = _stats(time.perf_counter() - t0, self.comm)
        return self.stats

    def write_copies(
        self, block: EnsembleBlock, targets: Sequence[Path], progress: Advance = no_progress,
    ) -> IOStats:  # fmt: skip
        """Collective: tile t of member m copied to ``targets[m·P + t]``, then the analysis into it.

        ``io.in_place: false`` for tiles: the copies are made byte for byte
        (round robin over the ranks), so the checked offsets of the sources
        hold for them and each rank pwrites its rows into every copy; halos
        stay the prior's. The sources are not touched, so nothing is
        journaled: ``targets`` are the run's staged names, renamed at its commit.
        """
        t0 = time.perf_counter()
        sources = [p for tiles in self.tiled.paths for p in tiles]
        if len(targets) != len(sources):
            raise ValueError(f"{len(targets)} copy targets for {len(sources)} tile files")
        infos = self.scan.refresh()
        all_call(self.comm, lambda: copy_members(sources, targets, self.comm.rank,
                                                 self.comm.size))  # fmt: skip
        p = self.tiled.geometry.count
        copies = self.tiled.with_paths([list(targets[i : i + p])
                                        for i in range(0, len(targets), p)])  # fmt: skip
        data = block.to_write()  # inactive rows keep their (prior) bytes
        raise_if_any(self.comm, copies.write_all(self.comm, data, self.rows.start, None,
                                                 self.io.fsync, infos)[0])  # fmt: skip
        for _ in range(self.n_members):
            progress()
        self.stats = _stats(time.perf_counter() - t0, self.comm)
        return self.stats


def copy_targets(pattern: str, ens: EnsembleSection, count: int,
                 resolve: Callable[[str], Path]) -> list[Path]:
    """``output.members`` of tiled members, member-major (``{member}``, ``{tile}`` filled)."""
    return [resolve(pattern.format(member=m, tile=t)) for m in ens.numbers
            for t in range(count)]  # fmt: skip


def _stats(seconds: float, comm: MPI.Comm, inactive: dict[str, int] | None = None) -> IOStats:
    """Timing (the per-phase breakdown of ``files`` mode is not measured here) and, for a
    read, the inactive points per variable."""
    return IOStats(total_seconds=float(comm.allreduce(seconds, op=MPI.MAX)),
                   inactive=inactive or {})
