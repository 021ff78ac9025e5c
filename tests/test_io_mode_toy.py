"""A new ``io.mode`` is one class plus a registry entry (issue 25 item 3).

The toy mode below lives in the test suite only: it subclasses ``files``
mode's class and is registered under a name of its own, nothing in src is
touched. ``run_analysis`` must run it through its hooks (the toy counts
them) and leave exactly the members ``io.mode: files`` leaves, and the run
record it writes must make a ``files`` rerun "already analysed" (the record
names contents, not modes).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from cases import EnsembleCase, VarCase, make_obs_case, reference_matrix, row_lonlat, sha256
from mpi4py import MPI

from ensio.config import config_from_dict
from ensio.config.schema import Config
from ensio.io.modes import ensemble as registry
from ensio.io.modes.base import EnsembleIO, RunCommit
from ensio.io.modes.files import FileEnsembleIO
from ensio.io.modes.stats import IOStats
from ensio.layout.block import EnsembleBlock
from ensio.offline import run_analysis

VARS = [VarCase("state", ("lat", "lon")), VarCase("t", ("lev", "lat", "lon"))]
CALLS: Counter[str] = Counter()


class ToyEnsembleIO(FileEnsembleIO):
    """``files`` mode's machinery under another name; each hook the driver asks is counted."""

    @classmethod
    def check_run(cls, config: Config) -> None:
        CALLS["check_run"] += 1
        super().check_run(config)

    @classmethod
    def open_run(cls, config: Config, comm: MPI.Comm, root: Path) -> EnsembleIO:
        CALLS["open_run"] += 1
        return super().open_run(config, comm, root)

    def read(self, *args, **kw) -> EnsembleBlock:
        CALLS["read"] += 1
        return super().read(*args, **kw)

    def commit(self, analysis: EnsembleBlock, run: RunCommit) -> IOStats | None:
        CALLS["commit"] += 1
        return super().commit(analysis, run)


def _members(root: Path, seed: int) -> list[Path]:
    """Members and two observation files of them, written once (reruns see the same)."""
    case = EnsembleCase(members=4, nlat=6, nlon=9, nlev=2, variables=VARS, seed=seed)
    paths = case.write(root)
    X = reference_matrix(paths, VARS)
    with netCDF4.Dataset(paths[0]) as ds:
        lon, lat = np.asarray(ds["lon"][:], float), np.asarray(ds["lat"][:], float)
    make_obs_case(X, row_lonlat(paths[0], VARS), lon, lat, np.random.default_rng(seed)).write(root)
    return paths


def _config(root: Path, mode: str) -> Config:
    """The same observations and filter in every directory; ``mode`` set after loading
    (the config's ``Literal`` names the shipped modes; the toy is the test's own)."""
    raw = EnsembleCase(variables=VARS, members=4).config(root)
    raw["observations"] = [{"file": "obs_a.nc"}, {"file": "obs_b.nc"}]
    raw["analysis"] = {"filter": "letkf", "seed": 5,
                       "localization": {"taper": "gaspari-cohn", "radius_km": 4000.0}}
    raw["output"] = {"mean": "mean.nc"}
    cfg = config_from_dict(raw, base_dir=root)
    return dataclasses.replace(cfg, io=dataclasses.replace(cfg.io, mode=mode))


def test_a_toy_mode_registered_by_subclassing_alone_equals_files_mode(tmp_path, rng,
                                                                        monkeypatch):
    monkeypatch.setitem(registry.ENSEMBLE_IO, "toy", ToyEnsembleIO)
    CALLS.clear()
    seed = int(rng.integers(1, 10_000))
    files_dir, toy_dir = tmp_path / "files", tmp_path / "toy"
    files_dir.mkdir()
    paths = _members(files_dir, seed)
    shutil.copytree(files_dir, toy_dir)
    prior = reference_matrix(paths, VARS)

    run_analysis(_config(files_dir, "files"), MPI.COMM_SELF, cycle=1)
    assert not CALLS  # files mode never reaches the toy
    report = run_analysis(_config(toy_dir, "toy"), MPI.COMM_SELF, cycle=1)

    assert report.already is None
    assert CALLS == {"check_run": 1, "open_run": 1, "read": 1, "commit": 1}
    want = reference_matrix(paths, VARS)
    got = reference_matrix(sorted(toy_dir.glob("mem*.nc")), VARS)
    assert np.abs(want - prior).max() > 1e-6  # the analysis changed the members
    np.testing.assert_array_equal(got, want)
    with netCDF4.Dataset(files_dir / "mean.nc") as a, netCDF4.Dataset(toy_dir / "mean.nc") as b:
        for v in VARS:
            np.testing.assert_array_equal(b[v.name][:], a[v.name][:])

    # the toy's run record identifies the analysis by contents: files mode sees it done
    before = [sha256(p) for p in sorted(toy_dir.glob("mem*.nc"))]
    again = run_analysis(_config(toy_dir, "files"), MPI.COMM_SELF, cycle=1)
    assert again.already is not None
    assert [sha256(p) for p in sorted(toy_dir.glob("mem*.nc"))] == before
    assert CALLS["read"] == 1  # nothing was read again


def test_an_unregistered_mode_is_one_line_naming_io_mode(tmp_path, rng):
    from ensio.config.schema import ConfigError

    seed = int(rng.integers(1, 10_000))
    _members(tmp_path, seed)
    cfg = _config(tmp_path, "nosuch")
    before = [sha256(p) for p in sorted(tmp_path.glob("mem*.nc"))]
    with pytest.raises(ConfigError, match=r"^io.mode: unknown mode 'nosuch' \(one of files, "
                                          r"shuffle\)$"):
        run_analysis(cfg, MPI.COMM_SELF)
    assert [sha256(p) for p in sorted(tmp_path.glob("mem*.nc"))] == before
