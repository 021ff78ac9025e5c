"""``ensio analyse`` on Veros-like restarts with every write-back companion (issue 26).

Plain HDF5 members as Veros writes them (tests/veros_like.py), a grid file, a cyclic x
halo, ``time_level.increment: all`` and an ``also`` variable (``core/dtemp`` receives
``core/temp``'s increment). After the analysis, checked with numpy periodic indexing
written here: the state level's x halo is an exact copy of the opposite interior
column, every other level (interior and x halo) holds old + (analysis − prior) of its
column, the ``also`` variable likewise at every level, and every other stored element
(land, y halo, other variables) is byte-identical. The same through the chunked + gzip
library path and the contiguous byte-range path, and under ``mpiexec -n 2`` with
io.tasks 2 (byte-identical files).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from netCDF4 import Dataset
from seeds import draw_seed
from veros_like import grid_axes, write_grid_file, write_veros_like

ENSIO = [sys.executable, "-m", "ensio"]
MPIEXEC = Path(sys.executable).with_name("mpiexec")
NX, NY, NZ, H, K = 8, 6, 3, 2, 4


def _read(paths, name):
    out = []
    for p in paths:
        with h5py.File(p, "r") as f:
            out.append(f[name][...])
    return np.stack(out)


def _case(root: Path, rng: np.random.Generator, chunks) -> tuple[list[Path], np.ndarray, int]:
    tau = int(rng.integers(0, 3))
    land = rng.random((NX, NY, NZ)) < 0.2
    paths = [root / f"acc_{m:02d}.h5" for m in range(1, K + 1)]
    for p in paths:
        write_veros_like(p, nx=NX, ny=NY, nz=NZ, halo=H, tau=tau, land=land, chunks=chunks,
                         seed=int(rng.integers(1 << 30)))
    write_grid_file(root / "grid.nc", nx=NX, ny=NY, nz=NZ, land=land)
    xt, yt, _ = grid_axes(NX, NY, NZ)
    i, j, _ = np.nonzero(~land)
    temp = _read(paths, "core/temp")[:, H:-H, H:-H, :, tau][:, ~land]
    n, m = temp.shape[1], 15
    rows = rng.choice(n, m, replace=False)
    with Dataset(root / "obs.nc", "w") as ds:
        ds.createDimension("obs", m)
        for name, v in (("lon", xt[i][rows]), ("lat", yt[j][rows]),
                        ("value", temp[:, rows].mean(axis=0) + rng.normal(0.0, 1.0, m)),
                        ("error", rng.uniform(0.5, 1.0, m))):
            ds.createVariable(name, "f8", ("obs",))[:] = v
        ds.createVariable("index", "i8", ("obs",))[:] = rows
    config = {
        "ensemble": {
            "members": "acc_{member:02d}.h5", "size": K, "dims": ["xt", "yt", "zt", "level"],
            "halo": {"xt": H, "yt": H}, "cyclic": ["xt"], "grid": "grid.nc",
            "time_level": {"dim": "level", "from": "core/tau", "increment": "all"},
            "coordinates": {"lon": "xt", "lat": "yt", "level": "zt"},
            "variables": [{"name": "core/temp", "mask": "maskT", "also": ["core/dtemp"]}],
        },
        "observations": [{"file": "obs.nc", "variable": "core/temp"}],
        "analysis": {"filter": "letkf", "localization": {"radius_km": 1500.0}},
    }
    (root / "ensio.yaml").write_text(yaml.safe_dump(config))
    return paths, land, tau


def _everything(paths):
    names = []
    with h5py.File(paths[0], "r") as f:
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return {n: _read(paths, n) for n in names}


@pytest.mark.parametrize("chunks", [None, "contiguous"], ids=["gzip-library", "byte-range"])
def test_analyse_writes_halo_levels_and_also(tmp_path, chunks):
    rng = np.random.default_rng(draw_seed(f"companions analyse {chunks}"))
    paths, land, tau = _case(tmp_path, rng, chunks)
    before = _everything(paths)
    r = subprocess.run([*ENSIO, "analyse", str(tmp_path / "ensio.yaml")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    after = _everything(paths)
    ocean = ~land
    src = H + (np.arange(NX + 2 * H) - H) % NX  # stored x -> interior source column
    P, A = before["core/temp"], after["core/temp"]
    inner = (slice(None), slice(H, -H), slice(H, -H), slice(None), tau)
    inc = np.where(ocean, A[inner] - P[inner], 0.0)  # (K, NX, NY, NZ)
    assert np.abs(inc).max() > 0
    wrapped = inc[:, src - H]  # (K, NX + 2H, NY, NZ): the increment of each stored column
    wet = ocean[src - H]
    expect = P.copy()
    expect[inner] = np.where(ocean, A[inner], P[inner])
    # the state level: x halo of interior y = exact copy of the opposite interior column
    state = expect[:, :, H:-H, :, tau]
    halo_x = np.r_[0:H, NX + H:NX + 2 * H]
    fill = state[:, src][:, halo_x]
    state[:, halo_x] = np.where(wet[halo_x], fill, state[:, halo_x])
    expect[:, :, H:-H, :, tau] = state
    exact = np.ones(P.shape, dtype=bool)
    for lv in range(3):
        if lv == tau:
            continue
        layer = expect[:, :, H:-H, :, lv]
        expect[:, :, H:-H, :, lv] = np.where(wet, layer + wrapped, layer)
        exact[:, :, H:-H, :, lv] = ~wet
    np.testing.assert_array_equal(A[exact].view(np.uint64), expect[exact].view(np.uint64))
    np.testing.assert_allclose(A, expect, rtol=1e-12, atol=1e-12)
    D, DA = before["core/dtemp"], after["core/dtemp"]
    want_d = D.copy()
    for lv in range(3):
        layer = want_d[:, :, H:-H, :, lv]
        want_d[:, :, H:-H, :, lv] = np.where(wet, layer + wrapped, layer)
    untouched = np.ones(D.shape, dtype=bool)
    untouched[:, :, H:-H] = ~wet[None, :, :, :, None]
    np.testing.assert_array_equal(DA[untouched].view(np.uint64), D[untouched].view(np.uint64))
    np.testing.assert_allclose(DA, want_d, rtol=1e-12, atol=1e-12)
    for name, values in before.items():
        if name not in ("core/temp", "core/dtemp"):
            assert np.array_equal(after[name].view(np.uint8), values.view(np.uint8)), name


@pytest.mark.parametrize("chunks", [None, "contiguous"], ids=["gzip-library", "byte-range"])
def test_analyse_same_files_for_mpiexec_2_and_io_tasks(tmp_path, chunks):
    if not MPIEXEC.exists():
        pytest.fail(f"{MPIEXEC} missing (the mpich wheel)")
    rng = np.random.default_rng(draw_seed(f"companions mpiexec {chunks}"))
    base = tmp_path / "base"
    base.mkdir()
    paths, _, _ = _case(base, rng, chunks)
    runs = {
        "serial": [*ENSIO, "analyse"],
        "mpi2-tasks1": [str(MPIEXEC), "-n", "2", *ENSIO, "analyse", "--set", "io.tasks=1"],
        "mpi2-tasks2": [str(MPIEXEC), "-n", "2", *ENSIO, "analyse", "--set", "io.tasks=2"],
    }
    digests = {}
    for label, cmd in runs.items():
        d = tmp_path / label
        shutil.copytree(base, d)
        cmd = [*cmd[:cmd.index("analyse") + 1], str(d / "ensio.yaml"),
               *cmd[cmd.index("analyse") + 1:]]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (label, r.stderr)
        digests[label] = [(d / p.name).read_bytes() for p in paths]
    assert digests["mpi2-tasks1"] == digests["serial"]
    assert digests["mpi2-tasks2"] == digests["serial"]
