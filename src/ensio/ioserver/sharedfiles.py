"""Files written by every server: each one its rows of one CDF-5 file (``shared``).

Why: with several servers a large file would otherwise be written by one of
them, which then holds the whole post-processing state of that file and does
all of its I/O while the others idle. A file resolved as *shared*
(:func:`shared_files`: ``shared: true``, or ``auto`` with several servers and
a record of at least ``ioserver.shared_min_mb``) is instead written by all
servers. Server rank ``r`` owns rows ``RowDistribution.of(nj_glo, srvcomm)``
of the file's domain; it runs the graph of the shared files on those rows
only (``Graph(points=...)``) and writes them with
:class:`~.shared.SharedRecordFile` (positional writes at the classic-layout
offsets). Server 0 creates each file (the header comes from
:mod:`.cflayout` through the writer, so it is the header a single server
writes), writes the time coordinates and announces complete records.

Routing (kept simple): every server receives the clients' full parts of the
fields a shared file needs (the field table lists all servers for them) and
keeps its rows of the assembled global array. A row-routed protocol would send
each server only the rows it owns (see the report of issue 11).

Collective points among the servers: creating and closing each (split) file.
Every server meets them in the same order (they run the same graph over the
same steps), and none waits for another while a client waits for it:
a server is only blocked there after every client sent the step that ends
the period, so the messages the other servers still need are already posted.
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import faults
from ..errors import file_op
from ..parallel.distribution import RowDistribution
from .config import FileDef, IOServerConfig, shared_obstacle
from .geometry import DomainGeometry
from .pipeline import Sink, SinkFactory, field_mask, with_missing

__all__ = ["shared_files", "record_bytes", "SharedPipeline", "ServerSink",
           "server_sink_factory"]


def record_bytes(cfg: IOServerConfig, f: FileDef) -> int:
    """Bytes of one record of a file (its enabled fields at their precision)."""
    return sum(math.prod(cfg.grid_shape(fd.grid)) * fd.precision
               for fd in f.fields if fd.enabled)


def shared_files(cfg: IOServerConfig, n_servers: int) -> tuple[str, ...]:
    """Ids of the enabled files every server writes in row ranges (server mode only).

    ``shared: true`` always (the config checked it can be); ``auto`` when there
    are several servers, nothing prevents it (:func:`.config.shared_obstacle`)
    and a record holds at least ``ioserver.shared_min_mb``.
    """
    if cfg.mode != "server":
        return ()
    out = []
    for f in cfg.enabled_files:
        if f.shared == "true" or (
                f.shared == "auto" and n_servers > 1
                and shared_obstacle(f, cfg.grids, cfg.domains) is None
                and record_bytes(cfg, f) >= cfg.shared_min_mb * 2**20):
            out.append(f.id)
    return tuple(out)


def _close(sf: Any) -> None:
    """Collective: close a shared file and free its communicator."""
    try:
        sf.close()
    finally:
        sf.comm.Free()


class _Split:
    """One open split file: the shared file and period → record index."""

    def __init__(self, key: tuple[str, int], sf: Any) -> None:
        self.key = key
        self.sf = sf
        self.periods: dict[int, int] = {}
        self.done = 0  #: records this server finished (declared done)


class SharedPipeline:
    """The graph of the shared files on this server's rows, and their shared files.

    Parameters
    ----------
    cfg : IOServerConfig
    files : sequence of str
        Ids of the shared files (every server passes the same, in the same order).
    geometry : mapping
        Global :class:`DomainGeometry` per domain id.
    out_dir : Path
    history : str
    comm : MPI.Comm
        The servers' communicator (rank 0 creates the files and announces records).
    """

    def __init__(self, cfg: IOServerConfig, files: Sequence[str],
                 geometry: Mapping[str, DomainGeometry], out_dir: Path, history: str,
                 comm: MPI.Comm) -> None:
        from .graph import Graph
        from .writer import FileSet

        self._cfg = cfg
        self._comm = comm
        self._geometry = geometry
        # Layouts, names and time numbers of the single-server writer: same header.
        self._fs = FileSet(cfg, files, geometry, out_dir, history)
        self._rows = {d.id: RowDistribution.of(d.nj_glo, comm)
                      for d in cfg.domains.values() if d.type != "unstructured"}
        points = {}
        for gid, g in cfg.grids.items():
            rows = self._rows.get(g.domain)
            if rows is not None:
                shape = list(cfg.grid_shape(gid))
                shape[-2] = rows.count
                points[gid] = tuple(shape)
        self._graph = Graph(cfg, files=files, points=points)
        self._open: dict[str, _Split] = {}
        self._paths: list[Path] = []

    @property
    def nbytes(self) -> int:
        return self._graph.nbytes

    def _slice(self, grid: str) -> slice:
        rows = self._rows[self._cfg.grids[grid].domain]
        return slice(rows.start, rows.start + rows.count)

    def push(self, field_id: str, step: int, data: np.ndarray) -> None:
        """A source's global data at ``step``: its rows go to the graph."""
        if not self._graph.needs(field_id, step):
            return
        fd = self._cfg.fields[field_id]
        if self._cfg.grids[fd.grid].domain not in self._rows:
            return  # no shared file uses an unstructured domain
        rows = self._slice(fd.grid)
        mask = field_mask(self._cfg, self._geometry, field_id)
        part = with_missing(data[..., rows, :], None if mask is None else mask[rows, :],
                            fd.missing_value)
        self._graph.push(field_id, step, part)

    def advance(self, step: int) -> None:
        self._write(self._graph.advance(step))

    def finish(self, last_step: int) -> None:
        self._write(self._graph.finish(last_step))

    def poll(self) -> None:
        """Owner: announce the records every server has written (non-blocking)."""
        for split in self._open.values():
            with file_op("write", split.sf.path):  # a full disk names the file
                split.sf.poll()

    # ------------------------------------------------------------------ writing
    def _write(self, records: Sequence[Any]) -> None:
        """Records of one graph advance, written per (file, period) in period order."""
        groups: dict[tuple[str, int], list[Any]] = defaultdict(list)
        for r in records:
            groups[(r.file_id, r.period)].append(r)
        for (fid, _), recs in sorted(groups.items(), key=lambda kv: kv[0][1]):
            self._write_period(fid, recs)
        self.poll()

    def _write_period(self, fid: str, recs: list[Any]) -> None:
        lay = self._fs._layouts[fid]
        first = recs[0]
        split = self._split(lay, first)
        idx = split.periods.setdefault(first.period, len(split.periods))
        for r in recs:
            var = lay.vars[r.field.name]
            data = np.asarray(r.data, dtype=np.float64)
            mask = self._geometry[self._cfg.grids[r.field.grid].domain].mask
            if mask is not None and not mask.all():
                data = np.where(~mask[self._slice(r.field.grid), :], np.nan, data)
            with file_op("write", split.sf.path):
                split.sf.write_rows(idx, var.name, np.where(np.isnan(data), var.fill, data))
        with file_op("write", split.sf.path):
            split.sf.record_done(idx, self._time_values(lay, recs))
        faults.point(f"ioserver-shared-done {split.sf.path.name} {idx + 1}")
        split.done = max(split.done, idx + 1)

    def _time_values(self, lay: Any, recs: list[Any]) -> dict[str, np.ndarray]:
        """``time``, ``time_bnds`` (and ``time_instant``) of one period, as the writer's."""
        r = recs[0]
        t0, t1 = self._fs._num(lay.fd, r.t0), self._fs._num(lay.fd, r.t1)
        out = {"time": np.array(0.5 * (t0 + t1)), "time_bnds": np.array([t0, t1])}
        if lay.has_instant:
            inst = t1
            for x in recs:
                if x.field.operation == "instant" and x.t_instant is not None:
                    inst = self._fs._num(lay.fd, x.t_instant)
            out["time_instant"] = np.array(inst)
        return out

    def _split(self, lay: Any, r: Any) -> _Split:
        """The open file of the record's split period (collective when it changes)."""
        from .calendar import parse_freq
        from .shared import SharedRecordFile

        fd = lay.fd
        k = self._fs._clock.period_of(parse_freq(fd.split_freq), r.t1) if fd.split_freq else 0
        split = self._open.get(fd.id)
        if split is not None and split.key == (fd.id, k):
            return split
        if split is not None:
            del self._open[fd.id]
            _close(split.sf)
        path = self._fs._path(fd, k, r)
        if path in self._paths:
            raise ValueError(f"file {fd.id}: split period of {path.name} came back after "
                             "a later one (a shared file is written once)")
        rows = self._rows[self._cfg.grids[fd.fields[0].grid].domain]
        axes = {v.name: v.levels for v in lay.vars.values()}
        path.parent.mkdir(parents=True, exist_ok=True)
        # A communicator per file: its record notices (one tag) are its own.
        comm = self._comm.Dup()
        try:
            sf = SharedRecordFile(path, comm, 0, lambda ds: self._fs._define(ds, lay),
                                  rows, row_axes=axes, durable=False)
        except BaseException:
            comm.Free()
            raise
        self._paths.append(path)
        split = self._open[fd.id] = _Split((fd.id, k), sf)
        return split

    # ------------------------------------------------------------------ ending
    def close(self) -> Any:
        """Collective: close every file; sizes and paths on server 0 (others: none)."""
        from .writer import WriterStats

        for fid in list(self._open):
            _close(self._open.pop(fid).sf)
        if self._comm.rank != 0:
            return WriterStats(0, ())
        paths = tuple(self._paths)
        return WriterStats(sum(p.stat().st_size for p in paths), paths)

    def abandon(self, grace: float = 2.0) -> None:
        """Abort path, not collective: each file keeps the records every server finished.

        The owner keeps announcing for at most ``grace`` seconds, until every
        record it finished itself is announced (the other servers' notices of
        those records may still be on their way; a server that failed mid-record
        never sends its notice, hence the bound), then cuts the file after the
        announced records. Nothing waits for the others.
        """
        deadline = time.monotonic() + grace
        for split in self._open.values():
            sf = split.sf
            try:
                while (sf.is_owner and sf.numrecs < split.done
                       and time.monotonic() < deadline):
                    sf.poll()
                    time.sleep(1e-3)  # the notices are in flight: yield the core
                if sf.is_owner:  # drop the bytes of records never announced (a full disk)
                    end = sf.layout.data_end(sf.numrecs)
                    if end and os.fstat(sf._fd).st_size > end:
                        os.ftruncate(sf._fd, end)
            except Exception:  # the run is ending with its own reason
                pass
            finally:
                if sf._fd >= 0:  # closed without close(): that one is collective
                    os.close(sf._fd)
                    sf._fd = -1
        self._open.clear()


class ServerSink:
    """What a server feeds: its own files (an inner sink) and the shared files."""

    def __init__(self, own: Sink | None, shared: SharedPipeline | None) -> None:
        self._parts = [p for p in (own, shared) if p is not None]
        self._own, self._shared = own, shared

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self._parts)

    def push(self, field_id: str, step: int, data: np.ndarray) -> None:
        for p in self._parts:
            p.push(field_id, step, data)

    def advance(self, step: int) -> None:
        for p in self._parts:
            p.advance(step)

    def finish(self, last_step: int) -> None:
        for p in self._parts:
            p.finish(last_step)

    def poll(self) -> None:
        if self._shared is not None:
            self._shared.poll()

    def close(self) -> Any:
        from .writer import WriterStats

        stats = [p.close() for p in self._parts]
        return WriterStats(sum(s.bytes_written for s in stats),
                           tuple(p for s in stats for p in s.files))

    def abort(self) -> None:
        """Abort path: the own files closed (valid), the shared ones abandoned."""
        try:
            if self._own is not None:
                self._own.close()
        finally:
            if self._shared is not None:
                self._shared.abandon()


def server_sink_factory(inner: SinkFactory, shared: Sequence[str],
                        comm: MPI.Comm) -> Callable[..., ServerSink]:
    """A sink factory for a server: ``inner`` for its own files, the shared ones here."""

    def build(cfg: IOServerConfig, files: Sequence[str],
              geometry: Mapping[str, DomainGeometry], out_dir: Path,
              history: str) -> ServerSink:
        own = [f for f in files if f not in shared]
        return ServerSink(
            inner(cfg, own, geometry, out_dir, history) if own else None,
            SharedPipeline(cfg, shared, geometry, out_dir, history, comm) if shared else None)

    return build
