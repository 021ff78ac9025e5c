"""Who holds what in the group shuffle: ranks ⇄ (member, tile, part), rows ⇄ ranks.

``io.mode: shuffle`` runs on N_mpi = N_e × P × S ranks (S ≥ 1, the
*multiple*). The files are numbered ``f = m · P + p`` (member-major) and
file f lives in the local directory of rank f (the placement rule,
:mod:`ensio.io.node.placemap`). Rank ``r = q · (N_e · P) + f`` is ``(m, p, q)``:
it reads *part q* of tile p of member m, i.e. the tile's interior rows, in
increasing global order, cut into S consecutive pieces
(:func:`~ensio.parallel.distribution.block_distribution`); with S = 1 that
is the whole tile, read by the rank that holds it. The N_e ranks that read
part q of tile p (one per member) form *group* ``p · S + q``; inside it,
the part is cut again into N_e *chunks*, and group rank m (the reader of
member m) ends up with chunk m of every member. With S = 1 this is the
seed's layout: group p holds tile p of all members.

Everything here is pure and the same on every rank: the plan of all ranks'
rows (:class:`~ensio.parallel.rowsets.RowSets`) is built from the tile runs
without communication and without one index per state row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...config.errors import ConfigError
from ...parallel.distribution import block_distribution
from ...parallel.rowsets import RowSets
from ..tiles.tilefile import TileRuns

__all__ = ["ShufflePlan", "cut_runs", "shuffle_shape"]


def shuffle_shape(n_mpi: int, n_members: int, n_tiles: int) -> int:
    """S, the ranks per (member, tile); ConfigError unless N_mpi is a multiple of N_e × P."""
    per = n_members * n_tiles
    if n_mpi < per or n_mpi % per:
        raise ConfigError(
            f"io.mode: shuffle needs N_mpi = N_e x P x S ranks (S >= 1): N_e = {n_members}, "
            f"P = {n_tiles} tiles, so a multiple of {per}; got N_mpi = {n_mpi}"
        )
    return n_mpi // per


def cut_runs(
    starts: np.ndarray, lengths: np.ndarray, bounds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut a list of row runs at positions ``bounds`` of their concatenation.

    Parameters
    ----------
    starts, lengths : ndarray of int64, shape (n,)
        Runs of rows, in the order of the concatenation (here: increasing).
    bounds : ndarray of int64, shape (c + 1,)
        Increasing positions in the concatenation, ``bounds[0] = 0`` and
        ``bounds[-1]`` = the total length; interval k is ``[bounds[k], bounds[k+1])``.

    Returns
    -------
    (piece_starts, piece_lengths, interval)
        Maximal pieces that lie inside one run and one interval, in order;
        ``interval[i]`` is the interval of piece i.
    """
    ends = np.concatenate([[0], np.cumsum(lengths)])
    cuts = np.union1d(ends, bounds)
    pos, nxt = cuts[:-1], cuts[1:]
    run = np.searchsorted(ends, pos, side="right") - 1
    interval = np.searchsorted(bounds, pos, side="right") - 1
    return starts[run] + (pos - ends[run]), nxt - pos, interval


def _split(n: int, parts: int) -> np.ndarray:
    """Bounds of ``n`` items cut into ``parts`` block pieces, shape (parts + 1,)."""
    return np.array([block_distribution(n, parts, i)[0] for i in range(parts)] + [n], np.int64)


@dataclass(frozen=True, eq=False)
class ShufflePlan:
    """The shuffle of one run: this rank's (m, p, q), its part, its chunk, everyone's rows.

    Attributes
    ----------
    n_members, n_tiles, per_tile : int
        N_e, P and S.
    member, tile, part : int
        This rank's (m, p, q): it reads part q of tile p of the m-th member,
        file ``m · P + p``, held by the rank of that number.
    window : (int, int)
        Global rows ``[lo, hi)`` spanned by its part (the part is the
        tile's interior rows inside it).
    part_rows : int
        Rows of its part.
    chunk_counts : ndarray of int64, shape (N_e,)
        Rows of each chunk of its part (chunk c goes to group rank c).
    rows : RowSets
        Every rank's rows after the shuffle; this rank's are chunk m of its part.
    """

    n_members: int
    n_tiles: int
    per_tile: int
    member: int
    tile: int
    part: int
    window: tuple[int, int]
    part_rows: int
    chunk_counts: np.ndarray
    rows: RowSets

    @property
    def file(self) -> int:
        """The number of the file this rank reads (``m · P + p``), also its holder rank."""
        return self.member * self.n_tiles + self.tile

    @property
    def group(self) -> int:
        """Colour of this rank's group: ``p · S + q``."""
        return self.tile * self.per_tile + self.part

    @classmethod
    def build(
        cls, runs: list[list[TileRuns]], n_rows: int, n_members: int, size: int, rank: int
    ) -> ShufflePlan:
        """The plan from the tiles' runs (``runs[p]``: per variable, tile p's runs).

        Raises
        ------
        ConfigError
            ``size`` is not a multiple of N_e × P.
        ValueError
            A part of a tile has fewer rows than N_e (the message names the
            tile): the shuffle would give a rank nothing.
        """
        n_tiles = len(runs)
        s = shuffle_shape(size, n_members, n_tiles)
        f = rank % (n_members * n_tiles)
        me = (f // n_tiles, f % n_tiles, rank // (n_members * n_tiles))
        all_starts, all_lengths, all_owners = [], [], []
        window, part_rows, counts = (0, 0), 0, np.zeros(0, np.int64)
        for p, per_var in enumerate(runs):
            starts = np.concatenate([r.rows for r in per_var])
            lengths = np.concatenate([r.lengths for r in per_var])
            n_p = int(lengths.sum())
            parts = _split(n_p, s)
            bounds, owners = [], []
            for q in range(s):
                size_q = int(parts[q + 1] - parts[q])
                if size_q < n_members:
                    raise ValueError(
                        f"tile {p}: part {q} has {size_q} rows for {n_members} members; "
                        "use fewer ranks per tile (N_mpi / (N_e x P))"
                    )
                chunks = parts[q] + _split(size_q, n_members)
                bounds.append(chunks[:-1])
                owners.append(q * n_members * n_tiles + np.arange(n_members) * n_tiles + p)
                if (p, q) == me[1:]:
                    part_rows, counts = size_q, np.diff(chunks)
            b = np.append(np.concatenate(bounds), n_p)
            ps, pl, k = cut_runs(starts, lengths, b)
            all_starts.append(ps)
            all_lengths.append(pl)
            all_owners.append(np.concatenate(owners)[k])
            if p == me[1]:
                q = me[2]
                inside = (k >= q * n_members) & (k < (q + 1) * n_members)
                window = (int(ps[inside][0]), int(ps[inside][-1] + pl[inside][-1]))
        plan = RowSets.from_pieces(n_rows, size, rank, np.concatenate(all_starts),
                                   np.concatenate(all_lengths), np.concatenate(all_owners))
        return cls(n_members, n_tiles, s, *me, window, part_rows, counts, plan)  # fmt: skip
