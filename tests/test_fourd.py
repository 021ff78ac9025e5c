"""The 4-D analysis: precomputed HX in every filter, one slot = 3-D, an independent
4-D Kalman check on a linear model, and 4-D beating 3-D on a moving field."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest
from mpi4py import MPI
from reference_letkf import letkf

from ensio.analysis.api import analyse
from ensio.config.analysis import AnalysisSection
from ensio.config.load import from_plain, load_config
from ensio.models.moving import config_text, write_moving, write_state
from ensio.models.synthetic import grid
from ensio.obs import ObsBatch, RegularGrid
from ensio.offline import run_analysis

FILTERS = ["etkf", "estkf", "enkf", "letkf", "lestkf", "lenkf"]
#: (filter, kernel): the global filters and both local kernels.
CASES = [(f, "batched") for f in FILTERS] + [(f, "pointwise") for f in FILTERS if f[0] == "l"]


def _section(filt: str, kernel: str = "batched", radius_km: float = 4000.0) -> AnalysisSection:
    raw = {"filter": filt, "seed": 5}
    if filt.startswith("l"):
        raw.update(localization={"radius_km": radius_km}, kernel=kernel, tile_points=7)
    return from_plain(AnalysisSection, raw, "analysis")


def _members(path_of, data) -> None:
    ny, nx = data.shape[1:]
    for j, x in enumerate(data):
        write_state(path_of(j + 1), nx, ny, x)


def _read_members(pattern, k) -> np.ndarray:
    out = []
    for j in range(1, k + 1):
        with netCDF4.Dataset(pattern.format(member=j)) as ds:
            out.append(np.asarray(ds["state"][:], dtype=float).ravel())
    return np.array(out)


# ---------------------------------------------------------------- in memory


class _Case:
    """A small lon/lat problem: k members, index observations, a linear slot model."""

    def __init__(self, rng, nx=16, ny=8, k=8, m=30, slots=3):
        self.nx, self.ny, self.k, self.slots = nx, ny, k, slots
        lon, lat = grid(nx, ny)
        self.grid = RegularGrid(lon, lat)
        n = nx * ny
        base = np.sin(np.radians(self.grid.coords()[:, 0]))[None, :] * 2.0
        self.X = base + rng.normal(size=(k, n)) @ np.diag(rng.uniform(0.5, 1.5, n))
        self.index = np.sort(rng.choice(n, size=m, replace=False))
        self.slot = rng.integers(0, slots, size=m)
        self.values = rng.normal(size=m)
        self.errors = rng.uniform(0.5, 1.0, size=m)
        lonlat = self.grid.coords()[self.index]
        self.obs = ObsBatch(self.values, self.errors, lonlat[:, 0], lonlat[:, 1], index=self.index)

    def model(self, s: int) -> np.ndarray:
        """M_s (n × n): advection by s columns eastward, damped by 0.8^s (linear, known)."""
        n = self.nx * self.ny
        rows = np.arange(n)
        src = (rows // self.nx) * self.nx + (rows % self.nx - s) % self.nx
        M = np.zeros((n, n))
        M[rows, src] = 0.8**s
        return M

    def H4(self) -> np.ndarray:
        """H̃ (m × n): row i is H_i M_{s_i}, the observation of the analysis-time state."""
        m, n = self.index.size, self.nx * self.ny
        H = np.zeros((m, n))
        H[np.arange(m), self.index] = 1.0
        return np.stack([H[i] @ self.model(self.slot[i]) for i in range(m)])

    def slot_hx(self) -> np.ndarray:
        """HX from each member's state at each observation's slot, as the StoO forms it."""
        states = [self.X @ self.model(s).T for s in range(self.slots)]
        return np.stack([states[s][:, i] for i, s in zip(self.index, self.slot, strict=True)],
                        axis=1)


@pytest.mark.parametrize(("filt", "kernel"), CASES)
def test_every_filter_takes_precomputed_hx(rng, filt, kernel):
    """HX handed in equals H applied by the pipeline (3-D)."""
    c = _Case(rng)
    cfg = _section(filt, kernel)
    ref = analyse(c.X, c.obs, cfg, grid=c.grid)
    got = analyse(c.X, c.obs, cfg, grid=c.grid, hx=c.X[:, c.index])
    np.testing.assert_allclose(got.ensemble, ref.ensemble, rtol=1e-12, atol=1e-12)
    assert got.qc == ref.qc


def _kalman(X: np.ndarray, H: np.ndarray, y: np.ndarray, sigma: np.ndarray):
    """Mean and covariance of the exact Kalman update with the ensemble covariance."""
    xbar = X.mean(axis=0)
    P = np.cov(X.T, ddof=1)
    S = H @ P @ H.T + np.diag(sigma**2)
    K = np.linalg.solve(S, H @ P).T
    return xbar + K @ (y - H @ xbar), P - K @ H @ P


@pytest.mark.parametrize("filt", ["etkf", "estkf", "enkf"])
def test_global_4d_update_is_the_kalman_update_of_the_linear_model(rng, filt):
    """4-D ETKF/ESTKF = Kalman filter at the analysis time with H̃ = H M_s (Hunt et al. 2004).

    Mean and covariance for the square-root filters; the mean for the EnKF,
    whose centred perturbations make its mean the Kalman mean.
    """
    c = _Case(rng)
    res = analyse(c.X, c.obs, _section(filt), grid=c.grid, hx=c.slot_hx())
    mean, cov = _kalman(c.X, c.H4(), c.values, c.errors)
    np.testing.assert_allclose(res.ensemble.mean(axis=0), mean, rtol=1e-9, atol=1e-10)
    if filt != "enkf":
        np.testing.assert_allclose(np.cov(res.ensemble.T, ddof=1), cov, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize(("filt", "kernel"), [(f, k) for f, k in CASES if f in ("letkf",
                                                                             "lestkf")])
def test_local_4d_update_is_the_reference_letkf_with_the_slot_operator(rng, filt, kernel):
    """The 4-D LETKF weights by hand: tests/reference_letkf.py with H̃ (its HX = X H̃ᵀ)."""
    c = _Case(rng)
    radius = 4000.0
    res = analyse(c.X, c.obs, _section(filt, kernel, radius), grid=c.grid, hx=c.slot_hx())
    rows = c.grid.coords()
    ref = letkf(c.X, rows, np.ones(rows.shape[0], bool), c.H4(), c.values, c.errors,
                rows[c.index], radius)
    np.testing.assert_allclose(res.ensemble.mean(axis=0), ref.mean(axis=0), rtol=1e-9,
                               atol=1e-10)
    for i in range(0, rows.shape[0], 11):  # the local covariance, a few rows
        np.testing.assert_allclose(np.var(res.ensemble[:, i]), np.var(ref[:, i]), rtol=1e-9)


# ---------------------------------------------------------------- through files (StoO)


def _run(directory, text, comm=MPI.COMM_SELF):
    (directory / "run.yaml").write_text(text)
    return run_analysis(load_config(directory / "run.yaml"), comm)


@pytest.mark.parametrize(("filt", "kernel"), CASES)
def test_one_slot_equals_the_3d_analysis(tmp_path, filt, kernel):
    case = write_moving(tmp_path, nx=24, ny=12, members=6, slots=1, n_obs=60, speed=0.2)
    extra = ["  seed: 5\n", f"  kernel: {kernel}\n"]
    three = config_text(case, False, out="an3").replace("  filter: letkf\n", f"  filter: {filt}\n")
    if not filt.startswith("l"):
        three = "".join(line for line in three.splitlines(True) if "localization" not in line)
    four = three.replace("  filter:", "  time_slots: 1\n  filter:").replace("an3/", "an4/")
    for text in (three, four):
        _run(tmp_path, text.replace("analysis:\n", "analysis:\n" + "".join(extra)))
    a3 = _read_members(str(tmp_path / "an3/mem{member:03d}.nc"), 6)
    a4 = _read_members(str(tmp_path / "an4/mem{member:03d}.nc"), 6)
    prior = _read_members(str(tmp_path / "mem{member:03d}.nc"), 6)
    assert np.abs(a3 - prior).max() > 1e-3  # the analysis did something
    np.testing.assert_allclose(a4, a3, rtol=1e-12, atol=1e-12)


def test_stoo_through_files_is_the_kalman_update(tmp_path, rng):
    """Slot files from the linear model, observations with times: offline ETKF = Kalman with H̃."""
    c = _Case(rng, nx=12, ny=6, k=6, m=25, slots=3)
    _members(lambda j: tmp_path / f"mem{j:03d}.nc", c.X.reshape(c.k, c.ny, c.nx))
    (tmp_path / "fc").mkdir()
    for s in range(c.slots):
        Xs = c.X @ c.model(s).T
        _members(lambda j, s=s: tmp_path / "fc" / f"m{j}_{s + 1}.nc", Xs.reshape(c.k, c.ny, c.nx))
    t = -3.0 + 2.0 * c.slot + rng.uniform(0.0, 2.0, size=c.slot.size)  # edges -3, -1, 1, 3
    with netCDF4.Dataset(tmp_path / "obs.nc", "w") as ds:
        ds.createDimension("obs", c.index.size)
        for name, v in (("lon", c.obs.lon), ("lat", c.obs.lat), ("index", c.index),
                        ("value", c.values), ("error", c.errors), ("time", t)):
            ds.createVariable(name, "i8" if name == "index" else "f8", ("obs",))[:] = v
    text = (
        f'ensemble: {{members: "mem{{member:03d}}.nc", size: {c.k}, variables: [state],\n'
        '           slots: "fc/m{member}_{slot}.nc"}\n'
        "io: {in_place: false}\nobservations: [obs.nc]\n"
        "analysis: {filter: etkf, time_slots: 3, window: [-3, 3]}\n"
        'output: {members: "an/mem{member:03d}.nc"}\n'
    )
    rep = _run(tmp_path, text)
    assert rep.result.qc.accepted == c.index.size
    Xa = _read_members(str(tmp_path / "an/mem{member:03d}.nc"), c.k)
    mean, cov = _kalman(c.X, c.H4(), c.values, c.errors)
    np.testing.assert_allclose(Xa.mean(axis=0), mean, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(np.cov(Xa.T, ddof=1), cov, rtol=1e-9, atol=1e-10)


def _rmse(path, truth) -> float:
    with netCDF4.Dataset(path) as ds:
        return float(np.sqrt(np.mean((np.asarray(ds["state"][:]) - truth) ** 2)))


def test_4d_beats_3d_on_a_moving_field(tmp_path):
    """Observations spread over ±3 h of a field moving ~18° of longitude per hour."""
    case = write_moving(tmp_path, speed=0.2)
    with netCDF4.Dataset(tmp_path / "truth.nc") as ds:
        truth = np.asarray(ds["state"][:])
    prior = _read_members(str(tmp_path / "mem{member:03d}.nc"), case.members).mean(axis=0)
    rmse = {"prior": float(np.sqrt(np.mean((prior - truth.ravel()) ** 2)))}
    for name, four in (("3d", False), ("4d", True)):
        _run(tmp_path, config_text(case, four, out=f"an{name}"))
        rmse[name] = _rmse(tmp_path / f"an{name}/mean.nc", truth)
    print("moving field, analysis-mean RMSE:", {k: round(v, 5) for k, v in rmse.items()})
    assert rmse["4d"] < rmse["3d"]
    assert rmse["4d"] < rmse["prior"]  # 3-D, misplacing the observations, may even hurt


def test_4d_equals_3d_on_a_field_at_rest(tmp_path):
    """With speed 0 every slot state is the member itself: 4-D and 3-D agree to rounding."""
    case = write_moving(tmp_path, nx=36, ny=18, members=8, n_obs=100, speed=0.0)
    for name, four in (("3d", False), ("4d", True)):
        _run(tmp_path, config_text(case, four, out=f"an{name}"))
    a3 = _read_members(str(tmp_path / "an3d/mem{member:03d}.nc"), 8)
    a4 = _read_members(str(tmp_path / "an4d/mem{member:03d}.nc"), 8)
    np.testing.assert_allclose(a4, a3, rtol=1e-12, atol=1e-12)
