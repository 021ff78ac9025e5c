"""Attribute tables of the iodef.xml reader: each XIOS attribute, what ensio does with it.

One table per element kind says, for every attribute ensio knows, whether it
maps to a key (and how its value converts), is ignored because ignoring it is
harmless under XIOS's own semantics (a warning says so, once per attribute), is
ignored silently (tuning of XIOS's own servers), or is refused with a one-line
error naming the element path and the attribute. An attribute in no table is
refused too: silently dropping what a user wrote would write different files.
The tables are the README's list; :mod:`.iodefmap` applies them.

Keys that another part of ensio adds (``freq_offset``, ``sync_freq``,
``time_counter``...) are mapped only when the config dataclasses have them, so
an older ensio says "not supported yet" instead of failing in the loader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from .config import AxisDef, DomainDef, FieldDef, FileDef
from .iodefxml import Node, array, boolean, duration, number

__all__ = ["Rule", "apply", "AXIS", "DOMAIN", "FIELD", "FILE", "CALENDAR", "supported"]

Out = dict[str, Any]
Rule = Callable[[Node, str, Out, list[str]], None]

_KEYS = {
    "field": {f.name for f in fields(FieldDef)},
    "file": {f.name for f in fields(FileDef)},
    "domain": {f.name for f in fields(DomainDef)},
    "axis": {f.name for f in fields(AxisDef)},
}


def supported(kind: str, key: str) -> bool:
    """Does this ensio have the config key ``key`` on a ``kind`` (field, file...)?"""
    return key in _KEYS[kind]


def apply(node: Node, table: dict[str, Rule], out: Out, warnings: list[str],
          skip: tuple[str, ...] = ()) -> Out:
    """Run ``table`` over the node's attributes (those in ``skip`` are handled by the
    caller); an attribute not in the table is refused."""
    for attr in node.attrib:
        if attr in skip:
            continue
        rule = table.get(attr)
        if rule is None:
            raise node.fail(f"not an attribute ensio reads on <{node.tag}> (see the "
                            "README's iodef.xml table)", attr)
        rule(node, attr, out, warnings)
    return out


# --- rule factories ----------------------------------------------------------------------

def text(node: Node, attr: str) -> str:
    return node.attrib[attr].strip()


def to(key: str, conv: Callable[[Node, str], Any] = text) -> Rule:
    def rule(node: Node, attr: str, out: Out, warnings: list[str]) -> None:
        out[key] = conv(node, attr)
    return rule


def pending(kind: str, key: str, conv: Callable[[Node, str], Any] = text) -> Rule:
    """Map to ``key`` when this ensio has it, else refuse with "not supported yet"."""
    def rule(node: Node, attr: str, out: Out, warnings: list[str]) -> None:
        if not supported(kind, key):
            raise node.fail(f"not supported yet (needs the {kind} key {key})", attr)
        out[key] = conv(node, attr)
    return rule


def pending_or_warn(kind: str, key: str, conv: Callable[[Node, str], Any],
                    reason: str) -> Rule:
    """Map to ``key`` when this ensio has it, else ignore with a warning (``reason``:
    why ignoring it is harmless)."""
    def rule(node: Node, attr: str, out: Out, warnings: list[str]) -> None:
        if supported(kind, key):
            out[key] = conv(node, attr)
        else:
            warn(reason)(node, attr, out, warnings)
    return rule


def _time_counter(node: Node, attr: str) -> str:
    v = text(node, attr)
    if v not in ("centered", "instant", "record", "none"):
        raise node.fail(f"{v!r}: ensio writes centered, instant, record or none "
                        "(not exclusive)", attr)
    return v


def warn(reason: str) -> Rule:
    def rule(node: Node, attr: str, out: Out, warnings: list[str]) -> None:
        warnings.append(f"{node.file}: {node.where} attribute {attr}: ignored ({reason})")
    return rule


def refuse(reason: str) -> Rule:
    def rule(node: Node, attr: str, out: Out, warnings: list[str]) -> None:
        raise node.fail(reason, attr)
    return rule


def quiet(node: Node, attr: str, out: Out, warnings: list[str]) -> None:
    """Ignored without a word: it tunes XIOS's own machinery, not the files."""


def refuse_unless(allowed: tuple[str, ...], reason: str) -> Rule:
    def rule(node: Node, attr: str, out: Out, warnings: list[str]) -> None:
        if node.attrib[attr].strip().lower() not in allowed:
            raise node.fail(f"{node.attrib[attr]!r}: {reason}", attr)
    return rule


def choice(values: dict[str, str | None]) -> Rule:
    """One of ``values``: ``None`` = nothing to say, a text = ignored with that warning."""
    def rule(node: Node, attr: str, out: Out, warnings: list[str]) -> None:
        v = node.attrib[attr].strip()
        if v not in values:
            raise node.fail(f"{v!r}: ensio reads {', '.join(values)}", attr)
        if values[v] is not None:
            warnings.append(f"{node.file}: {node.where} attribute {attr}={v}: ignored "
                            f"({values[v]})")
    return rule


def refuse_true(reason: str) -> Rule:
    def rule(node: Node, attr: str, out: Out, warnings: list[str]) -> None:
        if boolean(node, attr):
            raise node.fail(reason, attr)
    return rule


def _int(node: Node, attr: str) -> int:
    return int(number(node, attr, int))


def _float(node: Node, attr: str) -> float:
    return float(number(node, attr, float))


def _dur(node: Node, attr: str) -> str | None:
    return duration(node, attr)


def _offset(node: Node, attr: str) -> str:
    # XIOS writes "0ts" for no offset; ensio's key accepts zero durations as "0ts"
    return duration(node, attr, zero_ok=True) or "0ts"


def _prec(node: Node, attr: str) -> int:
    p = _int(node, attr)
    if p not in (2, 4, 8):
        raise node.fail(f"{p}: XIOS prec is 2, 4 or 8", attr)
    return p


_SET_BY_MODEL = "set by the model (xios_set_*_attr), not in the iodef.xml, in ensio"

# --- tables --------------------------------------------------------------------------------

CALENDAR: dict[str, Rule] = {
    "id": quiet,
    "start_date": to("start"),
    "timestep": to("timestep", _dur),
    "comment": quiet,
}
for _a in ("day_length", "month_lengths", "year_length", "leap_year_month",
           "leap_year_drift", "leap_year_drift_offset"):
    CALENDAR[_a] = refuse("user-defined calendars are not supported")

AXIS: dict[str, Rule] = {
    "name": to("name"),
    "n_glo": to("n", _int),
    "unit": to("units"),
    "positive": to("positive"),
    "standard_name": to("standard_name"),
    "long_name": to("long_name"),
    "value": to("values", array),
    "prec": warn("axis values are written as float64"),
    "comment": warn("ensio writes no axis comment"),
    "label": refuse("label axes are not supported"),
    "formula": refuse("formula terms are not supported"),
    "bounds": warn("ensio writes no vertical bounds"),
    "n": warn("the local size is the model's decomposition; levels are never split"),
    "begin": warn("the local start is the model's decomposition; levels are never split"),
    "dim_name": refuse("ensio names the axis dimension after the axis name"),
}

DOMAIN: dict[str, Rule] = {
    "type": to("type"),
    "ni_glo": to("ni_glo", _int),
    "nj_glo": to("nj_glo", _int),
    "nvertex": to("nvertex", _int),
    "lonvalue_1d": pending("domain", "lon", array),
    "latvalue_1d": pending("domain", "lat", array),
    "name": warn("ensio names the coordinates lon and lat"),
    "long_name": warn("ensio names the coordinates lon and lat"),
    "standard_name": warn("ensio names the coordinates lon and lat"),
    "lon_name": warn("ensio names the longitude lon"),
    "lat_name": warn("ensio names the latitude lat"),
    "dim_i_name": warn("ensio names the dimensions lon/lat (or cell)"),
    "dim_j_name": warn("ensio names the dimensions lon/lat (or cell)"),
    "bounds_lon_name": warn("ensio names the bounds lon_bnds"),
    "bounds_lat_name": warn("ensio names the bounds lat_bnds"),
    "prec": warn("coordinates are written as float64"),
    "comment": warn("ensio writes no domain comment"),
}
for _a in ("ibegin", "jbegin", "ni", "nj", "i_index", "j_index", "data_dim", "data_ibegin",
           "data_jbegin", "data_ni", "data_nj", "data_i_index", "data_j_index", "mask_1d",
           "mask_2d", "lonvalue_2d", "latvalue_2d", "bounds_lon_1d", "bounds_lat_1d",
           "bounds_lon_2d", "bounds_lat_2d", "area"):
    DOMAIN[_a] = refuse(_SET_BY_MODEL)

#: attributes of <field> and <field_group> (definitions and file entries)
FIELD: dict[str, Rule] = {
    "name": to("name"),
    "long_name": to("long_name"),
    "standard_name": to("standard_name"),
    "unit": to("units"),
    "operation": to("operation"),
    "freq_op": to("freq_op", _dur),
    "freq_offset": pending("field", "freq_offset", _offset),
    "prec": to("precision", _prec),
    "enabled": to("enabled", boolean),
    "default_value": to("missing_value", _float),
    "detect_missing_value": quiet,  # ensio always skips the missing value (see the README)
    "scale_factor": pending("field", "scale_factor", _float),
    "add_offset": pending("field", "add_offset", _float),
    "valid_min": pending("field", "valid_min", _float),
    "valid_max": pending("field", "valid_max", _float),
    "check_if_active": quiet,  # ensio's is_active is always exact
    "comment": warn("ensio writes no variable comment"),
    "cell_methods": warn("ensio writes cell_methods from the operation"),
    "cell_methods_mode": warn("ensio writes cell_methods from the operation"),
    "compression_level": warn("compression is per file in ensio: set compression_level "
                              "on the file"),
    "ts_enabled": refuse_true("time-series files are not supported"),
    "ts_split_freq": refuse("time-series files are not supported"),
    "read_access": refuse_true("reading fields from files is not supported"),
    "indexed_output": refuse_true("indexed (compressed) output is not supported"),
    "grid_path": refuse("grid_path is not supported"),
    "scalar_ref": refuse("scalars are not supported"),
    "build_workflow_graph": quiet,
    "conversion_by_NetCDF": quiet,
    "chunking_blocksize_target": quiet,
}

#: attributes of <file>, <file_group> and <file_definition>
FILE: dict[str, Rule] = {
    "output_freq": to("output_freq", _dur),
    "split_freq": to("split_freq", _dur),
    "sync_freq": pending_or_warn("file", "sync_freq", _dur,
                                 "this ensio syncs after every output step, more often"),
    "enabled": to("enabled", boolean),
    "compression_level": to("compression", _int),
    "time_units": to("time_units"),
    "time_counter": pending("file", "time_counter", _time_counter),
    "time_counter_name": pending("file", "time_counter_name"),
    "description": quiet,  # written as the global attribute description (iodefmap)
    "type": choice({"one_file": None,
                     "multiple_file": "ensio writes one file whatever the number of servers"}),
    "format": choice({"netcdf4": None,
                      "netcdf4_classic": "written as netcdf4 (readable by the same tools)"}),
    "convention": refuse_unless(("cf",), "only the CF convention is written (no UGRID)"),
    "append": refuse_true("appending to existing files is not supported"),
    "mode": refuse_unless(("write",), "only mode write (reading files is not supported)"),
    "timeseries": refuse_unless(("none",), "time-series files are not supported"),
    "record_offset": refuse_unless(("0",), "record_offset is not supported"),
    "split_start_offset": refuse("split offsets are not supported"),
    "split_end_offset": refuse("split offsets are not supported"),
    "split_last_date": refuse("split_last_date is not supported"),
    "cyclic": refuse_true("cyclic files are not supported"),
    "min_digits": quiet,  # numbering of multiple_file files; ensio writes one file
    "par_access": quiet,
    "output_level": quiet,  # applied to the fields' level (iodefmap)
    "name": quiet,          # iodefmap: name + name_suffix + split dates
    "name_suffix": quiet,
    "split_freq_format": quiet,
    "uuid_name": warn("ensio writes no uuid attribute"),
    "uuid_format": warn("ensio writes no uuid attribute"),
    "time_stamp_name": warn("ensio writes the history attribute instead"),
    "time_stamp_format": warn("ensio writes the history attribute instead"),
    "convention_str": warn("ensio writes Conventions = CF-1.8"),
    "comment": quiet,       # a global attribute (iodefmap)
    "read_metadata_par": quiet,
    "gatherer": quiet,
    "writer": quiet,
    "using_server2": quiet,
}
