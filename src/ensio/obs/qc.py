"""Observation quality control with counts for the log."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["QC_FLAGS", "QCCounts", "quality_control", "quality_flags"]

#: The per-observation quality-control flag: its value is the position here
#: (0 accepted, then the reasons in the order they are checked, each observation
#: flagged with the first that rejects it). The observation-space diagnostics
#: file writes these as the CF ``flag_values`` / ``flag_meanings`` of ``qc``.
QC_FLAGS = ("accepted", "bad_value", "bad_error", "outside", "missing_state",
            "outside_window", "bad_prior", "gross")  # fmt: skip


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

    @staticmethod
    def of_flags(flags: np.ndarray) -> QCCounts:
        """The counts of per-observation flags (:data:`QC_FLAGS` codes)."""
        n = np.bincount(np.asarray(flags, dtype=np.int64), minlength=len(QC_FLAGS))
        return QCCounts(int(n.sum()), *(int(x) for x in n[: len(QC_FLAGS)]))

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

    The checks and parameters of :func:`quality_flags`.

    Returns
    -------
    accepted : ndarray of bool, shape (m,)
    counts : QCCounts
    """
    flags = quality_flags(values, errors, hx, max_sigma=max_sigma, inside=inside,
                          missing=missing, in_window=in_window)  # fmt: skip
    return flags == 0, QCCounts.of_flags(flags)


def quality_flags(
    values: np.ndarray,
    errors: np.ndarray,
    hx: np.ndarray | None = None,
    *,
    max_sigma: float | None = None,
    inside: np.ndarray | None = None,
    missing: np.ndarray | None = None,
    in_window: np.ndarray | None = None,
) -> np.ndarray:
    """Per observation: 0 accepted, else the code of the first check that rejects it.

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
    ndarray of int8, shape (m,)
        Codes of :data:`QC_FLAGS`.
    """
    values = np.asarray(values, dtype=float)
    errors = np.asarray(errors, dtype=float)
    m = values.size
    flags = np.zeros(m, dtype=np.int8)

    def reject(name: str, bad: np.ndarray) -> None:
        flags[(flags == 0) & bad] = QC_FLAGS.index(name)

    reject("bad_value", ~np.isfinite(values))
    reject("bad_error", ~(np.isfinite(errors) & (errors > 0)))
    if inside is not None:
        reject("outside", ~np.asarray(inside, bool))
    if missing is not None:
        reject("missing_state", np.asarray(missing, bool))
    if in_window is not None:
        reject("outside_window", ~np.asarray(in_window, bool))
    if hx is not None:
        hx = np.asarray(hx, dtype=float)
        reject("bad_prior", ~np.all(np.isfinite(hx), axis=0))
        if max_sigma is not None:
            with np.errstate(invalid="ignore"):
                mean = hx.mean(axis=0)
                var_b = hx.var(axis=0, ddof=1) if hx.shape[0] > 1 else np.zeros(m)
                spread = np.sqrt(errors**2 + var_b)
                reject("gross", ~(np.abs(values - mean) <= max_sigma * spread))
    return flags
