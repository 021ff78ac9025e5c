"""``ensio bench ioserver``: one tiny run through the CLI, and :func:`projection`.

The run is checked for what a user relies on (exit code, the JSON keys, every
mode, the kept run directories, the plot) and for the data: the output files
of every mode hold the fields a :class:`StencilModel` run computed here sends.
Nothing is asserted about the times themselves (this machine is shared).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
from mpi4py import MPI

from ensio.bench.ioserver import IOServerBenchSettings, projection
from ensio.models.stencil import StencilModel

NX, NY, NZ, FIELDS, EVERY, STEPS, SWEEPS = 16, 8, 2, 2, 2, 4, 1
STEP_SECONDS = 900  # a model step is 15 minutes
OUTPUT_MODES = ("sync", "attached", "server1")


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    needs.mpiexec()  # the benchmark launches the one next to the interpreter
    tmp = tmp_path_factory.mktemp("bench-ioserver")
    argv = [sys.executable, "-m", "ensio", "bench", "ioserver",
            "--nx", str(NX), "--ny", str(NY), "--nz", str(NZ), "--fields", str(FIELDS),
            "--every", str(EVERY), "--steps", str(STEPS), "--sweeps", str(SWEEPS),
            "--repeat", "1", "--servers", "1", "--workdir", str(tmp / "work"),
            "--json", str(tmp / "out" / "x.json"), "--plot", str(tmp / "x.png")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    return res, tmp


def expected_outputs() -> dict[int, np.ndarray]:
    """The model state after each output step, from the model run here on one process."""
    model = StencilModel.build(NX, NY, NZ, MPI.COMM_SELF)
    states = {}
    for n in range(1, STEPS + 1):
        model.step(MPI.COMM_SELF, n, SWEEPS)
        if n % EVERY == 0:
            states[n] = model.t[:, 1:-1].copy()
    return states


@pytest.mark.mpi
def test_run_reports_every_mode(bench):
    res, tmp = bench
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads((tmp / "out" / "x.json").read_text())
    for key in ("cost_sync", "cost_attached", "cost_server", "cost_server_projected",
                "client_wait_fraction"):
        assert math.isfinite(data[key]), key
    assert [r["mode"] for r in data["rows"]] == ["none", *OUTPUT_MODES]
    assert data["workdir"] == str(tmp / "work")
    png = tmp / "x.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.mpi
def test_run_directories_keep_the_data_the_model_sent(bench):
    res, tmp = bench
    assert res.returncode == 0, res.stderr[-3000:]
    work = tmp / "work"
    assert not (work / "none-0" / "output").exists()  # the baseline writes nothing
    states = expected_outputs()
    assert sorted(states) == [2, 4]
    for mode in OUTPUT_MODES:
        result = json.loads((work / f"{mode}-0" / "result.json").read_text())
        assert result["mode"] == mode.rstrip("1")  # the mode that ran (server1: server)
        files = sorted((work / f"{mode}-0" / "output").glob("*.nc"))
        assert len(files) == 1, (mode, files)
        with netCDF4.Dataset(files[0]) as ds:
            instants = [int(round(t)) for t in ds["time_instant"][:]]
            assert instants == [n * STEP_SECONDS for n in states], mode
            for k, n in enumerate(states):
                for i in range(FIELDS):
                    got = np.ma.getdata(ds[f"f{i:02d}"][k])
                    want = states[n] * (1.0 + 0.01 * i)
                    assert ds[f"f{i:02d}"].dtype == np.float32
                    # precision 4: float32 rounding, half an ulp (2**-24) relative at most
                    np.testing.assert_allclose(got, want, rtol=2.0 ** -24, atol=0,
                                               err_msg=f"{mode} f{i:02d} step {n}")
                np.testing.assert_allclose(np.ma.getdata(ds["tas"][k]), states[n][0],
                                           rtol=2.0 ** -24, atol=0)


# ------------------------------------------------------------------------ projection


def test_projection_is_client_time_plus_the_servers_excess():
    """On dedicated server cores the model pays its non-blocked client time (at least
    the copies) and waits only for the server time beyond its own run time."""
    st = IOServerBenchSettings(nx=10, ny=5, nz=2, fields=3, every=4, steps=20)
    n_out = 5  # 20 steps, an output every 4
    nbytes = 8 * 10 * 5 * (2 * 3 + 1)  # float64: 3 fields of 2 levels and one surface field
    t0 = 2.0
    c_byte = 1e-9
    copy = c_byte * nbytes * n_out
    run = {"seconds": 3.0, "seconds_in_output_calls": 0.75, "seconds_in_close": 0.25,
           "report": {"messages": 40, "blocked_seconds": 0.1, "server_busy_fraction": 0.8}}
    calls = 0.75 - 0.25 - 0.1  # the loop's own client time, not blocked
    busy = 0.8 * 3.0  # 2.4 s of server work against a 2 s run: 0.4 s of waiting
    p = projection(st, t0, run, c_byte)
    assert p["projected_client_seconds"] == pytest.approx(calls)
    assert p["projected_wait_seconds"] == pytest.approx(busy - t0)
    assert p["cost_server_projected"] == pytest.approx((calls + busy - t0) / t0)
    assert p["c_msg_us"] == pytest.approx((calls - copy) / 40 * 1e6)
    assert p["server_seconds_per_output"] == pytest.approx(busy / n_out)
    assert p["model_seconds_per_output"] == pytest.approx(t0 / n_out)
    assert p["c_byte_ns"] == pytest.approx(1.0)


def test_projection_never_below_the_copies_and_no_wait_when_servers_keep_up():
    st = IOServerBenchSettings(nx=100, ny=50, nz=4, fields=2, every=3, steps=10)
    n_out = 3  # steps 3, 6, 9
    nbytes = 8 * 100 * 50 * (4 * 2 + 1)
    c_byte = 1e-6  # copies dearer than the measured client time
    copy = c_byte * nbytes * n_out
    run = {"seconds": 1.5, "seconds_in_output_calls": 0.3, "seconds_in_close": 0.1,
           "report": {"blocked_seconds": 0.05, "server_busy_fraction": 0.2}}  # no "messages"
    assert 0.3 - 0.1 - 0.05 < copy
    t0 = 1.0  # servers busy 0.3 s of it: they keep up
    p = projection(st, t0, run, c_byte)
    assert p["c_msg_us"] == 0.0
    assert p["projected_client_seconds"] == pytest.approx(copy)
    assert p["projected_wait_seconds"] == 0.0
    assert p["cost_server_projected"] == pytest.approx(copy / t0)
