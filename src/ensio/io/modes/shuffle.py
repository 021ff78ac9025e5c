"""``io.mode: shuffle``: tiles on node-local disks, one group all-to-all, no global scatter.

The seed's data path (NICAM-LETKF, issue 13 item 2). Rank (m, p, q) (see
:mod:`ensio.io.modes.shuffleplan`) reads part q of tile p of member m, file
f = m · P + p, from the local directory where ``ensio stage in`` puts it
(:mod:`ensio.io.node.placemap`: ``io.local_dir`` filled with rank f and its host,
joined with the file's name); with S = 1 that is its own directory. The
ranks reading one file must run on its holder's host. The N_e ranks reading
part q of tile p
form a group (``comm.Split``, the group communicator is kept on the
object), and one ``Alltoallv`` inside it gives each of them every member for
1/N_e of the part. The block it returns is a
:class:`~ensio.layout.rowsetblock.RowSetBlock`: its rows are one piece per
latitude line and level, not a contiguous range, and the analysis takes
them as they are. Writing is the mirror: the reverse ``Alltoallv`` brings
each rank its own part of the analysis, and it writes its own tile in place.

Validation happens before any byte is written and the same error is raised
on every rank: a local directory or a tile file missing on one rank, a tile
of the wrong shape, a decomposition that does not fit.

The write is journaled as in ``files`` mode, with one journal per local
directory (ranks sharing a directory, e.g. one host with a ``{host}``
pattern, share it, and the first of them holds that directory's lock while
the object lives): every rank saves the prior bytes of its tile first, and a
failure anywhere rolls every local directory back. The offline driver makes
the write one atomic step across every directory: the journals carry its
transaction, and the run record on the global file system decides them all
at once (:mod:`ensio.io.txn.shufflecommit`). Without a transaction (the
benchmark) each directory's journal commits on its own once every rank has
written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import netCDF4
import numpy as np
from mpi4py import MPI

from ...config.errors import ConfigError
from ...config.schema import Config, EnsembleSection, IOSection
from ...errors import InputError
from ...layout.rowsetblock import RowSetBlock
from ...layout.state import StateLayout
from ...locks import EnsembleLock, command_line
from ...parallel.agree import ErrorNote, agree, guard, note_error, raise_if_any, rebuild, root_call
from ...parallel.nodes import this_host
from ...progress import Advance, no_progress
from ..node.placemap import format_local_dir, holder_rank
from ..scan.members import MemberMeta
from ..scan.tileplace import check_local_tiles
from ..tiles.tilefile import plan_runs, read_tile, write_tile
from ..tiles.tileproducts import TileProducts
from ..tiles.tilerewrite import rewrite_tile
from ..txn import journal as journal_mod
from ..txn.commit import journaled_write, run_of
from ..txn.runrecord import sha256_file
from ..txn.shufflecommit import ShuffleTransaction
from . import shufflerun
from .base import EnsembleIO, ProductWriters, RunCommit
from .shuffleplan import ShufflePlan, shuffle_shape
from .shuffletile import TileDigest, describe, tile_digest
from .stats import IOStats

__all__ = ["ShuffleEnsembleIO", "ShuffleTraffic"]


@dataclass(frozen=True)
class ShuffleTraffic:
    """What one shuffle (read or write) moved over MPI, summed over the ranks.

    ``bytes`` counts values sent to another rank (a rank's own chunk is a
    local copy); ``partners`` is the largest number of other ranks one rank
    exchanges with.
    """

    bytes: int
    partners: int


def _slice_of(part_rows: np.ndarray, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values`` of ``rows``: one variable's rows are a consecutive stretch of the part's."""
    if rows.size == 0:
        return values[:0]
    k = int(np.searchsorted(part_rows, rows[0]))
    if part_rows[k + rows.size - 1] != rows[-1]:
        raise AssertionError("a variable's rows are not consecutive in the part")
    return values[k : k + rows.size]


def _check_hosts(hosts: list[str], per: int) -> None:
    """Every rank runs on the host of the rank whose local directory it reads (same error
    on every rank)."""
    for r, h in enumerate(hosts):
        if h != hosts[r % per]:
            raise ConfigError(
                f"io.local_dir: rank {r} reads part {r // per} of the tile held by rank "
                f"{r % per} on host {hosts[r % per]}, but runs on host {h}: with N_mpi a "
                f"multiple of N_e x P = {per}, ranks r and r mod {per} must share a node"
            )


class ShuffleEnsembleIO(EnsembleIO):
    """Collective: tiles on local disks ⇄ every rank's row set, through group all-to-alls.

    The registry's ``shuffle`` mode: the I/O here, its run hooks (global
    lock root, rerun check by the tiles' contents, the two-phase commit of
    :class:`~ensio.io.txn.shufflecommit.ShuffleTransaction`) in
    :mod:`ensio.io.modes.shufflerun`.

    Parameters
    ----------
    ens : EnsembleSection
        ``{tile}`` in ``members``; the tile's file name is taken from it.
        Untiled members are one tile each (P = 1).
    base : Path
        Relative patterns (``members``, ``io.local_dir``) resolve against it.
    io : IOSection
        ``local_dir``, ``journal``, ``fsync``.
    comm : MPI.Comm
        N_e × P × S ranks; not freed (the group and disk communicators split
        from it are, by :meth:`close`).
    locked : Path, optional
        The global directory whose ensemble lock the caller's run holds (the
        offline driver's rank 0): recovery of a shuffle journal then reads
        the run record without taking that lock.

    Raises
    ------
    ConfigError
        N_mpi is not a multiple of N_e × P; ``io.in_place`` is false (no copies).
    InputError
        On every rank: a local directory or tile missing on any rank, a tile
        of the wrong shape or a decomposition that does not fit.
    """

    mode: ClassVar[str] = "shuffle"

    def __init__(self, ens: EnsembleSection, base: Path, io: IOSection, comm: MPI.Comm, *,
                 locked: Path | None = None) -> None:
        if not io.in_place:
            raise ConfigError("io.in_place: io.mode shuffle writes the tiles in place only")
        self.io, self.comm, self.names = io, comm, [v.name for v in ens.variables]
        hosts = comm.allgather(this_host())
        host = hosts[comm.rank]
        assert io.local_dir is not None
        n_tiles = root_call(comm, lambda: self._tile_count(ens, base, hosts[0]))
        per = ens.size * n_tiles
        shuffle_shape(comm.size, ens.size, n_tiles)
        _check_hosts(hosts, per)
        f = comm.rank % per  # the file this rank reads; rank f holds it (io.node.placemap)
        m, p, first = f // n_tiles, f % n_tiles, comm.rank < n_tiles
        holder = holder_rank(f, comm.size)  # = f: the placement rule
        self.local = format_local_dir(io.local_dir, base, rank=holder, host=hosts[holder])
        self.path = self.local / ens.tile_path(ens.numbers[m], p, base).name
        note: ErrorNote = None
        digest = None
        try:
            if not self.local.is_dir():
                raise InputError(f"{self.local}: io.local_dir of rank {f} on host {host} "
                                 "not found")  # fmt: skip
            masks = [v.mask for v in ens.variables if v.mask is not None]
            digest = tile_digest(self.path, self.names, keep_small=first, masks=masks)
        except Exception as exc:  # raised on every rank below
            note = note_error(exc)
        raise_if_any(comm, note)
        firsts = comm.gather(digest if first else None)
        self.geometry, self.layout = root_call(
            comm, lambda: describe(ens, [d for d in firsts if d is not None])
        )
        self.runs = plan_runs(self.geometry, self.layout)
        raise_if_any(comm, guard(lambda: self._check_tile(digest, p)))
        assert digest is not None
        # the shared scan's checks of every tile's place (coordinates, DOMAIN_*, time)
        check_local_tiles(comm, self.path, p, self.layout, self.geometry, digest.attrs,
                          comm.rank < per)  # fmt: skip
        self.infos = digest.infos
        self.plan = ShufflePlan.build(self.runs, self.layout.n_rows, ens.size, comm.size,
                                      comm.rank)  # fmt: skip
        self.disk, self.root = self._disk_comm(host)
        self.group = comm.Split(self.plan.group, self.plan.member)
        # the S ranks of one file, its holder first: a chunked or compressed tile
        # is rewritten through the library by the holder alone (io.tilerewrite)
        self.file_comm = comm.Split(f, comm.rank)
        self.library = any(self.infos[n].raw_offset is None for n in self.names)
        self.host, self.holds_file = host, comm.rank < per  # one rank per file hashes it
        self._lock: EnsembleLock | None = None
        try:
            self._lock_and_recover(locked)
        except BaseException:
            self.close()
            raise
        self.n_io = comm.size
        self.stats: IOStats | None = None
        self.traffic: ShuffleTraffic | None = None
        self.seconds: dict[str, float] = {}

    def _lock_and_recover(self, locked: Path | None) -> None:
        """Collective: the first rank of each local directory takes its lock, then
        recovers its journal (a shuffle journal is decided by the global record,
        :mod:`ensio.io.txn.shufflejournal`); an error anywhere is raised on every rank.

        The lock is the run's (:func:`~ensio.io.txn.commit.run_of`): a directory
        this run already holds (the global one, when ``io.local_dir`` names it)
        is joined, and was recovered by its holder; another live run's is
        refused, naming that run."""
        run = run_of(self.comm)

        def take() -> None:
            self._lock = EnsembleLock(self.root, command_line(), run=run).acquire()

        def recover() -> None:
            assert self._lock is not None
            if self._lock.joined is None:
                journal_mod.recover(self.root, fsync=self.io.fsync, locked=locked)

        raise_if_any(self.comm, guard(take) if self.disk.rank == 0 else None)
        raise_if_any(self.comm, guard(recover) if self.disk.rank == 0 else None)

    def _tile_count(self, ens: EnsembleSection, base: Path, host: str) -> int:
        """P: 1 for untiled members, declared, or ``DOMAIN_number_total`` of rank 0's tile
        (tile 0 of member 1)."""
        if not ens.tiled:
            return 1
        if ens.tiles is not None:
            return ens.tiles.count
        assert self.io.local_dir is not None
        local = format_local_dir(self.io.local_dir, base, rank=0, host=host)
        if not local.is_dir():
            raise InputError(f"{local}: io.local_dir of rank 0 on host {host} not found")
        first = local / ens.tile_path(ens.numbers[0], 0, base).name
        if not first.is_file():
            raise InputError(f"{first}: tile file not found")
        with netCDF4.Dataset(first) as ds:
            if "DOMAIN_number_total" not in ds.ncattrs():
                raise InputError(f"{first}: ensemble.members has {{tile}} but no decomposition: "
                                 "declare ensemble.tiles or give the files NEMO's DOMAIN_* "
                                 "global attributes")  # fmt: skip
            return int(np.asarray(ds.getncattr("DOMAIN_number_total")).ravel()[0])

    def _check_tile(self, digest: TileDigest | None, p: int) -> None:
        assert digest is not None
        box = self.geometry.boxes[p]
        for v in self.layout.variables:
            want = (*v.shape[:-2], *box.file_shape)
            have = digest.infos[v.name].shape
            if have != want:
                raise InputError(f"{self.path}: state variable '{v.name}' has shape {have}, "
                                 f"tile {p} needs {want}")  # fmt: skip

    def _disk_comm(self, host: str) -> tuple[MPI.Comm, Path]:
        """The ranks sharing this rank's local directory (one journal and one lock per
        directory and run, whatever the ranks' count), and its root.

        Keyed by the directory itself (real path), so two spellings of one
        directory (a symlink) are one group, not two journals in one place.
        """
        root = Path(os.path.abspath(self.local))
        keys = self.comm.allgather((host, os.path.realpath(root)))
        return self.comm.Split(keys.index(keys[self.comm.rank]), self.comm.rank), root

    def __enter__(self) -> ShuffleEnsembleIO:
        return self

    def close(self) -> None:
        """Collective: free the group and disk communicators, release the local lock."""
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            lock.release()
        for c in ("group", "disk", "file_comm"):
            sub = getattr(self, c, None)
            if sub is not None and sub != MPI.COMM_NULL:
                sub.Free()
                setattr(self, c, None)

    @property
    def n_members(self) -> int:
        return self.plan.n_members

    def _traffic(self) -> ShuffleTraffic:
        counts = self.plan.chunk_counts
        sent = 8 * (int(counts.sum()) - int(counts[self.plan.member]))
        partners = int(np.count_nonzero(counts)) - (1 if counts[self.plan.member] else 0)
        return ShuffleTraffic(int(self.comm.allreduce(sent)),
                              int(self.comm.allreduce(partners, op=MPI.MAX)))  # fmt: skip

    def read(
        self, out: object = None, *, overlap: bool = True, progress: Advance = no_progress,
    ) -> RowSetBlock:  # fmt: skip
        """Collective: this rank's rows (its chunk) of every member, shape (N_e, count).

        ``out`` and ``overlap`` are accepted for the interface and ignored.
        """
        del out, overlap
        t0 = time.perf_counter()
        plan = self.plan
        values = np.empty(plan.part_rows)
        took = {"read": 0.0}

        def load() -> None:
            t = time.perf_counter()
            rows, vals = read_tile(self.path, self.names, self.runs[plan.tile], *plan.window,
                                   infos=self.infos)
            if rows.size != plan.part_rows:
                raise InputError(f"{self.path}: {rows.size} interior rows in part "
                                 f"{plan.part} of tile {plan.tile}, expected {plan.part_rows}")
            values[...] = vals
            took["read"] = time.perf_counter() - t

        raise_if_any(self.comm, guard(load))
        t1 = time.perf_counter()
        counts = plan.chunk_counts
        mine = int(counts[plan.member])
        data = np.empty((plan.n_members, mine))
        sdispl = np.concatenate([[0], np.cumsum(counts)[:-1]])
        recv = np.full(plan.n_members, mine)
        self.group.Alltoallv([values, counts, sdispl, MPI.DOUBLE],
                             [data, recv, np.arange(plan.n_members) * mine, MPI.DOUBLE])
        t2 = time.perf_counter()
        for _ in range(plan.n_members):
            progress()
        block = RowSetBlock.of(self.layout, plan.rows, data)
        block.inactive = block.inactive_rows()
        counts = block.count_by_variable(block.inactive)  # the report's missing-data line
        self.comm.Allreduce(MPI.IN_PLACE, counts, op=MPI.SUM)
        self.traffic = self._traffic()
        self.seconds = {"read": took["read"], "shuffle": t2 - t1}
        self.stats = IOStats(total_seconds=t2 - t0, read_seconds=took["read"],
                             comm_seconds=t2 - t1,
                             inactive={v.name: int(n) for v, n in zip(
                                 self.layout.variables, counts, strict=True)}
                             ).reduce(self.comm)  # fmt: skip
        return block

    def write(
        self, block: RowSetBlock, *, overlap: bool = True, journal: bool | None = None,
        progress: Advance = no_progress, txn: ShuffleTransaction | None = None,
    ) -> IOStats:  # fmt: skip
        """Collective: the reverse shuffle, then every rank writes its own part in place.

        All or nothing over every rank: each journals its prior bytes in its
        local directory's journal; if any rank fails, every local directory
        is rolled back before the error is raised on every rank. With ``txn``
        this is only the *prepare* phase of the run's commit
        (:meth:`ensio.io.txn.shufflecommit.ShuffleTransaction.prepare`; ``journal``
        is the transaction's): the journals stay, marked with the transaction,
        until its :meth:`~ensio.io.txn.shufflecommit.ShuffleTransaction.commit`.
        Without it each directory's journal is committed on its own (the
        benchmark; not atomic across directories).
        """
        del overlap
        plan = self.plan
        if block.data.shape != (plan.n_members, plan.rows.count) or not np.array_equal(
            block.rows, plan.rows.rows
        ):
            raise ValueError(f"rank {self.comm.rank}: the block is not this rank's row set")
        t0 = time.perf_counter()
        data = block.to_write()  # inactive rows keep their (prior) bytes
        counts = plan.chunk_counts
        mine = int(counts[plan.member])
        values = np.empty(plan.part_rows)
        rdispl = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self.group.Alltoallv([data, np.full(plan.n_members, mine),
                              np.arange(plan.n_members) * mine, MPI.DOUBLE],
                             [values, counts, rdispl, MPI.DOUBLE])  # fmt: skip
        t1 = time.perf_counter()
        rows = None
        took = {"write": 0.0}

        def one(undo: journal_mod.UndoLog | None) -> None:
            nonlocal rows
            t = time.perf_counter()
            lo, hi = plan.window
            rows = np.concatenate([r.window(lo, hi)[1] for r in self.runs[plan.tile]])
            if self.library:  # one writer per file: the S parts go to the holder
                parts = [(e, _slice_of(rows, values, r))
                         for e, r in (run.window(lo, hi) for run in self.runs[plan.tile])]
                gathered = self.file_comm.gather(parts, root=0)
                if gathered is not None:
                    rewrite_tile(self.path, self.names, gathered, undo, self.io.fsync)
            else:
                write_tile(self.path, self.names, self.runs[plan.tile], plan.window,
                           lambda r: _slice_of(rows, values, r), undo, self.io.fsync,
                           self.infos)
            took["write"] = time.perf_counter() - t

        journaled = self.io.journal if journal is None else journal
        if txn is not None:  # prepare agrees over every rank after the undo logs are closed
            txn.prepare(lambda undo: guard(lambda: one(undo)))
        else:  # every rank wrote before any journal commits
            journaled_write(self.disk, self.root, journaled, self.io.fsync,
                            lambda undo: agree(self.comm, guard(lambda: one(undo))))
        t2 = time.perf_counter()
        for _ in range(plan.n_members):
            progress()
        self.traffic = self._traffic()
        self.seconds = {"shuffle": t1 - t0, "write": took["write"],
                        "journal": t2 - t1 - took["write"]}
        self.stats = IOStats(total_seconds=t2 - t0, write_seconds=took["write"],
                             journal_seconds=t2 - t1 - took["write"],
                             comm_seconds=t1 - t0).reduce(self.comm)  # fmt: skip
        return self.stats

    def tile_digests(self) -> dict[str, str]:
        """Collective: sha256 of every tile file as it is now, keyed ``host:path``.

        One rank per file hashes it (local paths repeat on different hosts,
        hence the host); the same mapping on every rank. A file that cannot be
        read raises on every rank.
        """
        mine: dict[str, str] = {}

        def digest() -> None:
            if self.holds_file:
                mine[f"{self.host}:{os.path.abspath(self.path)}"] = sha256_file(self.path)

        note = guard(digest)
        parts = self.comm.allgather((mine, note))
        first = next((n for _, n in parts if n is not None), None)
        if first is not None:
            raise rebuild(first)
        return {k: v for part, _ in parts for k, v in part.items()}

    def transaction(self, run: RunCommit, targets: Sequence[Path] = ()) -> ShuffleTransaction:
        """Collective: a new two-phase commit over this object's local directories,
        decided by the run record of the run root (its files are staged by name:
        ``targets`` is not needed)."""
        return ShuffleTransaction(self.comm, self.disk, self.root, run.root,
                                  fsync=self.io.fsync, journaled=self.io.journal)

    # ------------------------------------------------- run hooks (shufflerun)
    @classmethod
    def check_run(cls, config: Config) -> None:
        shufflerun.check_run(config)

    @classmethod
    def run_root(cls, config: Config, comm: MPI.Comm) -> Path:
        return shufflerun.run_root(config, comm)

    @classmethod
    def open_run(cls, config: Config, comm: MPI.Comm, root: Path) -> ShuffleEnsembleIO:
        """Collective, under the lock: tidy the global directory, then recover every
        local journal while opening (``locked``: the run record is read without the lock)."""
        shufflerun.tidy_global(config, comm, root)
        return cls(config.ensemble, config.base_dir, config.io, comm, locked=root)

    @classmethod
    def from_paths(cls, paths: Sequence[Path], layout: StateLayout | EnsembleSection,
                   io: IOSection, comm: MPI.Comm, *, private: bool = False,
                   copies_of: Sequence[MemberMeta] | None = None) -> EnsembleIO:
        raise ConfigError(f"io.mode: {io.mode} reads the node-local copies of "
                          "io.local_dir, not a list of member paths (run it through "
                          "ensio analyse)")  # fmt: skip

    def member_files(self, config: Config) -> list[Path]:
        """Every global tile path (P from the local tiles: the global ones need not be readable)."""
        e, p = config.ensemble, len(self.geometry.boxes)
        return [e.tile_path(m, t, config.base_dir) for m in e.numbers for t in range(p)]

    def tile_products(self) -> TileProducts:
        """Tile p's product takes its structure from rank p's own tile (tile p of member 1)."""
        count = len(self.geometry.boxes)
        return TileProducts(self.geometry, [self.path] * count)  # only rank p reads entry p

    def already(self, config: Config, root: Path, keys: tuple[str, str], comm: MPI.Comm,
                products: ProductWriters) -> dict[str, Any] | None:  # fmt: skip
        return shufflerun.already(self, root, keys, comm)

    def commit(self, analysis: RowSetBlock, run: RunCommit) -> IOStats | None:  # type: ignore[override]
        shufflerun.commit_run(self, analysis, run)
        return None
