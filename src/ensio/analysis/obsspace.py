"""Observations as the analysis kernels see them: after H and quality control.

Shared by the global transforms, the batched and the pointwise local
kernels and the filter variants, so it lives apart from all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["ObsSpace"]


@dataclass(frozen=True, eq=False)
class ObsSpace:
    """Observations as the analysis sees them (after H and quality control).

    Stored sorted by global id, so sums over observations run in the same
    order whichever subset a rank holds.

    Attributes
    ----------
    hx : ndarray, shape (k, m)
        Observed prior ensemble.
    values, errors : ndarray, shape (m,)
    coords : ndarray, shape (m, d)
        Locations in the localization geometry.
    ids : ndarray of int, shape (m,)
        Global observation numbers.
    perturbations : ndarray, shape (k, m), optional
        ε_j (scaled by σ_o) for the stochastic filters.
    """

    hx: np.ndarray
    values: np.ndarray
    errors: np.ndarray
    coords: np.ndarray
    ids: np.ndarray
    perturbations: np.ndarray | None = None
    mean: np.ndarray = field(init=False)
    Y: np.ndarray = field(init=False)
    d: np.ndarray = field(init=False)
    rinv: np.ndarray = field(init=False)
    var: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids, dtype=np.int64).ravel()
        for name in ("values", "errors"):
            if np.shape(getattr(self, name)) != ids.shape:
                raise ValueError(
                    f"ObsSpace.{name}: shape {np.shape(getattr(self, name))}, ids {ids.shape}"
                )
        if np.ndim(self.hx) != 2 or np.shape(self.hx)[1] != ids.size:
            raise ValueError(f"ObsSpace.hx: shape {np.shape(self.hx)}, expected (k, {ids.size})")
        order = np.argsort(ids, kind="stable")
        hx = np.asarray(self.hx, dtype=float)[:, order]
        put = object.__setattr__
        put(self, "ids", ids[order])
        put(self, "hx", hx)
        put(self, "values", np.asarray(self.values, dtype=float)[order])
        put(self, "errors", np.asarray(self.errors, dtype=float)[order])
        coords = np.asarray(self.coords, dtype=float)
        if coords.ndim == 1:
            coords = coords[:, None]
        if coords.shape[0] != ids.size:
            raise ValueError(f"{coords.shape[0]} observation coordinates for {ids.size} ids")
        put(self, "coords", coords[order])
        if self.perturbations is not None:
            put(self, "perturbations", np.asarray(self.perturbations, dtype=float)[:, order])
        mean = hx.mean(axis=0)
        put(self, "mean", mean)
        put(self, "Y", hx - mean)
        put(self, "d", self.values - mean)
        put(self, "rinv", 1.0 / self.errors**2)
        k = hx.shape[0]
        put(self, "var", (self.Y**2).sum(axis=0) / max(k - 1, 1))

    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def k(self) -> int:
        return int(self.hx.shape[0])
