"""Fill numba's on-disk cache once per installation (``python -m ensio.cli.warm``).

Why: the analysis' compiled kernels (``cache=True``) are compiled the first time
a process calls them and loaded from numba's cache afterwards. Compiling takes
some 20-60 s of CPU; left to first use it lands inside whichever test, member
job or timed benchmark happens to come first (``test_analysis_mpi[lenkf]``: 57 s
cold, 5 s warm; issue 24). ``make venv`` runs this module once after installing,
so every later process only loads.

It runs tiny analyses through the public entry points, so each kernel is
compiled for the argument types real analyses pass (numba caches one machine
code per type signature): the lon/lat Gaspari-Cohn weights (``taperfused``),
the lockstep eigensolver and its apply (``eigensolver``, ``lockstep_ql``,
``lockstep_apply``) for the stochastic and deterministic filters and for both
one and several rows per point, and the weight-interpolation blend
(``winterp_bands``). numba writes the cache next to the sources, in
``src/ensio/analysis/__pycache__`` (``*.nbi`` index, ``*.nbc`` code), or under
``NUMBA_CACHE_DIR`` when set; :func:`cache_files` lists them. The command around
it (``--check``, messages) is :mod:`ensio.cli.warm`: cli/ is the one room that
parses arguments.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..config.schema import AnalysisSection

__all__ = ["KERNEL_MODULES", "cache_files", "warm", "warm_for"]

#: The modules holding ``@njit(cache=True)`` kernels.
KERNEL_MODULES = ("taperfused", "lockstep_ql", "eigensolver", "lockstep_apply", "winterp_bands")


def _lonlat_case(rng: np.random.Generator, k: int, n: int, m: int, stochastic: bool):
    """A small lon/lat ensemble, its points and observations (``ObsSpace``)."""
    from .obsspace import ObsSpace

    pts = np.stack([rng.uniform(-180, 180, n), rng.uniform(-80, 80, n)], axis=1)
    obs_coords = np.stack([rng.uniform(-180, 180, m), rng.uniform(-80, 80, m)], axis=1)
    errors = rng.uniform(0.5, 2.0, m)
    pert = rng.standard_normal((k, m)) if stochastic else None
    obs = ObsSpace(
        hx=rng.standard_normal((k, m)) + rng.standard_normal(m),
        values=rng.standard_normal(m),
        errors=errors,
        coords=obs_coords,
        ids=np.arange(m),
        perturbations=None if pert is None else (pert - pert.mean(axis=0)) * errors,
    )
    X = rng.standard_normal((k, n)) * 2.0 + rng.standard_normal(n)
    return X, pts, obs


def warm() -> float:
    """Compile (or load) every kernel for the types the analysis uses; seconds taken."""
    from ..stopwatch import Stopwatch
    from .eigensolver import eigh_stack
    from .local import local_analysis
    from .localization import Geometry, Localization
    from .variants import VARIANTS
    from .winterp import WeightGrid, interpolated_local
    from .winterp import warm_up as warm_winterp

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)  # the values do not matter, only the types
    loc = Localization(Geometry("lonlat"), "gaspari-cohn", 3000.0)
    eigh_stack(np.eye(2)[None], 0.0)
    warm_winterp()
    for method in ("etkf", "estkf", "enkf"):
        for k in (6, 40):  # few members (deferred apply) and full rank (lockstep solver)
            X, pts, obs = _lonlat_case(rng, k, 120, 60, stochastic=method == "enkf")
            forget = np.full(X.shape[1], 0.95)
            local_analysis(X, pts, obs, loc, method=method, forget=forget, tile_points=16)
            # several rows per point (levels of one column): the other apply path
            stacked = np.concatenate([pts, pts])
            local_analysis(np.concatenate([X, X], axis=1), stacked, obs, loc, method=method,
                           forget=np.concatenate([forget, forget]), tile_points=16)
        lon, lat = np.arange(-180.0, 180.0, 30.0), np.arange(-90.0, 90.1, 30.0)
        grid = np.stack([a.ravel() for a in np.meshgrid(lon, lat)], axis=1)
        # k = 6: matrices blended into the rows; k = 40: transforms applied as vectors
        # (_Vectors); the state in C and in Fortran order (a transposed view reaches it)
        for k in (6, 40):
            X, _, obs = _lonlat_case(rng, k, grid.shape[0], 60, stochastic=method == "enkf")
            for state in (X, np.asfortranarray(X)):
                interpolated_local(state, grid, obs, loc, VARIANTS[method], 1.0, "batched", 16,
                                   1, Stopwatch(enabled=False), WeightGrid(lon, lat, 2))
    return time.perf_counter() - t0


def warm_for(analysis: AnalysisSection, members: int) -> float:
    """Load what one configured analysis uses, on a tiny case; seconds taken.

    For an analysis started ahead (:mod:`ensio.workflow.prestart`): the
    configured filter runs on a few points with ``members`` members (the
    kernels' types and paths depend on the member count), one row and
    several rows per point, so numba's cached kernels and scipy's k-d tree
    module are loaded before the members are due. Nothing is read or written.
    """
    from scipy.spatial import cKDTree  # noqa: F401  (the observation search imports it)

    from .filters import make_filter
    from .obsspace import ObsSpace

    t0 = time.perf_counter()
    filt = make_filter(analysis)
    rng = np.random.default_rng(0)
    k, n, m = max(members, 2), 24, 12
    loc = getattr(filt, "localization", None)
    kind = loc.geometry.kind if loc is not None else "euclidean"
    if kind == "lonlat":
        pts = np.stack([rng.uniform(-5, 5, n), rng.uniform(-5, 5, n)], axis=1)
        where = np.stack([rng.uniform(-5, 5, m), rng.uniform(-5, 5, m)], axis=1)
    else:
        pts, where = rng.uniform(0, 1, (n, 1)), rng.uniform(0, 1, (m, 1))
    if loc is not None and loc.vertical is not None:
        pts = np.concatenate([pts, rng.uniform(0, 10, (n, 1))], axis=1)
        where = np.concatenate([where, rng.uniform(0, 10, (m, 1))], axis=1)
    for rows in (pts, np.concatenate([pts, pts])):
        pert = rng.standard_normal((k, m))
        obs = ObsSpace(hx=rng.standard_normal((k, m)), values=rng.standard_normal(m),
                       errors=np.ones(m), coords=where, ids=np.arange(m),
                       perturbations=pert - pert.mean(axis=0))
        X = rng.standard_normal((k, rows.shape[0]))
        filt.analyse(X, rows if loc is not None else None, obs)
    return time.perf_counter() - t0


def cache_files() -> list[Path]:
    """numba's cache files of the kernel modules (index and code), wherever numba keeps them."""
    from numba.core.config import CACHE_DIR

    here = Path(__file__).resolve().parent
    roots = [Path(CACHE_DIR)] if CACHE_DIR else [here / "__pycache__"]
    found: list[Path] = []
    for root in roots:
        if root.is_dir():
            found += [p for p in root.rglob("*") if p.suffix in (".nbi", ".nbc")
                      and p.name.split(".")[0] in KERNEL_MODULES]
    return sorted(found)
