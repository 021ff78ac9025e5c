"""``ensio bench ioserver --model fortran``: the Fortran twin writes what the Python model writes.

One tiny run of the benchmark with the Fortran stencil model (2 model ranks, server
mode MPMD with one ``ensio ioserver`` rank) and one with the Python model (1 rank:
another decomposition, so the Fortran halo exchange is checked too). Every output
mode's file of the Fortran model must equal the Python model's, variable for variable
and bitwise (values, time axis, coordinates, attributes; the history names the time),
and its history must name the mode that ran. Nothing is asserted about the times.
The bench writes float32 (``precision: 4``); one more run with ``precision: 8`` checks
the float64 numbers themselves, on odd sizes (one longitude, one level).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import needs
import netCDF4
import pytest
import yaml
from ioclient_support import MPIEXEC, TIMEOUT, assert_same_files

from ensio.bench.ioserver import IOServerBenchSettings
from ensio.errors import ConfigError
from ensio.models.stencil import iodef
from ensio.models.stencilf import stencil_argv

#: NY odd: the model's initial state is symmetric about the equator, and 2 ranks must
#: split rows 4 + 3 (not at the equator) for a wrong halo row to show in the files.
NX, NY, NZ, FIELDS, EVERY, STEPS, SWEEPS = 12, 7, 3, 2, 2, 5, 2
OUTPUT_MODES = ("sync", "attached", "server1")

pytestmark = [needs.tools_mark("gfortran"), needs.mark(needs.venv_tool, "mpicc")]


def _bench(tmp: Path, model: str, ranks: int) -> tuple[subprocess.CompletedProcess, Path]:
    argv = [sys.executable, "-m", "ensio", "bench", "ioserver", "--model", model,
            "--ranks", str(ranks), "--nx", str(NX), "--ny", str(NY), "--nz", str(NZ),
            "--fields", str(FIELDS), "--every", str(EVERY), "--steps", str(STEPS),
            "--sweeps", str(SWEEPS), "--repeat", "1", "--servers", "1",
            "--workdir", str(tmp / model), "--json", str(tmp / f"{model}.json")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    return res, tmp / model


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    needs.mpiexec()  # the benchmark launches the one next to the interpreter
    tmp = tmp_path_factory.mktemp("bench-ioserver-fortran")
    fortran, fwork = _bench(tmp, "fortran", 2)
    assert fortran.returncode == 0, fortran.stdout[-2000:] + fortran.stderr[-3000:]
    python, pwork = _bench(tmp, "python", 1)
    assert python.returncode == 0, python.stderr[-3000:]
    return fwork, pwork


@pytest.mark.mpi
def test_fortran_run_reports_every_mode_and_names_the_model(runs):
    fwork, _ = runs
    data = json.loads((fwork.parent / "fortran.json").read_text())
    assert data["model"] == "fortran" and data["settings"]["model"] == "fortran"
    assert [r["mode"] for r in data["rows"]] == ["none", *OUTPUT_MODES]
    assert [r["processes"] for r in data["rows"]] == [2, 2, 2, 3]  # MPMD: + 1 ensio ioserver
    assert not (fwork / "none-0" / "output").exists()  # the baseline writes nothing
    server = json.loads((fwork / "server1-0" / "result.json").read_text())
    assert server["model"] == "fortran" and server["model_ranks"] == 2
    assert server["report"]["files_written"] == 1


@pytest.mark.mpi
@pytest.mark.parametrize("mode", OUTPUT_MODES)
def test_fortran_files_equal_the_python_model_files(runs, mode):
    fwork, pwork = runs
    got = sorted((fwork / f"{mode}-0" / "output").glob("*.nc"))
    want = sorted((pwork / f"{mode}-0" / "output").glob("*.nc"))
    assert [p.name for p in got] == [p.name for p in want] and len(want) == 1, (got, want)
    assert_same_files(got[0], want[0])
    with netCDF4.Dataset(got[0]) as ds:
        assert f"mode {mode.rstrip('1')})" in ds.history  # the config's mode ran
        assert len(ds["time_instant"]) == STEPS // EVERY


@pytest.mark.mpi
@pytest.mark.parametrize(("nx", "ny", "nz"), [(5, 7, 3), (1, 3, 1)])
def test_fortran_float64_numbers_equal_numpys(runs, tmp_path, nx, ny, nz):
    fwork, _ = runs
    exe = fwork / "fortran" / "bin" / "ensio-stencil-f"  # what the bench built
    out = {}
    for who in ("fortran", "python"):
        cfg = tmp_path / f"{who}.yaml"
        body = iodef(nx, ny, nz, 2, 3, "sync", 1, str(tmp_path / who), precision=8)
        cfg.write_text(yaml.safe_dump({"ioserver": body}))
        sizes = dict(nx=nx, ny=ny, nz=nz, fields=2, steps=7, sweeps=3)
        argv = ([MPIEXEC, "-n", "2", *stencil_argv(exe, cfg, json_path=tmp_path / "f.json",
                                                     **sizes)] if who == "fortran" else
                [MPIEXEC, "-n", "1", sys.executable, "-m", "ensio", "model", "stencil",
                 "--iodef", str(cfg), "--mode", "sync", "--json", str(tmp_path / "p.json"),
                 *(f"--{k}={v}" for k, v in sizes.items())])
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out[who] = sorted((tmp_path / who).glob("*.nc"))
    assert len(out["python"]) == 1 and len(out["fortran"]) == 1, out
    with netCDF4.Dataset(out["python"][0]) as ds:
        assert ds["f00"].dtype == "f8" and ds["f00"].shape == (2, nz, ny, nx)
    assert_same_files(out["fortran"][0], out["python"][0])


def test_unknown_model_is_a_config_error():
    with pytest.raises(ConfigError, match="model: expected one of python, fortran, got 'c'"):
        IOServerBenchSettings(model="c")
