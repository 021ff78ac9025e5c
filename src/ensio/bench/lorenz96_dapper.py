"""DAPPER's ``Lorenz96/sakov2008`` twin experiment, run on ensio's filters.

Why this module exists: "ensio's EnKF reaches the RMSE of the reference
implementation" is only a claim if both run the *same* experiment. This is
DAPPER's (1.7) set-up, term for term, so its published and measured figures
can be compared with ensio's over many seeds:

* Lorenz-96, 40 variables, F = 8, RK4 with dt = 0.05 (:mod:`ensio.models.lorenz96`);
* ``Chronology(0.05, dko=1, Ko=1000, BurnIn=20)``: an analysis after every
  model step, K = dko·(Ko + 1) = 1001 steps, no observation at t = 0;
* every variable observed with R = I;
* ``X0 = GaussRV(mu=x0, C=0.001)`` with ``x0 = e_0`` (1 at variable 0, else
  0): the truth and every member are drawn from it independently, so the
  first 20 time units are the model's spin-up *and* the filter's burn-in;
* the score ``rmse.a``: the time mean over analyses at ``t > BurnIn``
  (strictly; 601 of them) of ``sqrt(mean((mean(E^a) − x)²))``;
* ``infl`` multiplies the analysis anomalies after the update
  (``analysis.inflation.posterior``); no rotation;
* the LETKF's localizer ``nd_Id_localization((40,), (2,))`` analyses
  batches of 2 neighbouring variables with the distance from the batch
  centre (the mean of its two variables' distances): here every row takes
  the coordinate of its batch centre, observations stay at their index, and
  DAPPER's ``loc_rad = r`` with its Gaspari–Cohn taper is the support radius
  ``2 · 1.82 · r`` (:func:`dapper_gc_support`). DAPPER drops observations
  whose taper is below 1e-3; ensio keeps them (a weight < 1e-3 on R⁻¹).

The filter is called directly (:meth:`~ensio.analysis.filters.Filter.analyse`
with an :class:`~ensio.analysis.obsspace.ObsSpace`): H is the identity, there
is nothing for quality control to do, and a thousand cycles of the file-free
pipeline would only add overhead. Randomness: one
:class:`numpy.random.SeedSequence` per seed, spawned into the truth and
observation stream and the initial ensemble stream, so every filter of the
same seed sees the same truth and observations (paired comparisons); the
EnKF's observation perturbations use ``analysis.seed = seed`` and the cycle.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from ..analysis.filters import make_filter
from ..analysis.obsspace import ObsSpace
from ..config.analysis import AnalysisSection
from ..models.lorenz96 import DT, FORCING, Lorenz96

__all__ = ["Sakov2008", "SeedSummary", "analysis_rmse", "dapper_gc_support", "summarize"]

#: DAPPER's Gaspari–Cohn half-width per unit ``loc_rad`` (``R = 1.82 · radius``).
DAPPER_GC_FACTOR = 1.82


def dapper_gc_support(loc_rad: float) -> float:
    """Support radius (taper 0 at and beyond) of DAPPER's GC taper with ``loc_rad``."""
    return 2.0 * DAPPER_GC_FACTOR * loc_rad


@dataclass(frozen=True)
class Sakov2008:
    """The chronology and initial condition of DAPPER's ``sakov2008`` (defaults).

    Attributes
    ----------
    n : int
        Lorenz-96 variables.
    cycles : int
        Model steps, each followed by an analysis (DAPPER: ``dko·(Ko+1)``).
    burn_in : float
        Analyses at model time ``t > burn_in`` are scored.
    x0_variance : float
        Variance of the truth's and the members' draw around ``e_0``.
    batch : int
        Neighbouring variables analysed together by the local filters.
    """

    n: int = 40
    cycles: int = 1001
    burn_in: float = 20.0
    x0_variance: float = 0.001
    batch: int = 2

    def __post_init__(self) -> None:
        if self.cycles * DT <= self.burn_in:
            raise ValueError(
                f"cycles={self.cycles} end at t={self.cycles * DT:g}, not after burn_in"
                f"={self.burn_in:g}: nothing would be scored"
            )
        if self.batch < 1 or self.n % self.batch:
            raise ValueError(f"batch={self.batch} must divide n={self.n}")

    def row_coords(self) -> np.ndarray:
        """Coordinate of every variable: the centre of its batch, shape (n,)."""
        first = (np.arange(self.n) // self.batch) * self.batch
        return first + 0.5 * (self.batch - 1)

    def scored(self) -> np.ndarray:
        """Which cycles (0-based; cycle c ends at t = (c+1)·dt) enter the score."""
        t = np.arange(1, self.cycles + 1) * DT
        return t > self.burn_in


def analysis_rmse(
    cfg: AnalysisSection, members: int, seed: int, setup: Sakov2008 | None = None
) -> float:
    """Time-mean analysis RMSE (DAPPER's ``rmse.a``) of one seeded twin experiment.

    Parameters
    ----------
    cfg : AnalysisSection
        The filter; a local filter needs ``localization.periodic = n``.
        ``seed`` is replaced by ``seed`` (the EnKF perturbation stream).
    members : int
        Ensemble size N.
    seed : int
        Keys the truth, the observations and the initial ensemble.
    setup : Sakov2008, optional
    """
    s = setup if setup is not None else Sakov2008()
    flt = make_filter(dataclasses.replace(cfg, seed=seed))
    spawned = np.random.SeedSequence(seed).spawn(2)
    truth_stream, ens_stream = (np.random.default_rng(q) for q in spawned)
    model = Lorenz96(s.n, FORCING, DT)
    x0 = np.zeros(s.n)
    x0[0] = 1.0
    sd = np.sqrt(s.x0_variance)
    x = x0 + sd * truth_stream.standard_normal(s.n)
    E = x0 + sd * ens_stream.standard_normal((members, s.n))
    coords = s.row_coords()[:, None] if cfg.localization is not None else None
    index = np.arange(s.n)
    scored = s.scored()
    errors = np.empty(int(scored.sum()))
    j = 0
    # one BLAS thread: threads only slow the N × N eigendecompositions down (as in the pipeline)
    with threadpool_limits(limits=1, user_api="blas"):
        for cycle in range(s.cycles):
            x = model(x, 1)
            E = model(E, 1)
            y = x + truth_stream.standard_normal(s.n)
            obs = ObsSpace(hx=E, values=y, errors=np.ones(s.n), coords=index.astype(float),
                           ids=index)
            E = flt.analyse(E, coords, obs, cycle=cycle).ensemble
            if scored[cycle]:
                errors[j] = np.sqrt(np.mean((E.mean(axis=0) - x) ** 2))
                j += 1
    return float(errors.mean())


@dataclass(frozen=True)
class SeedSummary:
    """Mean and standard error of a score over independent seeds."""

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def stderr(self) -> float:
        """Sample standard deviation / √(number of seeds)."""
        v = np.asarray(self.values)
        return float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")

    def within(self, reference: float, reference_stderr: float, k: float = 2.0) -> bool:
        """``|mean − reference| ≤ k · sqrt(stderr² + reference_stderr²)``."""
        return abs(self.mean - reference) <= k * float(np.hypot(self.stderr, reference_stderr))


def summarize(
    cfg: AnalysisSection, members: int, seeds: list[int] | range, setup: Sakov2008 | None = None
) -> SeedSummary:
    """:func:`analysis_rmse` for every seed."""
    return SeedSummary(tuple(analysis_rmse(cfg, members, s, setup) for s in seeds))
