"""Every mode from Fortran (issue 27 item 4): the mode comes from the config.

tests/data/ioclient/model_modes.F90 (3 ranks in unequal latitude bands, a land mask,
cell areas, a 2-D real(8) and a 3-D real(4) field) is run with one config in server
mode (MPMD with ``ensio ioserver``), attached and sync (no server ranks: the client
runs the Python client in the model process). Its files must equal, variable for
variable and bitwise (values, time axis, bounds, attributes), the files of the same
model written in Python through ``ensio.ioserver.start`` in server mode, the Python
API's files; and the instant file holds the formula itself (an independent numpy
evaluation), fill where the mask says land.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
from ioclient_support import (
    DATA,
    assert_same_files,
    build,
    compile_model,
    run_job,
    write_config,
)

pytestmark = [needs.tools_mark("gfortran"), needs.mark(needs.venv_tool, "mpicc"),
              needs.mark(needs.venv_tool, "mpiexec")]

NI, NJ, NK, NSTEPS, NPROC = 24, 12, 3, 6, 3

#: The output definition: every step instant, 3-hourly average/maximum/global mean.
BODY = {
    "calendar": {"type": "noleap", "start": "2001-02-27 00:00:00", "timestep": "1h"},
    "axes": [{"id": "lev", "n": NK, "name": "lev", "units": "1", "values": [1, 2, 3]}],
    "domains": [{"id": "atm", "type": "rectilinear", "ni_glo": NI, "nj_glo": NJ}],
    "grids": [{"id": "g2", "domain": "atm"}, {"id": "g3", "domain": "atm", "axis": "lev"}],
    "fields": [{"id": "tas", "grid": "g2", "units": "K"},
               {"id": "ta", "grid": "g3", "units": "K"}],
    "files": [
        {"id": "inst", "name": "inst", "output_freq": "1ts",
         "fields": [{"field_ref": "tas", "operation": "instant"},
                    {"field_ref": "ta", "operation": "instant"}]},
        {"id": "avg", "name": "avg", "output_freq": "3h",
         "fields": [{"field_ref": "tas", "operation": "average"},
                    {"field_ref": "tas", "name": "tasmax", "operation": "maximum"},
                    {"field_ref": "ta", "operation": "average"},
                    {"field_ref": "tas", "name": "tas_gm", "operation": "average",
                     "mean": "global"}]},
    ],
}

#: The Fortran model's twin through the Python API (same grid, parts and numbers).
_PY_TWIN = f"""
import sys
import numpy as np
from mpi4py import MPI
from ensio.ioserver import start
config, nsteps = sys.argv[1], int(sys.argv[2])
NI, NJ, NK = {NI}, {NJ}, {NK}
client = start(MPI.COMM_WORLD, config, context="modes")
if client is not None:
    r, p = client.comm.rank, client.comm.size
    jb = sum(1 + 2 * q for q in range(r))
    nj = NJ - jb if r == p - 1 else 1 + 2 * r
    i = np.arange(NI, dtype=float)
    j = np.arange(jb, jb + nj, dtype=float)
    lon = (i + 0.5) * 15.0
    lat = -90.0 + (j + 0.5) * 15.0
    jj, ii = np.meshgrid(j, i, indexing="ij")
    land = (jj >= 2) & (jj < 4) & (ii >= 5) & (ii < 9)
    client.set_domain("atm", ibegin=0, ni=NI, jbegin=jb, nj=nj, lon=lon, lat=lat,
                      lon_bounds=np.stack([lon - 7.5, lon + 7.5], axis=1),
                      lat_bounds=np.stack([lat - 7.5, lat + 7.5], axis=1),
                      mask=~land, area=1.0 + jj)
    client.close_definition()
    k = np.arange(NK, dtype=float)[:, None, None]
    for s in range(1, nsteps + 1):
        client.update_timestep(s)
        if client.is_active("tas"):
            client.send("tas", 1000.0 * s + 10.0 * jj + ii + 0.25)
        if client.is_active("ta"):
            client.send("ta", (0.5 + 1000.0 * s + 100.0 * k + 10.0 * jj + ii).astype("f4"))
    client.close()
"""


#: tests/data/ioclient/model_f.f90's grids (see test_ioserver_cclient.py) as a config.
DOMAINS_BODY = {
    "calendar": {"type": "standard", "start": "2000-01-01 00:00:00", "timestep": "1h"},
    "axes": [{"id": "lev", "n": 3, "name": "lev", "units": "1", "values": [1, 2, 3]}],
    "domains": [{"id": "atm", "type": "rectilinear", "ni_glo": 8, "nj_glo": 6},
                {"id": "cells", "type": "unstructured", "ni_glo": 10, "nvertex": 3},
                {"id": "ocn", "type": "curvilinear", "ni_glo": 4, "nj_glo": 3}],
    "grids": [{"id": "atm2d", "domain": "atm"},
              {"id": "atm3d", "domain": "atm", "axis": "lev"},
              {"id": "cells1d", "domain": "cells"}, {"id": "ocn2d", "domain": "ocn"}],
    "fields": [{"id": f, "grid": g} for f, g in (("tas", "atm2d"), ("ta", "atm3d"),
                                                  ("cu", "cells1d"), ("pr", "atm2d"),
                                                  ("sst", "ocn2d"))],
    "files": [
        {"id": "a", "name": "atm", "output_freq": "1ts",
         "fields": [{"field_ref": "tas", "operation": "instant"},
                    {"field_ref": "tas", "name": "tas_gm", "operation": "instant",
                     "mean": "global"}]},
        {"id": "b", "name": "ta", "output_freq": "2ts",
         "fields": [{"field_ref": "ta", "operation": "instant"}]},
        {"id": "c", "name": "cells", "output_freq": "2ts",
         "fields": [{"field_ref": "cu", "operation": "average"}]},
        {"id": "d", "name": "ocn", "output_freq": "1ts",
         "fields": [{"field_ref": "sst", "operation": "instant"}]},
    ],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """The Python API's output (server mode) and the Fortran model's in each mode."""
    tmp = tmp_path_factory.mktemp("ioclient-modes")
    model = compile_model(build(tmp / "prefix"), "model_modes.F90", tmp / "model_modes")
    twin = tmp / "twin.py"
    twin.write_text(_PY_TWIN)
    cfg = write_config(tmp / "python.yaml", "server", BODY)
    proc = run_job([sys.executable, str(twin), str(cfg), str(NSTEPS)], NPROC, cfg, "server")
    assert proc.returncode == 0, proc.stderr
    outs = {}
    for mode in ("server", "attached", "sync"):
        cfg = write_config(tmp / f"{mode}.yaml", mode, BODY)
        proc = run_job([str(model), str(cfg), str(NSTEPS)], NPROC, cfg, mode)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.count("REPORT") == NPROC, proc.stdout
        outs[mode] = tmp / f"out-{mode}"
    return tmp / "out-python", outs


@pytest.mark.parametrize("mode", ["server", "attached", "sync"])
def test_fortran_files_equal_the_python_api_files(runs, mode):
    python, outs = runs
    names = sorted(p.name for p in python.iterdir())
    assert names == ["avg.nc", "inst.nc"]
    assert sorted(p.name for p in outs[mode].iterdir()) == names
    for name in names:
        assert_same_files(outs[mode] / name, python / name)
    with netCDF4.Dataset(outs[mode] / "inst.nc") as ds:
        assert f"mode {mode}" in ds.history


def test_the_instant_file_is_the_formula(runs):
    """Independent of the code under test: numpy's evaluation of the model's formula."""
    _, outs = runs
    j, i = np.meshgrid(np.arange(NJ), np.arange(NI), indexing="ij")
    land = (j >= 2) & (j < 4) & (i >= 5) & (i < 9)
    steps = np.arange(1, NSTEPS + 1)[:, None, None]
    tas = 1000.0 * steps + 10.0 * j + i + 0.25
    ta = (0.5 + 1000.0 * steps[:, None] + 100.0 * np.arange(NK)[None, :, None, None]
          + 10.0 * j + i).astype(np.float32)
    with netCDF4.Dataset(outs["attached"] / "inst.nc") as ds:
        got_tas, got_ta = ds["tas"][...], ds["ta"][...]
        # the middle of each one-step output period (the files' time is centred)
        np.testing.assert_array_equal(ds["time"][:], (steps.ravel() - 0.5) * 3600.0)
    assert np.array_equal(got_tas.mask, np.broadcast_to(land, tas.shape))
    np.testing.assert_array_equal(got_tas.filled(np.nan)[:, ~land], tas[:, ~land])
    np.testing.assert_array_equal(got_ta.filled(np.nan)[..., ~land], ta[..., ~land])


def test_a_server_config_without_server_ranks_is_one_line(runs, tmp_path):
    """mode: server but no `ensio ioserver` in the job: the error says what to do."""
    python, _ = runs
    model = python.parent / "model_modes"
    cfg = write_config(tmp_path / "server.yaml", "server", BODY)
    proc = run_job([str(model), str(cfg), str(NSTEPS)], 2, cfg, "attached")
    assert proc.returncode != 0
    assert "no ioserver ranks" in proc.stderr, proc.stderr


def test_every_domain_type_from_fortran_equals_server_mode(tmp_path):
    """model_f.f90 (rectilinear with bounds, mask and area; curvilinear and unstructured
    with bounds; a halo section; a field no file wants) with init's config argument:
    attached and sync (the embedded path) write server mode's files (the C path)."""
    source = (DATA / "model_f.f90").read_text()
    source = source.replace("  implicit none\n",
                            "  implicit none\n  character(len=512) :: cfg\n", 1)
    source = source.replace('  call ensio_ioclient_init(world, "test", comm)\n',
                            '  call get_command_argument(1, cfg)\n'
                            '  call ensio_ioclient_init(world, "test", comm, config=trim(cfg))\n')
    assert "config=trim(cfg)" in source
    (tmp_path / "model_any.f90").write_text(source)
    r = build(tmp_path / "prefix")
    exe = tmp_path / "model_any"
    subprocess.run([str(r.fc), str(tmp_path / "model_any.f90"), "-o", str(exe),
                    *r.fortran_flags.split()], check=True, timeout=120, cwd=tmp_path,
                   capture_output=True)
    outs = {}
    for mode in ("server", "attached", "sync"):
        cfg = write_config(tmp_path / f"{mode}.yaml", mode, DOMAINS_BODY)
        proc = run_job([str(exe), str(cfg)], 2, cfg, mode)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.count("REPORT") == 2 and proc.stdout.count("ERR unknown") == 2
        outs[mode] = tmp_path / f"out-{mode}"
    names = sorted(p.name for p in outs["server"].iterdir())
    assert names == ["atm.nc", "cells.nc", "ocn.nc", "ta.nc"]
    for mode in ("attached", "sync"):
        for name in names:
            assert_same_files(outs[mode] / name, outs["server"] / name)
