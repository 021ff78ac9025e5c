"""Collective node-local copies: one process per node copies its ranks' files, all or nothing.

What ``ensio stage`` runs (the command keeps its name; in the code "stage"
means only a transaction's staged files, :mod:`ensio.io.txn.staging`, and the
node side is "placing": :func:`place_ensemble`, :mod:`ensio.io.node.placemap`).

``ensio stage in`` copies each member file (or tile) from its global path to
the node-local directory of the rank that holds it (:mod:`ensio.io.node.placemap`);
``ensio stage out`` copies the local files back. Under ``mpiexec`` it must run
with the ranks and hosts of the analysis (``{host}`` and ``{rank}`` then name
the same directories); the leader of each node (:func:`ensio.parallel.nodes.node_groups`)
copies the files of all its node's ranks, several at a time. Serially one
process stands for ``n_ranks`` ranks, all on this host.

Order of events, so that bad input modifies nothing:

1. every rank checks its own files: the source exists, the destination
   directory exists (a node-local directory can only be checked on its
   node), no undo journal of an interrupted analysis lies beside either;
   the ranks agree, and the lowest rank's error is raised on every rank;
2. each leader writes and verifies all its copies as temporaries;
   the ranks agree again (a failure removes every temporary);
3. each leader renames its copies into place and flushes the directories.

A kill leaves, per file, the old or the new content and at most a hidden
temporary (``.NAME.ensio-tmp.*``); running ``ensio stage`` again finishes the
job (:meth:`ensio.io.node.placecopy.CopySet.recover` removes the temporaries).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mpi4py import MPI

from ...config.errors import ConfigError
from ...config.schema import Config
from ...errors import InputError, file_op
from ...parallel.agree import (
    ErrorNote,
    agree,
    all_call,
    note_error,
    raise_if_any,
    rebuild,
    root_call,
)
from ...parallel.nodes import node_groups
from ..txn.journal import JOURNAL_DIRNAME
from .placecopy import Copy, CopySet
from .placemap import PlacedFile, ensemble_files, place_files

__all__ = ["Direction", "NodeCopyReport", "copy_on_nodes", "place_ensemble", "placement"]

Direction = Literal["in", "out"]


@dataclass(frozen=True)
class NodeCopyReport:
    """What a collective copy did (the same on every rank)."""

    files: int
    copied: int
    skipped: int
    bytes: int
    nodes: int
    seconds: float

    def line(self, what: str) -> str:
        return (f"{what}: {self.files} files on {self.nodes} node(s): {self.copied} copied "
                f"({self.bytes / 1e6:.1f} MB), {self.skipped} already there; "
                f"{self.seconds:.2f} s")


def placement(config: Config, comm: MPI.Comm, host: str,
              n_ranks: int | None = None) -> list[PlacedFile]:
    """Collective: every file with its holder rank and local path, the same on every rank.

    Under MPI the ranks are ``comm``'s (``n_ranks`` must be None or its size);
    serially ``n_ranks`` ranks on this host (default: one per file, N_e × P).
    """
    if comm.size > 1:
        if n_ranks not in (None, comm.size):
            raise ConfigError(f"--ranks {n_ranks}: under mpiexec the ranks are the "
                              f"{comm.size} processes")
        hosts = comm.allgather(host)
        return root_call(comm, lambda: place_files(config, hosts))
    if n_ranks is not None and n_ranks < 1:
        raise ConfigError(f"--ranks: must be at least 1, got {n_ranks}")
    count = n_ranks or len(ensemble_files(config.ensemble, config.base_dir))
    return place_files(config, [host] * count)


def _check_journal(directory: Path) -> None:
    if (directory / JOURNAL_DIRNAME).exists():
        raise InputError(
            f"{directory}: holds the undo journal of an interrupted analysis; run "
            f"'ensio recover {directory}' first"
        )


def check_copies(copies: Sequence[tuple[PlacedFile, Copy]]) -> None:
    """Raise :class:`InputError` for the first copy whose source or target directory is missing."""
    for placed, c in copies:
        for d in sorted({c.src.parent, c.dst.parent}):
            if not d.is_dir():
                what = ("local directory (io.local_dir)"
                        if placed.local is not None and d == placed.local.parent else "directory")
                raise InputError(f"{d}: {what} does not exist (rank {placed.rank} "
                                 f"on host {placed.host}); nothing copied")
            _check_journal(d)
        if not c.src.is_file():
            raise InputError(f"{c.src}: not found (member {placed.member}"
                             + (f" tile {placed.tile}" if placed.tile is not None else "")
                             + f", rank {placed.rank}); nothing copied")


def _served(comm: MPI.Comm, members: Sequence[int]) -> Callable[[int], bool]:
    """Ranks whose files this process handles: its node's, or (serially) all of them."""
    if comm.size == 1:
        return lambda rank: True
    mine = set(members)
    return lambda rank: rank in mine


def copy_on_nodes(comm: MPI.Comm, host: str,
                  copies: Sequence[tuple[PlacedFile, Copy]], *,
                  checksum: bool = False, threads: int = 4, fsync: bool = True,
                  label: str = "copy") -> NodeCopyReport:
    """Collective: check, prepare and commit ``copies`` (the same list on every rank).

    Each rank checks its own entries (serially: all); each node's leader copies
    its node's. Errors are agreed: the lowest rank's is raised on every rank,
    and nothing is replaced when any check or copy fails.
    """
    t0 = time.perf_counter()
    nodes = node_groups(comm, host)
    try:
        own = [x for x in copies if comm.size == 1 or x[0].rank == comm.rank]
        all_call(comm, lambda: check_copies(own))
        served = _served(comm, nodes.members)
        todo = [c for placed, c in copies if served(placed.rank)] if nodes.is_leader else []
        txn = CopySet(todo, threads=threads, checksum=checksum, fsync=fsync, label=label)
        note: ErrorNote = None
        try:
            with file_op("copy"):
                txn.prepare()
        except Exception as exc:  # agreed below, then raised on every rank
            note = note_error(exc)
        agreed = agree(comm, note)
        if agreed is not None:
            txn.abort()
            raise rebuild(agreed)
        note = None
        try:
            with file_op("rename"):
                copied = txn.commit()
                for p in txn.prepared:  # what a killed earlier run left beside the targets
                    CopySet.recover(p.copy.dst.parent, names={p.copy.dst.name})
        except Exception as exc:  # agreed below
            note, copied = note_error(exc), 0
        raise_if_any(comm, note)
        nbytes = sum(p.size for p in txn.prepared if p.tmp is not None)
        copied, nbytes = (int(comm.allreduce(v, op=MPI.SUM)) for v in (copied, nbytes))
        seconds = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        return NodeCopyReport(len(copies), copied, len(copies) - copied, nbytes,
                              nodes.n_nodes, seconds)
    finally:
        nodes.free()


def place_ensemble(config: Config, direction: Direction, comm: MPI.Comm, *, host: str,
          checksum: bool = False, threads: int = 4, n_ranks: int | None = None,
          fsync: bool = True) -> NodeCopyReport:
    """Collective: copy the ensemble's files to (``in``) or from (``out``) the local directories.

    Parameters
    ----------
    config : Config
        Needs ``io.local_dir``; the files are those of ``ensemble.members``.
    direction : {"in", "out"}
        ``in``: global → local (before a run on node-local disks);
        ``out``: local → global (after it).
    comm : MPI.Comm
        The ranks of the run (``COMM_SELF`` serially, standing for ``n_ranks``).
    host : str
        What ``{host}`` stands for on this rank (:func:`ensio.parallel.nodes.this_host`).
    checksum : bool
        Compare sha256 (skip test and read-back verification) instead of size + mtime.
    """
    if config.io.local_dir is None:
        raise ConfigError("io.local_dir: required by ensio stage (a pattern with {host}/{rank})")
    placed = placement(config, comm, host, n_ranks)
    pairs = []
    for p in placed:
        assert p.local is not None
        src, dst = (p.global_path, p.local) if direction == "in" else (p.local, p.global_path)
        pairs.append((p, Copy(src, dst)))

    return copy_on_nodes(comm, host, pairs, checksum=checksum,
                         threads=threads, fsync=fsync, label=f"stage-{direction}")
