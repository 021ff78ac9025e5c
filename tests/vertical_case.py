"""A 3-D ocean for the vertical-localization tests, and its independent reference LETKF.

Members (netCDF4 written here): ``temp(depth, lat, lon)`` on 8 depths in
metres and ``ssh(lat, lon)``. Observations, four files:

* ``profiles.nc``: temp at several depths of a few random columns
  (per-observation ``level`` between model depths: linear interpolation);
* ``sst.nc``: temp at ``level_index: 0`` (the config entry says so): its
  level is the first depth;
* ``ssh.nc``: the 2-D ``ssh``: no level, vertical weight 1;
* ``direct.nc``: temp rows observed by ``index``: the level of that row.

The reference (:func:`reference_letkf`) shares no code with ensio: H from
``reference_letkf.bilinear``/``level_weights``, great-circle distances and
Gaspari–Cohn from ``reference_letkf``, the vertical tapers written here from
their definitions (README "Localization"), and the LETKF of Hunt et al.
(2007) point by point: every row its own analysis with weights
``taper_h(d_h) · taper_v(|z_row − z_obs|)`` (1 vertically when either has no
level).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np
from reference_letkf import bilinear, gaspari_cohn, great_circle_km, level_weights

LON = np.arange(-40.0, 40.01, 5.0)
LAT = np.arange(-30.0, 30.01, 5.0)
DEPTH = np.array([5.0, 15.0, 30.0, 60.0, 100.0, 200.0, 400.0, 800.0])
RADIUS_KM = 1800.0
GC_HALF = 5.0 / 24.0


@dataclass
class ObsSet:
    lon: np.ndarray
    lat: np.ndarray
    value: np.ndarray
    error: np.ndarray
    var: str  # "temp" or "ssh"
    level: np.ndarray  # model-depth value, NaN: none (ssh)
    H: np.ndarray  # (m, n) dense


@dataclass
class Case:
    root: Path
    k: int
    X: np.ndarray  # (k, n) prior state matrix: temp then ssh, C order
    obs: list[ObsSet]
    files: list[dict]  # config entries

    @property
    def n(self) -> int:
        return self.X.shape[1]

    def row_lonlat_level(self) -> tuple[np.ndarray, np.ndarray]:
        L, B = np.meshgrid(LON, LAT)
        nt = DEPTH.size * L.size
        ll = np.concatenate([np.tile(np.stack([L.ravel(), B.ravel()], 1), (DEPTH.size, 1)),
                             np.stack([L.ravel(), B.ravel()], 1)])  # fmt: skip
        lev = np.concatenate([np.repeat(DEPTH, L.size), np.full(L.size, np.nan)])
        assert ll.shape[0] == lev.size == nt + L.size
        return ll, lev

    def config(self, vertical: dict | None, taper: str = "gaspari-cohn", **analysis) -> dict:
        loc = {"radius_km": RADIUS_KM, "taper": taper}
        if vertical is not None:
            loc["vertical"] = vertical
        return {
            "ensemble": {"members": str(self.root / "mem{member:03d}.nc"), "size": self.k,
                         "variables": ["temp", "ssh"],
                         "coordinates": {"lon": "lon", "lat": "lat", "level": "depth"}},
            "observations": self.files,
            "analysis": {"filter": "letkf", "localization": loc, **analysis},
            "io": {"journal": True},
            # the config has no file: keep the diag file out of the working directory
            "output": {"diagnostics": str(self.root / "diag_{cycle:03d}.nc")},
        }  # fmt: skip

    def read_state(self) -> np.ndarray:
        rows = []
        for m in range(1, self.k + 1):
            with netCDF4.Dataset(self.root / f"mem{m:03d}.nc") as ds:
                rows.append(np.concatenate([np.asarray(ds["temp"][:], float).ravel(),
                                            np.asarray(ds["ssh"][:], float).ravel()]))  # fmt: skip
        return np.stack(rows)


def write_obs(path: Path, cols: dict[str, np.ndarray], var: str) -> None:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", len(cols["value"]))
        for name, v in cols.items():
            kind = "i4" if name == "index" else "f8"
            x = ds.createVariable(name, kind, ("obs",))
            x[:] = v
        ds.setncattr("variable", var)


def _h_row(n: int, lon: float, lat: float, var: str, level: float) -> np.ndarray:
    nh = LON.size * LAT.size
    flat, w = bilinear(LON, LAT, lon, lat)
    h = np.zeros(n)
    if var == "ssh":
        np.add.at(h, DEPTH.size * nh + flat, w)
        return h
    for kk, wk in level_weights(DEPTH, level):
        np.add.at(h, kk * nh + flat, w * wk)
    return h


def make_case(root: Path, rng: np.random.Generator, k: int = 8) -> Case:
    """Members and observation files under ``root`` (fresh random values from ``rng``)."""
    root.mkdir(parents=True, exist_ok=True)
    shape3 = (DEPTH.size, LAT.size, LON.size)
    # smooth-ish fields: a mean profile, member perturbations correlated in the vertical
    base = 20.0 * np.exp(-DEPTH / 300.0)[:, None, None] + rng.standard_normal(shape3) * 0.2
    X = []
    for m in range(1, k + 1):
        pert = np.cumsum(rng.standard_normal(shape3), axis=0) * 0.3
        temp = base + pert
        ssh = 0.1 * rng.standard_normal(shape3[1:]) + 0.05 * pert[0]
        with netCDF4.Dataset(root / f"mem{m:03d}.nc", "w") as ds:
            for d, v in (("depth", DEPTH), ("lat", LAT), ("lon", LON)):
                ds.createDimension(d, v.size)
                c = ds.createVariable(d, "f8", (d,))
                c[:] = v
            ds["depth"].units, ds["depth"].positive = "m", "down"
            ds["lat"].units, ds["lon"].units = "degrees_north", "degrees_east"
            t = ds.createVariable("temp", "f8", ("depth", "lat", "lon"))
            t[:] = temp
            s = ds.createVariable("ssh", "f8", ("lat", "lon"))
            s[:] = ssh
        X.append(np.concatenate([temp.ravel(), ssh.ravel()]))
    Xm = np.stack(X)
    n = Xm.shape[1]
    xbar = Xm.mean(0)

    def inner(m):
        return rng.uniform(LON[0] + 1, LON[-1] - 1, m), rng.uniform(LAT[0] + 1, LAT[-1] - 1, m)

    sets, files = [], []
    # profiles: 6 columns × 5 depths
    plon, plat = inner(6)
    lon, lat = np.repeat(plon, 5), np.repeat(plat, 5)
    lev = rng.uniform(DEPTH[0], DEPTH[-1], lon.size)
    sets.append(("profiles", "temp", lon, lat, lev, {"level": lev}, {}))
    lon, lat = inner(12)
    sets.append(("sst", "temp", lon, lat, np.full(12, DEPTH[0]), {}, {"level_index": 0}))
    lon, lat = inner(10)
    sets.append(("ssh", "ssh", lon, lat, np.full(10, np.nan), {}, {}))
    out = []
    for name, var, lon, lat, lev, extra, entry in sets:
        H = np.stack([_h_row(n, a, b, var, z) for a, b, z in zip(lon, lat, lev, strict=True)])
        err = rng.uniform(0.3, 0.8, lon.size)
        value = H @ xbar + rng.standard_normal(lon.size) * 1.5
        path = root / f"{name}.nc"
        write_obs(path, {"lon": lon, "lat": lat, "value": value, "error": err, **extra}, var)
        files.append({"file": str(path), **entry})
        out.append(ObsSet(lon, lat, value, err, var, lev, H))
    # direct rows of temp (index): the row's own level and lon/lat
    nh = LON.size * LAT.size
    idx = rng.choice(DEPTH.size * nh, 8, replace=False)
    kk, jj, ii = np.unravel_index(idx, shape3)
    lon, lat, lev = LON[ii], LAT[jj], DEPTH[kk]
    H = np.zeros((8, n))
    H[np.arange(8), idx] = 1.0
    err = rng.uniform(0.3, 0.8, 8)
    value = H @ xbar + rng.standard_normal(8)
    path = root / "direct.nc"
    write_obs(path, {"lon": lon, "lat": lat, "value": value, "error": err, "index": idx}, "temp")
    files.append({"file": str(path)})
    out.append(ObsSet(lon, lat, value, err, "temp", lev, H))
    return Case(root, k, Xm, out, files)


# ----------------------------------------------------------------- the reference


def vertical_taper(name: str, d: np.ndarray, radius: float) -> np.ndarray:
    """The tapers from their definitions: support ``radius``, equal to GC at half of it."""
    d = np.asarray(d, float)
    inside = d < radius
    if name == "gaspari-cohn":
        return gaspari_cohn(d, radius / 2.0)
    if name == "gaussian":
        L = radius / (2.0 * np.sqrt(2.0 * np.log(1.0 / GC_HALF)))
        return np.where(inside, np.exp(-(d**2) / (2 * L**2)), 0.0)
    if name == "exponential":
        L = radius / (2.0 * np.log(1.0 / GC_HALF))
        return np.where(inside, np.exp(-d / L), 0.0)
    if name == "step":
        return inside.astype(float)
    raise ValueError(name)


def reference_letkf(
    case: Case, vertical: dict | None, forget: float = 1.0, taper: str = "gaspari-cohn"
) -> np.ndarray:
    """Point-by-point LETKF (Hunt et al. 2007) of every row, R-localized in 3-D.

    ``taper``: the horizontal one; ``vertical``: ``{radius, taper}`` or None.
    """
    H, y, sig = stacked(case)
    return letkf_rows(case.X, H, y, sig, weights(case, vertical, taper), forget)


def stacked(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """H (m, n), y, σ_o of all observations in file order (their global ids)."""
    H = np.concatenate([o.H for o in case.obs])
    y = np.concatenate([o.value for o in case.obs])
    sig = np.concatenate([o.error for o in case.obs])
    return H, y, sig


def weights(case: Case, vertical: dict | None, taper: str = "gaspari-cohn") -> np.ndarray:
    """Localization weights (n, m): horizontal taper × vertical taper (1 without a level)."""
    olon = np.concatenate([o.lon for o in case.obs])
    olat = np.concatenate([o.lat for o in case.obs])
    olev = np.concatenate([o.level for o in case.obs])
    row_ll, row_lev = case.row_lonlat_level()
    dist = great_circle_km(row_ll[:, None, 0], row_ll[:, None, 1], olon[None, :], olat[None, :])
    w = vertical_taper(taper, dist, RADIUS_KM)
    if vertical is not None:
        dz = np.abs(row_lev[:, None] - olev[None, :])
        wv = vertical_taper(vertical.get("taper", "gaspari-cohn"), dz, vertical["radius"])
        wv[np.isnan(dz)] = 1.0  # a row or an observation without a level
        w = w * wv
    return w


def kalman_gain_rows(
    X: np.ndarray, H: np.ndarray, y: np.ndarray, sig: np.ndarray, w: np.ndarray,
    eps: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """The local perturbed-observation EnKF (Burgers et al. 1998), row by row.

    ``x_j^a = x_j + K_i (y + ε_j − H x_j)`` with ``K_i = P_xy (P_yy + R_i)⁻¹``,
    ``R_i = diag(σ_o² / w[i])`` over the observations of non-zero weight.
    """
    k = X.shape[0]
    hx = X @ H.T
    Yp = hx - hx.mean(0)
    out = X.copy()
    for i in range(X.shape[1]):
        sel = w[i] > 0
        if not sel.any():
            continue
        xp = X[:, i] - X[:, i].mean()
        Pxy = xp @ Yp[:, sel] / (k - 1)
        Pyy = Yp[:, sel].T @ Yp[:, sel] / (k - 1)
        K = np.linalg.solve(Pyy + np.diag(sig[sel] ** 2 / w[i, sel]), Pxy)
        out[:, i] = X[:, i] + (y[sel][None, :] + eps[:, sel] - hx[:, sel]) @ K
    return out


def letkf_rows(
    X: np.ndarray, H: np.ndarray, y: np.ndarray, sig: np.ndarray, w: np.ndarray,
    forget: float = 1.0,
) -> np.ndarray:  # fmt: skip
    """Hunt et al. (2007) for every row i with localization weights ``w[i]`` (n, m)."""
    k = X.shape[0]
    HX = X @ H.T
    ybar = HX.mean(0)
    Yb = (HX - ybar).T  # (m, k)
    d = y - ybar
    out = X.copy()
    for i in range(X.shape[1]):
        sel = w[i] > 0
        if not sel.any():
            xb = X[:, i].mean()
            out[:, i] = xb + (X[:, i] - xb) / np.sqrt(forget)
            continue
        rinv = w[i, sel] / sig[sel] ** 2
        Ys = Yb[sel]
        A = (k - 1) * forget * np.eye(k) + Ys.T @ (rinv[:, None] * Ys)
        evals, evecs = np.linalg.eigh(A)
        Pa = (evecs / evals) @ evecs.T
        W = (evecs * np.sqrt((k - 1) / evals)) @ evecs.T
        wbar = Pa @ (Ys.T @ (rinv * d[sel]))
        xb = X[:, i].mean()
        out[:, i] = xb + (X[:, i] - xb) @ (wbar[:, None] + W)
    return out


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
