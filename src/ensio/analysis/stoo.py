"""The parallel observation operator of a 4-D analysis (StoO, state to observation).

Why per member: in a 4-D analysis (``analysis.time_slots``; Hunt et al. 2004,
Miyoshi's 4-D LETKF) each observation is compared with every member's state
at the observation's time slot. Those slot states are not in the ensemble
matrix (which holds the analysis time); they are the members' history files.
As in NICAM-LETKF (seed 001), the rank that reads a member's state at a slot
applies H to it right there, and only H(x), a few numbers per observation,
travels: no slot state is ever scattered over the row distribution.

Who does what (collective over the filter communicator):

1. The N_e × S (member, slot) pairs, member-major, are block-distributed over
   the ranks (:func:`pair_range`): with N_mpi = N_e each rank reads its
   member's S slot states, with N_mpi = N_e × S one state each, with fewer
   ranks several members each. A rank reads, for each of its pairs, only the
   rows the slot's observations read (``reader``), and computes H(x) of those
   observations (:func:`ensio.obs.slots.apply_at_rows`).
2. **In-memory exchange** (not one file per member): every rank sends the
   positions of the observations it analyses to the ranks holding their
   slots, and gets back the H(x) of those observations for the members they
   hold (zero where a rank holds the slot for another member only; the sum
   over holders is the exact value, since exactly one rank holds each
   (member, slot)). With N_mpi = N_e × S this moves N_e values per
   observation, the least possible. Why not files: the values are exact copies whatever the
   rank count, nothing lands on the shared file system (whose per-file cost
   the seed fights) and nothing is left to clean up or journal after a crash.

The result, :class:`SlotPrior`, replaces H applied to the ensemble matrix in
:func:`~ensio.analysis.pipeline.analyse_rows`; the filters then form the
observation-space mean and perturbations from it unchanged (a 4-D ``ObsSpace``
is an ``ObsSpace`` whose ``hx`` came from the slots).

Reading member files is the caller's business (``reader``, see
:mod:`ensio.io.scan.slotstates`): the analysis room never opens a member file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ..obs import ObsBatch, build_operator
from ..obs.operators import Locator
from ..obs.slots import apply_at_rows, assign_slots, rows_read
from ..parallel.agree import all_call
from ..parallel.distribution import block_distribution

__all__ = ["SlotPrior", "SlotReader", "observe_slots", "pair_range", "slot_prior"]

#: ``reader(j, s, rows)``: member ``j`` (0-based column of the matrix) at slot
#: ``s`` (0-based) at the sorted state ``rows``, shape (len(rows),), physical
#: float64 (NaN where missing). Called only on the rank holding the pair.
SlotReader = Callable[[int, int, np.ndarray], np.ndarray]


@dataclass(frozen=True, eq=False)
class SlotPrior:
    """H(x) of a rank's observations from the members' slot states.

    Attributes
    ----------
    hx : ndarray, shape (k, m)
        Member j's state at observation i's slot, observed by H (NaN outside
        the window).
    in_window : ndarray of bool, shape (m,)
        The observation's time lies in the assimilation window.
    """

    hx: np.ndarray
    in_window: np.ndarray


def pair_range(n_members: int, n_slots: int, size: int, rank: int) -> range:
    """(member, slot) pairs of ``rank``: ``p = j · n_slots + s``, contiguous blocks."""
    start, count = block_distribution(n_members * n_slots, size, rank)
    return range(start, start + count)


def _members(pairs: range, n_slots: int) -> range:
    """Members of which ``pairs`` hold at least one slot (contiguous)."""
    if not pairs:
        return range(0)
    return range(pairs[0] // n_slots, pairs[-1] // n_slots + 1)


def observe_slots(
    obs: ObsBatch,
    slot: np.ndarray,
    pairs: range,
    n_slots: int,
    n_rows: int,
    grid: Locator | None,
    reader: SlotReader,
) -> np.ndarray:
    """H(x) of every observation for this rank's (member, slot) pairs (step 1, no MPI).

    Returns
    -------
    ndarray, shape (len(members), m)
        Row ``j - members[0]``: member j at each observation's slot where this
        rank holds (j, slot); 0 elsewhere (and for observations outside the
        grid or window).
    """
    members = _members(pairs, n_slots)
    out = np.zeros((len(members), len(obs)))
    for s in sorted({p % n_slots for p in pairs}):
        sel = np.flatnonzero(slot == s)
        op, inside = build_operator(obs.subset(sel), n_rows, grid)
        sel, op = sel[inside], op.subset(inside)
        rows = rows_read(op)
        for p in pairs:
            if p % n_slots != s:
                continue
            j = p // n_slots
            values = reader(j, s, rows)  # also without rows: a missing file is an error
            out[j - members[0], sel] = apply_at_rows(op, rows, values)
    return out


def _exchange(
    held: np.ndarray, pairs: Sequence[range], n_slots: int, wanted: np.ndarray,
    slot: np.ndarray, k: int, comm: MPI.Comm,
) -> np.ndarray:
    """Collective: ``(k, len(wanted))`` H(x) of the observations at positions ``wanted``.

    ``held`` is this rank's :func:`observe_slots`; ``pairs[r]`` the pairs of
    rank r; ``slot`` the slot of every observation. Two ``Alltoallv``: to each
    rank, the positions whose slot it holds for some member; back, its rows of
    ``held`` there. Where a rank holds a slot for only some of its members
    its other rows are 0 and the replies are summed (one non-zero each), so
    every value is an exact copy. Observations outside the window are asked
    of nobody and stay 0.
    """
    size = comm.size
    wanted = np.asarray(wanted, dtype=np.int64)
    wslot = slot[wanted]
    asks = [np.flatnonzero(np.isin(wslot, sorted({p % n_slots for p in pairs[r]})))
            for r in range(size)]
    send_counts = np.array([a.size for a in asks], dtype=np.int64)
    recv_counts = np.empty(size, dtype=np.int64)
    comm.Alltoall(send_counts, recv_counts)
    sdispl = np.concatenate([[0], np.cumsum(send_counts)[:-1]])
    rdispl = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
    requests = np.empty(int(recv_counts.sum()), dtype=np.int64)
    comm.Alltoallv([np.concatenate([wanted[a] for a in asks]), send_counts, sdispl, MPI.INT64_T],
                   [requests, recv_counts, rdispl, MPI.INT64_T])
    mine = held.shape[0]
    reply = np.concatenate(
        [held[:, requests[rdispl[r]: rdispl[r] + recv_counts[r]]].ravel() for r in range(size)]
    )
    members = [_members(p, n_slots) for p in pairs]
    n_back = np.array([len(members[r]) for r in range(size)], dtype=np.int64) * send_counts
    bdispl = np.concatenate([[0], np.cumsum(n_back)[:-1]])
    back = np.empty(int(n_back.sum()))
    comm.Alltoallv([reply, recv_counts * mine, rdispl * mine, MPI.DOUBLE],
                   [back, n_back, bdispl, MPI.DOUBLE])
    hx = np.zeros((k, wanted.size))
    for r in range(size):
        if n_back[r]:
            block = back[bdispl[r]: bdispl[r] + n_back[r]].reshape(len(members[r]), -1)
            hx[members[r].start: members[r].stop, asks[r]] += block
    return hx


def slot_prior(
    obs: ObsBatch,
    wanted: np.ndarray,
    n_members: int,
    edges: Sequence[float] | None,
    n_slots: int,
    n_rows: int,
    grid: Locator | None,
    reader: SlotReader,
    comm: MPI.Comm,
) -> SlotPrior:
    """Collective: the 4-D prior H(x) of the observations ``obs[wanted]`` of this rank.

    Parameters
    ----------
    obs : ObsBatch
        Every observation (the same batch, in the same order, on every rank:
        locations, variables, levels and times; values are not needed).
    wanted : ndarray of int, shape (m,)
        Positions in ``obs`` of the observations this rank analyses.
    n_members : int
        N_e.
    edges : sequence of float, or None
        Slot edges (``analysis.edges``); None: one slot, times ignored.
    n_slots : int
    n_rows : int
        Length of the state vector.
    grid : StateGrid or RegularGrid, optional
        H of observations without an index.
    reader : SlotReader
        The state rows of a (member, slot): called on the pair's rank only.
    comm : MPI.Comm
        The filter communicator.

    Returns
    -------
    SlotPrior
        ``hx`` of shape (n_members, m), the same values whatever the number of ranks.
    """
    slot, in_window = assign_slots(obs.time, edges, len(obs))
    if edges is None:
        slot = np.zeros(len(obs), dtype=np.int64)
    pairs = pair_range(n_members, n_slots, comm.size, comm.rank)
    held = all_call(comm, lambda: observe_slots(obs, slot, pairs, n_slots, n_rows, grid, reader))
    every = [pair_range(n_members, n_slots, comm.size, r) for r in range(comm.size)]
    wanted = np.asarray(wanted, dtype=np.int64)
    hx = _exchange(held, every, n_slots, wanted, slot, n_members, comm)
    win = in_window[wanted]
    hx[:, ~win] = np.nan
    return SlotPrior(hx=hx, in_window=win)
