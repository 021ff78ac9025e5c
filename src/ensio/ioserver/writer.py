"""CF-1.8 netCDF output of the I/O server: :class:`FileSet`.

One netCDF file per file definition and split period, created when its first
record arrives and named from the definition's pattern (``{start}``/``{end}``
are the split period's bounds, formatted with cftime's strftime; ``.nc`` is
appended). The layout (dimensions, coordinates, attributes, spatial
operations) is built once per file definition by :mod:`.cflayout`.

Crash behaviour: files are never renamed. Each :meth:`FileSet.write` call (the
records of one graph advance, i.e. whole output periods) writes its records
and then syncs every file it touched, so a server killed at any later instant
leaves files that netCDF readers open, holding every complete period written
before that sync. (Syncing per call rather than per record is what keeps the
fields of one period together; the records of a call are written in
milliseconds.)

Time: ``time`` is the midpoint of the output period (t0, t1] with
``time_bnds``; ``time_instant`` holds the sample time of instant fields.
Values are ``<time_units> since <calendar start>`` in the configured calendar.
"""

from __future__ import annotations

import string
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import cftime
import netCDF4
import numpy as np

from .. import __version__
from ..config.errors import ConfigError
from ..errors import FileOpError, file_op
from .calendar import Calendar, parse_freq
from .cflayout import FileLayout, VarLayout
from .config import FileDef, IOServerConfig
from .geometry import DomainGeometry

__all__ = ["FileSet", "WriterStats"]

_FORMATS = {"netcdf4": "NETCDF4", "cdf5": "NETCDF3_64BIT_DATA"}


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
    """One split file: its path, open dataset (or None once closed) and period → index."""

    path: Path
    ds: netCDF4.Dataset | None
    periods: dict[int, int] = field(default_factory=dict)
    once_written: set[str] = field(default_factory=set)


class FileSet:
    """The netCDF files of the given file definitions (one per split period).

    ``geometry`` holds the global geometry of every domain the files use;
    ``history`` becomes the global ``history`` attribute. Records hold
    global arrays (NaN = missing); extract and mean operations are applied
    here. Raises ValueError naming the file and field for a bad definition
    (an empty extract box, a domain without geometry) when constructed.
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
        self._current: dict[str, tuple[str, int]] = {}
        self._once: dict[str, dict[str, np.ndarray]] = {fid: {} for fid in self._layouts}
        self._paths: dict[Path, tuple[str, int]] = {}
        self._closed = False

    # ------------------------------------------------------------------ writing
    def write(self, records: Sequence[_Record]) -> None:
        """Write ``records`` (any files, fields and periods), then sync the files touched.

        The files are synced even when a record fails (bad shape, unknown
        field), so what was written before the error is readable.
        """
        if self._closed:
            raise ValueError("FileSet.write after close")
        touched: dict[int, _Output] = {}
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
                with _netcdf_errors("write", out.path):
                    self._put(lay, var, out, r, values)
        finally:
            for out in touched.values():
                if out.ds is not None:  # a file closed by a split change is flushed
                    with _netcdf_errors("sync", out.path):
                        out.ds.sync()

    def _put(self, lay: FileLayout, var: VarLayout, out: _Output, r: _Record,
             values: np.ndarray) -> None:
        if var.timed:
            idx = self._time_index(lay, out, r)
            out.ds[var.name][idx, ...] = values
            if var.instant and r.t_instant is not None:
                out.ds["time_instant"][idx] = self._num(lay.fd, r.t_instant)
        else:
            self._once[r.file_id][var.name] = values
            out.ds[var.name][...] = values
            out.once_written.add(var.name)

    def close(self) -> WriterStats:
        """Close every file; the sizes and paths of all files this set created."""
        self._closed = True
        for out in self._outputs.values():
            if out.ds is not None:
                out.ds.close()
                out.ds = None
        paths = tuple(out.path for out in self._outputs.values())
        return WriterStats(sum(p.stat().st_size for p in paths), paths)

    # ------------------------------------------------------------------ helpers
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
            t0, t1 = self._num(lay.fd, r.t0), self._num(lay.fd, r.t1)
            out.ds["time"][idx] = 0.5 * (t0 + t1)
            out.ds["time_bnds"][idx, :] = [t0, t1]
            if lay.has_instant:
                out.ds["time_instant"][idx] = t1
        return idx

    def _output(self, lay: FileLayout, r: _Record) -> _Output:
        fd = lay.fd
        k = self._clock.period_of(parse_freq(fd.split_freq), r.t1) if fd.split_freq else 0
        key = (fd.id, k)
        current = self._current.get(fd.id)
        if current == key:
            out = self._outputs[key]
            assert out.ds is not None
            return out
        if current is not None:
            old = self._outputs[current]
            if old.ds is not None:
                old.ds.close()
                old.ds = None
        out = self._outputs.get(key)
        if out is None:
            out = self._create(lay, k, r)
            self._outputs[key] = out
        else:
            with _netcdf_errors("reopen", out.path):
                out.ds = netCDF4.Dataset(out.path, "a")
            out.ds.set_auto_mask(False)
        self._current[fd.id] = key
        for name, values in self._once[fd.id].items():
            if name not in out.once_written:
                out.ds[name][...] = values
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
            ds = netCDF4.Dataset(path, "w", format=_FORMATS[fd.format])
        try:
            with _netcdf_errors("create", path):
                ds.set_auto_mask(False)
                self._define(ds, lay)
                ds.sync()
        except BaseException:
            ds.close()
            path.unlink(missing_ok=True)
            raise
        return _Output(path, ds)

    def _define(self, ds: netCDF4.Dataset, lay: FileLayout) -> None:
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
            self._define_var(ds, fd, var)

    def _define_time(self, ds: netCDF4.Dataset, lay: FileLayout) -> None:
        units = f"{lay.fd.time_units} since {self._origin}"
        t = ds.createVariable("time", "f8", ("time",))
        t.setncatts({"standard_name": "time", "long_name": "time", "units": units,
                     "calendar": self._clock.type, "axis": "T", "bounds": "time_bnds"})
        ds.createVariable("time_bnds", "f8", ("time", "nv"))
        if lay.has_instant:
            ti = ds.createVariable("time_instant", "f8", ("time",))
            ti.setncatts({"standard_name": "time", "long_name": "time of the instant sample",
                          "units": units, "calendar": self._clock.type})

    def _define_var(self, ds: netCDF4.Dataset, fd: FileDef, var: VarLayout) -> None:
        dims = (("time",) if var.timed else ()) + var.dims
        kwargs: dict[str, Any] = {"fill_value": var.dtype.type(var.fill)}
        if fd.format == "netcdf4" and dims:
            # one chunk per time step and level: what cdo and plotting tools read
            sizes = [ds.dimensions[d].size for d in var.dims]
            if var.levels and len(sizes) > var.levels:
                sizes[: var.levels] = [1] * var.levels
            kwargs["chunksizes"] = ([1] if var.timed else []) + [max(s, 1) for s in sizes]
            if fd.compression:
                kwargs.update(zlib=True, complevel=fd.compression, shuffle=True)
        v = ds.createVariable(var.name, var.dtype, dims, **kwargs)
        v.setncatts(dict(var.attrs))
