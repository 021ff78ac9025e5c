"""The one result of an analysis, from the kernels up to the distributed pipeline.

Every level fills what it knows: the kernels the analysis rows and the
per-row observation sums, the filter the inflation estimate, the pipeline
(:func:`~ensio.analysis.pipeline.analyse_rows`) the quality-control counts,
the innovation statistics and the seconds per phase. One type, so callers of
any level (the in-memory API, the offline and online drivers, the benchmark)
read the same attribute names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..obs import QCCounts

if TYPE_CHECKING:
    from .obsdiag import ObsDiagnostics

__all__ = ["AnalysisResult", "InnovationStats"]


@dataclass(frozen=True)
class InnovationStats:
    """Mean and root-mean-square of ``y − mean(HX)`` over the accepted observations."""

    mean: float
    rms: float
    count: int

    @staticmethod
    def of(values: np.ndarray, hx: np.ndarray) -> InnovationStats:
        d = values - hx.mean(axis=0)
        if d.size == 0:
            return InnovationStats(float("nan"), float("nan"), 0)
        return InnovationStats(float(d.mean()), float(np.sqrt(np.mean(d**2))), int(d.size))

    @staticmethod
    def from_sums(total: float, squares: float, count: float) -> InnovationStats:
        """From ``Σd``, ``Σd²`` and the number of innovations (e.g. summed over ranks)."""
        if count == 0:
            return InnovationStats(float("nan"), float("nan"), 0)
        return InnovationStats(float(total / count), float(np.sqrt(squares / count)), int(count))


@dataclass(frozen=True, eq=False)
class AnalysisResult:
    """Analysis rows and what the caller needs to keep or log.

    Attributes
    ----------
    ensemble : ndarray, shape (k, n)
        The analysis rows, member-major.
    n_obs : ndarray of int, shape (n,)
        Observations used at each row (non-zero weight; all of them for a
        global filter).
    inflation : ndarray, shape (n,), or None
        Adaptive inflation estimate (multiplies P) for the next cycle; None
        when the inflation is not adaptive.
    qc : QCCounts or None
        Quality control over all observations (summed over their owner
        ranks: the same on every rank). Set by the pipeline.
    prior, posterior : InnovationStats or None
        Over all accepted observations, the same on every rank. Set by the
        pipeline.
    n_local_obs : int
        Observations this rank used for its rows (pipeline).
    timings : dict
        Seconds per phase (and ``*_flops`` / ``*_count`` counters) of this
        rank, see :func:`~ensio.analysis.local.local_analysis` and
        :func:`~ensio.analysis.pipeline.analyse_rows`.
    dRd, trace, weight_sum : ndarray, shape (n,), or None
        ``Σρd²/σ²``, ``Σρ var(HX)/σ²``, ``Σρ`` at each row: the inputs of the
        adaptive inflation estimate (kernel level).
    observations : ObsDiagnostics or None
        O−B, O−A, spreads and QC flags of the observations this rank owns
        (pipeline; :func:`~ensio.analysis.obsdiag.gather_diagnostics` joins
        them over the ranks).
    """

    ensemble: np.ndarray
    n_obs: np.ndarray
    inflation: np.ndarray | None = None
    qc: QCCounts | None = None
    prior: InnovationStats | None = None
    posterior: InnovationStats | None = None
    n_local_obs: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    dRd: np.ndarray | None = None
    trace: np.ndarray | None = None
    weight_sum: np.ndarray | None = None
    observations: ObsDiagnostics | None = None

    @classmethod
    def from_diagnostics(cls, ensemble: np.ndarray, diag: np.ndarray) -> AnalysisResult:
        """The result of a local kernel from its per-row diagnostics.

        ``diag`` has shape (n, 4): observation count, ``Σρd²/σ²``,
        ``Σρ var(HX)/σ²`` and ``Σρ`` per row, the layout the exact kernel
        and the weight interpolation both produce.
        """
        return cls(
            ensemble=ensemble,
            n_obs=diag[:, 0].astype(np.int64),
            dRd=diag[:, 1],
            trace=diag[:, 2],
            weight_sum=diag[:, 3],
        )
