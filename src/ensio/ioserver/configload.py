"""Loading the ``ioserver:`` section: YAML to :class:`~.config.IOServerConfig`, checked once.

This is where the structure of an ``iodef`` is undone: field groups pass their
attributes down to their fields, ``field_ref`` reuses a field, file fields
override what they reference, and expressions name other fields. The precedence
of a field's attributes is: its own keys, then the referenced field's attributes
(those it set or inherited, not the defaults it fell back on), then its enclosing
groups (innermost first), then the defaults — as in XIOS, where a reference is
inherited before the parent group. It is kept apart from the dataclasses
(:mod:`.config`), which every part of the server reads, because only the loader
needs to know how a definition was written.

Every problem (unknown key, dangling ``grid``/``domain``/``axis``/``field_ref``
or expression reference, a reference cycle, a duplicate id, ``shared: true`` on
a file that cannot be shared) is a :class:`~ensio.config.errors.ConfigError`
naming the dotted key.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..config.errors import ConfigError
from ..config.load import apply_overrides, from_plain
from ..config.yamlfile import read_yaml
from .calendar import Calendar
from .config import (
    AxisDef,
    CalendarDef,
    DomainDef,
    FieldDef,
    FileDef,
    GridDef,
    IOServerConfig,
    Mode,
    check_freq,
    check_id,
    shared_obstacle,
)
from .expr import parse
from .exprtree import ExprError
from .postcheck import (
    check_file_time,
    check_interp,
    check_interp_defs,
    check_offset,
    check_packing,
    check_reduce,
)

__all__ = ["load_ioserver_config", "ioserver_from_dict", "expression_refs"]

_SECTION_KEYS = {
    "mode", "servers", "client_buffer_mb", "server_buffer_mb", "shared_min_mb", "output_dir",
    "timeout_s", "calendar",
    "axes", "domains", "grids", "field_groups", "fields", "files",
}
_FIELD_KEYS = {f.name for f in fields(FieldDef) if not f.metadata.get("internal")}
_INHERITED = _FIELD_KEYS - {"id", "name", "expr", "field_ref"}
_GROUP_KEYS = _INHERITED | {"id", "fields", "groups"}
_FILE_KEYS = {f.name for f in fields(FileDef)}
_DEFAULTS = {f.name: f.default for f in fields(FieldDef)
             if f.name in _INHERITED and f.default is not MISSING}


@dataclass(frozen=True)
class _Ctx:
    """What a field's checks need besides the field: the definitions and where the
    config file is (region mask files are relative to it)."""

    grids: Mapping[str, GridDef]
    domains: Mapping[str, DomainDef]
    axes: Mapping[str, AxisDef]
    dt: int
    base_dir: Path


def load_ioserver_config(path: str | Path, overrides: Iterable[str] = ()) -> IOServerConfig:
    """Read the ``ioserver:`` section of a YAML file (safely) and resolve it; an XIOS
    ``iodef.xml`` (``*.xml`` or content starting with ``<``) is read by :mod:`.iodef`."""
    path = Path(path)
    from .iodef import iodef_section, is_iodef_xml  # here: the XML reader only when needed

    if is_iodef_xml(path):
        return ioserver_from_dict(iodef_section(path, overrides),
                                  base_dir=path.resolve().parent)
    raw = read_yaml(path)
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
                               "shared_min_mb", "timeout_s") if k in raw}
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
    check_interp_defs(domains, axes)
    ctx = _Ctx(grids, domains, axes, Calendar(calendar).dt, Path(base_dir))
    entries = _collect_fields(raw.get("field_groups", []), raw.get("fields", []))
    resolved = _resolve_fields(entries, ctx)
    files = _resolve_files(raw.get("files", []), resolved, ctx)
    for f in files:
        _check_shared(f, grids, domains)
    return IOServerConfig(
        mode=scalars.mode, servers=scalars.servers, client_buffer_mb=scalars.client_buffer_mb,
        server_buffer_mb=scalars.server_buffer_mb, shared_min_mb=scalars.shared_min_mb,
        timeout_s=scalars.timeout_s, output_dir=out_dir, calendar=calendar,
        axes=axes, domains=domains, grids=grids, fields=resolved, files=files,
    )


@dataclass(frozen=True)
class _Scalars:
    mode: Mode = "server"
    servers: int = 1
    client_buffer_mb: float = 64.0
    server_buffer_mb: float = 256.0
    shared_min_mb: float = 64.0
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.servers < 1:
            raise ConfigError(f"ioserver.servers: must be at least 1, got {self.servers}")
        for name in ("client_buffer_mb", "server_buffer_mb", "shared_min_mb", "timeout_s"):
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
    check_id(fid, f"{where}.id")
    return _Entry(where, f, chain)


def _resolve_fields(entries: list[_Entry], ctx: _Ctx) -> dict[str, FieldDef]:
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
        fd = _field(merged, e.key, ctx)
        done[fid] = fd
        return fd

    for fid in by_id:
        resolve(fid, ())
    for fid in by_id:  # the grid of the data each field's stream carries
        fd = done[fid]
        chain = fd
        while chain.expr is None and chain.field_ref is not None:
            chain = done[chain.field_ref]
        done[fid] = replace(fd, data_grid=chain.grid)
    for fid, e in by_id.items():
        check_interp(done[fid], e.key, ctx)
    for fid, e in by_id.items():
        _check_expr_refs(done[fid], e.key, done, by_id.keys())
    _check_expr_cycles(done, by_id)
    return {fid: done[fid] for fid in by_id}


def _field(values: Mapping[str, Any], key: str, ctx: _Ctx) -> FieldDef:
    fd = from_plain(FieldDef, dict(values), key)
    if fd.grid not in ctx.grids:
        raise ConfigError(f"{key}.grid: no grid {fd.grid!r}")
    if fd.precision not in (2, 4, 8):
        raise ConfigError(f"{key}.precision: 2, 4 or 8, got {fd.precision}")
    check_freq(fd.freq_op, f"{key}.freq_op")
    check_offset(fd.freq_offset, f"{key}.freq_offset", ctx.dt)
    check_packing(fd, key)
    if fd.reduce is not None:
        fd = replace(fd, reduce=check_reduce(fd, key, ctx))
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
        if n in known and known[n].interpolated:
            raise ConfigError(
                f"{key}.expr: field {n!r} is interpolated (at output, after its time "
                "operation): it cannot be an operand; interpolate the expression instead"
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
                   ctx: _Ctx) -> tuple[FileDef, ...]:
    out: list[FileDef] = []
    seen: set[str] = set()
    for i, raw in enumerate(_listing(value, "ioserver.files")):
        fid = raw.get("id") if isinstance(raw, Mapping) else None
        if not isinstance(fid, str):
            raise ConfigError(f"ioserver.files[{i}].id: required config key is missing")
        key = f"ioserver.files.{fid}"
        check_id(fid, f"{key}.id")
        if fid in seen:
            raise ConfigError(f"{key}: duplicate file id {fid!r}")
        seen.add(fid)
        for k in raw:
            if k not in _FILE_KEYS:
                raise ConfigError(f"{key}.{k}: unknown config key")
        entries = _listing(raw.get("fields"), f"{key}.fields")
        ffields = tuple(_file_field(e, f"{key}.fields", j, fid, defined, ctx)
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
        check_file_time(fd, key)
        out.append(fd)
    return tuple(out)


def _file_field(e: Any, key: str, j: int, file_id: str, defined: Mapping[str, FieldDef],
                ctx: _Ctx) -> FieldDef:
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
    values.pop("data_grid", None)
    fd = _field(values, where, ctx)
    fd = replace(fd, data_grid=defined[ref].in_grid if ref is not None else fd.grid)
    check_interp(fd, where, ctx)
    _check_expr_refs(fd, where, defined, defined.keys())
    return fd


def _check_file(fd: FileDef, key: str) -> None:
    check_freq(fd.output_freq, f"{key}.output_freq")
    if fd.split_freq is not None:
        check_freq(fd.split_freq, f"{key}.split_freq")
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


def _check_shared(fd: FileDef, grids: Mapping[str, GridDef],
                  domains: Mapping[str, DomainDef]) -> None:
    if fd.shared != "true":
        return
    why = shared_obstacle(fd, grids, domains)
    if why is not None:
        raise ConfigError(f"{why[0]}: {why[1]}; set ioserver.files.{fd.id}.shared: false")


def expression_refs(text: str) -> tuple[set[str], set[str]]:
    """Ids an expression reads: (instant references, ``@`` references); ``set()`` if it
    does not parse (its syntax error is reported where the field is checked)."""
    try:
        e = parse(text)
    except ExprError:
        return set(), set()
    return set(e.names()), set(e.at_names())
