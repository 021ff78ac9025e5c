"""Filter variants: how one ensemble-space transform is formed from observation sums.

A variant is what distinguishes the ETKF, the ESTKF and the stochastic EnKF;
whether a filter is global or local is the driver's business
(:class:`~ensio.analysis.filters.GlobalFilter` computes one transform from
all observations, :class:`~ensio.analysis.filters.LocalFilter` one per
analysis point through :func:`~ensio.analysis.local.local_analysis`), and
both drivers hand the same variant object the same sums. A variant provides

* :meth:`~Variant.projection`: the basis ``T`` (k × q) in which the sums are
  formed, or None for the k-dimensional ensemble space;
* :meth:`~Variant.innovations`: the right-hand-side vectors (one shared
  innovation for the square-root filters, one perturbed innovation per
  member for the stochastic one);
* :meth:`~Variant.transforms`: the finishing step, member-space transforms
  from the sums ``C = Yq R_loc⁻¹ Yqᵀ`` and ``Yq R_loc⁻¹ D``;
* :meth:`~Variant.global_transform`: the same for one global transform (the
  plain kernels of :mod:`~ensio.analysis.transforms`);
* class-level capabilities: ``stochastic`` (needs observation perturbations,
  drawn by the filter) and ``reducible`` (its local transforms may be formed
  in a reduced anomaly basis, :mod:`~ensio.analysis.basis`).

**Adding a filter** means adding a :class:`Variant` subclass here, decorated
with :func:`register`, and its name to
:data:`ensio.config.filters.VARIANT_NAMES` (the numpy-free list the config
validates against; the import-time check below names a missing entry). The
global and the local filter classes, the ``analysis.filter`` values
``name`` and ``"l" + name`` and both kernels follow from it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from ..config.filters import VARIANT_NAMES
from .obsspace import ObsSpace
from .transforms import (
    Eigh,
    enkf_transform,
    enkf_weights,
    estkf_projection,
    estkf_transform,
    etkf_transform,
    sqrt_weights,
    transform_from_weights,
)

__all__ = ["VARIANTS", "Variant", "register"]


class Variant(ABC):
    """How an ensemble-space filter turns observation sums into member-space transforms.

    Attributes
    ----------
    name : str
        The global filter's ``analysis.filter`` value (the local one is
        ``"l" + name``).
    title : str
        Stem of the filter class names (``ETKF`` → ``ETKF``, ``LETKF``).
    stochastic : bool
        Needs observation perturbations (``ObsSpace.perturbations``).
    reducible : bool
        Local transforms may be formed in a reduced anomaly basis (exact
        for square-root filters, whose sums live in the span of ``Y``).
    """

    name: ClassVar[str]
    title: ClassVar[str]
    stochastic: ClassVar[bool] = False
    reducible: ClassVar[bool] = False

    def projection(self, k: int) -> np.ndarray | None:
        """Basis ``T`` (k × q) of the space the sums are formed in; None: the ensemble space."""
        return None

    def innovations(self, obs: ObsSpace) -> np.ndarray:
        """Right-hand-side vectors, shape (s, m): ``d`` (s = 1) for a square-root filter."""
        return obs.d[None, :]

    @abstractmethod
    def transforms(
        self,
        C: np.ndarray,
        rhs: np.ndarray,
        rho: np.ndarray,
        k: int,
        T: np.ndarray | None,
        eigh: Eigh | None = None,
    ) -> np.ndarray:
        """Member-space transforms of p points from their ensemble-space sums.

        Parameters
        ----------
        C : ndarray, shape (p, q, q)
            ``Yq R_loc⁻¹ Yqᵀ`` with ``Yq = Tᵀ Y`` (or ``Y``).
        rhs : ndarray, shape (p, q, s)
            ``Yq R_loc⁻¹ Dᵀ`` for the vectors ``D`` of :meth:`innovations`.
        rho : ndarray, shape (p,)
            Forgetting factor of each point.
        k : int
            Ensemble size.
        T : ndarray, shape (k, q), or None
            :meth:`projection` of ``k``.
        eigh : callable, optional
            Eigensolver for the stack (LAPACK by default; the batched kernel
            passes :func:`~ensio.analysis.eigensolver.eigh_stack`).

        Returns
        -------
        ndarray, shape (p, k, k)
        """

    @abstractmethod
    def global_transform(self, obs: ObsSpace, rho: float) -> np.ndarray:
        """One transform ``(k, k)`` from all observations of ``obs``."""


#: The registered variants by name (filled by :func:`register`).
VARIANTS: dict[str, Variant] = {}


def register(cls: type[Variant]) -> type[Variant]:
    """Class decorator: register one instance of ``cls`` under ``cls.name``."""
    if cls.name not in VARIANT_NAMES:
        raise RuntimeError(
            f"filter variant {cls.name!r} is not listed in ensio.config.filters.VARIANT_NAMES"
        )
    VARIANTS[cls.name] = cls()
    return cls


def _square_root(C, rhs, rho, k: int, T: np.ndarray | None, eigh=None) -> np.ndarray:
    """Symmetric square-root transforms (Hunt et al. 2007), mapped back with ``T`` if given."""
    wbar, W = sqrt_weights(C, rhs[..., 0], rho, k, eigh)
    return transform_from_weights(wbar, W, omega=T)


@register
class ETKFVariant(Variant):
    """Ensemble transform Kalman filter (Hunt et al. 2007), symmetric square root."""

    name = "etkf"
    title = "ETKF"
    reducible = True

    def transforms(self, C, rhs, rho, k, T, eigh=None):
        return _square_root(C, rhs, rho, k, T, eigh)

    def global_transform(self, obs, rho):
        return etkf_transform(obs.Y, obs.d, obs.rinv, rho)


@register
class ESTKFVariant(Variant):
    """Error-subspace transform Kalman filter (Nerger et al. 2012).

    The ETKF analysis in the (k−1)-dimensional error subspace spanned by
    ``X T`` (:func:`~ensio.analysis.transforms.estkf_projection`): the same
    analysis with a smaller eigenproblem.
    """

    name = "estkf"
    title = "ESTKF"
    reducible = True

    def projection(self, k):
        return estkf_projection(k)

    def transforms(self, C, rhs, rho, k, T, eigh=None):
        return _square_root(C, rhs, rho, k, T, eigh)

    def global_transform(self, obs, rho):
        return estkf_transform(obs.Y, obs.d, obs.rinv, rho)


@register
class EnKFVariant(Variant):
    """Stochastic EnKF with perturbed observations (Burgers et al. 1998).

    Each member j is updated with ``d + ε_j`` in ensemble space,
    ``x̄ + X'[e_j/√ρ + P̃ Y R_loc⁻¹ (d + ε_j − Y_j/√ρ)]``; locally that is the
    same R-localization as the LETKF (batched the same way), not a Schur
    product on the gain. Perturbations come from per-member streams keyed on
    (seed, cycle, member) and indexed by global observation number
    (:func:`~ensio.analysis.transforms.obs_perturbations`); by default they
    are centred over the members, so the analysis mean is the Kalman mean.
    """

    name = "enkf"
    title = "EnKF"
    stochastic = True

    def innovations(self, obs):
        if obs.perturbations is None:
            raise ValueError("the stochastic filter needs observation perturbations")
        return obs.d[None, :] + obs.perturbations

    def transforms(self, C, rhs, rho, k, T, eigh=None):
        return enkf_weights(C, rhs, rho, k, eigh)

    def global_transform(self, obs, rho):
        if obs.perturbations is None:
            raise ValueError("the stochastic filter needs observation perturbations")
        return enkf_transform(obs.Y, obs.d, obs.rinv, obs.perturbations, rho)


_missing = set(VARIANT_NAMES) - set(VARIANTS)
if _missing:  # a name without its class would only fail when a config selects it
    raise RuntimeError(f"filter variants {sorted(_missing)} have no class in {__name__}")
