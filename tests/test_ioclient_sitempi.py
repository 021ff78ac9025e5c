"""The client built against a site MPI (Debian's Open MPI, installed by .ci/run).

``ensio ioclient build --mpicc mpicc.openmpi --mpifort mpifort.openmpi`` gives a module
that a model doing ``use mpi`` / ``use mpi_f08`` compiles with, run by Open MPI's own
``mpirun``. Every Python process of such a job uses Open MPI too: mpi4py's wheel picks
its MPI at import, finding the model's library in the embedded interpreter
(attached/sync) and told by ``MPI4PY_LIBMPI=libmpi.so.40`` in the ``ensio ioserver``
processes (server mode). Checked: the modes' files equal the Python API's files (written
with the venv's MPICH), and a restart written by 4 ranks is read back by 3, bitwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import needs
import pytest
from ioclient_support import assert_same_files, build, compile_model, run_job, write_config
from test_ioclient_modes import _PY_TWIN, BODY, NPROC, NSTEPS
from test_ioclient_restart import _check_restart, _restart

pytestmark = [needs.tools_mark("mpicc.openmpi", "mpifort.openmpi", "mpirun.openmpi"),
              needs.mark(needs.venv_tool, "mpiexec")]

MPIRUN = ("mpirun.openmpi", "--oversubscribe")
#: Open MPI as root in a container: allowed, shared memory without CMA, no network.
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
#: The server processes' MPI: Open MPI's library, not the venv's MPICH.
SERVER_ENV = ("-x", "MPI4PY_LIBMPI=libmpi.so.40")


def _site(models: list[str], n: int, config: Path, mode: str):
    return run_job(models, n, config, mode, mpiexec=MPIRUN, server_env=SERVER_ENV,
                   env=OMPI_ENV)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("ioclient-sitempi")
    r = build(tmp / "prefix", mpicc="mpicc.openmpi", mpifort="mpifort.openmpi")
    assert Path(r.fc).name == "mpifort.openmpi" and not r.mpi_link
    return {"modes": compile_model(r, "model_modes.F90", tmp / "modes", "ENSIO_USE_MPI"),
            "restart": compile_model(r, "model_restart.F90", tmp / "restart", "ENSIO_USE_MPI"),
            "restart_f08": compile_model(r, "model_restart.F90", tmp / "restart_f08",
                                         "ENSIO_USE_MPI_F08"),
            "tmp": tmp}


def test_every_mode_under_open_mpi_writes_the_python_api_files(built):
    tmp = built["tmp"]
    twin = tmp / "twin.py"
    twin.write_text(_PY_TWIN)
    cfg = write_config(tmp / "python.yaml", "server", BODY)
    proc = run_job([sys.executable, str(twin), str(cfg), str(NSTEPS)], NPROC, cfg, "server")
    assert proc.returncode == 0, proc.stderr
    for mode in ("server", "attached", "sync"):
        cfg = write_config(tmp / f"{mode}.yaml", mode, BODY)
        proc = _site([str(built["modes"]), str(cfg), str(NSTEPS)], NPROC, cfg, mode)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for name in ("inst.nc", "avg.nc"):
            assert_same_files(tmp / f"out-{mode}" / name, tmp / "out-python" / name)


def test_restart_by_4_use_mpi_ranks_read_back_by_3_mpi_f08_ranks(built, tmp_path, rng):
    src, template = tmp_path / "input.nc", tmp_path / "template.nc"
    _restart(src, rng)
    _restart(template, None)
    out4, out3, out3s = (tmp_path / n for n in ("by4.nc", "by3.nc", "by3-server.nc"))
    cfg = write_config(tmp_path / "attached.yaml", "attached")
    proc = _site([str(built["restart"]), str(cfg), "lat", str(src), str(template), str(out4)],
                 4, cfg, "attached")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_restart(out4, src, template)
    cfg = write_config(tmp_path / "sync.yaml", "sync")
    proc = _site([str(built["restart_f08"]), str(cfg), "lon", str(out4), str(template),
                  str(out3)], 3, cfg, "sync")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_restart(out3, src, template)
    cfg = write_config(tmp_path / "server.yaml", "server")
    proc = _site([str(built["restart"]), str(cfg), "lon", str(out4), str(template),
                  str(out3s)], 3, cfg, "server")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_restart(out3s, src, template)


def test_build_takes_mpicc_and_mpifc_from_the_environment(monkeypatch, tmp_path):
    from ensio.ioserver.build import BuildError, build_client

    monkeypatch.setenv("MPICC", "mpicc.openmpi")
    monkeypatch.setenv("MPIFC", str(tmp_path / "no-such-mpifort"))
    with pytest.raises(BuildError, match=r"MPI Fortran compiler not found: .*no-such-mpifort "
                                         r"\(choose one with --mpifort\)"):
        build_client(tmp_path / "bad")
    monkeypatch.setenv("MPIFC", "mpifort.openmpi")
    r = build_client(tmp_path / "prefix")
    assert (Path(r.mpicc).name, Path(r.fc).name) == ("mpicc.openmpi", "mpifort.openmpi")
    assert "-lmpi" not in r.fortran_flags  # the wrapper links its MPI itself
