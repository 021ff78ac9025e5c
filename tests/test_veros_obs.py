"""Lon/lat/level observations of a Veros restart: H reads the interior point at the state's level.

The OSSE's observation files (``ensio example veros``) give lon, lat and level (zt) of T
points, as a user would; ensio must find the interior element [i + halo, j + halo, k, tau]
of the stored (x + 4, y + 4, z, 3) array. Checked through ``ensio analyse`` on Veros-like
members (tests/veros_like.py): every observation is accepted, and the prior mean of H(x)
in the diagnostics file (value − O−B) equals the mean over the members of the stored
element, read with h5py at an index computed here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import yaml
from seeds import draw_seed
from veros_like import grid_axes, write_grid_file, write_veros_like

NX, NY, NZ, HALO, TAU = 12, 10, 5, 2, 2


def _obs_file(path: Path, variable: str, lon, lat, level) -> None:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", len(lon))
        for name, v in (("lon", lon), ("lat", lat), ("level", level),
                        ("value", np.full(len(lon), 1.0)), ("error", np.full(len(lon), 1.0))):
            ds.createVariable(name, "f8", ("obs",))[:] = v
        ds.variable = variable


def test_lonlat_level_observations_read_interior_at_tau(tmp_path: Path) -> None:
    seed = draw_seed("veros obs")
    rng = np.random.default_rng(seed)
    land = np.zeros((NX, NY, NZ), bool)
    land[:2, NY // 2:] = True  # acc's land strip
    members = []
    for m in range(1, 4):
        p = tmp_path / f"mem{m:03d}.h5"
        write_veros_like(p, nx=NX, ny=NY, nz=NZ, halo=HALO, tau=TAU, seed=seed + m, land=land)
        members.append(p)
    write_grid_file(tmp_path / "grid.nc", nx=NX, ny=NY, nz=NZ, land=land)
    xt, yt, zt = grid_axes(NX, NY, NZ)
    ocean = np.argwhere(~land)
    ocean = ocean[(ocean[:, 0] < NX - 1) & (ocean[:, 1] < NY - 1)]
    pick = ocean[rng.choice(len(ocean), size=6, replace=False)]
    i, j, k = pick.T
    _obs_file(tmp_path / "obs.nc", "core/temp", xt[i], yt[j], zt[k])
    config = {
        "ensemble": {"members": str(tmp_path / "mem{member:03d}.h5"), "size": 3,
                     "dims": ["xt", "yt", "zt", "level"], "halo": {"xt": HALO, "yt": HALO},
                     "cyclic": ["xt"], "time_level": {"dim": "level", "from": "core/tau"},
                     "grid": "grid.nc", "coordinates": {"lon": "xt", "lat": "yt", "level": "zt"},
                     "variables": [{"name": "core/temp", "mask": "maskT"}]},
        "observations": [str(tmp_path / "obs.nc")],
        "analysis": {"filter": "letkf", "localization": {"radius_km": 2000}},
        "io": {"in_place": False},
        "output": {"members": str(tmp_path / "an" / "mem{member:03d}.h5"),
                   "diagnostics": str(tmp_path / "diag.nc")},
    }
    (tmp_path / "an").mkdir()
    cfg = tmp_path / "ensio.yaml"
    cfg.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "ensio", "analyse", str(cfg)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "6 read, 6 accepted, 0 rejected" in proc.stdout, proc.stdout
    import h5py

    stored = []
    for p in members:
        with h5py.File(p, "r") as f:
            stored.append(f["core/temp"][...][i + HALO, j + HALO, k, TAU])
    expected = np.mean(stored, axis=0)
    with netCDF4.Dataset(tmp_path / "diag.nc") as ds:
        hxb = np.asarray(ds["value"][:]) - np.asarray(ds["omb"][:])
    np.testing.assert_allclose(hxb, expected, rtol=0, atol=1e-12)
