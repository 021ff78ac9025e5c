"""The ``ioserver:`` config section: calendar, axes, domains, grids, fields, files.

XIOS users write an ``iodef.xml``; ours is the same structure in YAML, resolved
once into frozen dataclasses so the servers, the attached mode and the C clients'
field table all see one resolved definition. Field groups pass their attributes
down to their fields; ``field_ref`` reuses a field. The precedence of a field's
attributes is: its own keys, then the referenced field's attributes (those it
set or inherited, not the defaults it fell back on), then its enclosing groups
(innermost first), then the defaults — as in XIOS, where a reference is
inherited before the parent group.

A file's ``shared: auto | true | false`` (with ``ioserver.shared_min_mb``)
says whether every server writes its rows of it (:mod:`.sharedfiles`);
``true`` is checked here (:func:`shared_obstacle`), ``auto`` is decided when
the number of servers is known.

Every problem (unknown key, dangling ``grid``/``domain``/``axis``/``field_ref``
or expression reference, a reference cycle, a duplicate id) is a
:class:`~ensio.config.errors.ConfigError` naming the dotted key.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from ..config.errors import ConfigError
from ..config.load import apply_overrides, from_plain
from .expr import ExprError, parse

__all__ = [
    "Mode",
    "Operation",
    "CalendarType",
    "CalendarDef",
    "AxisDef",
    "DomainDef",
    "shared_obstacle",
    "GridDef",
    "Box",
    "FieldDef",
    "FileDef",
    "IOServerConfig",
    "FREQ_RE",
    "load_ioserver_config",
    "ioserver_from_dict",
    "expression_refs",
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

#: A frequency: a positive count and an XIOS unit (timestep, second, minute, hour,
#: day, month, year).
FREQ_RE = re.compile(r"^([1-9][0-9]*)(ts|s|mi|h|d|mo|y)$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_freq(value: str, key: str, *, steps_ok: bool = True) -> None:
    m = FREQ_RE.match(value)
    if m is None:
        raise ConfigError(
            f"{key}: {value!r} is not a frequency (a count and one of ts s mi h d mo y, e.g. 6h)"
        )
    if not steps_ok and m.group(2) in ("ts", "mo", "y"):
        raise ConfigError(f"{key}: {value!r} must be a fixed duration (s, mi, h or d)")


def _check_id(value: str, key: str) -> None:
    if not _IDENT.match(value):
        raise ConfigError(f"{key}: {value!r} is not an identifier (letters, digits, _)")


@dataclass(frozen=True)
class CalendarDef:
    """``ioserver.calendar`` — model start date and time step (cftime calendars)."""

    type: CalendarType = "standard"
    start: str = "2000-01-01 00:00:00"
    timestep: str = "1h"

    def __post_init__(self) -> None:
        _check_freq(self.timestep, "ioserver.calendar.timestep", steps_ok=False)
        if not re.match(r"^\d{1,4}-\d{1,2}-\d{1,2}([ T]\d{1,2}:\d{2}(:\d{2})?)?$", self.start):
            raise ConfigError(
                f"ioserver.calendar.start: {self.start!r} is not a date "
                "(YYYY-MM-DD or YYYY-MM-DD hh:mm:ss)"
            )


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

    def __post_init__(self) -> None:
        _check_id(self.id, "ioserver.axes.id")
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
class DomainDef:
    """A horizontal domain; its coordinates come from the clients (their parts)."""

    id: str
    type: DomainType
    ni_glo: int
    nj_glo: int = 1
    nvertex: int | None = None

    def __post_init__(self) -> None:
        _check_id(self.id, "ioserver.domains.id")
        if self.ni_glo < 1 or self.nj_glo < 1:
            raise ConfigError(f"ioserver.domains.{self.id}: ni_glo and nj_glo must be >= 1")
        if self.type == "unstructured" and self.nj_glo != 1:
            raise ConfigError(
                f"ioserver.domains.{self.id}.nj_glo: an unstructured domain has nj_glo 1"
            )
        if self.nvertex is not None and self.nvertex < 3:
            raise ConfigError(f"ioserver.domains.{self.id}.nvertex: must be at least 3")

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

    @property
    def is_source(self) -> bool:
        return self.expr is None and self.field_ref is None

    @property
    def dtype(self) -> str:
        return "f4" if self.precision == 4 else "f8"


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


@dataclass(frozen=True)
class IOServerConfig:
    """The resolved ``ioserver:`` section."""

    mode: Mode = "server"
    servers: int = 1
    client_buffer_mb: float = 64.0
    server_buffer_mb: float = 256.0
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


def expression_refs(text: str) -> tuple[set[str], set[str]]:
    """Ids an expression reads: (instant references, ``@`` references); ``set()`` if it
    does not parse (its syntax error is reported where the field is checked)."""
    try:
        e = parse(text)
    except ExprError:
        return set(), set()
    return set(e.names()), set(e.at_names())


# --------------------------------------------------------------------------- loading

_SECTION_KEYS = {
    "mode", "servers", "client_buffer_mb", "server_buffer_mb", "shared_min_mb", "output_dir",
    "calendar",
    "axes", "domains", "grids", "field_groups", "fields", "files",
}
_FIELD_KEYS = {f.name for f in fields(FieldDef)}
_INHERITED = _FIELD_KEYS - {"id", "name", "expr", "field_ref"}
_GROUP_KEYS = _INHERITED | {"id", "fields", "groups"}
_FILE_KEYS = {f.name for f in fields(FileDef)}
_DEFAULTS = {f.name: f.default for f in fields(FieldDef)
             if f.name in _INHERITED and f.default is not MISSING}


def load_ioserver_config(path: str | Path, overrides: Iterable[str] = ()) -> IOServerConfig:
    """Read the ``ioserver:`` section of a YAML file (safely) and resolve it."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict) or "ioserver" not in raw:
        raise ConfigError(f"{path}: ioserver: required config section is missing")
    raw = apply_overrides(raw, overrides)
    return ioserver_from_dict(raw["ioserver"], base_dir=path.resolve().parent)


def ioserver_from_dict(raw: Any, base_dir: str | Path = ".") -> IOServerConfig:
    """Resolve plain data (the parsed ``ioserver:`` mapping) into :class:`IOServerConfig`."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"ioserver: expected a mapping, got {raw!r}")
    for k in raw:
        if k not in _SECTION_KEYS:
            raise ConfigError(f"ioserver.{k}: unknown config key")
    top = {k: raw[k] for k in ("mode", "servers", "client_buffer_mb", "server_buffer_mb",
                               "shared_min_mb") if k in raw}
    scalars = from_plain(_Scalars, top, "ioserver")
    out_dir = Path(from_plain(str, raw.get("output_dir", "output"), "ioserver.output_dir"))
    if not out_dir.is_absolute():
        out_dir = Path(base_dir) / out_dir
    calendar = from_plain(CalendarDef, raw.get("calendar", {}), "ioserver.calendar")
    axes = _by_id(AxisDef, raw.get("axes", []), "ioserver.axes")
    domains = _by_id(DomainDef, raw.get("domains", []), "ioserver.domains")
    grids = _by_id(GridDef, raw.get("grids", []), "ioserver.grids")
    for g in grids.values():
        if g.domain not in domains:
            raise ConfigError(f"ioserver.grids.{g.id}.domain: no domain {g.domain!r}")
        if g.axis is not None and g.axis not in axes:
            raise ConfigError(f"ioserver.grids.{g.id}.axis: no axis {g.axis!r}")
    entries = _collect_fields(raw.get("field_groups", []), raw.get("fields", []))
    resolved = _resolve_fields(entries, grids)
    files = _resolve_files(raw.get("files", []), resolved, grids)
    for f in files:
        _check_shared(f, grids, domains)
    return IOServerConfig(
        mode=scalars.mode, servers=scalars.servers, client_buffer_mb=scalars.client_buffer_mb,
        server_buffer_mb=scalars.server_buffer_mb, shared_min_mb=scalars.shared_min_mb,
        output_dir=out_dir, calendar=calendar,
        axes=axes, domains=domains, grids=grids, fields=resolved, files=files,
    )


@dataclass(frozen=True)
class _Scalars:
    mode: Mode = "server"
    servers: int = 1
    client_buffer_mb: float = 64.0
    server_buffer_mb: float = 256.0
    shared_min_mb: float = 64.0

    def __post_init__(self) -> None:
        if self.servers < 1:
            raise ConfigError(f"ioserver.servers: must be at least 1, got {self.servers}")
        for name in ("client_buffer_mb", "server_buffer_mb", "shared_min_mb"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ioserver.{name}: must be positive")


def _listing(value: Any, key: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list, got {value!r}")
    return value


def _by_id(tp: type, value: Any, key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, item in enumerate(_listing(value, key)):
        ident = item.get("id") if isinstance(item, Mapping) else None
        where = f"{key}.{ident}" if isinstance(ident, str) else f"{key}[{i}]"
        obj = from_plain(tp, item, where)
        if obj.id in out:
            raise ConfigError(f"{where}: duplicate id {obj.id!r}")
        out[obj.id] = obj
    return out


@dataclass(frozen=True)
class _Entry:
    """A field definition as written, with its groups' attributes (innermost first)."""

    key: str
    own: Mapping[str, Any]
    groups: tuple[Mapping[str, Any], ...]


def _collect_fields(groups: Any, loose: Any) -> list[_Entry]:
    entries: list[_Entry] = []

    def walk(group: Any, key: str, parents: tuple[Mapping[str, Any], ...]) -> None:
        if not isinstance(group, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {group!r}")
        for k in group:
            if k not in _GROUP_KEYS:
                raise ConfigError(f"{key}.{k}: unknown config key")
        attrs = {k: v for k, v in group.items() if k in _INHERITED}
        chain = (attrs, *parents)
        for i, f in enumerate(_listing(group.get("fields"), f"{key}.fields")):
            entries.append(_entry(f, f"{key}.fields", i, chain))
        for i, sub in enumerate(_listing(group.get("groups"), f"{key}.groups")):
            sid = sub.get("id") if isinstance(sub, Mapping) else None
            where = f"{key}.groups.{sid}" if isinstance(sid, str) else f"{key}.groups[{i}]"
            walk(sub, where, chain)

    for i, g in enumerate(_listing(groups, "ioserver.field_groups")):
        gid = g.get("id") if isinstance(g, Mapping) else None
        walk(g, f"ioserver.field_groups.{gid}" if isinstance(gid, str)
             else f"ioserver.field_groups[{i}]", ())
    for i, f in enumerate(_listing(loose, "ioserver.fields")):
        entries.append(_entry(f, "ioserver.fields", i, ()))
    return entries


def _entry(f: Any, key: str, i: int, chain: tuple[Mapping[str, Any], ...]) -> _Entry:
    if not isinstance(f, Mapping):
        raise ConfigError(f"{key}[{i}]: expected a mapping, got {f!r}")
    fid = f.get("id")
    if not isinstance(fid, str):
        raise ConfigError(f"{key}[{i}].id: required config key is missing")
    where = f"{key}.{fid}"
    for k in f:
        if k not in _FIELD_KEYS:
            raise ConfigError(f"{where}.{k}: unknown config key")
    _check_id(fid, f"{where}.id")
    return _Entry(where, f, chain)


def _resolve_fields(entries: list[_Entry], grids: Mapping[str, GridDef]) -> dict[str, FieldDef]:
    by_id: dict[str, _Entry] = {}
    for e in entries:
        fid = e.own["id"]
        if fid in by_id:
            raise ConfigError(f"{e.key}: duplicate field id {fid!r} (also {by_id[fid].key})")
        by_id[fid] = e
    done: dict[str, FieldDef] = {}
    # The attributes a field got from its own keys, its groups or its reference (not the
    # defaults): what a field referencing it inherits, so that a default the referenced
    # field merely fell back on does not hide the referencing field's groups.
    given: dict[str, dict[str, Any]] = {}

    def resolve(fid: str, stack: tuple[str, ...]) -> FieldDef:
        if fid in done:
            return done[fid]
        e = by_id[fid]
        ref = e.own.get("field_ref")
        base: dict[str, Any] = {}
        if ref is not None:
            if not isinstance(ref, str) or ref not in by_id:
                raise ConfigError(f"{e.key}.field_ref: no field {ref!r}")
            if ref in stack:
                cycle = " -> ".join((*stack, fid, ref))
                raise ConfigError(f"{e.key}.field_ref: reference cycle {cycle}")
            resolve(ref, (*stack, fid))
            base = given[ref]
        merged: dict[str, Any] = {}
        for g in reversed(e.groups):
            merged.update(g)
        merged.update(base)
        merged.update({k: v for k, v in e.own.items()})
        merged.setdefault("name", fid)
        given[fid] = {k: v for k, v in merged.items() if k in _INHERITED | {"name"}}
        merged = {**_DEFAULTS, **merged}
        if merged.get("grid") is None:
            raise ConfigError(f"{e.key}.grid: required config key is missing")
        fd = _field(merged, e.key, grids)
        done[fid] = fd
        return fd

    for fid in by_id:
        resolve(fid, ())
    for fid, e in by_id.items():
        _check_expr_refs(done[fid], e.key, done, by_id.keys())
    _check_expr_cycles(done, by_id)
    return {fid: done[fid] for fid in by_id}


def _field(values: Mapping[str, Any], key: str, grids: Mapping[str, GridDef]) -> FieldDef:
    fd = from_plain(FieldDef, dict(values), key)
    if fd.grid not in grids:
        raise ConfigError(f"{key}.grid: no grid {fd.grid!r}")
    if fd.precision not in (4, 8):
        raise ConfigError(f"{key}.precision: 4 or 8, got {fd.precision}")
    _check_freq(fd.freq_op, f"{key}.freq_op")
    return fd


def _check_expr_refs(fd: FieldDef, key: str, known: Mapping[str, FieldDef],
                     ids: Iterable[str]) -> None:
    if fd.expr is None:
        return
    try:
        parse(fd.expr)
    except ExprError as exc:
        raise ConfigError(f"{key}.expr: {exc}") from None
    names, ats = expression_refs(fd.expr)
    ids = set(ids)
    for n in sorted(names | ats):
        if n not in ids:
            raise ConfigError(f"{key}.expr: no field {n!r} in {fd.expr!r}")
        if n in known and known[n].grid != fd.grid:
            raise ConfigError(
                f"{key}.expr: field {n!r} is on grid {known[n].grid!r}, not {fd.grid!r}"
            )


def _check_expr_cycles(done: Mapping[str, FieldDef], by_id: Mapping[str, _Entry]) -> None:
    def deps(fd: FieldDef) -> set[str]:
        out = set()
        if fd.expr is not None:
            names, ats = expression_refs(fd.expr)
            out |= names | ats
        elif fd.field_ref is not None:
            out.add(fd.field_ref)
        return out

    state: dict[str, int] = {}

    def visit(fid: str, path: tuple[str, ...]) -> None:
        if state.get(fid) == 2:
            return
        if state.get(fid) == 1:
            cyc = " -> ".join((*path[path.index(fid):], fid))
            raise ConfigError(f"{by_id[path[0]].key}.expr: reference cycle {cyc}")
        state[fid] = 1
        for d in sorted(deps(done[fid])):
            visit(d, (*path, fid))
        state[fid] = 2

    for fid in done:
        visit(fid, ())


def _resolve_files(value: Any, defined: Mapping[str, FieldDef],
                   grids: Mapping[str, GridDef]) -> tuple[FileDef, ...]:
    out: list[FileDef] = []
    seen: set[str] = set()
    for i, raw in enumerate(_listing(value, "ioserver.files")):
        fid = raw.get("id") if isinstance(raw, Mapping) else None
        if not isinstance(fid, str):
            raise ConfigError(f"ioserver.files[{i}].id: required config key is missing")
        key = f"ioserver.files.{fid}"
        _check_id(fid, f"{key}.id")
        if fid in seen:
            raise ConfigError(f"{key}: duplicate file id {fid!r}")
        seen.add(fid)
        for k in raw:
            if k not in _FILE_KEYS:
                raise ConfigError(f"{key}.{k}: unknown config key")
        entries = _listing(raw.get("fields"), f"{key}.fields")
        ffields = tuple(_file_field(e, f"{key}.fields", j, fid, defined, grids)
                        for j, e in enumerate(entries))
        names = [f.name for f in ffields]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"{key}.fields: variable name {dup[0]!r} used twice")
        plain = {k: v for k, v in raw.items() if k != "fields"}
        plain["fields"] = []
        if isinstance(plain.get("shared"), bool):  # YAML true/false
            plain["shared"] = str(plain["shared"]).lower()
        fd = from_plain(FileDef, plain, key)
        fd = replace(fd, fields=ffields, attributes=dict(fd.attributes))
        _check_file(fd, key)
        out.append(fd)
    return tuple(out)


def _file_field(e: Any, key: str, j: int, file_id: str, defined: Mapping[str, FieldDef],
                grids: Mapping[str, GridDef]) -> FieldDef:
    if not isinstance(e, Mapping):
        raise ConfigError(f"{key}[{j}]: expected a mapping, got {e!r}")
    ref = e.get("field_ref")
    label = e.get("name") or ref
    where = f"{key}.{label}" if isinstance(label, str) else f"{key}[{j}]"
    for k in e:
        if k not in _FIELD_KEYS - {"id"}:
            raise ConfigError(f"{where}.{k}: unknown config key")
    if ref is None and e.get("expr") is None:
        raise ConfigError(f"{where}.field_ref: required config key is missing (or give expr)")
    values: dict[str, Any] = dict(_DEFAULTS)
    if ref is not None:
        if not isinstance(ref, str) or ref not in defined:
            raise ConfigError(f"{where}.field_ref: no field {ref!r}")
        base = defined[ref]
        values.update({k: getattr(base, k) for k in _INHERITED | {"name"}})
    elif e.get("grid") is None:
        try:
            parse(str(e["expr"]))
        except ExprError as exc:
            raise ConfigError(f"{where}.expr: {exc}") from None
        names, ats = expression_refs(str(e["expr"]))
        first = sorted(n for n in names | ats if n in defined)
        if first:
            values["grid"] = defined[first[0]].grid
    values.update(e)
    if values.get("name") is None:
        raise ConfigError(f"{where}.name: required config key is missing")
    values["id"] = f"{file_id}/{values['name']}"
    if values.get("grid") is None:
        raise ConfigError(f"{where}.grid: required config key is missing")
    fd = _field(values, where, grids)
    _check_expr_refs(fd, where, defined, defined.keys())
    return fd


def _check_file(fd: FileDef, key: str) -> None:
    _check_freq(fd.output_freq, f"{key}.output_freq")
    if fd.split_freq is not None:
        _check_freq(fd.split_freq, f"{key}.split_freq")
    if not 0 <= fd.compression <= 9:
        raise ConfigError(f"{key}.compression: 0..9, got {fd.compression}")
    if fd.format == "cdf5" and fd.compression:
        raise ConfigError(f"{key}.compression: cdf5 files cannot be compressed")
    for _, fname, _, _ in string.Formatter().parse(fd.name):
        if fname is None:
            continue
        if fname not in ("start", "end"):
            raise ConfigError(f"{key}.name: unknown placeholder {{{fname}}} (use start, end)")
        if fname == "end" and fd.split_freq is None:
            raise ConfigError(f"{key}.name: {{end}} needs split_freq")
    if "/" in fd.name:
        raise ConfigError(f"{key}.name: {fd.name!r} must be a file name, not a path")


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
    enabled = [f for f in fd.fields if f.enabled]
    doms = {grids[f.grid].domain for f in enabled}
    for f in enabled:
        where = f"{key}.fields.{f.name}"
        if f.extract is not None or f.mean is not None:
            what = "extract" if f.extract is not None else "mean"
            return f"{where}.{what}", f"{what} needs the global array (shared file)"
        if f.operation == "once":
            return f"{where}.operation", "once is not a record variable (shared file)"
        if domains[grids[f.grid].domain].type == "unstructured":
            return f"{where}.grid", "an unstructured domain has no rows (shared file)"
    if len(doms) > 1:
        return f"{key}.fields", f"a shared file holds one domain, not {sorted(doms)}"
    return None


def _check_shared(fd: FileDef, grids: Mapping[str, GridDef],
                  domains: Mapping[str, DomainDef]) -> None:
    if fd.shared != "true":
        return
    why = shared_obstacle(fd, grids, domains)
    if why is not None:
        raise ConfigError(f"{why[0]}: {why[1]}; set ioserver.files.{fd.id}.shared: false")


def field_ids(cfg: IOServerConfig) -> Sequence[str]:
    """All field ids (definitions), for error messages listing what exists."""
    return tuple(cfg.fields)
