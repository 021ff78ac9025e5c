"""``ensio bench io``: result keys, baselines, verification, CLI and mpiexec run.

No timing assertions: only that every figure exists and is positive, that the
benchmark leaves the data unchanged, and that a wrong reader is caught.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import needs
import netCDF4
import numpy as np
import pytest
from mpi4py import MPI
from rich.console import Console

from ensio.bench.io import bench_io, raw_ranges, result_table
from ensio.bench.machine import describe_machine, machine_markdown
from ensio.cli.bench import main as bench_main
from ensio.config import Config, load_config
from ensio.models.synthetic import SyntheticSpec, write_synthetic

TOP_KEYS = ("throughput_gbps", "raw_gbps", "naive_gbps", "ratio_raw", "ratio_naive")
DIR_KEYS = ("gbps", "seconds", "raw_gbps", "naive_gbps", "ratio_raw", "ratio_naive")


def _real_io() -> Any:
    return importlib.import_module("ensio.io.modes.ensemble")


def _case(tmp_path: Path, **kw: Any) -> Config:
    spec = SyntheticSpec(**{"nx": 24, "ny": 12, "members": 3, "seed": 2, **kw})
    return load_config(write_synthetic(tmp_path, spec).config)


def _state_and_aux(config: Config) -> list[dict[str, np.ndarray]]:
    out = []
    for path in config.member_paths():
        with netCDF4.Dataset(path) as ds:
            ds.set_auto_maskandscale(False)
            out.append({n: np.asarray(ds[n][:]).copy() for n in ("state", "aux")})
    return out


def _check_result(res: dict[str, Any], config: Config, n_mpi: int = 1) -> None:
    for key in TOP_KEYS:
        assert res[key] is not None and res[key] > 0, key
    for d in ("read", "write"):
        for key in DIR_KEYS:
            assert res[d][key] is not None and res[d][key] > 0, f"{d}.{key}"
        assert set(res[d]["breakdown"]) >= {"reading", "writing", "communication", "waiting"}
    assert res["n_mpi"] == n_mpi and res["members"] == config.ensemble.size
    assert res["per_file_us"] > 0 and res["metadata_seconds"] > 0
    assert res["files"] == config.ensemble.size and res["tiled"] is False
    assert res["state_bytes"] > 0 and res["journal"] is config.io.journal
    assert res["verified"] is True
    assert res["machine"]["cpu_model"] and res["machine"]["memory_bytes"] > 0
    assert res["timestamp"]
    json.dumps(res)  # serialisable as is


# ----------------------------------------------------------------- stand-in I/O


@dataclass
class _Stats:
    state_bytes: int
    total_seconds: float = 1e-3
    read_seconds: float = 1e-3
    write_seconds: float = 0.0
    comm_seconds: float = 0.0
    wait_seconds: float = 0.0
    journal_seconds: float = 0.0


def _stub_layout(paths: list[Path], ensemble: Any) -> SimpleNamespace:
    with netCDF4.Dataset(paths[0]) as ds:
        variables, offset = [], 0
        for spec in ensemble.variables:
            var = ds[spec.name]
            size = int(np.prod(var.shape))
            variables.append(SimpleNamespace(name=spec.name, shape=var.shape, offset=offset,
                                             size=size, active=None, itemsize=var.dtype.itemsize))
            offset += size
    return SimpleNamespace(variables=variables, n_rows=offset)


class _StubIO:
    """A serial stand-in for the ensemble-I/O object: netCDF4 reads, optional corruption."""

    n_io = 1

    def __init__(self, paths: Any, ensemble: Any, io: Any, comm: MPI.Comm,
                 corrupt: bool = False) -> None:
        self.paths, self.corrupt = list(paths), corrupt
        self.layout = _stub_layout(self.paths, ensemble)
        self.stats: _Stats | None = None

    def __enter__(self) -> _StubIO:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.paths = []

    def read(self, out: Any = None, overlap: bool = True) -> SimpleNamespace:
        layout = self.layout
        data = np.empty((len(self.paths), layout.n_rows))
        for m, path in enumerate(self.paths):
            with netCDF4.Dataset(path) as ds:
                for v in layout.variables:
                    data[m, v.offset : v.offset + v.size] = np.asarray(ds[v.name][:]).ravel()
        if self.corrupt:
            data[0, 0] += 1.0
        nbytes = sum(v.size * v.itemsize for v in layout.variables) * len(self.paths)
        self.stats = _Stats(state_bytes=nbytes)
        return SimpleNamespace(layout=layout, start=0, count=layout.n_rows, data=data)

    def write(self, block: Any, overlap: bool = True, journal: bool | None = None) -> _Stats:
        assert self.stats is not None
        self.stats = _Stats(state_bytes=self.stats.state_bytes, write_seconds=1e-3)
        return self.stats


def _stub_opener(corrupt: bool = False) -> Any:
    return lambda paths, ensemble, io, comm: _StubIO(paths, ensemble, io, comm, corrupt)


def test_baselines_with_stand_in_io(tmp_path: Path) -> None:
    config = _case(tmp_path)
    before = _state_and_aux(config)
    res = bench_io(config, MPI.COMM_SELF, repeat=2, opener=_stub_opener())
    _check_result(res, config)
    assert res["raw_bytes"] == res["state_bytes"] == 3 * 24 * 12 * 8
    assert all(len(v) == 2 for v in res["samples_seconds"].values())
    after = _state_and_aux(config)
    for b, a in zip(before, after, strict=True):  # raw and naive writes are identities
        for name in ("state", "aux"):
            assert a[name].tobytes() == b[name].tobytes()


def test_wrong_reader_is_not_verified(tmp_path: Path) -> None:
    config = _case(tmp_path)
    res = bench_io(config, MPI.COMM_SELF, repeat=1, opener=_stub_opener(corrupt=True))
    assert res["verified"] is False


def test_raw_ranges_cover_state_variables(tmp_path: Path) -> None:
    config = _case(tmp_path, format="cdf5", dtype="float32", levels=2)
    raw = raw_ranges(config.member_paths(), [v.name for v in config.ensemble.variables])
    assert raw is not None and len(raw.ranges) == 3
    for path, rs in zip(raw.paths, raw.ranges, strict=True):
        ((off, n),) = rs
        assert n == 2 * 12 * 24 * 4
        with netCDF4.Dataset(path) as ds:
            expect = np.asarray(ds["state"][:]).astype(">f4").tobytes()
        with open(path, "rb") as f:
            f.seek(off)
            assert f.read(n) == expect  # classic files are big-endian on disk


def test_result_table_and_machine_markdown(tmp_path: Path) -> None:
    config = _case(tmp_path)
    res = bench_io(config, MPI.COMM_SELF, repeat=1, opener=_stub_opener())
    out = io.StringIO()
    Console(file=out, width=80).print(result_table(res))
    text = out.getvalue()
    for label in ("ensio GB/s", "raw limit GB/s", "naive GB/s", "ensio / raw", "communication"):
        assert label in text
    md = machine_markdown(describe_machine(tmp_path))
    assert "CPU:" in md and "File system:" in md


# ------------------------------------------------------------ real implementation


@pytest.mark.parametrize(
    ("fmt", "dtype", "journal"),
    [("netcdf4", "float64", True), ("cdf5", "float32", False)],
)
def test_bench_io_real_serial(tmp_path: Path, fmt: str, dtype: str, journal: bool) -> None:
    ens = _real_io()
    _case(tmp_path, format=fmt, dtype=dtype)
    config = load_config(tmp_path / "ensio.yaml", [f"io.journal={str(journal).lower()}"])
    before = _state_and_aux(config)
    res = bench_io(config, MPI.COMM_SELF, repeat=1, opener=ens.open_ensemble)
    _check_result(res, config)
    assert res["n_io"] == 1
    assert res["quick_checked"] == 1.0  # every member: same structure as member 1
    after = _state_and_aux(config)
    for b, a in zip(before, after, strict=True):
        for name in ("state", "aux"):
            assert a[name].tobytes() == b[name].tobytes()


def test_bench_io_tiled_members(tmp_path: Path) -> None:
    """Tiled members: per-tile cost reported, no naive scheme, tiles unchanged."""
    from tiles_support import PATTERN, tile_case

    from ensio.layout.tiles import declared_geometry

    _real_io()
    _case(tmp_path, format="cdf5")
    geo = declared_geometry((12, 24), 4, (2, 2), 1)
    tile_case(tmp_path, geo, 3)
    config = load_config(tmp_path / "ensio.yaml", [
        f"ensemble.members={PATTERN}", "ensemble.tiles={count: 4, layout: [2, 2], halo: 1}",
        "io.journal=false"])  # fmt: skip
    tiles = sorted((tmp_path / "tiles").glob("*.nc"))
    before = [p.read_bytes() for p in tiles]
    res = bench_io(config, MPI.COMM_SELF, repeat=1)
    assert res["tiled"] is True and res["files"] == 12 and res["per_file_us"] > 0
    assert res["naive_gbps"] is None and res["verified"] is None
    assert res["state_bytes"] == 3 * 12 * 24 * 8
    assert res["raw_bytes"] > res["state_bytes"]  # the raw limit moves the halos too
    assert res["throughput_gbps"] > 0 and res["raw_gbps"] > 0
    assert [p.read_bytes() for p in tiles] == before
    out = io.StringIO()
    Console(file=out, width=100).print(result_table(res))
    assert "12 tile files" in out.getvalue() and "per-file µs" in out.getvalue()


def test_cli_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _real_io()
    config = _case(tmp_path)
    out = tmp_path / "res" / "io.json"
    rc = bench_main(["io", str(tmp_path / "ensio.yaml"), "--repeat", "1", "--json", str(out),
                     "--set", "io.journal=false"])
    assert rc == 0
    res = json.loads(out.read_text())
    _check_result(res, load_config(tmp_path / "ensio.yaml", ["io.journal=false"]))
    assert res["overrides"] == ["io.journal=false"]
    assert "ensio GB/s" in capsys.readouterr().out
    assert config.ensemble.size == res["members"]


def test_cli_unknown_key_is_one_line_error(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _case(tmp_path)
    rc = bench_main(["io", str(tmp_path / "ensio.yaml"), "--set", "io.bogus=1"])
    assert rc != 0
    err = capsys.readouterr().err.strip()
    assert "io.bogus" in err and len(err.splitlines()) == 1


@pytest.mark.mpi
def test_bench_io_under_mpiexec(tmp_path: Path) -> None:
    _real_io()
    mpiexec = str(needs.mpiexec(path_fallback=True))
    _case(tmp_path, members=4)
    out = tmp_path / "io.json"
    cmd = [mpiexec, "-n", "2", sys.executable, "-m", "ensio.cli.bench", "io",
           str(tmp_path / "ensio.yaml"), "--repeat", "1", "--json", str(out)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    _check_result(data, load_config(tmp_path / "ensio.yaml"), n_mpi=2)
    assert data["n_io"] == 2


def test_cli_missing_member_is_one_line_error(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _case(tmp_path)
    (tmp_path / "mem002.nc").unlink()
    rc = bench_main(["io", str(tmp_path / "ensio.yaml"), "--repeat", "1"])
    assert rc != 0
    err = capsys.readouterr().err.strip()
    assert "mem002.nc" in err and len(err.splitlines()) == 1
