"""``ensio cycle`` of HDF5 restarts (Veros) with ``workflow.transfer``: the restarts never
touch the disk, and the final analyses equal the file-based cycle's bit for bit.

Two member programs: a Veros-like model (reads its restart with h5py, steps the tracers
to the next time level, writes a restart as Veros 1.7 does: plain HDF5, chunked, gzip)
and, when Veros is installed, the unmodified ``veros run`` (through the example's member
command, ``python -m ensio.models.veros.run``). Each runs a 4-member ensemble for 2 cycles
twice, with and without ``examples/veros/transfer.yaml``. That no restart reached the disk
is watched with inotify (every name created or renamed into the cycles' ``forecast/``
and ``analysis/`` directories during the run) and checked in the final listings.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import needs
import numpy as np
import pytest
import yaml
from netCDF4 import Dataset
from seeds import draw_seed
from test_transfer_cycle import Watch
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    Host,
    host_fixture,
    interposer_cache_fixture,
)

ROOT = Path(__file__).resolve().parents[1]
TRANSFER = ROOT / "examples" / "veros" / "transfer.yaml"
TESTS = Path(__file__).resolve().parent
NE, CYCLES = 4, 2
MEMBER_FILE = re.compile(r"mem\d{3}\.nc")

# A Veros-like forecast: every dataset read, temp and salt stepped from level tau to
# taup1 (x-advection-like mixing plus a drift, land 0, cyclic x halo), tau advanced, the
# file written as Veros's write_to_h5 does (require_dataset with the same chunks, gzip).
MEMBER = r"""
import sys
import h5py
import numpy as np
src, out = sys.argv[1], sys.argv[2]
data, groups = {}, []
with h5py.File(src, "r") as f:
    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            data[name] = [obj[()], obj.chunks, obj.compression, obj.compression_opts]
        else:
            groups.append(name)
    f.visititems(visit)
tau = int(data["core/tau"][0])
new = (tau + 1) % 3
for name in ("core/temp", "core/salt"):
    a = data[name][0]
    cur = a[..., tau]
    a[..., new] = np.where(cur == 0, 0.0, cur + 0.1 * (np.roll(cur, 1, axis=0) - cur) + 0.01)
    a[:2, ..., new] = a[-4:-2, ..., new]
    a[-2:, ..., new] = a[2:4, ..., new]
for key, value in (("core/tau", new), ("core/taum1", tau), ("core/taup1", (new + 1) % 3)):
    data[key][0] = np.array(value, np.int32)
data["core/time"][0] = data["core/time"][0] + 86400.0
with h5py.File(out, "w") as f:
    for g in groups:
        f.require_group(g)
    for name, (value, chunks, compression, opts) in data.items():
        kw = {"exact": True}
        if chunks is not None:
            kw.update(chunks=chunks, compression=compression, compression_opts=opts)
        f.require_dataset(name, value.shape, value.dtype, **kw)
        f[name][...] = value
"""


def _observations(path: Path, x: np.ndarray, rows: np.ndarray, lon: np.ndarray,
                  lat: np.ndarray, rng: np.random.Generator) -> None:
    """Observations of state rows ``rows`` (by index) near the ensemble mean of ``x``
    (members, state rows): the analysis changes the members by a fraction of their spread."""
    m = rows.size
    with Dataset(path, "w") as ds:
        ds.createDimension("obs", m)
        value = x[:, rows].mean(axis=0) + rng.normal(0.0, 0.3, m)
        for name, v in (("lon", lon), ("lat", lat), ("value", value),
                        ("error", np.full(m, 0.5))):
            ds.createVariable(name, "f8", ("obs",))[:] = v
        ds.createVariable("index", "i8", ("obs",))[:] = rows


def _write_grid(path: Path, ocean: np.ndarray, xt, yt, zt) -> None:
    """grid.nc: xt, yt, zt and maskT(zt, yt, xt) from ``ocean`` (x, y, z)."""
    with Dataset(path, "w") as ds:
        for name, values in (("xt", xt), ("yt", yt), ("zt", zt)):
            ds.createDimension(name, len(values))
            ds.createVariable(name, "f8", (name,))[:] = values
        ds.createVariable("maskT", "i1", ("zt", "yt", "xt"))[:] = \
            np.transpose(ocean, (2, 1, 0)).astype(np.int8)


def _state(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Interior core/temp at tau of a restart, and its ocean (temp != 0), both (x, y, z)."""
    import h5py

    with h5py.File(path, "r") as f:
        tau = int(f["core/tau"][()])
        t = f["core/temp"][2:-2, 2:-2, :, tau]
    return t, t != 0


def _config(root: Path, member_command: str, radius_km: float) -> Path:
    cfg = {
        "ensemble": {"members": "forecast/mem{member:03d}.nc", "size": NE,
                     "dims": ["xt", "yt", "zt", "level"], "halo": {"xt": 2, "yt": 2},
                     "cyclic": ["xt"], "grid": str(root / "grid.nc"),
                     "time_level": {"dim": "level", "from": "core/tau"},
                     "coordinates": {"lon": "xt", "lat": "yt", "level": "zt"},
                     "variables": [{"name": "core/temp", "mask": "maskT"},
                                   {"name": "core/salt", "mask": "maskT"}]},
        "observations": [{"file": str(root / "obs.nc"), "variable": "core/temp"}],
        "analysis": {"filter": "letkf", "localization": {"radius_km": radius_km}},
        "workflow": {"backend": "local", "jobs": 2, "time_limit": "00:30:00",
                     "member_command": member_command, "retries": 0,
                     "initial": str(root / "init" / "mem{member:03d}.nc"),
                     "analysis_ranks": 1, "task_estimate": "00:00:10"},
    }  # fmt: skip
    path = root / "cycle.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cycle(host: Host, config: Path, workdir: Path, transfer: bool) -> str:
    extra = ["--set", f"workflow.transfer={TRANSFER}"] if transfer else []
    env = dict(host.env, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "ensio", "cycle", str(config), "--workdir",
                        str(workdir), "--cycles", str(CYCLES), *extra], cwd=host.work, env=env,
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"cycle {CYCLES}: done ({NE} of {NE} members + analysis)" in p.stdout, p.stdout
    return p.stdout


def _members(names) -> list[str]:
    return sorted(n for n in names if MEMBER_FILE.search(n))


def _listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def _variables(group) -> list[str]:
    """Paths of every variable of a netCDF group and its subgroups (``core/temp``)."""
    out = [f"{group.path.rstrip('/')}/{v}".lstrip("/") for v in group.variables]
    for sub in group.groups.values():
        out += _variables(sub)
    return out


def _same_products(a: Path, b: Path) -> None:
    """mean.nc/spread.nc: every variable equal (their history lines differ in time)."""
    with Dataset(a) as x, Dataset(b) as y:
        x.set_auto_mask(False)
        y.set_auto_mask(False)
        names = _variables(x)
        assert names and names == _variables(y), a
        for v in names:
            assert np.array_equal(x[v][...], y[v][...], equal_nan=True), (a, v)


def _restart(path: Path) -> bool:
    """Whether ``path`` is a Veros restart: an HDF5 file with ``core/tau`` (the products
    mean.nc and spread.nc have core/temp and core/salt only)."""
    import h5py

    if not path.is_file() or path.is_symlink():
        return False
    with open(path, "rb") as f:
        if f.read(8) != b"\x89HDF\r\n\x1a\n":
            return False
    with h5py.File(path, "r") as f:
        return "core/tau" in f


def _both_runs(host: Host, config: Path) -> None:
    """The cycle with and without transfer: bitwise equal analyses, no restart on disk."""
    files, memory = host.work / "files", host.work / "memory"
    _cycle(host, config, files, transfer=False)
    dirs = {(c, k): memory / f"cycle_{c:03d}" / k for c in range(1, CYCLES + 1)
            for k in ("forecast", "analysis")}
    watch = Watch(list(dirs.values()))
    try:
        _cycle(host, config, memory, transfer=True)
        seen = watch.collect()
    finally:
        watch.close()
    names = [f"mem{m:03d}.nc" for m in range(1, NE + 1)]
    last = CYCLES
    for c in range(1, CYCLES + 1):
        # the file-based run has every forecast and analysis member on disk
        assert _members(_listing(files / f"cycle_{c:03d}" / "forecast")) == names
        assert _members(_listing(files / f"cycle_{c:03d}" / "analysis")) == names
        # under transfer no forecast, nor a temporary of one, was ever created on disk
        assert _members(seen[dirs[c, "forecast"]]) == [], seen[dirs[c, "forecast"]]
        assert _members(_listing(dirs[c, "forecast"])) == []
        for p in ("mean.nc", "spread.nc"):
            _same_products(dirs[c, "analysis"] / p, files / f"cycle_{c:03d}" / "analysis" / p)
    for c in range(1, last):  # analysis members of the cycles before the last: memory only
        assert _members(seen[dirs[c, "analysis"]]) == [], seen[dirs[c, "analysis"]]
        assert _listing(dirs[c, "analysis"]) == ["mean.nc", "spread.nc"]
    # the last cycle's analysis members are written once, by the driver at the end (a
    # temporary renamed into place), never by the analysis task
    written = seen[dirs[last, "analysis"]]
    assert [n for n in written if n.endswith(".ensio-partial")] == [], written
    assert sorted(n for n in written if n in names) == names, written
    assert _listing(dirs[last, "analysis"]) == sorted(names + ["mean.nc", "spread.nc"])
    for n in names:
        assert (dirs[last, "analysis"] / n).read_bytes() == \
            (files / f"cycle_{last:03d}" / "analysis" / n).read_bytes(), n
    # and nowhere under the run directory (member work directories included) is there any
    # other restart
    restarts = sorted(str(p.relative_to(memory)) for p in memory.rglob("*") if _restart(p))
    assert restarts == [f"cycle_{last:03d}/analysis/{n}" for n in names], restarts
    assert len([p for p in files.rglob("*") if _restart(p)]) == 2 * CYCLES * NE
    # the analysis changed the members (their forecast is not their analysis)
    assert (files / f"cycle_{last:03d}" / "analysis" / names[0]).read_bytes() != \
        (files / f"cycle_{last:03d}" / "forecast" / names[0]).read_bytes()
    assert host.status() == []  # the daemon let go of every file


def test_veros_like_cycle_through_memory_equals_the_file_based_cycle(host: Host):
    from veros_like import grid_axes, write_veros_like

    rng = np.random.default_rng(draw_seed("veros-like transfer cycle"))
    nx, ny, nz = 10, 8, 3
    root = host.work
    land = rng.random((nx, ny, nz)) < 0.2
    (root / "init").mkdir()
    for m in range(1, NE + 1):
        write_veros_like(root / "init" / f"mem{m:03d}.nc", nx=nx, ny=ny, nz=nz, tau=1,
                         land=land, seed=int(rng.integers(1 << 30)))
    xt, yt, zt = grid_axes(nx, ny, nz)
    _write_grid(root / "grid.nc", ~land, xt, yt, zt)
    x = np.stack([_state(root / "init" / f"mem{m:03d}.nc")[0][~land] for m in range(1, NE + 1)])
    i, j, _ = np.nonzero(~land)
    rows = rng.choice(i.size, 15, replace=False)
    _observations(root / "obs.nc", x, rows, xt[i[rows]], yt[j[rows]], rng)
    (root / "member.py").write_text(MEMBER)
    config = _config(root, f"{sys.executable} {root / 'member.py'} {{analysis}} {{forecast}}",
                     radius_km=1500)
    _both_runs(host, config)


def _veros(*args: str, cwd: Path) -> None:
    veros = Path(sys.executable).with_name("veros")
    p = subprocess.run([str(veros if veros.exists() else "veros"), *args], cwd=cwd,
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]


@pytest.mark.slow
def test_veros_cycle_through_memory_equals_the_file_based_cycle(host: Host):
    """The unmodified ``veros run`` (acc set-up, half-day forecasts) as the members."""
    needs.module("veros")
    import h5py
    from veros_like import grid_axes

    rng = np.random.default_rng(draw_seed("veros transfer cycle"))
    root = host.work
    _veros("copy-setup", "acc", "--to", str(root / "setup"), cwd=root)
    (root / "spin").mkdir()
    _veros("run", str(root / "setup" / "acc.py"), "-s", "runlen", "43200.0",
           "-s", "restart_output_filename", str(root / "spin.h5"),
           "-s", "restart_frequency", "0.0", cwd=root / "spin")
    temp, ocean = _state(root / "spin.h5")
    nx, ny, nz = temp.shape
    (root / "init").mkdir()
    for m in range(1, NE + 1):  # perturbed temperature at every level, cyclic x halo kept
        path = root / "init" / f"mem{m:03d}.nc"
        shutil.copyfile(root / "spin.h5", path)
        with h5py.File(path, "r+") as f:
            t = f["core/temp"][...]
            noise = rng.normal(0.0, 0.2, t[2:-2, 2:-2].shape)
            t[2:-2, 2:-2] += np.where(t[2:-2, 2:-2] != 0, noise, 0.0)
            t[:2] = t[nx:nx + 2]
            t[nx + 2:] = t[2:4]
            f["core/temp"][...] = t
    xt, yt = 1.0 + 2.0 * np.arange(nx), -39.0 + 2.0 * np.arange(ny)
    _write_grid(root / "grid.nc", ocean, xt, yt, grid_axes(nx, ny, nz)[2])
    x = np.stack([_state(root / "init" / f"mem{m:03d}.nc")[0][ocean] for m in range(1, NE + 1)])
    i, j, _ = np.nonzero(ocean)
    rows = rng.choice(i.size, 30, replace=False)
    _observations(root / "obs.nc", x, rows, xt[i[rows]], yt[j[rows]], rng)
    command = (f"{sys.executable} -m ensio.models.veros.run {root / 'setup' / 'acc.py'} "
               "{analysis} {forecast} --days 0.5")
    _both_runs(host, _config(root, command, radius_km=1000))
