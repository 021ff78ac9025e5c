"""A real computing model for the I/O server: 3-D diffusion on a lon/lat/level grid.

Why a stencil and not a sleep: the output cost of seed 002 (2 % with XIOS
against 23 % for sequential output) is the cost seen by a model that computes,
communicates halos and competes for memory bandwidth while the servers write.

One sweep on ``T[k, j, i]`` (``nz`` levels, ``ny`` latitude rows, ``nx``
longitudes) is ``T ← T + κ (∇²_h T + ½ ∇²_z T) + 10⁻³ sin(0.01 n)`` at step ``n``,
with κ = :data:`KAPPA`:

* ``∇²_h T = T[j-1] + T[j+1] + T[i-1] + T[i+1] − 4 T``, periodic in longitude
  and closed at the poles: the row beyond the first (last) latitude is a
  mirror of it, so no heat crosses a pole;
* ``∇²_z T = T[k-1] + T[k+1] − 2 T``, closed at the top and bottom levels the
  same way (a missing level counts as ``T[k]``): one level alone does not diffuse.

The rows are decomposed over the model ranks in contiguous blocks, exchanging
one halo row with each neighbour per sweep. Every ``every`` steps the model
sends ``fields`` 3-D fields (field ``i`` is ``T × (1 + 0.01 i)``) and the 2-D
surface field ``sfc`` (the first level) through :mod:`ensio.ioserver`.

Run it under ``mpiexec``: ``ensio model stencil --iodef FILE ...``
(``--mode none`` runs without any output, the baseline of ``ensio bench ioserver``);
:func:`run` is the same from Python. Its :class:`RunResult` (model rank 0)
holds the wall time of the time loop including the final ``close()`` (which
waits for the servers to finish writing) and the client report.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..parallel.distribution import RowDistribution

__all__ = ["KAPPA", "MODES", "RunResult", "StencilModel", "StencilSettings", "field_ids",
           "iodef", "latitudes", "longitudes", "run"]

KAPPA = 0.1

#: ``none`` runs without output (the baseline); the others need an iodef, whose mode is used.
MODES = ("none", "server", "attached", "sync")


@dataclass(frozen=True)
class StencilSettings:
    """One run of the stencil model, resolved once (what ``ensio model stencil`` parses).

    ``mode`` says whether there is output at all: with an output mode the I/O
    server runs as ``iodef``'s ``ioserver.mode`` says, and the result names
    that mode (the benchmark writes both the same).
    """

    iodef: Path | None = None
    mode: str = "server"
    nx: int = 128
    ny: int = 64
    nz: int = 16
    fields: int = 4
    steps: int = 96
    sweeps: int = 4

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode != "none" and self.iodef is None:
            raise ConfigError(f"iodef: required unless mode is none (mode is {self.mode})")
        for key in ("nx", "ny", "nz", "steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}: must be at least 1, got {getattr(self, key)}")
        for key in ("fields", "sweeps"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}: must be at least 0, got {getattr(self, key)}")


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
        """The initial state (a wave in longitude, cooler with height) on this rank's rows.

        Every rank needs a row: a rank without one would have no halo to exchange
        and its neighbours would wait for it.
        """
        if ny < comm.size:
            raise ConfigError(f"ny: {ny} latitude rows for {comm.size} model ranks; "
                              "every model rank needs at least one row")
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
    """What model rank 0 reports of a run (``ensio model stencil --json``)."""

    mode: str
    model_ranks: int
    steps: int
    seconds: float
    seconds_in_output_calls: float  # every ensio call, close() included
    seconds_in_close: float  # close(): waits for the servers to write the last output
    report: dict[str, Any] | None


def run(world: Any, settings: StencilSettings) -> RunResult | None:
    """Run the model on this process of ``world`` (collective).

    Returns the result on model rank 0, else ``None`` (other model ranks, and
    server ranks after the servers have written everything). A model rank that
    fails aborts the I/O server, so the servers close the files and end the job
    instead of waiting for a client that is gone.
    """
    if settings.mode == "none":
        return _time_loop(world, settings, None)
    from .. import ioserver

    client = ioserver.start(world, settings.iodef)
    if client is None:
        return None  # a server rank: the loop ran inside start()
    with client:
        return _time_loop(client.comm, settings, client)


def _time_loop(comm: Any, st: StencilSettings, client: Any) -> RunResult | None:
    """Build, integrate ``st.steps`` steps sending the output, close; timed on every rank."""
    from mpi4py import MPI

    model = StencilModel.build(st.nx, st.ny, st.nz, comm)
    ids = field_ids(st.fields)
    if client is not None:
        client.set_domain("dom", ibegin=0, ni=st.nx, jbegin=model.j0, nj=model.nj,
                          lon=longitudes(st.nx),
                          lat=latitudes(st.ny)[model.j0:model.j0 + model.nj])
        client.close_definition()
    comm.Barrier()
    t_start = time.perf_counter()
    in_calls = 0.0
    for n in range(1, st.steps + 1):
        if client is not None:
            c = time.perf_counter()
            client.update_timestep(n)
            in_calls += time.perf_counter() - c
        model.step(comm, n, st.sweeps)
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
    mode = "none" if client is None else client.cfg.mode  # what ran, whatever the label
    return RunResult(mode, comm.Get_size(), st.steps, seconds, in_calls + in_close,
                     in_close, report)
