"""Members with missing values and packed variables, written the way models and NCO write them.

Clean physical fields are drawn here; NCO then turns them into what restart
files look like: ``ncpdq -P all_new`` packs ``ps`` to ``short`` (its own
scale/offset per member), ``ncap2`` packs ``ts`` with a fixed scale and a
``_FillValue``, ``ncatted`` sets ``missing_value`` on ``sst``, ``_FillValue =
NaN`` on ``q``, only ``add_offset`` on ``tk`` and ``valid_range`` on ``h``;
``nccopy`` chunks and deflates one member (the library path).

The expected values never come from ensio: the prior is read back with
netCDF4-python (its own unpacking and masking), the inactive points are where
any member reads as masked or NaN there, and the analysis reference is a
textbook ETKF (Hunt et al. 2007) in numpy on the active points.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np
import yaml

NLAT, NLON = 9, 12
LON = np.arange(NLON) * 30.0
LAT = np.linspace(-40.0, 40.0, NLAT)
#: State variables in config order; ``ps`` first (the bilinear grid is the first variable's).
NAMES = ("ps", "ts", "sst", "q", "tk", "h")
TOOLS = ("ncpdq", "ncap2", "ncatted", "ncks", "nccopy")


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: {proc.stderr.strip()}")


@dataclass
class Members:
    paths: list[Path]
    root: Path


def write_members(root: Path, rng: np.random.Generator, n: int = 6, fmt: str = "NETCDF4",
                  deflate: int | None = 2) -> Members:
    """N members under ``root`` (mem001.nc …); see the module docstring."""
    root.mkdir(parents=True, exist_ok=True)
    land = rng.random((NLAT, NLON)) < 0.15
    land[0, 0] = True
    paths = []
    for m in range(1, n + 1):
        base = root / f"base{m:03d}.nc"
        with netCDF4.Dataset(base, "w", format=fmt) as ds:
            ds.createDimension("lat", NLAT)
            ds.createDimension("lon", NLON)
            for name, vals in (("lat", LAT), ("lon", LON)):
                v = ds.createVariable(name, "f8", (name,))
                v[:] = vals
                v.units = "degrees_north" if name == "lat" else "degrees_east"
            ds.set_auto_maskandscale(False)
            _clean_fields(ds, rng, land, m)
        packed = root / f"pk{m:03d}.nc"
        _run("ncpdq", "-O", "-P", "all_new", "-v", "ps", base, packed)
        _run("ncks", "-A", "-x", "-v", "ps", base, packed)  # the other variables, unpacked
        _run("ncap2", "-O", "-s",
             "ts=short(rint((tsf-273.15f)/0.005f));where(tsf < 1.0f) ts=-32767s;"
             "ts@scale_factor=0.005f;ts@add_offset=273.15f;ts@_FillValue=-32767s",
             packed, packed)  # fmt: skip
        _run("ncks", "-O", "-x", "-v", "tsf", packed, packed)
        _run("ncatted", "-O", "-a", "_FillValue,ps,o,s,-32767", "-a", "missing_value,sst,o,f,-9e33",
             "-a", "_FillValue,q,o,f,NaN", "-a", "add_offset,tk,o,f,273.15",
             "-a", "valid_range,h,o,d,0.,100.", packed)  # fmt: skip
        out = root / f"mem{m:03d}.nc"
        if deflate is not None and m == deflate and fmt == "NETCDF4":
            _run("nccopy", "-d", "1", "-c", "lat/3,lon/4", packed, out)
        else:
            shutil.copyfile(packed, out)
        for p in (base, packed):
            p.unlink()
        paths.append(out)
    return Members(paths, root)


def _clean_fields(ds: netCDF4.Dataset, rng: np.random.Generator, land: np.ndarray, m: int) -> None:
    """Physical fields with their missing points as the model writes them (before NCO)."""
    shape = (NLAT, NLON)
    ps = ds.createVariable("ps", "f4", ("lat", "lon"), fill_value=np.float32(-32767.0))
    field = 1000.0 + 5.0 * rng.standard_normal(shape)
    if m == 3:
        field[2, 5] = -32767.0  # one member misses a point: ncpdq keeps it as the fill
    ps[:] = field.astype("f4")
    tsf = ds.createVariable("tsf", "f4", ("lat", "lon"))
    t = 288.0 + 2.0 * rng.standard_normal(shape)
    t[land] = 0.0  # ncap2's where() turns these into the fill value
    tsf[:] = t.astype("f4")
    sst = ds.createVariable("sst", "f4", ("lat", "lon"))
    s = 290.0 + rng.standard_normal(shape)
    s[land] = -9e33
    if m == 2:
        s[4, 7] = -9e33
    sst[:] = s.astype("f4")
    q = ds.createVariable("q", "f4", ("lat", "lon"))
    qq = 0.01 + 0.001 * rng.standard_normal(shape)
    if m == 5:
        qq[6, 2] = np.nan
    q[:] = qq.astype("f4")
    tk = ds.createVariable("tk", "f4", ("lat", "lon"))
    tk[:] = (2.0 * rng.standard_normal(shape)).astype("f4")  # stored as anomalies of 273.15
    h = ds.createVariable("h", "f8", ("lat", "lon"))
    hh = 99.6 + 0.1 * rng.standard_normal(shape)
    if m == 4:
        hh[1, 1] = -5.0  # outside valid_range: missing
    h[:] = hh


def read_physical(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """(X (N_e, N_x) physical, inactive (N_x,)) with netCDF4-python's own unpacking and masks."""
    rows, masks = [], []
    for p in paths:
        with netCDF4.Dataset(p) as ds:
            ds.set_auto_scale(False)  # its masks; unpacked here in float64 (CF: raw·scale + offset)
            parts = []
            for n in NAMES:
                v = ds[n]
                raw = np.ma.asarray(v[:]).astype(np.float64).reshape(-1)
                parts.append(raw * float(getattr(v, "scale_factor", 1.0))
                             + float(getattr(v, "add_offset", 0.0)))
        x = np.ma.concatenate(parts)
        rows.append(np.ma.filled(x, np.nan))
        masks.append(np.ma.getmaskarray(x) | ~np.isfinite(np.ma.filled(x, np.nan)))
    return np.array(rows), np.any(masks, axis=0)


def read_stored(path: Path) -> dict[str, np.ndarray]:
    """The stored (packed) values of the state variables, no masking or scaling."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return {n: np.asarray(ds[n][:]).reshape(-1).copy() for n in NAMES}


def encodings(path: Path) -> dict[str, tuple[float, float, np.dtype]]:
    """(scale, offset, stored dtype) of each state variable of one file."""
    out = {}
    with netCDF4.Dataset(path) as ds:
        for n in NAMES:
            v = ds[n]
            out[n] = (float(getattr(v, "scale_factor", 1.0)), float(getattr(v, "add_offset", 0.0)),
                      v.dtype)
    return out


def sizes() -> dict[str, tuple[int, int]]:
    """Row range of each variable in the state vector."""
    n = NLAT * NLON
    return {name: (i * n, (i + 1) * n) for i, name in enumerate(NAMES)}


@dataclass
class Obs:
    value: np.ndarray
    error: np.ndarray
    lon: np.ndarray
    lat: np.ndarray
    index: np.ndarray  # -1: bilinear
    H: np.ndarray  # (m, N_x) dense
    reads_inactive: np.ndarray


def make_obs(X: np.ndarray, inactive: np.ndarray, rng: np.random.Generator) -> Obs:
    """Index observations on every variable (some on inactive points) and bilinear ones on ps."""
    n_x = X.shape[1]
    rows: list[int] = []
    for lo, hi in sizes().values():
        bad = np.flatnonzero(inactive[lo:hi])
        good = np.flatnonzero(~inactive[lo:hi])
        rows += list(lo + rng.choice(good, 3, replace=False))
        if bad.size:
            rows.append(lo + int(bad[0]))
    H, lon, lat, index = [], [], [], []
    for r in rows:
        h = np.zeros(n_x)
        h[r] = 1.0
        H.append(h)
        index.append(r)
        lon.append(0.0)
        lat.append(0.0)
    # bilinear at cell centres of ps (every corner weighs 1/4), one next to a missing point
    cells = [(i, j) for i in range(NLAT - 1) for j in range(NLON - 1)]
    pick = [cells[k] for k in rng.choice(len(cells), 6, replace=False)]
    ps_bad = np.flatnonzero(inactive[: NLAT * NLON])
    if ps_bad.size:
        i, j = divmod(int(ps_bad[0]), NLON)
        pick.append((min(i, NLAT - 2), min(j, NLON - 2)))
    for i, j in pick:
        h = np.zeros(n_x)
        for a, b in ((i, j), (i + 1, j), (i, j + 1), (i + 1, j + 1)):
            h[a * NLON + b] = 0.25
        H.append(h)
        index.append(-1)
        lon.append((LON[j] + LON[j + 1]) / 2)
        lat.append((LAT[i] + LAT[i + 1]) / 2)
    Hm = np.array(H)
    reads = (Hm[:, inactive] != 0).any(axis=1)
    hx = np.where(reads[None, :], 0.0, np.nan_to_num(X) @ Hm.T)
    spread = hx.std(axis=0, ddof=1)
    err = np.maximum(0.5 * spread, 1e-4)
    value = hx.mean(axis=0) + err * rng.standard_normal(len(H))
    h_row = sizes()["h"][0]
    for k in np.flatnonzero(~reads & (Hm[:, h_row: h_row + NLAT * NLON] != 0).any(axis=1)):
        value[k], err[k] = 101.0, 0.05  # pulls h beyond valid_range: clipped on write
    return Obs(value, err, np.array(lon), np.array(lat), np.array(index), Hm, reads)


def write_obs(path: Path, obs: Obs) -> Path:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", len(obs.value))
        for name in ("lon", "lat", "value", "error"):
            ds.createVariable(name, "f8", ("obs",))[:] = getattr(obs, name)
        ds.createVariable("index", "i4", ("obs",))[:] = obs.index.astype("i4")
    return path


def etkf(X: np.ndarray, H: np.ndarray, y: np.ndarray, err: np.ndarray) -> np.ndarray:
    """Textbook ETKF with the symmetric square root (Hunt et al. 2007), member-major."""
    k = X.shape[0]
    xm = X.mean(axis=0)
    A = X - xm
    HX = X @ H.T
    HA = HX - HX.mean(axis=0)
    Rinv = 1.0 / err**2
    C = (HA * Rinv) @ HA.T
    evals, evecs = np.linalg.eigh((k - 1) * np.eye(k) + C)
    Pt = evecs @ np.diag(1.0 / evals) @ evecs.T
    W = evecs @ np.diag(np.sqrt((k - 1) / evals)) @ evecs.T
    w = Pt @ (HA * Rinv) @ (y - HX.mean(axis=0))
    return xm + (w[:, None] + W).T @ A


def config(root: Path, obs_file: Path, filt: str = "etkf", **io: object) -> Path:
    raw = {
        "ensemble": {
            "members": str(root / "mem{member:03d}.nc"),
            "size": len(list(root.glob("mem*.nc"))),
            "variables": list(NAMES),
            "coordinates": {"lon": "lon", "lat": "lat"},
        },
        "io": {"journal": True, **io},
        "observations": [{"file": obs_file.name}],
        "analysis": {"filter": filt},
    }
    if filt.startswith("l"):
        raw["analysis"]["localization"] = {"taper": "gaspari-cohn", "radius_km": 3000.0}
    path = root / "ensio.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def expected_clips(xa: np.ndarray, path: Path, active: np.ndarray) -> dict[str, int]:
    """Values of the reference analysis that do not fit the member's packed type / valid range."""
    enc = encodings(path)
    out = {}
    for name, (lo, hi) in sizes().items():
        x = xa[lo:hi][active[lo:hi]]
        scale, offset, dtype = enc[name]
        if name == "h":
            out[name] = int(((x < 0.0) | (x > 100.0)).sum())
        elif dtype.kind == "i":
            raw = np.rint((x - offset) / scale)
            info = np.iinfo(dtype)
            out[name] = int(((raw < info.min) | (raw > info.max) | (raw == -32767)).sum())
        else:
            out[name] = 0
    return out


def tolerance(path: Path) -> np.ndarray:
    """Per state row: the largest write error packing into ``path`` may cause (computed)."""
    enc = encodings(path)
    tol = np.empty(len(NAMES) * NLAT * NLON)
    for name, (lo, hi) in sizes().items():
        scale, offset, dtype = enc[name]
        if dtype.kind == "i":
            tol[lo:hi] = 0.5 * abs(scale) * (1 + 1e-6)
        elif dtype == np.float32:
            tol[lo:hi] = (abs(offset) + 400.0) * 2.0**-23
        else:
            tol[lo:hi] = 1e-9
    return tol


def check_analysis(paths: list[Path], prior_stored: list[dict], X: np.ndarray,
                   inactive: np.ndarray, obs, log: str) -> None:
    """Files and log of an ETKF analysis against the numpy reference (serial and MPI tests)."""
    act = ~inactive
    ok = ~obs.reads_inactive
    xa = np.array(X)
    xa[:, act] = etkf(X[:, act], obs.H[ok][:, act], obs.value[ok], obs.error[ok])
    after, _ = read_physical(paths)
    clips = dict.fromkeys(NAMES, 0)
    for m, path in enumerate(paths):
        stored = read_stored(path)
        for name, (lo, hi) in sizes().items():  # inactive points: every member's bytes stay
            bad = inactive[lo:hi]
            assert stored[name][bad].tobytes() == prior_stored[m][name][bad].tobytes(), name
        for name, n in expected_clips(xa[m], path, act).items():
            clips[name] += n
        tol = tolerance(path)
        lo_h, hi_h = sizes()["h"]
        want = xa[m].copy()
        want[lo_h:hi_h] = np.clip(want[lo_h:hi_h], 0.0, 100.0)
        fits = act.copy()
        for name, (lo, hi) in sizes().items():  # packed values beyond the type: clipped
            if name in ("ps", "ts"):
                with netCDF4.Dataset(path) as ds:
                    s, o = float(ds[name].scale_factor), float(ds[name].add_offset)
                raw = np.rint((xa[m, lo:hi] - o) / s)
                fits[lo:hi] &= (raw > -32768) & (raw < 32767) & (raw != -32767)
        err = np.abs(after[m] - want)[fits]
        assert np.all(err <= tol[fits]), (path, float(np.max(err / tol[fits])))
    total = int(inactive.sum())
    per = ", ".join(f"{n} {int(inactive[lo:hi].sum())}" for n, (lo, hi) in sizes().items()
                    if inactive[lo:hi].any())
    assert f"missing data: {total} inactive points (not analysed, bytes kept) ({per})" in log
    assert f"missing_state {int(obs.reads_inactive.sum())}" in log
    m = re.search(r"packing: (\d+) analysis values clipped \(([^)]*)\)", log)
    assert sum(clips.values()) > 0 and m is not None, log
    assert int(m.group(1)) == sum(clips.values()), (log, clips)


def poke_missing(case: Path) -> None:
    """NaN at a few points of member 2 of a synthetic case: those rows are inactive."""
    with netCDF4.Dataset(case / "mem002.nc", "a") as ds:
        v = ds["state"]
        flat = np.array(v[...]).reshape(-1, v.shape[-2], v.shape[-1])
        flat[:, 3, 2:6] = np.nan
        v[...] = flat.reshape(v.shape)
