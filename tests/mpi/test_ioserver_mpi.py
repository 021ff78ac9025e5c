"""ioserver server and sync modes in-process, on every rank of ``mpiexec -n 2`` / ``-n 4``.

The last rank becomes the server (``ioserver.servers: 1``); the model ranks
send the closed-form fields of tests/data/ioserver/iocore_model.py on its irregular
decomposition; the server's recording sink must hold the global arrays the
formulas give on the global grid.
"""

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from ensio import ioserver
from ensio.ioserver.configload import load_ioserver_config

DATA = Path(__file__).parent.parent / "data" / "ioserver"
sys.path.insert(0, str(DATA))
import iocore_model as M  # noqa: E402


def _run_model(client):
    comm = client.comm
    j0, nj, i0, ni = M.DECOMP[comm.size][comm.rank]
    jj, ii = np.meshgrid(np.arange(j0, j0 + nj), np.arange(i0, i0 + ni), indexing="ij")
    with client:
        client.set_domain("atm", ibegin=i0, ni=ni, jbegin=j0, nj=nj,
                          lon=M.lon(np.arange(i0, i0 + ni)), lat=M.lat(np.arange(j0, j0 + nj)),
                          mask=M.mask(jj, ii))
        client.close_definition()
        for step in range(1, M.STEPS + 1):
            client.update_timestep(step)
            client.send("tas", M.tas(step, jj, ii))
            client.send("ta", M.ta(step, np.arange(M.NK)[:, None, None], jj, ii))
            if client.is_active("pr"):
                client.send("pr", M.pr(step, jj, ii))
        return client.close()


def _check_record(path):
    rec = pickle.loads(path.read_bytes())
    assert rec["closed"] and rec["finish"] == M.STEPS
    j, i = np.meshgrid(np.arange(M.NJ), np.arange(M.NI), indexing="ij")
    assert len(rec["push"]) == 2 * M.STEPS + M.STEPS // 2
    for (f, s), data in rec["push"].items():
        if f == "ta":
            want = M.ta(s, np.arange(M.NK)[:, None, None], j, i)
        else:
            want = {"tas": M.tas, "pr": M.pr}[f](s, j, i)
        np.testing.assert_array_equal(data, want, err_msg=f"{f} step {s}")
    np.testing.assert_array_equal(rec["geometry"]["atm"]["mask"], M.mask(j, i))


@pytest.mark.parametrize("mode", ["server", "sync"])
def test_modes_in_process(comm, shared_dir, mode):
    if mode == "server" and comm.size < 2:  # CI runs -n 2 and -n 4: never skipped there
        pytest.skip("server mode needs a model rank and a server rank")
    cfg = load_ioserver_config(DATA / "iocore.yaml", [
        f"ioserver.output_dir={shared_dir}", f"ioserver.mode={mode}"])
    client = ioserver.start(comm, cfg, context="mpi-test", sink_factory=M.Recorder,
                            periods=M.periods)
    writer = comm.size - 1 if mode == "server" else 0
    if client is None:
        assert comm.rank == writer
    else:
        report = _run_model(client)
        assert report.files_written == 1 and report.bytes_written == 1000
        assert report.bytes_sent > 0 and report.blocked_seconds >= 0
    comm.Barrier()
    if comm.rank == writer:
        _check_record(shared_dir / f"record-{writer}.pkl")


def test_real_files_identical_in_every_mode(comm, shared_dir):
    import netCDF4

    modes = ["sync", "attached"] + (["server"] if comm.size > 1 else [])
    for mode in modes:
        cfg = load_ioserver_config(DATA / "iocore.yaml", [
            f"ioserver.output_dir={shared_dir / mode}", f"ioserver.mode={mode}"])
        client = ioserver.start(comm, cfg, context="mpi-test")
        if client is not None:
            report = _run_model(client)
            assert report.files_written == 2
        comm.Barrier()
    if comm.rank != 0:
        return
    names = sorted(p.name for p in (shared_dir / "sync").glob("*.nc"))
    assert names == ["surface.nc", "upper.nc"]
    for mode in modes[1:]:
        assert sorted(p.name for p in (shared_dir / mode).glob("*.nc")) == names
        for name in names:
            with netCDF4.Dataset(shared_dir / "sync" / name) as a, \
                    netCDF4.Dataset(shared_dir / mode / name) as b:
                for var, v in a.variables.items():
                    np.testing.assert_array_equal(v[:], b.variables[var][:],
                                                  err_msg=f"{mode} {name} {var}")
