"""CF-1.8 netCDF output of the I/O server: :class:`FileSet`.

One netCDF file per file definition and split period, created when its first
record arrives and named from the definition's pattern (``{start}``/``{end}``
are the split period's bounds, formatted with cftime's strftime; ``.nc`` is
appended). The layout (dimensions, coordinates, attributes, spatial
operations) is built once per file definition by :mod:`.cflayout`.

Crash behaviour (issue 27): each file is written as a CDF-5 staging file
(:mod:`.staged`, ``.NAME.ensio-partial.ioserver``) and published when it is
closed (:mod:`.recovery`: renamed, or copied into netCDF-4). Each
:meth:`FileSet.write` call (the records of one graph advance, i.e. whole output
periods) writes its records' bytes and only then publishes them (the staging
header's ``numrecs``), so a server killed at any instant leaves a staging file
holding exactly the periods published before; ``ensio ioserver recover`` (or
the next server starting in the directory) publishes it. A write that fails
(a full disk) rolls the call's records back: the file keeps the periods
published before, and the error names the final file. (Publishing per call
rather than per record is what keeps the fields of one period together.)

Time: ``time`` is the midpoint of the output period (t0, t1] with
``time_bnds``; ``time_instant`` holds the sample time of instant fields.
Values are ``<time_units> since <calendar start>`` in the configured calendar.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import cftime
import netCDF4
import numpy as np

from .. import __version__, faults
from ..config.errors import ConfigError
from ..errors import FileOpError, file_op
from .calendar import Calendar, parse_freq
from .cflayout import FileLayout, VarLayout
from .config import FileDef, IOServerConfig
from .geometry import DomainGeometry
from .recovery import publish, recover_dir
from .staged import StagedFile

__all__ = ["FileSet", "WriterStats"]


class _Record(Protocol):
    """What the writer reads of a record (``graph.Record``; duck typed)."""

    file_id: str
    field: Any
    period: int
    t0: Any
    t1: Any
    t_instant: Any
    data: np.ndarray


@dataclass(frozen=True)
class WriterStats:
    """What a :class:`FileSet` wrote: total size of its files (bytes) and their paths."""

    bytes_written: int
    files: tuple[Path, ...]


@contextmanager
def _netcdf_errors(op: str, path: Path) -> Iterator[None]:
    """OSError and netCDF library errors → one-line FileOpError naming the file."""
    with file_op(op, path):
        try:
            yield
        except RuntimeError as exc:  # netCDF4 reports library errors so ("NetCDF: HDF error")
            raise FileOpError(f"cannot {op} {path}: {exc}") from exc


def _attribute(value: Any) -> Any:
    """A YAML global attribute as netCDF can store it: text, a number or a numeric list."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (str, int, float)):
        return value
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        return np.asarray(value)
    return str(value)


class _NameFormatter(string.Formatter):
    """``{start:%Y%m%d}`` through cftime's strftime (``%Y%m%d`` when no format is given)."""

    def format_field(self, value: Any, format_spec: str) -> str:
        return value.strftime(format_spec or "%Y%m%d")


@dataclass(eq=False)
class _Output:
    """One split file: its final path, staging file (None once published), period → index."""

    path: Path
    staged: StagedFile | None
    periods: dict[int, int] = field(default_factory=dict)
    once_written: set[str] = field(default_factory=set)
    synced: int = 0  #: multiples of the file's sync_freq made durable so far
    moved: set[str] = field(default_factory=set)  #: fields with a record in a later split

    def rollback(self) -> None:
        """Forget the periods not published (their bytes are dropped from the file)."""
        if self.staged is not None:
            kept = self.staged.numrecs
            self.periods = {p: i for p, i in self.periods.items() if i < kept}
            self.staged.rollback()


class FileSet:
    """The netCDF files of the given file definitions (one per split period).

    ``geometry`` holds the global geometry of every domain the files use;
    ``history`` becomes the global ``history`` attribute. Records hold
    global arrays (NaN = missing); extract and mean operations are applied
    here. Raises ValueError naming the file and field for a bad definition
    (an empty extract box, a domain without geometry) when constructed.

    What earlier runs left in ``out_dir`` (staging files of a killed server)
    is published first (:func:`.recovery.recover_dir`), with one line each.
    """

    def __init__(self, cfg: IOServerConfig, files: Sequence[str],
                 geometry: Mapping[str, DomainGeometry], out_dir: Path, history: str):
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.history = history
        self._clock = Calendar(cfg.calendar)
        self._origin = self._clock.start.strftime("%Y-%m-%d %H:%M:%S")
        by_id = {f.id: f for f in cfg.files}
        self._layouts: dict[str, FileLayout] = {}
        for fid in files:
            if fid not in by_id:
                raise ConfigError(f"ioserver.files: no file {fid!r}")
            self._layouts[fid] = FileLayout(cfg, by_id[fid], geometry)
        self._outputs: dict[tuple[str, int], _Output] = {}
        self._once: dict[str, dict[str, np.ndarray]] = {fid: {} for fid in self._layouts}
        self._paths: dict[Path, tuple[str, int]] = {}
        self._closed = False
        self._failed = False  # a write failed: close() publishes what is complete, quietly
        self.notes: list[str] = []  #: files published in another format than configured
        if self._layouts:
            with file_op("recover leftovers in", self.out_dir):
                recover_dir(self.out_dir)

    # ------------------------------------------------------------------ writing
    def write(self, records: Sequence[_Record]) -> None:
        """Write ``records`` (any files, fields and periods), then publish them.

        All or nothing per file: if a record fails (bad shape, unknown field,
        a full disk) the records of this call are rolled back in every file
        it touched, which keep the periods published before; the error names
        the file.
        """
        if self._closed:
            raise ValueError("FileSet.write after close")
        touched: dict[int, _Output] = {}
        ends: dict[int, tuple[Any, Any]] = {}  # per file touched: (def, latest period end)
        try:
            for r in records:
                lay = self._layouts.get(r.file_id)
                if lay is None:
                    raise ValueError(
                        f"record for file {r.file_id!r}, which this writer does not own")
                var = lay.vars.get(r.field.name)
                if var is None:
                    raise ValueError(
                        f"file {r.file_id}: record for unknown field {r.field.name!r}")
                values = var.values(r.data, r.file_id)
                out = self._output(lay, r)
                touched[id(out)] = out
                ends[id(out)] = (lay.fd, max(ends.get(id(out), (None, r.t1))[1], r.t1))
                with _netcdf_errors("write", out.path):
                    self._put(lay, var, out, r, values)
            faults.point("ioserver-data-written")
            for out in touched.values():
                assert out.staged is not None
                with _netcdf_errors("write", out.path):
                    out.staged.publish(len(out.periods),
                                       durable=self._sync_due(out, *ends[id(out)]))
                faults.point(f"ioserver-published {out.path.name} {len(out.periods)}")
        except BaseException as exc:
            self._failed = True
            kept = []
            for out in touched.values():
                try:
                    out.rollback()
                except OSError:
                    pass  # the unpublished bytes stay beyond numrecs: readers ignore them
                kept.append(f"{out.path.name}: {len(out.periods)}")
            if isinstance(exc, FileOpError) and kept:
                raise FileOpError(f"{exc} (complete records kept: {', '.join(kept)})") from exc
            raise
        self._finish_left()

    def _put(self, lay: FileLayout, var: VarLayout, out: _Output, r: _Record,
             values: np.ndarray) -> None:
        assert out.staged is not None
        if var.timed:
            idx = self._time_index(lay, out, r)
            out.staged.write_record(idx, var.name, values)
            if var.instant and r.t_instant is not None:
                lay.time.put_instant(_timewriter(out), idx, self._num(lay.fd, r.t_instant))
        else:
            self._once[r.file_id][var.name] = values
            out.staged.write_fixed(var.name, values)
            out.once_written.add(var.name)

    def _finish_left(self) -> None:
        """Publish the split files every timed field of their file has left.

        A field may still send records of an earlier split after another one
        started (its records come late), so a split file is published only
        when each of its file's timed fields wrote a record in a later split;
        the others at :meth:`close`.
        """
        for (fid, _), out in self._outputs.items():
            timed = {v.name for v in self._layouts[fid].vars.values() if v.timed}
            if out.staged is not None and out.moved and timed <= out.moved:
                self._finish(out)

    def _finish(self, out: _Output) -> None:
        """Publish one file (its complete records) under its final name."""
        staged, out.staged = out.staged, None
        if staged is None:
            return
        try:
            with _netcdf_errors("write", out.path):
                done = publish(staged.path, staged.final, staged.fd, staged.numrecs,
                               has_records=staged.record_vars)
        finally:
            staged.close()
        if done.note:
            self.notes.append(done.note)
            if not self._failed:  # said once: the run ends on it, the rest is published quietly
                self._failed = True
                raise FileOpError(done.note)

    def close(self) -> WriterStats:
        """Publish every file; the sizes and paths of all files this set published.

        Every file is published (or, with no complete record, removed) even
        when one fails; the first failure is raised after.
        """
        self._closed = True
        first: BaseException | None = None
        for out in self._outputs.values():
            try:
                self._finish(out)
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first
        paths = tuple(out.path for out in self._outputs.values() if out.path.exists())
        return WriterStats(sum(p.stat().st_size for p in paths), paths)

    # ------------------------------------------------------------------ helpers
    def _sync_due(self, out: _Output, fd: FileDef, t_end: Any) -> bool:
        """``sync_freq``: flush (a durable publish) when the model time of the records
        has passed another multiple of it since the last flush (never without it)."""
        if fd.sync_freq is None:
            return False
        f = parse_freq(fd.sync_freq)
        k = self._clock.period_of(f, t_end)
        passed = k + 1 if self._clock.boundary(f, k + 1) == t_end else k
        if passed <= out.synced:
            return False
        out.synced = passed
        return True

    def _num(self, fd: FileDef, t: Any) -> float:
        units = f"{fd.time_units} since {self._origin}"
        return float(cftime.date2num(t, units, self._clock.type))

    def _time_index(self, lay: FileLayout, out: _Output, r: _Record) -> int:
        idx = out.periods.get(r.period)
        if idx is None:
            last = max(out.periods, default=-1)
            if r.period < last:
                raise ValueError(
                    f"file {out.path.name}: field {r.field.name} period {r.period} arrives "
                    f"after period {last} (time must increase along the file)"
                )
            idx = len(out.periods)
            out.periods[r.period] = idx
            assert out.staged is not None
            t0, t1 = self._num(lay.fd, r.t0), self._num(lay.fd, r.t1)
            lay.time.put(_timewriter(out), idx, t0, t1)  # names: cflayout's TimeAxis
        return idx

    def _output(self, lay: FileLayout, r: _Record) -> _Output:
        fd = lay.fd
        k = self._clock.period_of(parse_freq(fd.split_freq), r.t1) if fd.split_freq else 0
        key = (fd.id, k)
        for (fid, j), other in self._outputs.items():
            if fid == fd.id and j < k:
                other.moved.add(r.field.name)
        out = self._outputs.get(key)
        if out is not None:
            if out.staged is None:
                raise ValueError(f"file {fd.id}: split period of {out.path.name} came back "
                                 "after it was published")
            return out
        out = self._outputs[key] = self._create(lay, k, r)
        for name, values in self._once[fd.id].items():
            if name not in out.once_written:
                assert out.staged is not None
                with _netcdf_errors("write", out.path):
                    out.staged.write_fixed(name, values)
                out.once_written.add(name)
        return out

    def _path(self, fd: FileDef, k: int, r: _Record) -> Path:
        if fd.split_freq:
            start = self._clock.boundary(parse_freq(fd.split_freq), k)
            end = self._clock.boundary(parse_freq(fd.split_freq), k + 1)
        else:
            start, end = r.t0, None
        name = _NameFormatter().format(fd.name, start=start, end=end)
        path = self.out_dir / f"{name}.nc"
        other = self._paths.get(path)
        if other is not None and other != (fd.id, k):
            raise ValueError(f"file {fd.id}: name {path.name} is also the name of file "
                             f"{other[0]} (make the name patterns differ)")
        self._paths[path] = (fd.id, k)
        return path

    def _create(self, lay: FileLayout, k: int, r: _Record) -> _Output:
        fd = lay.fd
        path = self._path(fd, k, r)
        with _netcdf_errors("create", path):
            path.parent.mkdir(parents=True, exist_ok=True)
            staged = StagedFile(path, lambda ds, _fmt: self._define(ds, lay), fd.format,
                                fd.compression, _chunk_sizes(lay))
        return _Output(path, staged)

    def _define(self, ds: netCDF4.Dataset, lay: FileLayout) -> None:
        """The header and coordinates of a file of ``lay`` (classic-compatible: no record)."""
        fd = lay.fd
        attrs: dict[str, Any] = {
            "Conventions": "CF-1.8",
            "title": f"ensio ioserver output {fd.id}",
            "source": f"ensio {__version__} ioserver",
            "history": self.history,
        }
        attrs.update(fd.attributes)
        for k, v in attrs.items():
            ds.setncattr(k, _attribute(v))
        for name, size in lay.dims.items():
            ds.createDimension(name, size)
        if lay.has_time:
            self._define_time(ds, lay)
        for c in lay.coords:
            v = ds.createVariable(c.name, "f8", c.dims)
            v.setncatts(dict(c.attrs))
            v[...] = c.values
        for var in lay.vars.values():
            dims = ((var.time_dim,) if var.timed else ()) + var.dims
            v = ds.createVariable(var.name, var.dtype, dims,
                                  fill_value=var.dtype.type(var.fill))
            v.setncatts(dict(var.attrs))

    def _define_time(self, ds: netCDF4.Dataset, lay: FileLayout) -> None:
        units = f"{lay.fd.time_units} since {self._origin}"
        lay.time.define(ds, units, self._clock.type)  # cf or xios names (time_naming)


def _timewriter(out: _Output) -> Callable[[int, str, Any], None]:
    """``write(record, name, value)`` into a file's staging copy (for :class:`TimeAxis`)."""
    assert out.staged is not None
    staged = out.staged
    return lambda idx, name, value: staged.write_record(idx, name,
                                                        np.asarray(value, dtype=np.float64))


def _chunk_sizes(lay: FileLayout) -> dict[str, tuple[int, ...]]:
    """netCDF-4 chunks of the data variables: one per time step and level (what cdo
    and plotting tools read); used when the staging file is copied into netCDF-4."""
    out = {}
    for var in lay.vars.values():
        sizes = [lay.dims[d] or 1 for d in var.dims]
        if not var.timed and not sizes:
            continue
        if var.levels and len(sizes) > var.levels:
            sizes[: var.levels] = [1] * var.levels
        out[var.name] = tuple(([1] if var.timed else []) + [max(s, 1) for s in sizes])
    return out
