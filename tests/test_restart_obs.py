"""Issue 26: observations by lon/lat/level on a restart with halo and time levels.

H of the Veros-like layout (tests/veros_like.py, grid file) must read the interior cells
at the state's time level: equal to a trilinear interpolation written here (scipy's
RegularGridInterpolator) on the interior field at level tau, never a halo cell or
another level.
"""

from __future__ import annotations

import numpy as np
from scipy.interpolate import RegularGridInterpolator
from seeds import draw_seed
from veros_like import grid_axes, write_grid_file, write_veros_like

from ensio.config.load import config_from_dict
from ensio.io.scan.members import layout_from_member
from ensio.obs import ObsBatch, StateGrid, build_operator


def test_h_reads_the_interior_at_the_state_level(tmp_path):
    rng = np.random.default_rng(draw_seed("restart obs"))
    nx, ny, nz, h = 9, 7, 4, 2
    tau = int(rng.integers(0, 3))
    land = np.zeros((nx, ny, nz), bool)
    written = write_veros_like(tmp_path / "m01.h5", nx=nx, ny=ny, nz=nz, halo=h, tau=tau,
                               land=land, seed=int(rng.integers(1 << 30)))
    write_grid_file(tmp_path / "grid.nc", nx=nx, ny=ny, nz=nz, land=land)
    ens = config_from_dict({"ensemble": {
        "members": str(tmp_path / "m{member:02d}.h5"), "size": 1,
        "dims": ["xt", "yt", "zt", "level"], "halo": {"xt": h, "yt": h}, "cyclic": ["xt"],
        "time_level": {"dim": "level", "from": "core/tau"}, "grid": str(tmp_path / "grid.nc"),
        "coordinates": {"lon": "xt", "lat": "yt", "level": "zt"},
        "variables": ["core/temp", "core/salt"]}}).ensemble
    layout = layout_from_member(ens, tmp_path / "m01.h5")
    temp = written["core/temp"][h:-h, h:-h, :, tau]
    salt = written["core/salt"][h:-h, h:-h, :, tau]
    X = np.concatenate([temp.ravel(), salt.ravel()])[None, :]  # C order, x slowest
    xt, yt, zt = grid_axes(nx, ny, nz)
    m = 200
    lon = rng.uniform(xt[0], xt[-1], m)
    lat = rng.uniform(yt[0], yt[-1], m)
    z = rng.uniform(zt.min(), zt.max(), m)
    var = rng.integers(0, 2, m)
    obs = ObsBatch(np.zeros(m), np.ones(m), lon, lat, variable=var, level=z)
    op, inside = build_operator(obs, layout.n_rows, StateGrid(layout))
    assert inside.all()
    want = np.where(var == 0, RegularGridInterpolator((xt, yt, zt), temp)((lon, lat, z)),
                    RegularGridInterpolator((xt, yt, zt), salt)((lon, lat, z)))
    np.testing.assert_allclose(op.apply(X)[0], want, rtol=1e-12, atol=1e-12)
    # surface observations (the top level by index): bilinear on the interior's top level
    top = np.full(m, nz - 1)
    obs = ObsBatch(np.zeros(m), np.ones(m), lon, lat, variable=np.zeros(m, int),
                   level_index=top)
    op, inside = build_operator(obs, layout.n_rows, StateGrid(layout))
    assert inside.all()
    want = RegularGridInterpolator((xt, yt), temp[:, :, -1])((lon, lat))
    np.testing.assert_allclose(op.apply(X)[0], want, rtol=1e-12, atol=1e-12)
