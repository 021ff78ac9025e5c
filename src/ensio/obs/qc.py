"""Observation quality control with counts for the log."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["QCCounts", "quality_control"]


@dataclass(frozen=True)
class QCCounts:
    """How many observations each check rejected (each counted once, first reason).

    Attributes
    ----------
    total : int
    accepted : int
    bad_value : int
        Value NaN or infinite.
    bad_error : int
        Error not finite or ≤ 0.
    outside : int
        Outside the grid / state (no observation operator).
    missing_state : int
        The observation operator reads an inactive state point (a member
        holds a missing value there).
    outside_window : int
        Observation time outside the assimilation window, or missing
        (``analysis.time_slots``).
    bad_prior : int
        Observed prior not finite (e.g. a masked grid point).
    gross : int
        |innovation| > max_sigma · sqrt(σ_o² + σ_b²).
    """

    total: int = 0
    accepted: int = 0
    bad_value: int = 0
    bad_error: int = 0
    outside: int = 0
    missing_state: int = 0
    outside_window: int = 0
    bad_prior: int = 0
    gross: int = 0

    @property
    def rejected(self) -> int:
        return self.total - self.accepted

    def __add__(self, other: QCCounts) -> QCCounts:
        return QCCounts(*(a + b for a, b in zip(_astuple(self), _astuple(other), strict=True)))


def _astuple(c: QCCounts) -> tuple[int, ...]:
    return (c.total, c.accepted, c.bad_value, c.bad_error, c.outside, c.missing_state,
            c.outside_window, c.bad_prior, c.gross)


def quality_control(
    values: np.ndarray,
    errors: np.ndarray,
    hx: np.ndarray | None = None,
    *,
    max_sigma: float | None = None,
    inside: np.ndarray | None = None,
    missing: np.ndarray | None = None,
    in_window: np.ndarray | None = None,
) -> tuple[np.ndarray, QCCounts]:
    """Accept/reject observations and count the reasons.

    The gross-error check compares the innovation with its expected spread
    ``sqrt(σ_o² + σ_b²)`` (σ_b² the ensemble variance of the observed prior,
    ddof 1) so that an observation far from a *confident* prior is rejected
    while one far from an uncertain prior is kept.

    Parameters
    ----------
    values, errors : ndarray, shape (m,)
    hx : ndarray, shape (k, m), optional
        Observed prior ensemble; needed for ``bad_prior`` and ``gross``.
    max_sigma : float, optional
        Gross-error threshold; ``None`` disables the check.
    inside : ndarray of bool, shape (m,), optional
        False where the observation operator could not be built.
    missing : ndarray of bool, shape (m,), optional
        True where the observation operator reads an inactive state point.
    in_window : ndarray of bool, shape (m,), optional
        False where the observation time is outside the assimilation window
        (a 4-D analysis; its ``hx`` there is NaN and not counted as a bad prior).

    Returns
    -------
    accepted : ndarray of bool, shape (m,)
    counts : QCCounts
    """
    values = np.asarray(values, dtype=float)
    errors = np.asarray(errors, dtype=float)
    m = values.size
    ok = np.ones(m, dtype=bool)
    counts: dict[str, int] = {}

    def reject(name: str, bad: np.ndarray) -> None:
        nonlocal ok
        new = ok & bad
        counts[name] = int(new.sum())
        ok = ok & ~bad

    reject("bad_value", ~np.isfinite(values))
    reject("bad_error", ~(np.isfinite(errors) & (errors > 0)))
    reject("outside", np.zeros(m, bool) if inside is None else ~np.asarray(inside, bool))
    reject("missing_state", np.zeros(m, bool) if missing is None else np.asarray(missing, bool))
    reject("outside_window",
           np.zeros(m, bool) if in_window is None else ~np.asarray(in_window, bool))
    if hx is not None:
        hx = np.asarray(hx, dtype=float)
        reject("bad_prior", ~np.all(np.isfinite(hx), axis=0))
        if max_sigma is not None:
            with np.errstate(invalid="ignore"):
                mean = hx.mean(axis=0)
                var_b = hx.var(axis=0, ddof=1) if hx.shape[0] > 1 else np.zeros(m)
                spread = np.sqrt(errors**2 + var_b)
                reject("gross", ~(np.abs(values - mean) <= max_sigma * spread))
    return ok, QCCounts(total=m, accepted=int(ok.sum()), **counts)
