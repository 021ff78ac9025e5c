"""The Veros OSSE in small (issue 26 items 4 and 5), with the real, unmodified model.

One module fixture runs ``ensio example veros DIR --members 4 --cycles 2 --days 1`` (a
10-day spin-up; about a minute on 2 cores, most of it Veros's start-up per run); the tests
then check its report against numbers computed here from the files with h5py, and use
its set-up, grid and restarts for the restart-level acceptance tests:

* the round trip: an analysis without observations leaves every Veros restart
  byte-identical, and Veros's next forecast from it equals the one from the untouched
  restart bit for bit;
* a malformed restart (missing group, wrong halo, missing ``tau``) is one line naming the
  file and the key, exit 2, nothing modified;
* the restart Veros writes on 2 × 1 processes (chunked per subdomain, uncompressed) is
  read and written by ensio exactly as the 1-process restart (same analysis), and Veros
  resumes from it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pytest
import yaml
from veros_support import CYCLES, MEMBERS, small_osse

ENSIO = [sys.executable, "-m", "ensio"]


def _interior_at_tau(path: Path, name: str) -> np.ndarray:
    with h5py.File(path, "r") as f:
        tau = int(f["core/tau"][()])
        return f[f"core/{name}"][...][2:-2, 2:-2, :, tau]


@pytest.fixture(scope="module")
def osse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The session's small OSSE (tests/veros_support.py: set up once per worker, shared
    with the kill and SLURM tests)."""
    root = small_osse(tmp_path_factory)
    return root, json.loads((root / "osse.json").read_text())


def test_small_osse_report(osse: tuple[Path, dict]) -> None:
    root, rep = osse
    for key in ("rmse_analysis_temp", "rmse_free_temp", "rmse_analysis_salt", "rmse_free_salt",
                "spread_ratio_temp", "spread_ratio_salt"):
        assert np.isfinite(rep[key]) and rep[key] > 0, key
    assert rep["members"] == MEMBERS
    assert [c["cycle"] for c in rep["cycles"]] == [1, 2]
    with netCDF4.Dataset(root / "grid.nc") as g:
        ocean = np.transpose(np.asarray(g["maskT"][:]) == 1, (2, 1, 0))  # (x, y, z)
    # the headline numbers (second half = cycle 2) recomputed from the files
    truth = {v: _interior_at_tau(root / "truth" / "truth_002.h5", v) for v in ("temp", "salt")}
    for run, pattern in (("analysis", "assim/cycle_002/analysis/mem{:03d}.nc"),
                         ("free", "free/cycle_002/mem{:03d}.h5")):
        for v in ("temp", "salt"):
            ens = np.stack([_interior_at_tau(root / pattern.format(m), v)[ocean]
                            for m in range(1, MEMBERS + 1)])
            rmse = np.sqrt(np.mean((ens.mean(axis=0) - truth[v][ocean]) ** 2))
            assert rep[f"rmse_{run}_{v}"] == pytest.approx(rmse, rel=1e-12)
            if run == "analysis":
                spread = np.sqrt(np.mean(ens.var(axis=0, ddof=1)))
                assert rep[f"spread_ratio_{v}"] == pytest.approx(spread / rmse, rel=1e-12)
    for c in rep["cycles"]:
        inn = c["innovations"]
        # every observation was placed and the analysis fits the profiles better
        assert inn["all"]["omb"]["count"] == sum(c["observations"].values())
        for kind in ("prof_temp", "prof_salt"):
            assert inn[kind]["oma"]["rms"] < inn[kind]["omb"]["rms"]
        t = c["timing"]
        assert t["cycle"] >= t["members"] > 0 and t["io"] > 0 and t["analysis"] > 0
    for png in ("rmse_spread.png", "sst_increment.png", "omb_oma.png"):
        assert (root / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # every member forecast of both runs went through the checked runner
    logs = list((root / "assim").glob("cycle_*/work/mem*/veros.log"))
    assert len(logs) == MEMBERS * CYCLES
    assert all("Integration done" in p.read_text() for p in logs)


def _config(root: Path, members: str, tmp: Path, obs: list[str],
            inflation: bool = True) -> Path:
    """An ``ensio analyse`` config of the OSSE's own cycle config, in place, on ``members``."""
    raw = yaml.safe_load((root / "cycle.yaml").read_text())
    raw.pop("workflow")
    if not inflation:
        raw["analysis"].pop("inflation", None)
    raw["ensemble"]["members"] = members
    raw["observations"] = obs
    raw["output"] = {"diagnostics": False}
    path = tmp / "analyse.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _empty_obs(path: Path) -> Path:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", 0)
        for name in ("lon", "lat", "level", "value", "error"):
            ds.createVariable(name, "f8", ("obs",))
        ds.variable = "core/temp"
    return path


def _forecast(root: Path, start: Path, out: Path, work: Path, days: float = 1.0) -> None:
    work.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "ensio.models.veros.run",
                           str(root / "setup" / "acc.py"), str(start), str(out),
                           "--days", str(days)], cwd=work, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _core(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {k: f[f"core/{k}"][()] for k in f["core"]}


def test_round_trip_no_observations(osse: tuple[Path, dict], tmp_path: Path) -> None:
    """The OSSE's analysis (LETKF, horizontal and vertical localization, RTPS) without
    observations: every restart byte for byte."""
    root, _ = osse
    for m in range(1, MEMBERS + 1):
        shutil.copyfile(root / "init" / f"mem{m:03d}.h5", tmp_path / f"mem{m:03d}.h5")
    cfg = _config(root, str(tmp_path / "mem{member:03d}.h5"), tmp_path,
                  [str(_empty_obs(tmp_path / "empty.nc"))])
    proc = subprocess.run([*ENSIO, "analyse", str(cfg)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for m in range(1, MEMBERS + 1):
        assert (tmp_path / f"mem{m:03d}.h5").read_bytes() == \
            (root / "init" / f"mem{m:03d}.h5").read_bytes(), f"member {m} changed"
    _forecast(root, tmp_path / "mem001.h5", tmp_path / "a.h5", tmp_path / "wa")
    _forecast(root, root / "init" / "mem001.h5", tmp_path / "b.h5", tmp_path / "wb")
    a, b = _core(tmp_path / "a.h5"), _core(tmp_path / "b.h5")
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_bad_option_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([*ENSIO, "example", "veros", str(tmp_path / "x"), "--spacing-days",
                           "1"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--spacing-days" in proc.stderr, proc.stderr
    assert not (tmp_path / "x").exists()


def _malformed_missing_group(paths: list[Path]) -> tuple[Path, tuple[str, ...]]:
    with h5py.File(paths[2], "r+") as f:
        f.move("core", "kern")
    return paths[2], ("core/temp",)


def _malformed_missing_tau(paths: list[Path]) -> tuple[Path, tuple[str, ...]]:
    with h5py.File(paths[2], "r+") as f:
        del f["core/tau"]
    return paths[2], ("core/tau",)


def _malformed_wrong_halo(paths: list[Path]) -> tuple[Path, tuple[str, ...]]:
    """Restarts with 3 ghost cells in y, not the 2 of ``ensemble.halo``: the interior no
    longer matches the grid (a single such member is a shape mismatch with member 1)."""
    for path in paths:
        with h5py.File(path, "r+") as f:
            for name in ("temp", "salt"):
                data = f[f"core/{name}"][()]
                del f[f"core/{name}"]
                f.create_dataset(f"core/{name}",
                                 data=np.pad(data, ((0, 0), (1, 1), (0, 0), (0, 0))))
    return paths[0], ("ensemble.halo", "ensemble.grid")


@pytest.mark.parametrize("break_it", [_malformed_missing_group, _malformed_missing_tau,
                                      _malformed_wrong_halo],
                         ids=["missing-group", "missing-tau", "wrong-halo"])
def test_malformed_restart_one_line(osse: tuple[Path, dict], tmp_path: Path, break_it) -> None:
    root, _ = osse
    for m in range(1, MEMBERS + 1):
        shutil.copyfile(root / "init" / f"mem{m:03d}.h5", tmp_path / f"mem{m:03d}.h5")
    bad, keys = break_it([tmp_path / f"mem{m:03d}.h5" for m in range(1, MEMBERS + 1)])
    before = {p.name: p.read_bytes() for p in tmp_path.glob("mem*.h5")}
    cfg = _config(root, str(tmp_path / "mem{member:03d}.h5"), tmp_path,
                  [str(root / "obs" / "prof_temp_001.nc")])
    proc = subprocess.run([*ENSIO, "analyse", str(cfg)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(bad) in lines[0] and any(k in lines[0] for k in keys), lines[0]
    assert {p.name: p.read_bytes() for p in tmp_path.glob("mem*.h5")} == before


def _as_two_subdomains(src: Path, dst: Path) -> None:
    """``src`` rewritten as ``veros run -n 2 1`` writes it: every dataset with x and y in
    its shape chunked per subdomain (x interior / 2, y interior, ...), uncompressed.

    Veros on 2 processes writes through h5py's MPI-IO driver, which the pip wheel of
    h5py lacks (``h5py was built without MPI support``), so the layout is reproduced
    here from Veros's own rule (veros/restart.py ``write_to_h5``: chunk = the
    subdomain's shape without ghost cells, gzip only on one process).
    """
    with h5py.File(src, "r") as fi, h5py.File(dst, "w") as fo:
        nx = fi["core/temp"].shape[0] - 4
        ny = fi["core/temp"].shape[1] - 4

        def copy(name: str, obj) -> None:
            if isinstance(obj, h5py.Group):
                fo.require_group(name)
                return
            data = obj[()]
            if obj.chunks is None or data.ndim == 0:
                fo.create_dataset(name, data=data)
                return
            chunks = tuple(nx // 2 if s == nx + 4 else ny if s == ny + 4 else c
                           for s, c in zip(data.shape, obj.chunks, strict=True))
            fo.create_dataset(name, data=data, chunks=chunks)

        fi.visititems(copy)


def test_two_subdomain_restart_reads_and_writes_as_one(osse: tuple[Path, dict],
                                                       tmp_path: Path) -> None:
    root, _ = osse
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    for m in range(1, MEMBERS + 1):
        src = root / "init" / f"mem{m:03d}.h5"
        shutil.copyfile(src, one / f"mem{m:03d}.h5")
        _as_two_subdomains(src, two / f"mem{m:03d}.h5")
    with h5py.File(two / "mem001.h5") as f:
        assert f["core/temp"].chunks == (15, 42, 15, 3) and f["core/temp"].compression is None
    obs = [str(root / "obs" / f"{k}_001.nc") for k in ("sst", "prof_temp", "prof_salt")]
    for d in (one, two):
        (d / "cfg").mkdir()
        cfg = _config(root, str(d / "mem{member:03d}.h5"), d / "cfg", obs)
        proc = subprocess.run([*ENSIO, "analyse", str(cfg)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    for m in range(1, MEMBERS + 1):
        a, b = _core(one / f"mem{m:03d}.h5"), _core(two / f"mem{m:03d}.h5")
        for k in a:
            assert np.array_equal(a[k], b[k]), (m, k)
    with h5py.File(two / "mem001.h5") as f:  # written back in its own layout
        assert f["core/temp"].chunks == (15, 42, 15, 3)
    _forecast(root, one / "mem001.h5", tmp_path / "a.h5", tmp_path / "wa")
    _forecast(root, two / "mem001.h5", tmp_path / "b.h5", tmp_path / "wb")
    a, b = _core(tmp_path / "a.h5"), _core(tmp_path / "b.h5")
    for k in a:
        assert np.array_equal(a[k], b[k]), k
