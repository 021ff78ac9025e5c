"""A real computing model for the I/O server: 3-D diffusion on a lon/lat/level grid.

Why a stencil and not a sleep: the output cost of seed 002 (2 % with XIOS
against 23 % for sequential output) is the cost seen by a model that computes,
communicates halos and competes for memory bandwidth while the servers write.
The model integrates ``T ← T + κ ∇²T + forcing`` (periodic in longitude, closed
at the poles, levels coupled) on ``(nz, ny, nx)`` points decomposed over the
model ranks by latitude rows, exchanging one halo row with each neighbour per
sweep. Every ``every`` steps it sends ``fields`` 3-D fields (``T`` scaled) and
the 2-D surface field ``sfc`` through :mod:`ensio.ioserver`.

Run it under ``mpiexec``: ``python -m ensio.models.stencil --iodef FILE ...``
(``--mode none`` runs without any output, the baseline of ``ensio bench ioserver``).
The JSON it writes (rank 0) holds the wall time of the time loop including the
final ``close()`` (which waits for the servers to finish writing) and the
client report.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..parallel.distribution import RowDistribution

__all__ = ["StencilModel", "field_ids", "iodef", "main"]

KAPPA = 0.1


@dataclass
class StencilModel:
    """This rank's rows ``[j0, j0 + nj)`` of the global ``(nz, ny, nx)`` temperature.

    ``t`` has one halo row on each side: shape ``(nz, nj + 2, nx)``.
    """

    nx: int
    ny: int
    nz: int
    j0: int
    nj: int
    t: np.ndarray
    _lap: np.ndarray | None = None
    _vert: np.ndarray | None = None
    _out: np.ndarray | None = None

    @classmethod
    def build(cls, nx: int, ny: int, nz: int, comm: Any) -> StencilModel:
        dist = RowDistribution.of(ny, comm)
        j0, nj = int(dist.start), int(dist.count)
        lat = np.deg2rad(latitudes(ny)[j0:j0 + nj])
        lon = np.deg2rad(longitudes(nx))
        lev = np.arange(nz)[:, None, None]
        t = np.empty((nz, nj + 2, nx))
        t[:, 1:-1] = 280.0 + 20.0 * np.cos(lat)[None, :, None] * np.cos(lon)[None, None, :] \
            - 5.0 * lev
        return cls(nx, ny, nz, j0, nj, t)

    def step(self, comm: Any, n: int, sweeps: int = 1) -> None:
        """``sweeps`` diffusion sweeps with halo exchange (one per sweep).

        In place, into buffers allocated once: temporaries of this size would make
        every sweep page-fault fresh memory from the kernel, and how often the
        allocator returns memory depends on what else the process allocated (the I/O
        client's buffers), which would make the no-output baseline the slow run.
        """
        if self._lap is None:
            self._lap = np.empty_like(self.t[:, 1:-1])
            self._vert = np.empty_like(self._lap)
        lap, vert = self._lap, self._vert
        for _ in range(sweeps):
            self._halo(comm)
            t = self.t
            inner = t[:, 1:-1]
            np.add(t[:, :-2], t[:, 2:], out=lap)
            lap[..., 1:] += inner[..., :-1]
            lap[..., :1] += inner[..., -1:]
            lap[..., :-1] += inner[..., 1:]
            lap[..., -1:] += inner[..., :1]
            np.multiply(inner, 4.0, out=vert)
            lap -= vert
            vert.fill(0.0)
            if self.nz > 1:
                vert[1:] += inner[:-1]
                vert[1:] -= inner[1:]
                vert[:-1] += inner[1:]
                vert[:-1] -= inner[:-1]
            vert *= 0.5
            lap += vert
            lap *= KAPPA
            inner += lap
            inner += 1e-3 * np.sin(0.01 * n)

    def _halo(self, comm: Any) -> None:
        rank, size = comm.Get_rank(), comm.Get_size()
        t = self.t
        up = rank - 1 if rank > 0 else None
        down = rank + 1 if rank < size - 1 else None
        # closed boundaries: mirror the edge row where there is no neighbour
        if self.nj == 0:
            return
        if up is None:
            t[:, 0] = t[:, 1]
        if down is None:
            t[:, -1] = t[:, -2]
        from mpi4py import MPI

        null = MPI.PROC_NULL
        send_first = np.ascontiguousarray(t[:, 1])
        send_last = np.ascontiguousarray(t[:, -2])
        recv_last = np.empty_like(send_last)
        recv_first = np.empty_like(send_first)
        comm.Sendrecv(send_first, dest=null if up is None else up,
                      recvbuf=recv_last, source=null if down is None else down)
        comm.Sendrecv(send_last, dest=null if down is None else down,
                      recvbuf=recv_first, source=null if up is None else up)
        if down is not None:
            t[:, -1] = recv_last
        if up is not None:
            t[:, 0] = recv_first

    def field(self, i: int) -> np.ndarray:
        """Output field ``i``: this rank's part ``(nz, nj, nx)``, in a reused buffer
        (the I/O client copies what it is given)."""
        if self._out is None:
            self._out = np.empty_like(self.t[:, 1:-1])
        return np.multiply(self.t[:, 1:-1], 1.0 + 0.01 * i, out=self._out)

    def surface(self) -> np.ndarray:
        return self.t[0, 1:-1]


def longitudes(nx: int) -> np.ndarray:
    return (np.arange(nx) + 0.5) * 360.0 / nx


def latitudes(ny: int) -> np.ndarray:
    return -90.0 + (np.arange(ny) + 0.5) * 180.0 / ny


def field_ids(fields: int) -> list[str]:
    return [f"f{i:02d}" for i in range(fields)]


def iodef(nx: int, ny: int, nz: int, fields: int, every: int, mode: str, servers: int,
          output_dir: str, *, operation: str = "instant", precision: int = 4,
          compression: int = 1) -> dict[str, Any]:
    """The ``ioserver:`` section the benchmark writes: ``fields`` 3-D fields every ``every`` steps.

    A model time step is 15 minutes, so ``every = 24`` is a 6-hourly output. The
    file is netCDF-4 with zlib ``compression`` (level 1 by default, what climate
    output usually gets): compressing is the post-processing the sync mode pays
    on the model's time and the servers hide.
    """
    fdefs = [{"id": f, "name": f, "units": "K", "standard_name": "air_temperature",
              "long_name": f"temperature field {i}"} for i, f in enumerate(field_ids(fields))]
    fdefs.append({"id": "sfc", "name": "tas", "grid": "g2d", "units": "K",
                  "standard_name": "air_temperature", "long_name": "surface temperature"})
    minutes = 15 * every
    return {
        "mode": mode, "servers": servers, "output_dir": output_dir,
        "calendar": {"type": "noleap", "start": "2000-01-01 00:00:00", "timestep": "15mi"},
        "axes": [{"id": "lev", "n": nz, "name": "lev", "units": "1", "long_name": "model level",
                  "positive": "down"}],
        "domains": [{"id": "dom", "type": "rectilinear", "ni_glo": nx, "nj_glo": ny}],
        "grids": [{"id": "g3d", "domain": "dom", "axis": "lev"}, {"id": "g2d", "domain": "dom"}],
        "field_groups": [{"id": "model", "grid": "g3d", "operation": operation,
                          "precision": precision, "fields": fdefs}],
        "files": [{"id": "out", "name": "stencil_{start:%Y%m%d%H%M}",
                   "output_freq": f"{minutes}mi", "compression": compression,
                   "fields": [{"field_ref": f} for f in [*field_ids(fields), "sfc"]]}],
    }


@dataclass
class RunResult:
    mode: str
    model_ranks: int
    steps: int
    seconds: float
    seconds_in_output_calls: float  # every ensio call, close() included
    seconds_in_close: float  # close(): waits for the servers to write the last output
    report: dict[str, Any] | None


def run(args: argparse.Namespace) -> RunResult | None:
    """Run the model on this process; returns the result on model rank 0, else ``None``."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    client = None
    comm = world
    if args.mode != "none":
        from .. import ioserver

        client = ioserver.start(world, args.iodef)
        if client is None:
            return None  # a server rank: the loop ran inside start()
        comm = client.comm
    model = StencilModel.build(args.nx, args.ny, args.nz, comm)
    ids = field_ids(args.fields)
    if client is not None:
        client.set_domain("dom", ibegin=0, ni=args.nx, jbegin=model.j0, nj=model.nj,
                          lon=longitudes(args.nx),
                          lat=latitudes(args.ny)[model.j0:model.j0 + model.nj])
        client.close_definition()
    comm.Barrier()
    t_start = time.perf_counter()
    in_calls = 0.0
    for n in range(1, args.steps + 1):
        if client is not None:
            c = time.perf_counter()
            client.update_timestep(n)
            in_calls += time.perf_counter() - c
        model.step(comm, n, args.sweeps)
        if client is None:
            continue
        c = time.perf_counter()
        for i, fid in enumerate(ids):
            if client.is_active(fid, n):
                client.send(fid, model.field(i))
        if client.is_active("sfc", n):
            client.send("sfc", model.surface())
        in_calls += time.perf_counter() - c
    report = None
    in_close = 0.0
    if client is not None:
        c = time.perf_counter()
        rep = client.close()
        in_close = time.perf_counter() - c
        report = asdict(rep) if hasattr(rep, "__dataclass_fields__") else dict(rep)
    comm.Barrier()
    seconds = time.perf_counter() - t_start
    in_calls = comm.allreduce(in_calls, op=MPI.MAX)
    in_close = comm.allreduce(in_close, op=MPI.MAX)
    if comm.Get_rank() != 0:
        return None
    return RunResult(args.mode, comm.Get_size(), args.steps, seconds, in_calls + in_close,
                     in_close, report)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ensio.models.stencil", description=__doc__)
    p.add_argument("--iodef", type=Path, help="YAML with the ioserver: section")
    p.add_argument("--mode", default="server", choices=("none", "server", "attached", "sync"),
                   help="none: no output at all (the baseline); else the iodef's mode is used")
    p.add_argument("--nx", type=int, default=128)
    p.add_argument("--ny", type=int, default=64)
    p.add_argument("--nz", type=int, default=16)
    p.add_argument("--fields", type=int, default=4)
    p.add_argument("--steps", type=int, default=96)
    p.add_argument("--sweeps", type=int, default=4, help="diffusion sweeps per time step")
    p.add_argument("--json", type=Path, default=None, help="result (model rank 0)")
    args = p.parse_args(argv)
    if args.mode != "none" and args.iodef is None:
        p.error("--iodef is required unless --mode none")
    res = run(args)
    if res is not None and args.json is not None:
        args.json.write_text(json.dumps(asdict(res), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
