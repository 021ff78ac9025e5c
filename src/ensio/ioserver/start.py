"""``ensio.ioserver.start``: split the world, plan the servers, return a client or serve.

Setup is collective over the world and identical in Python and C (see the
protocol): ``MPI_Allgather`` of one int role, ``MPI_Comm_split`` by role,
``MPI_Comm_dup`` of the world for all ensio traffic. Every server computes the
same plan from the config (files balanced over servers by estimated bytes, the
source fields each server needs), so no server has to tell another; the first
server sends the field table to every model rank.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from mpi4py import MPI

from .client import Client, ServerLink, recv_text
from .config import FieldDef, FileDef, IOServerConfig
from .configload import load_ioserver_config
from .handshake import SetupFailed, announce, exchange_status, one_line
from .pipeline import OutputPipeline, SinkFactory, field_periods
from .protocol import (
    TAG_TABLE,
    VERDICT_ERROR,
    FieldEntry,
    FieldTable,
    IOServerError,
    Status,
    format_table,
    parse_table,
    timestep_seconds,
)

__all__ = ["start", "Plan", "build_plan", "file_weight", "history_line"]

PeriodsFn = Callable[[IOServerConfig, Sequence[str] | None], Mapping[str, tuple[int, ...]]]

_APPROX_SECONDS = {"s": 1, "mi": 60, "h": 3600, "d": 86400, "mo": 30 * 86400, "y": 365 * 86400}


@dataclass(frozen=True)
class Plan:
    """Which files each server writes, and the field table the clients get.

    ``shared`` files (row ranges written by every server, :mod:`.sharedfiles`)
    are in every server's ``files``.
    """

    files: Mapping[int, tuple[str, ...]]
    table: FieldTable
    shared: tuple[str, ...] = ()


def _out_points(cfg: IOServerConfig, fd: FieldDef) -> int:
    shape = cfg.grid_shape(fd.grid)
    levels = shape[0] if cfg.grids[fd.grid].axis else 1
    if fd.mean == "global":
        return levels
    if fd.mean == "zonal":
        d = cfg.domains[cfg.grids[fd.grid].domain]
        return levels * (d.nj_glo if d.type != "unstructured" else 1)
    return int(np.prod(shape))


def file_weight(cfg: IOServerConfig, f: FileDef) -> float:
    """Estimated bytes per second of model time a file receives (for balancing)."""
    per_record = sum(_out_points(cfg, fd) * fd.precision for fd in f.fields if fd.enabled)
    n, unit = int("".join(c for c in f.output_freq if c.isdigit())), f.output_freq.lstrip(
        "0123456789")
    seconds = timestep_seconds(cfg.calendar.timestep) if unit == "ts" else _APPROX_SECONDS[unit]
    return per_record / (n * seconds)


def build_plan(cfg: IOServerConfig, servers: Sequence[int],
               periods: PeriodsFn = field_periods) -> Plan:
    """Greedy balance of files over ``servers`` (largest first to the least loaded).

    Shared files (:func:`.sharedfiles.shared_files`) go to every server.
    """
    from .sharedfiles import shared_files

    shared = shared_files(cfg, len(servers))
    files = sorted((f for f in cfg.enabled_files if f.id not in shared),
                   key=lambda f: (-file_weight(cfg, f), f.id))
    load = {s: 0.0 for s in servers}
    own: dict[int, list[str]] = {s: [] for s in servers}
    for f in files:
        s = min(servers, key=lambda r: (load[r], r))
        load[s] += file_weight(cfg, f)
        own[s].append(f.id)
    for s in servers:
        own[s].extend(shared)
    order = {f.id: i for i, f in enumerate(cfg.files)}
    files_of = {s: tuple(sorted(own[s], key=order.__getitem__)) for s in servers}
    need = {s: periods(cfg, files_of[s]) for s in servers}
    entries = {}
    for fid in cfg.sources:
        users = tuple(s for s in servers if need[s].get(fid))
        steps = sorted({p for s in users for p in need[s][fid]})
        entries[fid] = FieldEntry(cfg.fields[fid].grid, users, tuple(steps))
    cal = cfg.calendar
    table = FieldTable(
        calendar=(cal.type, cal.start, timestep_seconds(cal.timestep)),
        domains={i: (d.type, d.ni_glo, d.nj_glo, d.nvertex or 0) for i, d in cfg.domains.items()},
        axes={i: a.n for i, a in cfg.axes.items()},
        grids={i: (g.domain, g.axis) for i, g in cfg.grids.items()},
        fields=entries,
        timeout_s=cfg.timeout_s,
    )
    return Plan(files_of, table, shared)


def history_line(cfg: IOServerConfig, context: str) -> str:
    """The files' ``history`` attribute."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{now} UTC: written by ensio ioserver (context {context}, mode {cfg.mode})"


def start(world: MPI.Comm, config: IOServerConfig | str | Path, context: str = "model", *,
          role: Literal["model", "server"] = "model", overrides: Iterable[str] = (),
          sink_factory: SinkFactory = OutputPipeline,
          periods: PeriodsFn = field_periods) -> Client | None:
    """Start the I/O server (collective over ``world``).

    Parameters
    ----------
    world : MPI.Comm
        Every process of the job (models and, in server mode, servers).
    config : IOServerConfig or path
        The resolved config, or a YAML file with an ``ioserver:`` section.
    context : str
        A label for the files' history (an XIOS context id).
    role : {"model", "server"}
        ``"server"`` only for the ``ensio ioserver CONFIG`` processes of an MPMD job.
    overrides : iterable of str
        ``key=value`` overrides when ``config`` is a path.
    sink_factory, periods
        The output pipeline and the rule of which steps files need; tests
        replace them with a recording sink.

    Returns
    -------
    Client or None
        A :class:`Client` on model ranks; ``None`` on server ranks, after the
        run ended (every client closed and every file was closed).
    """
    try:
        cfg = config if isinstance(config, IOServerConfig) else load_ioserver_config(
            config, overrides)
    except Exception as exc:  # every rank of the job learns it in the handshake
        try:
            return _start_server_mode(world, None, one_line(exc), context, role,
                                      sink_factory, periods)
        except SetupFailed:
            if role == "server":
                raise
            raise exc from None  # a model rank's own error, as the config reader raised it
    if cfg.mode != "server":
        if role == "server":
            return _start_server_mode(
                world, cfg, f"ioserver.mode is {cfg.mode!r}: ensio ioserver runs only in mode "
                "server (an MPMD job: mpiexec -n P MODEL : -n S ensio ioserver CONFIG); in "
                f"mode {cfg.mode} the model ranks write the files, start the model alone",
                context, role, sink_factory, periods)
        from .attached import start_attached
        from .sync import start_sync

        begin = {"attached": start_attached, "sync": start_sync}[cfg.mode]
        return begin(world, cfg, history_line(cfg, context), sink_factory, periods)
    return _start_server_mode(world, cfg, None, context, role, sink_factory, periods)


def _start_server_mode(world: MPI.Comm, cfg: IOServerConfig | None, problem: str | None,
                       context: str, role: str, sink_factory: SinkFactory,
                       periods: PeriodsFn) -> Client | None:
    """The handshake (:mod:`.handshake`), then serve or return the client.

    ``problem`` is this rank's setup error (then ``cfg`` may be None): every
    rank then raises :class:`~.handshake.SetupFailed`, after one line.
    """
    states = exchange_status(world, role == "server", problem)
    assert cfg is not None  # a rank without config raised in the handshake
    roles = states & Status.SERVER
    if roles.any():
        servers = tuple(int(r) for r in np.flatnonzero(roles))
    elif cfg.servers < world.size:
        servers = tuple(range(world.size - cfg.servers, world.size))
    else:
        raise IOServerError(f"ioserver.servers: {cfg.servers} servers need more than "
                            f"{world.size} processes (no model rank would be left)")
    if len(servers) == world.size:
        raise IOServerError("ioserver: every process is a server, no model rank")
    is_server = world.rank in servers
    sub = world.Split(int(is_server), world.rank)
    iocomm = world.Dup()
    clients = tuple(r for r in range(world.size) if r not in servers)
    if not is_server:
        first = world.rank == clients[0]
        text, _ = recv_text(iocomm, servers[0], TAG_TABLE,
                            (cfg.timeout_s, world.rank, first, "no field table at start"))
        if text.startswith(VERDICT_ERROR):
            announce(world, states, servers[0], text.removeprefix(VERDICT_ERROR))
        link = ServerLink(iocomm, parse_table(text), servers,
                          int(cfg.client_buffer_mb * 2**20), world.rank)
        return Client(cfg, sub, world.rank, link)
    _run_server(cfg, world, states, iocomm, sub, servers, clients, context, sink_factory,
                periods)
    return None


def _run_server(cfg: IOServerConfig, world: MPI.Comm, states: np.ndarray, iocomm: MPI.Comm,
                sub: MPI.Comm, servers: tuple[int, ...], clients: tuple[int, ...], context: str,
                sink_factory: SinkFactory, periods: PeriodsFn) -> None:
    from .serverend import serve

    try:
        plan = build_plan(cfg, servers, periods)
        error = None
    except Exception as exc:  # told to the clients (they would wait for a table forever)
        plan, error = None, f"cannot plan the servers: {one_line(exc)}"
    error = next((e for e in sub.allgather(error) if e is not None), None)
    if world.rank == servers[0]:
        text = bytearray((VERDICT_ERROR + error if error else format_table(plan.table)).encode())
        MPI.Request.Waitall([iocomm.Isend([text, MPI.CHAR], dest=c, tag=TAG_TABLE)
                             for c in clients])
    if error is not None:
        announce(world, states, servers[0], error)
    periods = {f: e.periods for f, e in plan.table.fields.items() if world.rank in e.servers}
    fields = set(periods)
    cfg.output_dir.mkdir(parents=True, exist_ok=True)
    if plan.shared:
        from .sharedfiles import server_sink_factory

        sink_factory = server_sink_factory(sink_factory, plan.shared, sub)
    serve(cfg, iocomm, sub, servers, clients, plan.files[world.rank], fields, sink_factory,
          cfg.output_dir, history_line(cfg, context), periods=periods)
    iocomm.Free()
    sub.Free()
