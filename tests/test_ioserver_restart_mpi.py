"""Dedicated restart writers under mpiexec: the synthetic model's restarts via the servers.

`ensio model synthrun --ioserver IODEF` on P model ranks (rows of the state
spread by RowDistribution) plus S server ranks must write the same member
files — every variable, every attribute — as the serial `ensio model
synthrun` on the same input (the independent reference, itself checked
against ``np.roll`` of the input); so must the attached and sync modes. A
block outside the variable ends the job with an error naming the model rank
and the file, and leaves no file (whole or partial) behind.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import yaml

MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))
ENSIO = str(Path(sys.executable).with_name("ensio"))
NLEV, NLAT, NLON = 2, 11, 16

_SCRIPT = f"""
import sys
import numpy as np
from mpi4py import MPI
from ensio.ioserver import start
iodef, template, out, how = sys.argv[1:5]
bad = how == "bad"
client = start(MPI.COMM_WORLD, iodef, context="test")
if client is not None:
    with client:
        p, r = client.comm.size, client.comm.rank
        if how == "die" and r == 0:
            raise SystemExit(client.close() and 0)  # rank 0 never sends its blocks
        rows = np.array_split(np.arange({NLAT}), p)[r]
        j0 = int(rows[0]) + (5 if bad and r == 1 else 0)
        block = np.full(({NLEV}, rows.size, {NLON}), float(r), dtype="f4")
        client.write_restart(out, {{"state": ((0, j0, 0), block)}}, template=template)
        if how == "die":
            raise RuntimeError("the model blew up")
        report = client.close()
    if r == 0:
        print("REPORT", report.files_written, report.bytes_written, flush=True)
"""


def _run(argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _iodef(tmp: Path, mode: str, servers: int = 1) -> Path:
    path = tmp / f"iodef-{mode}-{servers}.yaml"
    path.write_text(yaml.safe_dump({"ioserver": {
        "mode": mode, "servers": servers, "client_buffer_mb": 1,
        "output_dir": str(tmp / "diag")}}))
    return path


def _member(path: Path, rng: np.random.Generator, member: int) -> None:
    """A restart with a 3-D float32 state, an auxiliary variable and attributes."""
    with netCDF4.Dataset(path, "w") as ds:
        for name, n in (("lev", NLEV), ("lat", NLAT), ("lon", NLON)):
            ds.createDimension(name, n)
        ds.createVariable("lon", "f8", ("lon",))[:] = np.arange(NLON) * 360.0 / NLON
        ds.createVariable("lat", "f8", ("lat",))[:] = np.linspace(-80, 80, NLAT)
        v = ds.createVariable("state", "f4", ("lev", "lat", "lon"))
        v[...] = rng.standard_normal((NLEV, NLAT, NLON))
        v.long_name = "synthetic state"
        a = ds.createVariable("aux", "f8", ("lat", "lon"))
        a[...] = rng.standard_normal((NLAT, NLON))
        ds.member = member
        ds.description = "test member"


def _inputs(tmp: Path, rng: np.random.Generator) -> tuple[list[Path], int]:
    inits = [tmp / "init" / f"mem{m:03d}.nc" for m in (1, 2)]
    inits[0].parent.mkdir()
    for m, p in enumerate(inits, start=1):
        _member(p, rng, m)
    return inits, int(rng.integers(1, NLON))


def _serial(tmp: Path, inits: list[Path], shift: int) -> list[Path]:
    outs = [tmp / "serial" / p.name for p in inits]
    proc = _run([ENSIO, "model", "synthrun", "--init", *map(str, inits),
                 "--out", *map(str, outs), "--shift", str(shift)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    for init, out in zip(inits, outs, strict=True):  # the reference, checked on its own
        with netCDF4.Dataset(init) as a, netCDF4.Dataset(out) as b:
            np.testing.assert_array_equal(b["state"][...], np.roll(a["state"][...], shift, -1))
    return outs


def _assert_same_file(got: Path, want: Path) -> None:
    with netCDF4.Dataset(got) as g, netCDF4.Dataset(want) as w:
        assert {k: g.getncattr(k) for k in g.ncattrs()} == {k: w.getncattr(k)
                                                           for k in w.ncattrs()}
        assert list(g.variables) == list(w.variables)
        for name, wv in w.variables.items():
            gv = g[name]
            assert gv.dtype == wv.dtype and gv.dimensions == wv.dimensions
            assert {k: gv.getncattr(k) for k in gv.ncattrs()} == {
                k: wv.getncattr(k) for k in wv.ncattrs()}
            gv.set_auto_maskandscale(False)
            wv.set_auto_maskandscale(False)
            np.testing.assert_array_equal(gv[...], wv[...], err_msg=name)


def _synthrun(tmp: Path, nprocs: int, iodef: Path, inits: list[Path], shift: int,
              label: str) -> list[Path]:
    outs = [tmp / label / p.name for p in inits]
    proc = _run([MPIEXEC, "-n", str(nprocs), ENSIO, "model", "synthrun", "--ioserver",
                 str(iodef), "--init", *map(str, inits), "--out", *map(str, outs),
                 "--shift", str(shift), "--sleep", "0.1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in outs[0].parent.iterdir()) == sorted(p.name for p in outs)
    return outs


@pytest.mark.parametrize(("models", "servers"), [(2, 1), (3, 2)])
def test_server_mode_restarts_equal_the_serial_model(tmp_path, rng, models, servers):
    inits, shift = _inputs(tmp_path, rng)
    want = _serial(tmp_path, inits, shift)
    got = _synthrun(tmp_path, models + servers, _iodef(tmp_path, "server", servers), inits,
                    shift, "server")
    for g, w in zip(got, want, strict=True):
        _assert_same_file(g, w)


@pytest.mark.parametrize("mode", ["sync", "attached"])
def test_sync_and_attached_modes_write_the_same_restarts(tmp_path, rng, mode):
    inits, shift = _inputs(tmp_path, rng)
    want = _serial(tmp_path, inits, shift)
    got = _synthrun(tmp_path, 3, _iodef(tmp_path, mode), inits, shift, mode)
    for g, w in zip(got, want, strict=True):
        _assert_same_file(g, w)


@pytest.mark.parametrize(("mode", "nprocs"), [("server", 3), ("server", 4), ("sync", 2),
                                              ("attached", 3)])
def test_report_counts_the_restart(tmp_path, rng, mode, nprocs):
    template = _inputs(tmp_path, rng)[0][0]
    script = tmp_path / "model.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "out" / "r.nc"
    servers = 2 if nprocs == 4 else 1
    proc = _run([MPIEXEC, "-n", str(nprocs), sys.executable, str(script),
                 str(_iodef(tmp_path, mode, servers)), str(template), str(out), "ok"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("REPORT"))
    assert line.split()[1:] == ["1", str(NLEV * NLAT * NLON * 4)]
    models = nprocs - servers if mode == "server" else nprocs
    want = np.repeat(np.arange(models), [len(a) for a in np.array_split(np.arange(NLAT),
                                                                       models)])
    with netCDF4.Dataset(out) as ds, netCDF4.Dataset(template) as tp:
        np.testing.assert_array_equal(ds["state"][...],
                                      np.broadcast_to(want[None, :, None], (NLEV, NLAT, NLON)))
        np.testing.assert_array_equal(ds["aux"][...], tp["aux"][...])


@pytest.mark.parametrize(("mode", "nprocs"), [("server", 3), ("sync", 2)])
def test_a_block_outside_the_variable_names_rank_and_file_and_writes_nothing(
        tmp_path, rng, mode, nprocs):
    template = _inputs(tmp_path, rng)[0][0]
    script = tmp_path / "model.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "out" / "bad.nc"
    out.parent.mkdir()
    proc = _run([MPIEXEC, "-n", str(nprocs), sys.executable, str(script),
                 str(_iodef(tmp_path, mode)), str(template), str(out), "bad"])
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.startswith("ensio ioserver:")]
    assert lines, proc.stderr[-3000:]
    assert "model rank 1" in lines[0] and str(out) in lines[0] and "outside" in lines[0]
    assert list(out.parent.iterdir()) == []


def test_a_rank_that_fails_mid_restart_ends_the_job_naming_the_unwritten_restart(tmp_path, rng):
    template = _inputs(tmp_path, rng)[0][0]
    script = tmp_path / "model.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "out" / "r.nc"
    out.parent.mkdir()
    proc = _run([MPIEXEC, "-n", "3", sys.executable, str(script),
                 str(_iodef(tmp_path, "server")), str(template), str(out), "die"])
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.startswith("ensio ioserver:")]
    assert lines, proc.stderr[-3000:]
    assert "model rank 1" in lines[0] and "the model blew up" in lines[0]
    assert f"restarts not written: {out}" in lines[0]
    assert list(out.parent.iterdir()) == []


def test_ensio_cycle_takes_its_forecast_files_from_the_restart_writers(tmp_path):
    """examples/synthetic with the commented member_command = the default command's cycle."""
    import os

    example = Path(__file__).parents[1] / "examples" / "synthetic"
    raw = yaml.safe_load((example / "cycle.yaml").read_text())
    raw["ensemble"]["size"] = 3
    raw["workflow"].update(jobs=1, setup=raw["workflow"]["setup"].replace(
        "--nx 180 --ny 90", "--nx 24 --ny 12"))
    runs = {}
    for label, prefix in (("serial", ""), ("server", f"{MPIEXEC} -n 3 ")):
        io = f" --ioserver {example / 'iodef.yaml'}" if prefix else ""
        raw["workflow"]["member_command"] = (
            f"{prefix}{ENSIO} model synthrun{io} --init {{analysis}} --out {{forecast}} "
            "--shift 2")
        cfg = tmp_path / f"{label}.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        env = dict(os.environ, PATH=f"{Path(ENSIO).parent}{os.pathsep}{os.environ['PATH']}")
        proc = subprocess.run([ENSIO, "cycle", str(cfg), "--workdir", str(tmp_path / label),
                               "--cycles", "2"], capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[label] = tmp_path / label
    files = sorted(p.relative_to(runs["serial"]) for p in runs["serial"].glob("cycle_*/*/mem*.nc"))
    assert len(files) == 2 * 2 * 3
    for rel in files:
        _assert_same_file(runs["server"] / rel, runs["serial"] / rel)
