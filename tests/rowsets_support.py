"""Random row sets for the tests of the analysis on row sets (shuffle, weight interpolation)."""

from __future__ import annotations

import numpy as np

from ensio.parallel.rowsets import RowSets


def random_row_sets(n_rows: int, comm, seed: int) -> RowSets:
    """Pieces of random lengths (1..7 rows) dealt to random ranks; the same on every rank."""
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < n_rows:
        lengths.append(int(min(rng.integers(1, 8), n_rows - sum(lengths))))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    owners = rng.integers(0, comm.size, len(lengths))
    owners[: comm.size] = np.arange(comm.size)  # no rank is left empty
    return RowSets.from_pieces(n_rows, comm.size, comm.rank, starts, np.array(lengths), owners)
