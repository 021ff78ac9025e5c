"""Ensemble-space analysis kernels: ETKF, ESTKF, stochastic EnKF.

Pure functions on numpy arrays: no MPI, no I/O. The orientation follows the
ensemble blocks of DESIGN.md, **member-major**:

* ``X`` — ensemble, shape ``(k, n)`` (k members, n state rows);
* ``Y`` — observed prior anomalies ``HX − mean(HX)``, shape ``(k, m)``;
* ``d`` — innovations ``y − mean(HX)``, shape ``(m,)``;
* ``rinv`` — diagonal of R⁻¹ (possibly times localization weights), ``(m,)``.

Every filter ends in the same place, a **member-space transform** ``G`` of
shape ``(k, k)`` such that analysis member j of a row is

``x^a_j = x̄ + Σ_a x'_a G[a, j]``           (:func:`apply_transform`),

so the global filters (one G for all rows) and the local ones (one G per
grid point) share the update, and a rank needs only the G of its own rows.

The forgetting factor ρ ≤ 1 (PDAF convention) inflates the prior covariance
to ``P/ρ``; it enters as ``(k−1)ρ I`` in the ensemble-space matrix (Hunt et al.
2007 write ``(k−1)I/ρ_Hunt`` with ``ρ_Hunt = 1/ρ``). DAPPER's ``infl`` is a
different filter: it multiplies the analysis anomalies after the update
(``analysis.inflation.posterior``, :func:`~ensio.analysis.inflation.inflate_anomalies`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = [
    "Eigh",
    "ensemble_space_sums",
    "eig_analysis",
    "sqrt_weights",
    "etkf_transform",
    "estkf_projection",
    "estkf_transform",
    "enkf_weights",
    "enkf_transform",
    "transform_from_weights",
    "apply_transform",
    "obs_perturbations",
    "obs_perturbation",
    "random_rotation",
    "rotate",
]

#: A symmetric eigensolver for stacks: ``(C, shift) -> (lam, U)`` with ``C + shift·I =
#: U diag(lam) Uᵀ`` per matrix, eigenvalues in any order (see :func:`eig_analysis`).
Eigh = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]

# Domain separation of the seeded random streams (arbitrary fixed tags).
_STREAM_OBS_PERTURBATION = 0x6F627370  # "obsp"
_STREAM_ROTATION = 0x726F7421  # "rot!"
#: Observations per counter block of a member's perturbation stream.
PERTURBATION_BLOCK = 1024


def ensemble_space_sums(
    Y: np.ndarray, rinv: np.ndarray, d: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``C = Y R⁻¹ Yᵀ`` and ``b = Y R⁻¹ d`` (ensemble space, one point).

    Parameters
    ----------
    Y : ndarray, shape (q, m)
    rinv : ndarray, shape (m,)
    d : ndarray, shape (m,)

    Returns
    -------
    C : ndarray, shape (q, q)
    b : ndarray, shape (q,)
    """
    Yr = Y * rinv
    return Yr @ Y.T, Yr @ d


def eig_analysis(
    C: np.ndarray, forget: np.ndarray | float, k: int, eigh: Eigh | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Eigendecomposition of ``A = (k−1)ρ I + C`` for a stack ``(..., q, q)``.

    The one place the prior precision ``(k−1)ρ`` enters the ensemble-space
    matrix, shared by the dense transforms here and the factored ones of
    :mod:`~ensio.analysis.basis`. ``eigh`` (a stack ``(p, q, q)`` and its
    shifts) replaces LAPACK's ``numpy.linalg.eigh``: the batched kernel
    passes the lockstep solver of :mod:`~ensio.analysis.eigensolver`; the
    pointwise reference and the global filters keep LAPACK.

    Returns
    -------
    lam : ndarray, shape (..., q)
        Eigenvalues, ascending with LAPACK (in the solver's order otherwise;
        every use is element-wise with the matching vectors).
    U : ndarray, shape (..., q, q)
        Eigenvectors (columns).
    """
    C = np.asarray(C, dtype=float)
    rho = np.broadcast_to(np.asarray(forget, dtype=float), C.shape[:-2])
    if eigh is not None:
        q = C.shape[-1]
        lam, U = eigh(C.reshape(-1, q, q), ((k - 1) * rho).reshape(-1))
        return lam.reshape(C.shape[:-1]), U.reshape(C.shape)
    A = np.array(C, dtype=float)  # a copy: the shift goes on its diagonal in place
    diag = np.einsum("...ii->...i", A)  # writable view of the diagonals
    diag += ((k - 1) * rho)[..., None]
    return np.linalg.eigh(A)


def sqrt_weights(
    C: np.ndarray, b: np.ndarray, forget: np.ndarray | float, k: int, eigh: Eigh | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Mean weights and symmetric square-root transform (Hunt et al. 2007).

    With ``A = (k−1)ρ I + C = U Λ Uᵀ`` the analysis covariance in ensemble
    space is ``P̃ = A⁻¹``; ``w̄ = P̃ b`` and ``W = [(k−1) P̃]^{1/2} =
    U sqrt((k−1)/Λ) Uᵀ``. The symmetric root is the one closest to the
    identity, so the analysis members stay as close as possible to the prior
    members (and the transform of neighbouring points varies smoothly).

    Parameters
    ----------
    C : ndarray, shape (..., q, q)
        ``Y R⁻¹ Yᵀ`` (any stack of points).
    b : ndarray, shape (..., q)
        ``Y R⁻¹ d``.
    forget : float or ndarray, shape (...)
        Forgetting factor ρ per point.
    k : int
        Ensemble size (``q = k`` for ETKF, ``k − 1`` for ESTKF).
    eigh : callable, optional
        Eigensolver for stacks (:func:`eig_analysis`); LAPACK by default.

    Returns
    -------
    wbar : ndarray, shape (..., q)
    W : ndarray, shape (..., q, q)
    """
    lam, U = eig_analysis(C, forget, k, eigh)
    Ut = np.swapaxes(U, -1, -2)
    Ub = (Ut @ b[..., None])[..., 0]
    wbar = (U @ (Ub / lam)[..., None])[..., 0]
    W = (U * np.sqrt((k - 1) / lam)[..., None, :]) @ Ut
    return wbar, W


def transform_from_weights(
    wbar: np.ndarray, W: np.ndarray, omega: np.ndarray | None = None
) -> np.ndarray:
    """Member-space transform ``G`` from mean weights and square root.

    ETKF (``omega is None``): ``G = w̄ 1ᵀ + W``. ESTKF (``omega = T``, k × (k−1)):
    the weights live in the error subspace spanned by ``L = X T``, and
    ``G = T w̄ 1ᵀ + T W Tᵀ``.

    Parameters
    ----------
    wbar : ndarray, shape (..., q)
    W : ndarray, shape (..., q, q)
    omega : ndarray, shape (k, q), optional

    Returns
    -------
    G : ndarray, shape (..., k, k)
    """
    if omega is None:
        return W + wbar[..., :, None]
    Tw = wbar @ omega.T  # (..., k)
    return omega @ W @ omega.T + Tw[..., :, None]


def etkf_transform(
    Y: np.ndarray, d: np.ndarray, rinv: np.ndarray, forget: float = 1.0
) -> np.ndarray:
    """Global ETKF transform (Hunt, Kostelich & Szunyogh 2007, symmetric root).

    Parameters
    ----------
    Y : ndarray, shape (k, m)
    d : ndarray, shape (m,)
    rinv : ndarray, shape (m,)
    forget : float

    Returns
    -------
    G : ndarray, shape (k, k)
    """
    k = Y.shape[0]
    C, b = ensemble_space_sums(Y, rinv, d)
    return transform_from_weights(*sqrt_weights(C, b, forget, k))


def estkf_projection(k: int) -> np.ndarray:
    """ESTKF projection ``T`` (Nerger et al. 2012, MWR 140, 2335–2345).

    ``T`` is k × (k−1) with ``T_ij = 1 − 1/(k(1/√k + 1))`` (i = j < k),
    ``−1/(k(1/√k + 1))`` (i ≠ j, i < k) and ``−1/√k`` (i = k). Its columns are
    orthonormal and orthogonal to the vector of ones, so ``T Tᵀ = I − 11ᵀ/k``:
    ``X T`` spans the ensemble error subspace with k−1 columns instead of k.
    """
    if k < 2:
        raise ValueError("the ESTKF needs at least 2 members")
    c = 1.0 / (k * (1.0 / np.sqrt(k) + 1.0))
    T = np.full((k, k - 1), -c)
    T[np.arange(k - 1), np.arange(k - 1)] += 1.0
    T[k - 1, :] = -1.0 / np.sqrt(k)
    return T


def estkf_transform(
    Y: np.ndarray, d: np.ndarray, rinv: np.ndarray, forget: float = 1.0
) -> np.ndarray:
    """Global ESTKF transform in the (k−1)-dimensional error subspace.

    ``HL = Tᵀ Y`` (member-major), ``A = (k−1)ρ I + HLᵀR⁻¹HL`` is (k−1)×(k−1),
    and the symmetric square root is mapped back with ``T``. With a symmetric
    root this is algebraically the same analysis as the ETKF at a smaller
    eigenproblem (Nerger et al. 2012).

    Returns
    -------
    G : ndarray, shape (k, k)
    """
    k = Y.shape[0]
    T = estkf_projection(k)
    C, b = ensemble_space_sums(T.T @ Y, rinv, d)
    return transform_from_weights(*sqrt_weights(C, b, forget, k), omega=T)


def enkf_weights(
    C: np.ndarray, B: np.ndarray, forget: np.ndarray | float, k: int, eigh: Eigh | None = None
) -> np.ndarray:
    """Stochastic EnKF transform from ensemble-space sums (any stack of points).

    With prior anomalies inflated to ``X'/√ρ`` and perturbed observations
    ``y + ε_j``, member j's analysis is ``x̄ + X'[e_j/√ρ + P̃ Y R⁻¹(d + ε_j − Y_j/√ρ)]``
    with ``P̃ = ((k−1)ρ I + C)⁻¹`` (the Kalman gain ``X'Yᵀ(YYᵀ + (k−1)R)⁻¹``
    rewritten in ensemble space). ``Y R⁻¹ Y_jᵀ`` is column j of C, so

    ``G = I/√ρ + P̃ (B − C/√ρ)``, ``B[:, j] = Y R⁻¹ (d + ε_j)``.

    Parameters
    ----------
    C : ndarray, shape (..., k, k)
    B : ndarray, shape (..., k, k)
    forget : float or ndarray, shape (...)
    eigh : callable, optional
        Eigensolver for stacks (:func:`eig_analysis`); LAPACK by default.

    Returns
    -------
    G : ndarray, shape (..., k, k)
    """
    lam, U = eig_analysis(C, forget, k, eigh)
    isr = 1.0 / np.sqrt(np.asarray(forget, dtype=float))[..., None, None]
    rhs = B - C * isr
    Pa_rhs = U @ ((np.swapaxes(U, -1, -2) @ rhs) / lam[..., :, None])
    return Pa_rhs + isr * np.eye(k)


def enkf_transform(
    Y: np.ndarray,
    d: np.ndarray,
    rinv: np.ndarray,
    perturbations: np.ndarray,
    forget: float = 1.0,
) -> np.ndarray:
    """Global stochastic EnKF (perturbed observations, Burgers et al. 1998).

    Parameters
    ----------
    Y : ndarray, shape (k, m)
    d : ndarray, shape (m,)
    rinv : ndarray, shape (m,)
    perturbations : ndarray, shape (k, m)
        Observation perturbations ε_j (already scaled by σ_o), one row per member.
    forget : float

    Returns
    -------
    G : ndarray, shape (k, k)
    """
    k = Y.shape[0]
    Yr = Y * rinv
    C = Yr @ Y.T
    B = Yr @ (d[None, :] + perturbations).T
    return enkf_weights(C, B, forget, k)


def apply_transform(X: np.ndarray, G: np.ndarray) -> np.ndarray:
    """Analysis ensemble ``x̄ + X'G`` for every row.

    Parameters
    ----------
    X : ndarray, shape (k, n)
        Prior ensemble (member-major).
    G : ndarray, shape (k, k) or (n, k, k)
        One transform for all rows, or one per row.

    Returns
    -------
    ndarray, shape (k, n)
    """
    mean = X.mean(axis=0)
    Xp = X - mean
    if G.ndim == 2:
        return mean + G.T @ Xp
    return mean + np.einsum("an,naj->jn", Xp, G)


def _member_key(seed: int, cycle: int, member: int, stream: int) -> np.ndarray:
    return np.random.SeedSequence([stream, seed, cycle, member]).generate_state(2, np.uint64)


def obs_perturbations(
    seed: int, cycle: int, members: np.ndarray, obs_ids: np.ndarray
) -> np.ndarray:
    """Standard-normal observation perturbations, decomposition independent.

    Member j's stream is a Philox generator keyed on (seed, cycle, member j).
    Global observation number i is drawn from counter block
    ``i // PERTURBATION_BLOCK`` of that stream (the block's counter word is
    set, so blocks never overlap) at position ``i % PERTURBATION_BLOCK``. The
    value therefore depends on (seed, cycle, member, i) only — not on which
    other observations a rank holds, their order, or the number of ranks.

    Parameters
    ----------
    seed, cycle : int
        Non-negative.
    members : ndarray of int, shape (k,)
        0-based member numbers.
    obs_ids : ndarray of int, shape (m,)
        Global observation numbers (≥ 0).

    Returns
    -------
    ndarray, shape (k, m)
        Multiply by σ_o to get ε.
    """
    members = np.atleast_1d(np.asarray(members, dtype=np.int64))
    ids = np.atleast_1d(np.asarray(obs_ids, dtype=np.int64))
    if ids.size and ids.min() < 0:
        raise ValueError("observation numbers must be >= 0")
    out = np.empty((members.size, ids.size))
    blocks = ids // PERTURBATION_BLOCK
    order = np.argsort(blocks, kind="stable")
    ublocks, starts = np.unique(blocks[order], return_index=True)
    bounds = np.append(starts, ids.size)
    for i, mem in enumerate(members):
        key = _member_key(seed, cycle, int(mem), _STREAM_OBS_PERTURBATION)
        for b, lo, hi in zip(ublocks, bounds[:-1], bounds[1:], strict=True):
            bitgen = np.random.Philox(key=key, counter=np.array([0, 0, b, 0], dtype=np.uint64))
            z = np.random.Generator(bitgen).standard_normal(PERTURBATION_BLOCK)
            pos = order[lo:hi]
            out[i, pos] = z[ids[pos] % PERTURBATION_BLOCK]
    return out


def obs_perturbation(seed: int, cycle: int, member: int, obs_id: int) -> float:
    """The standard-normal perturbation of observation ``obs_id`` for ``member``."""
    return float(obs_perturbations(seed, cycle, np.array([member]), np.array([obs_id]))[0, 0])


def random_rotation(k: int, seed: int, cycle: int) -> np.ndarray:
    """Mean-preserving random orthogonal matrix ``Λ`` (k × k), seeded.

    ``Λ = T Q Tᵀ + 11ᵀ/k`` with Q Haar-distributed on O(k−1) (QR of a Gaussian
    matrix with the sign fix of Mezzadri 2007) and T from
    :func:`estkf_projection`: Λ is orthogonal and ``Λ1 = Λᵀ1 = 1``, so
    ``X'Λ`` keeps the ensemble mean and covariance while mixing the members.
    """
    if k < 2:
        return np.ones((1, 1))
    rng = np.random.default_rng(np.random.SeedSequence([_STREAM_ROTATION, seed, cycle]))
    q, r = np.linalg.qr(rng.standard_normal((k - 1, k - 1)))
    q = q * np.sign(np.diag(r))
    T = estkf_projection(k)
    return T @ q @ T.T + 1.0 / k


def rotate(X: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """Mix the members of ``X`` (k, n) with a mean-preserving rotation ``Λ`` (k, k).

    Member j becomes ``x̄ + Σ_a x'_a Λ[a, j]``; mean and covariance are unchanged.
    """
    mean = X.mean(axis=0)
    return mean + rotation.T @ (X - mean)
