"""Products of a shuffle run: mean and spread tiles written by one rank per tile.

In ``io.mode: shuffle`` no rank holds the whole state, and the tiles of the
first member that give a product tile its structure are on node-local disks.
So the statistics are computed where the members meet — every rank has all
N_e members of its row set after the shuffle, and ``mean``/``std`` over them
is the very expression ``files`` mode evaluates per row — and tile p's
product is written by the rank that holds tile p of the first member (rank
p), from its own local tile. It asks the owners of the rows its file shows
(interior and halo) for their values in one ``Alltoallv`` (:func:`fetch_rows`),
so no rank gathers more than one tile.

The product files are written under the staged names of the run's
transaction (``stage``: :meth:`ensio.io.txn.shufflecommit.ShuffleTransaction.stage`)
before the run's decision, their digests go into the run-record entry, and
the transaction renames them into place after it; a kill in between is
rolled forward by the next run
(:meth:`~ensio.io.txn.shufflecommit.ShuffleTransaction.publish_recorded`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ...config.schema import Coordinates
from ...errors import file_op
from ...layout.state import StateLayout
from ...parallel.agree import ErrorNote, guard, raise_if_any
from ...parallel.rowsets import RowSets
from ..tiles.tileproducts import TileProducts, tile_paths
from ..txn.runrecord import sha256_file
from ..txn.transaction import Staging
from .products import history, statistics, write_field_file

__all__ = ["fetch_rows", "write_shuffle_products"]


def fetch_rows(comm: MPI.Comm, plan: RowSets, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Collective: ``values`` (k, count) of this rank's rows, fetched for ``wanted`` rows.

    ``wanted`` (n,) are global state rows (any rank's; -1: none, NaN back).
    Returns (k, n). Two ``Alltoallv``: the rows to each owner, their values back.
    """
    k = values.shape[0]
    ok = wanted >= 0
    rows = wanted[ok]
    owners = plan.owner(rows) if rows.size else np.zeros(0, np.int64)
    order = np.argsort(owners, kind="stable")
    send_counts = np.bincount(owners, minlength=comm.size).astype(np.int64)
    recv_counts = np.empty_like(send_counts)
    comm.Alltoall(send_counts, recv_counts)
    asked = np.empty(int(recv_counts.sum()), np.int64)
    comm.Alltoallv([np.ascontiguousarray(rows[order]), send_counts, _displ(send_counts),
                    MPI.INT64_T], [asked, recv_counts, _displ(recv_counts), MPI.INT64_T])
    reply = np.ascontiguousarray(values[:, plan.local(asked)].T)  # (asked, k)
    got = np.empty((rows.size, k))
    comm.Alltoallv([reply, recv_counts * k, _displ(recv_counts) * k, MPI.DOUBLE],
                   [got, send_counts * k, _displ(send_counts) * k, MPI.DOUBLE])
    out = np.full((k, wanted.size), np.nan)
    back = np.empty_like(got)
    back[order] = got
    out[:, ok] = back.T
    return out


def _displ(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def write_shuffle_products(
    comm: MPI.Comm, plan: RowSets, layout: StateLayout, tiles: TileProducts,
    data: np.ndarray, inactive: np.ndarray, targets: Mapping[str, Path],
    coordinates: Coordinates, program: str, stage: Staging,
) -> dict[str, str]:  # fmt: skip
    """Collective: every product tile written to ``stage(tile)``; their digests, on every rank.

    ``data`` (N_e, count): this rank's rows of the analysis; ``inactive``
    (count,): rows not analysed (the fill value in the products).
    ``tiles.templates[p]`` is read on rank p only (its own local tile).
    Returns ``{absolute final path: sha256 of the staged file}``.
    """
    ddof, stats = statistics(data, targets)
    if not stats:
        return {}
    mine = np.stack([np.where(inactive, np.nan, compute()) for _, _, compute in stats])
    p = comm.rank if comm.rank < tiles.geometry.count else None
    box = tiles.geometry.boxes[p] if p is not None else None
    tile_layout = tiles.layout(layout, box) if box is not None else None
    wanted = tiles.rows(layout, box) if box is not None else np.zeros(0, np.int64)
    values = fetch_rows(comm, plan, mine, wanted)
    digests: dict[str, str] = {}

    def write() -> None:
        assert p is not None and tile_layout is not None
        for i, (key, statistic, _) in enumerate(stats):
            target = tile_paths(targets[key], tiles.geometry.count)[p]
            out = stage(target)
            with file_op("write", target):
                write_field_file(out, tiles.templates[p], tile_layout, values[i], coordinates,
                                 history(program, statistic), statistic=statistic,
                                 ddof=ddof)  # fmt: skip
            digests[os.path.abspath(target)] = sha256_file(out)

    note: ErrorNote = guard(write) if p is not None else None
    raise_if_any(comm, note)
    return {k: v for part in comm.allgather(digests) for k, v in part.items()}
