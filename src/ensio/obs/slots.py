"""Time slots of a 4-D analysis: which slot each observation falls in, H at one slot.

A 4-D analysis (``analysis.time_slots``; Hunt et al. 2004, the 4-D LETKF of
Miyoshi's code) compares each observation with every member's state at the
observation's time slot rather than at the analysis time. This module holds
the two pure pieces of that: binning observation times into slots
(:func:`assign_slots`) and applying a batch's operator to one member's state
at one slot, given the values of the rows it reads (:func:`apply_at_rows`).
The parallel part (which rank reads which member and slot, the exchange of
H(x) in observation space) is :mod:`ensio.analysis.stoo`.

Slot convention: slot ``s`` (0-based here, ``{slot}`` = s + 1 in file
patterns) holds the times ``edges[s] <= t < edges[s + 1]``; the last slot
also holds ``t == edges[-1]``. Times outside the edges, or NaN, are outside
the window.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .operators import ObsOperator

__all__ = ["apply_at_rows", "assign_slots", "rows_read"]


def assign_slots(
    time: np.ndarray | None, edges: Sequence[float] | None, m: int
) -> tuple[np.ndarray, np.ndarray]:
    """Slot of every observation and whether it lies in the window.

    Parameters
    ----------
    time : ndarray, shape (m,), or None
        Observation times (NaN: none).
    edges : sequence of float, or None
        ``n_slots + 1`` increasing slot edges; ``None``: one slot, every
        observation in it whatever its time (a 3-D-equivalent analysis).
    m : int
        Number of observations (``time`` may be None).

    Returns
    -------
    slot : ndarray of int64, shape (m,)
        0-based slot, -1 outside the window.
    in_window : ndarray of bool, shape (m,)
    """
    if edges is None:
        return np.zeros(m, dtype=np.int64), np.ones(m, dtype=bool)
    e = np.asarray(edges, dtype=float)
    if time is None:
        return np.full(m, -1, dtype=np.int64), np.zeros(m, dtype=bool)
    t = np.asarray(time, dtype=float)
    with np.errstate(invalid="ignore"):
        inside = (t >= e[0]) & (t <= e[-1])
    slot = np.searchsorted(e, np.where(inside, t, e[0]), side="right") - 1
    slot = np.minimum(slot, e.size - 2)  # t == edges[-1]: the last slot
    return np.where(inside, slot, -1).astype(np.int64), inside


def rows_read(op: ObsOperator) -> np.ndarray:
    """Sorted distinct state rows an operator reads with a non-zero weight."""
    return np.unique(op.rows[op.weights != 0.0])


def apply_at_rows(op: ObsOperator, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """H(x) of one member ``(m,)`` from the values of the rows it reads.

    The same arithmetic as the distributed H of the 3-D analysis
    (:func:`ensio.analysis.distributed.observe`): zero-weight entries read 0,
    so an unused NaN row does not spoil an observation.

    Parameters
    ----------
    op : ObsOperator
        Rows and weights ``(m, p)``.
    rows : ndarray of int, shape (r,)
        Sorted rows, at least :func:`rows_read` of ``op``.
    values : ndarray, shape (r,)
        The member's state at ``rows``.
    """
    used = op.weights != 0.0
    pos = np.searchsorted(rows, op.rows)
    pos[~used] = 0
    V = np.asarray(values, dtype=float)[None, pos] if rows.size else np.zeros((1, *op.rows.shape))
    V[:, ~used] = 0.0
    return np.einsum("kmp,mp->km", V, op.weights)[0]
