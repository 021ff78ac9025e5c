"""Restarts from Fortran (issue 27 item 4): write_restart / read_restart in every mode.

tests/data/ioclient/model_restart.F90 reads its box of a restart (read_restart) and
writes it back (write_restart, a copy of a template). A restart of random values is
read and written by 4 Fortran ranks in latitude bands, and what they wrote is read and
written again by 3 ranks in longitude bands (the remapping both ways): both files hold
the input's variables bitwise, and everything else of the template (auxiliary variable,
attributes). The 4-rank file equals, variable for variable, the one a Python model
writes through ``Client.read_restart`` / ``Client.write_restart`` in the same run
layout, which is the Python API's file format. The C twin (model_restart.c, starts
and shapes in C order) reads and writes the Fortran ranks' file the same way.
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
    assert_bitwise,
    assert_same_files,
    build,
    compile_model,
    raw_variables,
    run_job,
    write_config,
)

pytestmark = [needs.tools_mark("gfortran"), needs.mark(needs.venv_tool, "mpicc"),
              needs.mark(needs.venv_tool, "mpiexec")]

NLEV, NLAT, NLON = 3, 11, 16
VARIABLES = ("state", "sst", "kind")

_PY_TWIN = f"""
import sys
from mpi4py import MPI
from ensio.ioserver import start
config, split, src, template, out = sys.argv[1:6]
client = start(MPI.COMM_WORLD, config, context="restart")
if client is not None:
    with client:
        p, r = client.comm.size, client.comm.rank
        i0, ni, j0, nj = 0, {NLON}, 0, {NLAT}
        if split == "lat":
            j0 = r * {NLAT} // p
            nj = (r + 1) * {NLAT} // p - j0
        else:
            i0 = r * {NLON} // p
            ni = (r + 1) * {NLON} // p - i0
        boxes = {{"state": ((0, j0, i0), ({NLEV}, nj, ni)), "sst": ((j0, i0), (nj, ni)),
                  "kind": ((j0, i0), (nj, ni))}}
        got = client.read_restart(src, boxes)
        client.write_restart(out, {{k: (boxes[k][0], got[k]) for k in boxes}},
                             template=template)
        client.close()
"""


def _restart(path: Path, rng: np.random.Generator | None) -> None:
    """Random state/sst/kind (zeros for a template), an auxiliary variable, attributes."""
    with netCDF4.Dataset(path, "w") as ds:
        for name, n in (("lev", NLEV), ("lat", NLAT), ("lon", NLON)):
            ds.createDimension(name, n)
        shapes = {"state": ("f8", ("lev", "lat", "lon")), "sst": ("f4", ("lat", "lon")),
                  "kind": ("i4", ("lat", "lon"))}
        for name, (dtype, dims) in shapes.items():
            v = ds.createVariable(name, dtype, dims)
            shape = tuple(len(ds.dimensions[d]) for d in dims)
            if rng is None:
                v[...] = np.zeros(shape, dtype)
            elif dtype == "i4":
                v[...] = rng.integers(-2**31, 2**31 - 1, shape, dtype=np.int32)
            else:
                v[...] = rng.standard_normal(shape).astype(dtype)
            v.long_name = f"{name} of the test restart"
        ds.createVariable("aux", "f8", ("lat",))[:] = np.linspace(-80.0, 80.0, NLAT)
        ds.title = "restart template" if rng is None else "restart input"
        ds.member = 7


_BAD_START = """
program bad_start
  use ensio_ioclient
  implicit none
  real(8) :: a(2, 3, 4)
  integer :: world, comm, ierr
  character(len=256) :: config
  call get_command_argument(1, config)
  call ensio_ioclient_mpi_init()
  world = ensio_ioclient_comm_world()
  call ensio_ioclient_init(world, "bad", comm, config=trim(config))
  call ensio_ioclient_restart_begin("x.nc", "t.nc")
  a = 0
  call ensio_ioclient_restart_put("state", [0, 0], a, ierr)
  print "(a, i0, 1x, a)", "ERR ", ierr, ensio_ioclient_errmsg()
  call ensio_ioclient_read_restart("t.nc", "state", [0, 0, 0, 0], a, ierr)
  print "(a, i0, 1x, a)", "ERR ", ierr, ensio_ioclient_errmsg()
  call ensio_ioclient_finalize()
  call ensio_ioclient_mpi_finalize()
end program bad_start
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The Fortran model, its C twin and the bad-start program, compiled against the client."""
    tmp = tmp_path_factory.mktemp("ioclient-restart")
    r = build(tmp / "prefix")
    c_model = tmp / "model_restart_c"
    subprocess.run([str(r.mpicc), "-Wall", "-Werror", str(DATA / "model_restart.c"), "-o",
                    str(c_model), *r.c_flags.split()], check=True, timeout=120)
    bad = tmp / "bad_start.f90"
    bad.write_text(_BAD_START)
    subprocess.run([str(r.fc), str(bad), "-o", str(tmp / "bad_start"), *r.fortran_flags.split()],
                   check=True, timeout=120, cwd=tmp)
    return (compile_model(r, "model_restart.F90", tmp / "model_restart"), c_model,
            tmp / "bad_start")


@pytest.fixture
def model(built) -> Path:
    return built[0]


@pytest.fixture
def files(tmp_path, rng) -> tuple[Path, Path]:
    src, template = tmp_path / "input.nc", tmp_path / "template.nc"
    _restart(src, rng)
    _restart(template, None)
    return src, template


def _check_restart(out: Path, src: Path, template: Path) -> None:
    """``out`` = template with the input's variables, bitwise."""
    got, want, tmpl = raw_variables(out), raw_variables(src), raw_variables(template)
    assert list(got) == list(tmpl)
    for name in VARIABLES:
        assert_bitwise(got[name][0], want[name][0], f"{out.name}:{name}")
    assert_bitwise(got["aux"][0], tmpl["aux"][0], "aux")
    with netCDF4.Dataset(out) as o:
        assert (o.title, int(o.member)) == ("restart template", 7)


@pytest.mark.parametrize("mode", ["server", "attached", "sync"])
def test_written_by_4_fortran_ranks_read_back_by_3_bitwise(model, files, tmp_path, mode):
    src, template = files
    config = write_config(tmp_path / f"{mode}.yaml", mode)
    out4, out3 = tmp_path / "by4" / "restart.nc", tmp_path / "by3.nc"
    first = run_job([str(model), str(config), "lat", str(src), str(template), str(out4)], 4,
                    config, mode)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count("DONE") == 4, first.stdout
    _check_restart(out4, src, template)
    second = run_job([str(model), str(config), "lon", str(out4), str(template), str(out3)], 3,
                     config, mode)
    assert second.returncode == 0, second.stdout + second.stderr
    _check_restart(out3, src, template)
    if mode == "server":  # the Python API's file for the same layout
        twin = tmp_path / "twin.py"
        twin.write_text(_PY_TWIN)
        py_out = tmp_path / "python.nc"
        proc = run_job([sys.executable, str(twin), str(config), "lat", str(src),
                        str(template), str(py_out)], 4, config, mode)
        assert proc.returncode == 0, proc.stderr
        assert_same_files(out4, py_out)


@pytest.mark.parametrize("mode", ["server", "sync"])
def test_c_model_reads_and_writes_the_fortran_ranks_restart(built, files, tmp_path, mode):
    model, c_model, _ = built
    src, template = files
    config = write_config(tmp_path / f"{mode}.yaml", mode)
    by_fortran, by_c = tmp_path / "fortran.nc", tmp_path / "c.nc"
    proc = run_job([str(model), str(config), "lat", str(src), str(template), str(by_fortran)],
                   4, config, mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_job([str(c_model), str(config), "lon", str(by_fortran), str(template),
                    str(by_c)], 3, config, mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("DONE") == 3
    _check_restart(by_c, src, template)


def test_a_missing_variable_is_one_line_naming_file_and_variable(model, tmp_path, rng):
    src, template = tmp_path / "input.nc", tmp_path / "template.nc"
    _restart(template, None)
    with netCDF4.Dataset(src, "w") as ds:  # no 'state'
        ds.createDimension("lat", NLAT)
    config = write_config(tmp_path / "attached.yaml", "attached")
    out = tmp_path / "out.nc"
    proc = run_job([str(model), str(config), "lat", str(src), str(template), str(out)], 2,
                   config, "attached")
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if "no variable 'state'" in x]
    assert lines and str(src) in lines[0], proc.stderr
    assert not out.exists()


def test_python_read_restart_reads_any_box_as_stored(files, tmp_path):
    """Client.read_restart's reader against netCDF4 slicing of the file (no MPI)."""
    from ensio.ioserver.restart import RestartError, read_restart_blocks

    src, _ = files
    want = raw_variables(src)
    got = read_restart_blocks(src, {"state": ((1, 2, 3), (2, 5, 7)), "kind": ((0, 0), (0, 4))})
    assert_bitwise(got["state"], want["state"][0][1:3, 2:7, 3:10], "state box")
    assert got["kind"].shape == (0, 4) and got["kind"].dtype == np.int32
    with pytest.raises(RestartError, match=r"outside sst"):
        read_restart_blocks(src, {"sst": ((10, 0), (2, 16))})
    with pytest.raises(RestartError, match="cannot read"):
        read_restart_blocks(tmp_path / "nope.nc", {"sst": ((0, 0), (1, 1))})


def test_fortran_start_of_the_wrong_length_is_an_error_naming_the_variable(built, tmp_path):
    config = write_config(tmp_path / "attached.yaml", "attached")
    proc = run_job([str(built[2]), str(config)], 1, config, "attached")
    assert proc.returncode == 0, proc.stderr
    errors = [x for x in proc.stdout.splitlines() if x.startswith("ERR ")]
    assert errors == [
        "ERR 1 ensio_ioclient_restart_put: state: start has 2 indices for a 3-d block on rank 0",
        "ERR 1 ensio_ioclient_read_restart: state: start has 4 indices for a 3-d block "
        "on rank 0"], proc.stdout
