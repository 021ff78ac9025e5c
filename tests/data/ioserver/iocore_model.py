"""Model (and server) program of the server-core tests, run under mpiexec.

usage: iocore_model.py CONFIG OUTDIR SCENARIO [--server] [--set k=v ...]

Every rank calls ``ensio.ioserver.start`` with a recording sink (server
ranks) and a fixed rule of when fields are needed; model ranks send fields
given by closed formulas on an irregular decomposition with a mask, so the
test can check the server's global arrays against the formulas.
Scenarios: ok, bad_field, bad_shape, raise, kill, empty, sink_fails (the last
server's sink raises at step 3).
"""

import os
import pickle
import signal
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ensio import ioserver
from ensio.ioserver.configload import load_ioserver_config
from ensio.ioserver.protocol import Header, Kind, encode

NI, NJ, NK, STEPS = 7, 5, 3, 6
SCENARIO = sys.argv[3] if len(sys.argv) > 3 else "ok"
#: Irregular rectangles [j0, nj, i0, ni] per number of model ranks.
DECOMP = {
    1: [(0, 5, 0, 7)],
    2: [(0, 2, 0, 7), (2, 3, 0, 7)],
    3: [(0, 2, 0, 4), (0, 2, 4, 3), (2, 3, 0, 7)],
    4: [(0, 2, 0, 4), (0, 2, 4, 3), (2, 3, 0, 2), (2, 3, 2, 5)],
}


def lon(i):
    return 10.0 * i + 5.0


def lat(j):
    return -40.0 + 20.0 * j


def mask(j, i):
    return (i + 2 * j) % 5 != 0


def tas(step, j, i):
    return 250.0 + step + 0.5 * j + 0.01 * i


def ta(step, k, j, i):
    return 1000.0 * (k + 1) + step + 0.5 * j + 0.01 * i


def pr(step, j, i):
    return step * 1e-3 + j * 1e-4 + i * 1e-5


def periods(cfg, files):
    """Fixed rule: pr every 2nd step, the others every step (when the server has files)."""
    if files is not None and not files:
        return {f: () for f in cfg.sources}
    return {f: (2,) if f == "pr" else (1,) for f in cfg.sources}


class Recorder:
    """A sink that keeps everything it is given and pickles it at close."""

    nbytes = 0

    def __init__(self, cfg, files, geometry, out_dir, history):
        self.path = Path(out_dir) / f"record-{MPI.COMM_WORLD.rank}.pkl"
        self.rec = {"files": list(files), "history": history, "push": {}, "advance": [],
                    "finish": None, "closed": False,
                    "geometry": {k: {a: getattr(g, a) for a in
                                     ("lon", "lat", "lon_bounds", "lat_bounds", "area", "mask")}
                                 for k, g in geometry.items()}}
        self._dump()

    def _dump(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(self.rec))
        tmp.replace(self.path)

    def push(self, field_id, step, data):
        assert (field_id, step) not in self.rec["push"], (field_id, step)
        self.rec["push"][(field_id, step)] = np.array(data)
        self._dump()

    def advance(self, step):
        world = MPI.COMM_WORLD
        if SCENARIO == "sink_fails" and step == 3 and world.rank == world.size - 1:
            raise OSError(28, "No space left on device")
        self.rec["advance"].append(step)
        self._dump()

    def finish(self, last_step):
        self.rec["finish"] = last_step

    def close(self):
        self.rec["closed"] = True
        self._dump()

        class Stats:
            bytes_written = 1000
            files = ["a.nc"]

        return Stats()


def model(client, scenario):
    comm = client.comm
    if scenario == "empty":
        empty_rank(client)
        return
    j0, nj, i0, ni = DECOMP[comm.size][comm.rank]
    jj, ii = np.meshgrid(np.arange(j0, j0 + nj), np.arange(i0, i0 + ni), indexing="ij")
    kk = np.arange(NK)[:, None, None]
    with client:
        client.set_domain("atm", ibegin=i0, ni=ni, jbegin=j0, nj=nj,
                          lon=lon(np.arange(i0, i0 + ni)), lat=lat(np.arange(j0, j0 + nj)),
                          mask=mask(jj, ii))
        client.close_definition()
        for step in range(1, STEPS + 1):
            client.update_timestep(step)
            if scenario == "raise" and step == 4 and comm.rank == comm.size - 1:
                raise RuntimeError("boom in the model")
            if scenario == "kill" and step == 4 and comm.rank == comm.size - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if scenario == "bad_field" and step == 3 and comm.rank == 1:
                link = client.transport  # bypass the client's own check: the server's
                link._post(encode(Header(Kind.FIELD, step=step, name="nosuch"),
                                  np.zeros((nj, ni))), link.servers)
            if scenario == "bad_shape" and step == 3 and comm.rank == 1:
                client.transport.send("tas", step, np.zeros((nj, ni + 1)))
            client.send("tas", tas(step, jj, ii).astype(np.float32))
            client.send("ta", ta(step, kk, jj, ii))
            if client.is_active("pr"):
                client.send("pr", pr(step, jj, ii))
        report = client.close()
    rep = comm.gather(report, root=0)
    if comm.rank == 0:
        out = Path(sys.argv[2]) / "reports.pkl"
        out.write_bytes(pickle.dumps(rep))


def empty_rank(client):
    """3 model ranks; rank 1 has no part of the domain and sends nothing (server mode)."""
    comm = client.comm
    rects = [(0, 5, 0, 4), None, (0, 5, 4, 3)]
    with client:
        if rects[comm.rank] is not None:
            j0, nj, i0, ni = rects[comm.rank]
            jj, ii = np.meshgrid(np.arange(j0, j0 + nj), np.arange(i0, i0 + ni), indexing="ij")
            client.set_domain("atm", ibegin=i0, ni=ni, jbegin=j0, nj=nj,
                              lon=lon(np.arange(i0, i0 + ni)),
                              lat=lat(np.arange(j0, j0 + nj)), mask=mask(jj, ii))
        client.close_definition()
        for step in range(1, STEPS + 1):
            client.update_timestep(step)
            if rects[comm.rank] is None:
                continue
            client.send("tas", tas(step, jj, ii).astype(np.float32))
            client.send("ta", ta(step, np.arange(NK)[:, None, None], jj, ii))
            if client.is_active("pr"):
                client.send("pr", pr(step, jj, ii))
        client.close()


def main():
    cfg_path, out_dir, scenario = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    rest = sys.argv[4:]
    role = "server" if "--server" in rest else "model"
    overrides = [rest[i + 1] for i, a in enumerate(rest) if a == "--set"]
    cfg = load_ioserver_config(cfg_path, [f"ioserver.output_dir={out_dir}", *overrides])
    client = ioserver.start(MPI.COMM_WORLD, cfg, context="test", role=role,
                            sink_factory=Recorder, periods=periods)
    if client is not None:
        model(client, scenario)


if __name__ == "__main__":
    main()
