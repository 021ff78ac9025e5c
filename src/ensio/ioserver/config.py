"""The resolved ``ioserver:`` section: calendar, axes, domains, grids, fields, files.

XIOS users write an ``iodef.xml``; ours is the same structure in YAML, resolved
once (:mod:`.configload`: inheritance, references, checks) into the frozen
dataclasses of this module, so the servers, the attached mode and the C clients'
field table all see one resolved definition. A :class:`FieldDef` here is final:
its groups and references are already applied.

A file's ``shared: auto | true | false`` (with ``ioserver.shared_min_mb``)
says whether every server writes its rows of it (:mod:`.sharedfiles`);
``true`` is checked when the section is loaded (:func:`shared_obstacle`),
``auto`` is decided when the number of servers is known.

A value no definition can hold (a bad frequency, date or identifier, a size
below 1) is a :class:`~ensio.config.errors.ConfigError` naming the dotted key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..config.errors import ConfigError

__all__ = [
    "Mode",
    "Operation",
    "CalendarType",
    "CalendarDef",
    "AxisDef",
    "AxisInterp",
    "DomainDef",
    "DomainInterp",
    "RegionMask",
    "Reduce",
    "shared_obstacle",
    "GridDef",
    "Box",
    "FieldDef",
    "FileDef",
    "IOServerConfig",
    "FREQ_RE",
    "check_freq",
    "check_id",
]

Mode = Literal["server", "attached", "sync"]
Operation = Literal["instant", "average", "minimum", "maximum", "accumulate", "once"]
CalendarType = Literal[
    "standard", "gregorian", "proleptic_gregorian", "noleap", "365_day",
    "all_leap", "366_day", "360_day", "julian",
]
DomainType = Literal["rectilinear", "curvilinear", "unstructured"]
FileFormat = Literal["netcdf4", "cdf5"]
TimeUnits = Literal["seconds", "minutes", "hours", "days"]
MeanKind = Literal["global", "zonal"]
SharedMode = Literal["auto", "true", "false"]
InterpMethod = Literal["bilinear", "conservative"]
ReduceOp = Literal["mean", "sum", "min", "max"]
TimeNaming = Literal["cf", "xios"]
TimeCounter = Literal["centered", "instant", "record", "none"]

#: A frequency: a positive count and an XIOS unit (timestep, second, minute, hour,
#: day, month, year).
FREQ_RE = re.compile(r"^([1-9][0-9]*)(ts|s|mi|h|d|mo|y)$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A duration that may be zero (``freq_offset``): a count and a fixed unit.
OFFSET_RE = re.compile(r"^(0|[1-9][0-9]*)(ts|s|mi|h|d)$")


def check_freq(value: str, key: str, *, steps_ok: bool = True) -> None:
    """A frequency (``FREQ_RE``), or a one-line error naming ``key``; the loader checks
    the frequencies of fields and files with it too. ``steps_ok=False``: a fixed
    duration only (no time steps, months or years)."""
    m = FREQ_RE.match(value)
    if m is None:
        raise ConfigError(
            f"{key}: {value!r} is not a frequency (a count and one of ts s mi h d mo y, e.g. 6h)"
        )
    if not steps_ok and m.group(2) in ("ts", "mo", "y"):
        raise ConfigError(f"{key}: {value!r} must be a fixed duration (s, mi, h or d)")


def check_id(value: str, key: str) -> None:
    """An identifier (it names netCDF variables and dotted keys), or an error naming ``key``."""
    if not _IDENT.match(value):
        raise ConfigError(f"{key}: {value!r} is not an identifier (letters, digits, _)")


@dataclass(frozen=True)
class CalendarDef:
    """``ioserver.calendar`` — model start date and time step (cftime calendars)."""

    type: CalendarType = "standard"
    start: str = "2000-01-01 00:00:00"
    timestep: str = "1h"

    def __post_init__(self) -> None:
        check_freq(self.timestep, "ioserver.calendar.timestep", steps_ok=False)
        if not re.match(r"^\d{1,4}-\d{1,2}-\d{1,2}([ T]\d{1,2}:\d{2}(:\d{2})?)?$", self.start):
            raise ConfigError(
                f"ioserver.calendar.start: {self.start!r} is not a date "
                "(YYYY-MM-DD or YYYY-MM-DD hh:mm:ss)"
            )


@dataclass(frozen=True)
class AxisInterp:
    """``interpolate:`` of a target axis (XIOS ``interpolate_axis``): linear in the level
    values from axis ``from``. ``coordinate`` (a field holding the source levels'
    coordinate per point) is XIOS's, not supported: an error naming the key."""

    from_: str = field(metadata={"key": "from"})
    coordinate: str | None = None

    def __post_init__(self) -> None:
        if self.coordinate is not None:  # ValueError: from_plain prefixes the dotted key
            raise ValueError("coordinate: a vertical coordinate field is not supported "
                             "(the source axis values are the coordinate)")


@dataclass(frozen=True)
class AxisDef:
    """One vertical (or other) axis: ``n`` levels, optional values and CF attributes."""

    id: str
    n: int
    name: str | None = None
    units: str | None = None
    positive: Literal["up", "down"] | None = None
    standard_name: str | None = None
    long_name: str | None = None
    values: tuple[float, ...] | None = None
    interpolate: AxisInterp | None = None

    def __post_init__(self) -> None:
        check_id(self.id, "ioserver.axes.id")
        if self.n < 1:
            raise ConfigError(f"ioserver.axes.{self.id}.n: must be at least 1, got {self.n}")
        if self.values is not None and len(self.values) != self.n:
            raise ConfigError(
                f"ioserver.axes.{self.id}.values: {len(self.values)} values for n = {self.n}"
            )

    @property
    def out_name(self) -> str:
        return self.name or self.id


@dataclass(frozen=True)
class DomainInterp:
    """``interpolate:`` of a target domain (XIOS ``interpolate_domain``): from domain
    ``from`` by ``method``; ``renormalize`` divides by the valid sources' weight."""

    from_: str = field(metadata={"key": "from"})
    method: InterpMethod = "conservative"
    renormalize: bool = True


@dataclass(frozen=True)
class DomainDef:
    """A horizontal domain; its coordinates come from the clients (their parts).

    A domain with ``interpolate`` is a target the model never sends: its
    coordinates are ``lon``/``lat`` (cell centres) from the config, else the
    regular global grid (:func:`.geometry.regular_geometry`).
    """

    id: str
    type: DomainType
    ni_glo: int
    nj_glo: int = 1
    nvertex: int | None = None
    lon: tuple[float, ...] | None = None
    lat: tuple[float, ...] | None = None
    interpolate: DomainInterp | None = None

    def __post_init__(self) -> None:
        check_id(self.id, "ioserver.domains.id")
        if self.ni_glo < 1 or self.nj_glo < 1:
            raise ConfigError(f"ioserver.domains.{self.id}: ni_glo and nj_glo must be >= 1")
        if self.type == "unstructured" and self.nj_glo != 1:
            raise ConfigError(
                f"ioserver.domains.{self.id}.nj_glo: an unstructured domain has nj_glo 1"
            )
        if self.nvertex is not None and self.nvertex < 3:
            raise ConfigError(f"ioserver.domains.{self.id}.nvertex: must be at least 3")
        for name, n in (("lon", self.ni_glo), ("lat", self.nj_glo)):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ConfigError(f"ioserver.domains.{self.id}.{name}: {len(values)} values "
                                  f"for {'ni_glo' if name == 'lon' else 'nj_glo'} = {n}")
        if (self.lon is None) != (self.lat is None):
            raise ConfigError(f"ioserver.domains.{self.id}: give both lon and lat or neither")
        if self.lat is not None and any(abs(x) > 90 for x in self.lat):
            raise ConfigError(f"ioserver.domains.{self.id}.lat: latitudes are within -90..90")
        if (self.interpolate is not None or self.lon is not None) and self.type != "rectilinear":
            what = "interpolate" if self.interpolate is not None else "lon"
            raise ConfigError(f"ioserver.domains.{self.id}.{what}: only a rectilinear domain "
                              f"(not {self.type})")

    @property
    def shape(self) -> tuple[int, ...]:
        """Global horizontal shape: ``(nj_glo, ni_glo)``, or ``(ni_glo,)`` for cells."""
        if self.type == "unstructured":
            return (self.ni_glo,)
        return (self.nj_glo, self.ni_glo)


@dataclass(frozen=True)
class GridDef:
    """A domain with an optional axis: fields on it are ``(nk, nj, ni)`` or ``(nj, ni)``."""

    id: str
    domain: str
    axis: str | None = None


@dataclass(frozen=True)
class Box:
    """``extract: {lon: [w, e], lat: [s, n]}`` — a lon/lat box (degrees, inclusive)."""

    lon: tuple[float, float] = (-360.0, 360.0)
    lat: tuple[float, float] = (-90.0, 90.0)

    def __post_init__(self) -> None:
        if len(self.lon) != 2 or len(self.lat) != 2:
            raise ValueError("lon and lat are [min, max] pairs")  # from_plain names the key
        if self.lat[0] > self.lat[1]:
            raise ValueError(f"lat: south {self.lat[0]} is north of {self.lat[1]}")


@dataclass(frozen=True)
class RegionMask:
    """``mask: {file, variable}`` of a region reduction: region ids ``(nj, ni)``
    (regions = the distinct ids > 0) or a 0/1 stack ``(nregion, nj, ni)``."""

    file: Path
    variable: str


@dataclass(frozen=True)
class Reduce:
    """``reduce: {op, mask}``: one value per region and level (``mean`` is area-weighted)."""

    op: ReduceOp
    mask: RegionMask


@dataclass(frozen=True)
class FieldDef:
    """A field, fully resolved (inheritance applied).

    ``id`` is the field's id; for an entry of a file it is ``"<file>/<name>"``
    and ``field_ref`` names the field it reuses. A field with neither ``expr``
    nor ``field_ref`` is a *source*: the model sends it.
    """

    id: str
    name: str
    grid: str
    operation: Operation = "instant"
    freq_op: str = "1ts"
    precision: int = 4
    enabled: bool = True
    units: str | None = None
    standard_name: str | None = None
    long_name: str | None = None
    expr: str | None = None
    field_ref: str | None = None
    missing_value: float | None = None
    extract: Box | None = None
    mean: MeanKind | None = None
    freq_offset: str | None = None
    scale_factor: float | None = None
    add_offset: float | None = None
    valid_min: float | None = None
    valid_max: float | None = None
    reduce: Reduce | None = None
    #: not a config key: the grid of the arrays the graph produces for this field (its
    #: field_ref chain's grid), set by the loader; differs from ``grid`` when interpolated
    data_grid: str | None = field(default=None, metadata={"internal": True})

    @property
    def is_source(self) -> bool:
        return self.expr is None and self.field_ref is None

    @property
    def in_grid(self) -> str:
        """The grid of the records' data (before interpolation to ``grid``)."""
        return self.data_grid or self.grid

    @property
    def interpolated(self) -> bool:
        return self.in_grid != self.grid

    @property
    def dtype(self) -> str:
        return {2: "i2", 4: "f4", 8: "f8"}[self.precision]


@dataclass(frozen=True)
class FileDef:
    """One output file definition (split into one file per ``split_freq`` period)."""

    id: str
    name: str
    output_freq: str
    fields: tuple[FieldDef, ...]
    split_freq: str | None = None
    format: FileFormat = "netcdf4"
    compression: int = 0
    enabled: bool = True
    time_units: TimeUnits = "seconds"
    attributes: dict[str, Any] = field(default_factory=dict)
    #: row ranges written by every server (``"auto"``: when several servers and the
    #: record is at least ``ioserver.shared_min_mb``; see :mod:`.sharedfiles`)
    shared: SharedMode = "auto"
    #: flush to disk when model time passes a multiple of this (None: every write)
    sync_freq: str | None = None
    time_naming: TimeNaming = "cf"
    time_counter: TimeCounter = "centered"
    time_counter_name: str = "time_counter"


@dataclass(frozen=True)
class IOServerConfig:
    """The resolved ``ioserver:`` section."""

    mode: Mode = "server"
    servers: int = 1
    client_buffer_mb: float = 64.0
    server_buffer_mb: float = 256.0
    #: seconds a model rank waits for the servers without any progress before it ends
    #: the job naming the server (a stopped or hung server); sent in the field table
    timeout_s: float = 300.0
    output_dir: Path = Path("output")
    shared_min_mb: float = 64.0
    calendar: CalendarDef = field(default_factory=CalendarDef)
    axes: Mapping[str, AxisDef] = field(default_factory=dict)
    domains: Mapping[str, DomainDef] = field(default_factory=dict)
    grids: Mapping[str, GridDef] = field(default_factory=dict)
    fields: Mapping[str, FieldDef] = field(default_factory=dict)
    files: tuple[FileDef, ...] = ()

    @property
    def sources(self) -> tuple[str, ...]:
        """Ids of the fields the model sends, in definition order."""
        return tuple(f.id for f in self.fields.values() if f.is_source)

    @property
    def enabled_files(self) -> tuple[FileDef, ...]:
        return tuple(f for f in self.files if f.enabled)

    def field_shape(self, field_id: str) -> tuple[int, ...]:
        """Global array shape of a field (levels first)."""
        return self.grid_shape(self.fields[field_id].grid)

    def grid_shape(self, grid_id: str) -> tuple[int, ...]:
        g = self.grids[grid_id]
        horiz = self.domains[g.domain].shape
        return (self.axes[g.axis].n, *horiz) if g.axis else horiz


def shared_obstacle(fd: FileDef, grids: Mapping[str, GridDef],
                    domains: Mapping[str, DomainDef]) -> tuple[str, str] | None:
    """Why a file cannot be written in row ranges by several servers: (key, reason).

    Each server sees only its rows, so every variable must be a plain row
    split of one 2-D domain: a CDF-5 file (byte ranges), no box extraction or
    spatial mean (they need the global array), no ``once`` variable (not a
    record variable).
    """
    key = f"ioserver.files.{fd.id}"
    if fd.format != "cdf5":
        return f"{key}.format", f"a shared file must be cdf5, not {fd.format}"
    if fd.time_naming != "cf":
        return f"{key}.time_naming", "a shared file has cf time names"
    enabled = [f for f in fd.fields if f.enabled]
    doms = {grids[f.grid].domain for f in enabled}
    for f in enabled:
        where = f"{key}.fields.{f.name}"
        if f.extract is not None or f.mean is not None or f.reduce is not None:
            what = ("extract" if f.extract is not None else "mean" if f.mean is not None
                    else "reduce")
            return f"{where}.{what}", f"{what} needs the global array (shared file)"
        if f.interpolated:
            return f"{where}.grid", "interpolation needs the global array (shared file)"
        if f.precision == 2:
            return f"{where}.precision", "packed 16-bit output is not shared (shared file)"
        if f.operation == "once":
            return f"{where}.operation", "once is not a record variable (shared file)"
        if domains[grids[f.grid].domain].type == "unstructured":
            return f"{where}.grid", "an unstructured domain has no rows (shared file)"
    if len(doms) > 1:
        return f"{key}.fields", f"a shared file holds one domain, not {sorted(doms)}"
    return None


def field_ids(cfg: IOServerConfig) -> Sequence[str]:
    """All field ids (definitions), for error messages listing what exists."""
    return tuple(cfg.fields)
