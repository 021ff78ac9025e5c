"""Issue 26: ``ensio analyse`` on model restarts with a halo, time levels and a grid file.

netCDF-4 members shaped as Veros's restarts (group ``core``, (x + 2h, y + 2h, z, 3) under
unnamed ``phony_dim_N`` dims, a scalar ``core/tau``), the grid (xt, yt, zt, maskT) in its
own file: the analysis equals an independent numpy LETKF (tests/reference_letkf.py) on the
interior ocean points at level tau, enumerated here; every other element (halo, other
levels, other variables) and every byte outside the state's is unchanged. Malformed
restarts are one line naming file and key, exit 2, nothing modified.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import reference_letkf as ref
import yaml
from netCDF4 import Dataset
from seeds import draw_seed

ENSIO = [sys.executable, "-m", "ensio"]
DIMS = ("phony_dim_0", "phony_dim_1", "phony_dim_2", "phony_dim_3")
RADIUS_KM = 1500.0


def _member(path: Path, temp: np.ndarray, salt: np.ndarray, tau: int, extra=None) -> None:
    with Dataset(path, "w", format="NETCDF4") as ds:
        core = ds.createGroup("core")
        for d, n in zip(DIMS, temp.shape, strict=True):
            core.createDimension(d, n)
        for name, values in (("temp", temp), ("salt", salt)):
            core.createVariable(name, "f8", DIMS, contiguous=True)[:] = values
        for name, value in {"tau": tau, **(extra or {})}.items():
            core.createVariable(name, "i4", ()).assignValue(value)


def _grid(path: Path, xt, yt, zt, ocean) -> None:
    with Dataset(path, "w") as ds:
        for d, values in (("xt", xt), ("yt", yt), ("zt", zt)):
            ds.createDimension(d, len(values))
            ds.createVariable(d, "f8", (d,))[:] = values
        ds["zt"].positive = "up"
        ds.createVariable("maskT", "i1", ("zt", "yt", "xt"))[:] = np.transpose(ocean, (2, 1, 0))


class Case:
    """k members, their grid, observations of random state rows, the config."""

    def __init__(self, root: Path, label: str, k: int = 6) -> None:
        rng = np.random.default_rng(draw_seed(label))
        self.root, self.k = root, k
        nx, ny, nz = 7, 6, 3
        self.h, self.tau = 2, int(rng.integers(0, 3))
        self.xt = 10.0 + 3.0 * np.arange(nx)
        self.yt = -30.0 + 3.0 * np.arange(ny)
        self.zt = np.array([-400.0, -150.0, -25.0])
        self.ocean = rng.random((nx, ny, nz)) > 0.25
        shape = (nx + 2 * self.h, ny + 2 * self.h, nz, 3)
        self.paths = [root / f"m{m:02d}" / "restart.nc" for m in range(1, k + 1)]
        for p in self.paths:
            p.parent.mkdir()
            temp = rng.normal(10.0, 2.0, shape)
            _member(p, temp, rng.normal(35.0, 1.0, shape), self.tau,
                    {"tau_far": 7, "tau_m": int(p.parent.name == "m02")})
        _grid(root / "grid.nc", self.xt, self.yt, self.zt, self.ocean)
        # the state rows, enumerated independently: interior, level tau, ocean, C order
        i, j, kk = np.nonzero(self.ocean)
        self.lonlat = np.stack([self.xt[i], self.yt[j]], axis=1)
        n = i.size
        m = 25
        self.obs_rows = rng.choice(n, m, replace=False)
        X = self.prior()
        self.y = X[:, self.obs_rows].mean(axis=0) + rng.normal(0.0, 1.0, m)
        self.sigma = rng.uniform(0.5, 1.0, m)
        with Dataset(root / "obs.nc", "w") as ds:
            ds.createDimension("obs", m)
            ll = self.lonlat[self.obs_rows]
            for name, v in (("lon", ll[:, 0]), ("lat", ll[:, 1]), ("value", self.y),
                            ("error", self.sigma)):
                ds.createVariable(name, "f8", ("obs",))[:] = v
            ds.createVariable("index", "i8", ("obs",))[:] = self.obs_rows
        self.config = {
            "ensemble": {
                "members": "m{member:02d}/restart.nc", "size": k,
                "dims": ["xt", "yt", "zt", "level"], "halo": {"xt": self.h, "yt": self.h},
                "time_level": {"dim": "level", "from": "core/tau"}, "grid": "grid.nc",
                "coordinates": {"lon": "xt", "lat": "yt", "level": "zt"},
                "variables": [{"name": "core/temp", "mask": "maskT"}],
            },
            "observations": [{"file": "obs.nc", "variable": "core/temp"}],
            "analysis": {"filter": "letkf", "localization": {"radius_km": RADIUS_KM}},
        }
        self.cfg_path = root / "ensio.yaml"
        self.cfg_path.write_text(yaml.safe_dump(self.config))

    def read(self, name: str = "core/temp") -> np.ndarray:
        out = []
        for p in self.paths:
            with Dataset(p) as ds:
                out.append(np.asarray(ds[name][...]))
        return np.stack(out)

    def state(self, arrays: np.ndarray) -> np.ndarray:
        """(k, stored...) -> (k, n): interior, level tau, ocean, C order (x slowest)."""
        h = self.h
        return np.stack([a[h:-h, h:-h, :, self.tau][self.ocean] for a in arrays])

    def prior(self) -> np.ndarray:
        return self.state(self.read())

    def bytes(self) -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in sorted(self.root.rglob("*.nc"))}


def _ensio(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ENSIO, *args], capture_output=True, text=True, timeout=300)


def test_analysis_equals_independent_letkf_on_the_interior(tmp_path):
    case = Case(tmp_path, "restart analyse")
    before_temp, before_salt = case.read(), case.read("core/salt")
    before = case.bytes()
    X = case.state(before_temp)
    n = X.shape[1]
    H = np.zeros((case.obs_rows.size, n))
    H[np.arange(case.obs_rows.size), case.obs_rows] = 1.0
    want = ref.letkf(X, case.lonlat, np.ones(n, bool), H, case.y, case.sigma,
                     case.lonlat[case.obs_rows], RADIUS_KM)
    r = _ensio("analyse", str(case.cfg_path), "--set", "output.mean=an/mean.nc")
    assert r.returncode == 0, r.stderr
    after_temp = case.read()
    got = case.state(after_temp)
    assert np.max(np.abs(got - want)) <= 1e-10 * np.max(np.abs(want))
    assert np.max(np.abs(got - X)) > 1e-3  # the analysis did something
    # the mean product: the members' group and dimension names, fill outside the state
    with Dataset(tmp_path / "an" / "mean.nc") as ds:
        mean = ds["core/temp"][...]
        assert ds["core/temp"].dimensions == DIMS
    inner = mean[case.h:-case.h, case.h:-case.h, :, case.tau]
    np.testing.assert_allclose(inner[case.ocean], got.mean(axis=0), rtol=1e-12)
    assert mean.count() == got.shape[1]
    # every other element of temp (halo, other levels, land) bit for bit
    h, tau = case.h, case.tau
    state = np.zeros(before_temp.shape[1:], bool)
    state[h:-h, h:-h, :, tau] = case.ocean
    assert np.array_equal(after_temp[:, ~state].view(np.uint64),
                          before_temp[:, ~state].view(np.uint64))
    assert np.array_equal(case.read("core/salt").view(np.uint64), before_salt.view(np.uint64))
    # and every byte outside the state's elements (contiguous temp: its offset in the file)
    import h5py

    elems = np.flatnonzero(state.ravel())
    for p in case.paths:
        with h5py.File(p, "r") as f:
            offset = f["core/temp"].id.get_offset()
        old, new = np.frombuffer(before[p], np.uint8), np.frombuffer(p.read_bytes(), np.uint8)
        assert old.size == new.size
        touched = np.zeros(old.size, bool)
        touched[(offset + 8 * elems[:, None] + np.arange(8)).ravel()] = True
        assert np.array_equal(old[~touched], new[~touched]), p
    for p in (tmp_path / "grid.nc", tmp_path / "obs.nc"):
        assert p.read_bytes() == before[p]


@pytest.mark.parametrize(
    "override, key, where",
    [
        (["ensemble.variables=[{name: ocean/temp, mask: maskT}]"], "ensemble.variables", "m01"),
        (["ensemble.halo.xt=6"], "ensemble.halo.xt", "m01"),
        (["ensemble.time_level.from=core/tau_now"], "ensemble.time_level.from", "m01"),
        (["ensemble.time_level.from=core/tau_far"], "ensemble.time_level.from", "m01"),
        (["ensemble.time_level.from=core/tau_m"], "ensemble.time_level.from", "m02"),
        (["ensemble.grid=nogrid.nc"], "ensemble.grid", "nogrid.nc"),
        (["ensemble.grid=bad_grid.nc"], "ensemble.grid", "m01"),
        (["ensemble.dims=[xt, yt, level]", "ensemble.time_level.dim=level"], "ensemble.dims",
         "m01"),
    ],
)
def test_malformed_restart_is_one_line_exit_2_nothing_modified(tmp_path, override, key, where):
    case = Case(tmp_path, "restart errors", k=3)
    _grid(tmp_path / "bad_grid.nc", np.append(case.xt, 40.0), case.yt, case.zt,
          np.ones((case.xt.size + 1, case.yt.size, case.zt.size), bool))
    before = case.bytes()
    sets = [a for o in override for a in ("--set", o)]
    r = _ensio("analyse", str(case.cfg_path), *sets)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert key in r.stderr and where in r.stderr, r.stderr
    assert case.bytes() == before
    assert not [p for p in tmp_path.rglob("*") if "ensio" in p.name and p.suffix != ".yaml"]


def test_veros_like_restarts_with_cyclic_halo(tmp_path):
    """Plain HDF5 restarts as Veros writes them (chunked, gzip), grid file, cyclic x."""
    import h5py
    from veros_like import grid_axes, write_grid_file, write_veros_like

    rng = np.random.default_rng(draw_seed("veros-like analyse"))
    nx, ny, nz, h, k = 8, 6, 3, 2, 5
    tau = int(rng.integers(0, 3))
    land = rng.random((nx, ny, nz)) < 0.2
    paths = [tmp_path / f"acc_{m:02d}.h5" for m in range(1, k + 1)]
    for p in paths:
        write_veros_like(p, nx=nx, ny=ny, nz=nz, halo=h, tau=tau, land=land,
                         seed=int(rng.integers(1 << 30)))
    write_grid_file(tmp_path / "grid.nc", nx=nx, ny=ny, nz=nz, land=land)
    xt, yt, _ = grid_axes(nx, ny, nz)

    def read(name):
        out = []
        for p in paths:
            with h5py.File(p, "r") as f:
                out.append(f[name][...])
        return np.stack(out)

    before = read("core/temp")
    X = np.stack([a[h:-h, h:-h, :, tau][~land] for a in before])
    i, j, _ = np.nonzero(~land)
    lonlat = np.stack([xt[i], yt[j]], axis=1)
    n, m = X.shape[1], 20
    rows = rng.choice(n, m, replace=False)
    y = X[:, rows].mean(axis=0) + rng.normal(0.0, 1.0, m)
    sigma = rng.uniform(0.5, 1.0, m)
    with Dataset(tmp_path / "obs.nc", "w") as ds:
        ds.createDimension("obs", m)
        for name, v in (("lon", lonlat[rows, 0]), ("lat", lonlat[rows, 1]), ("value", y),
                        ("error", sigma)):
            ds.createVariable(name, "f8", ("obs",))[:] = v
        ds.createVariable("index", "i8", ("obs",))[:] = rows
    config = {
        "ensemble": {
            "members": "acc_{member:02d}.h5", "size": k, "dims": ["xt", "yt", "zt", "level"],
            "halo": {"xt": h, "yt": h}, "cyclic": ["xt"], "grid": "grid.nc",
            "time_level": {"dim": "level", "from": "core/tau"},
            "coordinates": {"lon": "xt", "lat": "yt", "level": "zt"},
            "variables": [{"name": "core/temp", "mask": "maskT"}],
        },
        "observations": [{"file": "obs.nc", "variable": "core/temp"}],
        "analysis": {"filter": "letkf", "localization": {"radius_km": RADIUS_KM}},
    }
    (tmp_path / "ensio.yaml").write_text(yaml.safe_dump(config))
    others = {name: read(name) for name in ("core/salt", "core/tau", "averages/temp")}
    H = np.zeros((m, n))
    H[np.arange(m), rows] = 1.0
    want = ref.letkf(X, lonlat, np.ones(n, bool), H, y, sigma, lonlat[rows], RADIUS_KM)
    r = _ensio("analyse", str(tmp_path / "ensio.yaml"), "--set", "output.spread=spread.nc")
    assert r.returncode == 0, r.stderr
    after = read("core/temp")
    got = np.stack([a[h:-h, h:-h, :, tau][~land] for a in after])
    assert np.max(np.abs(got - want)) <= 1e-10 * np.max(np.abs(want))
    with Dataset(tmp_path / "spread.nc") as ds:  # a netCDF-4 product of plain HDF5 members
        spread = ds["core/temp"][...][h:-h, h:-h, :, tau]
    np.testing.assert_allclose(spread[~land], got.std(axis=0, ddof=1), rtol=1e-10)
    # expected file contents: the prior, the analysis at the state rows, the cyclic x halo
    # of the interior y rows at level tau copied from the opposite interior columns
    expect = before.copy()
    for a, x in zip(expect, got, strict=True):
        inner = a[h:-h, h:-h, :, tau]
        inner[~land] = x
        a[h:-h, h:-h, :, tau] = inner
        a[:h, h:-h, :, tau] = a[nx:nx + h, h:-h, :, tau]
        a[nx + h:, h:-h, :, tau] = a[h:2 * h, h:-h, :, tau]
    assert np.array_equal(after.view(np.uint64), expect.view(np.uint64))
    for name, values in others.items():
        assert np.array_equal(read(name), values), name


def test_two_ranks_write_the_same_bytes(tmp_path):
    """mpiexec -n 2 with io.tasks 2 leaves the members bit for bit as one rank does."""
    import shutil

    import needs

    mpiexec = str(needs.mpiexec())
    (tmp_path / "one").mkdir()
    one = Case(tmp_path / "one", "restart ranks")
    two = tmp_path / "two"
    shutil.copytree(one.root, two)
    r = _ensio("analyse", str(one.cfg_path), "--set", "io.tasks=1")
    assert r.returncode == 0, r.stderr
    r = subprocess.run([mpiexec, "-n", "2", *ENSIO, "analyse", str(two / "ensio.yaml"),
                        "--set", "io.tasks=2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for p in one.paths:
        assert p.read_bytes() == (two / p.relative_to(one.root)).read_bytes(), p
