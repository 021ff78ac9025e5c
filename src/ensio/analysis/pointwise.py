"""The pointwise local-analysis kernel: the reference the batched kernel must equal.

One small product and one eigendecomposition per analysis point, written as
directly as the formulas (Hunt et al. 2007 with R-localization): the batched
kernel (:mod:`~ensio.analysis.batched`) must agree with it to rounding
(≤ 1e-10 relative), and ``ensio bench analysis`` times the two side by side.
"""

from __future__ import annotations

import numpy as np

from ..stopwatch import Stopwatch
from .batched import Apply, empty_transform
from .localization import Localization, prepare
from .obsspace import ObsSpace
from .tiles import taper_weights
from .variants import Variant

__all__ = ["pointwise_kernel"]


def pointwise_kernel(
    pts: np.ndarray,
    obs: ObsSpace,
    loc: Localization,
    variant: Variant,
    rho: np.ndarray,
    T: np.ndarray | None,
    apply: Apply,
    sw: Stopwatch,
    **_: object,
) -> np.ndarray:
    """Transforms of all points ``pts`` (p, d), one by one, handed to ``apply``.

    Same arguments and result as :func:`~ensio.analysis.batched.batched_kernel`
    (whose tiling and threading keywords are accepted and ignored).
    """
    k = obs.k
    Yq = obs.Y if T is None else T.T @ obs.Y
    D = variant.innovations(obs)  # (s, m)
    diag = np.zeros((pts.shape[0], 4))
    pts, pt_lev = loc.split(pts)
    obs_xy, obs_lev = loc.split(obs.coords)
    pts_pre, obs_pre = prepare(loc.geometry, pts), prepare(loc.geometry, obs_xy)
    reg = (obs.var, obs.errors**2) if loc.regulated else None
    for p in range(pts.shape[0]):
        one = np.array([p])
        G = empty_transform(rho[one], k)
        if len(obs):
            lev = None if pt_lev is None else (pt_lev[one], obs_lev)
            taper = taper_weights(loc, pts_pre[one], obs_pre, rho[one], reg, lev)[0]
            sel = np.nonzero(taper)[0]
            sw.lap("weights")
            if sel.size:
                w = taper[sel] * obs.rinv[sel]
                Yl = Yq[:, sel]
                Yw = Yl * w
                C = Yw @ Yl.T
                sw.add("gemm_flops", 2.0 * sel.size * Yl.shape[0] * (Yl.shape[0] + 1))
                rhs = Yw @ D[:, sel].T  # (q, s)
                diag[p] = (sel.size, w @ obs.d[sel] ** 2, w @ obs.var[sel], taper[sel].sum())
                sw.lap("gemm")
                G = variant.transforms(C[None], rhs[None], rho[one], k, T)
                sw.lap("transform")
        apply(one, G)
        sw.lap("update")
    return diag
