"""ioserver config: inheritance precedence, file-field overrides, every error naming its key."""

import copy
from pathlib import Path

import pytest

from ensio.config.errors import ConfigError
from ensio.ioserver.config import Box
from ensio.ioserver.configload import (
    expression_refs,
    ioserver_from_dict,
    load_ioserver_config,
)

EXAMPLE = Path(__file__).parents[1] / "examples" / "ioserver" / "iodef.yaml"


def base():
    return {
        "calendar": {"type": "noleap", "start": "2000-01-01", "timestep": "1h"},
        "axes": [{"id": "lev", "n": 2, "values": [1000, 500]}],
        "domains": [{"id": "d", "type": "rectilinear", "ni_glo": 4, "nj_glo": 3},
                    {"id": "u", "type": "unstructured", "ni_glo": 10, "nvertex": 6}],
        "grids": [{"id": "g", "domain": "d"}, {"id": "g3", "domain": "d", "axis": "lev"},
                  {"id": "gu", "domain": "u"}],
        "field_groups": [{"id": "atm", "grid": "g", "operation": "average", "fields": [
            {"id": "tas", "units": "K"}, {"id": "pr", "operation": "accumulate"}]}],
        "files": [{"id": "f", "name": "out", "output_freq": "1d",
                   "fields": [{"field_ref": "tas"}]}],
    }


def test_example_loads(tmp_path):
    cfg = load_ioserver_config(EXAMPLE)
    assert cfg.output_dir == EXAMPLE.parent / "output"
    assert cfg.sources == ("tas", "pr", "ta")
    assert cfg.field_shape("ta") == (4, 18, 36)
    weekly = {f.id: f for f in cfg.files}["weekly"]
    assert weekly.fields[0].id == "weekly/ave_daily_max"
    cfg2 = load_ioserver_config(EXAMPLE, ["ioserver.servers=3", "ioserver.calendar.type=360_day"])
    assert (cfg2.servers, cfg2.calendar.type) == (3, "360_day")


def test_shapes_and_sources():
    cfg = ioserver_from_dict(base())
    assert cfg.grid_shape("g") == (3, 4)
    assert cfg.grid_shape("g3") == (2, 3, 4)
    assert cfg.grid_shape("gu") == (10,)
    assert cfg.sources == ("tas", "pr")
    assert [f.id for f in cfg.enabled_files] == ["f"]


def test_inheritance_precedence_own_ref_groups_defaults():
    raw = base()
    raw["field_groups"] = [{
        "id": "outer", "grid": "g", "operation": "maximum", "precision": 8, "units": "K",
        "fields": [{"id": "a", "freq_op": "2ts", "long_name": "A"}],
        "groups": [{"id": "inner", "operation": "minimum", "fields": [
            {"id": "b"},                                         # inner group > outer group
            {"id": "c", "field_ref": "a"},                       # ref > groups
            {"id": "d", "field_ref": "a", "operation": "once"},  # own > ref
        ]}],
    }]
    raw["fields"] = [{"id": "e", "grid": "g"}]                   # defaults only
    raw["files"] = []
    f = ioserver_from_dict(raw).fields
    assert (f["a"].operation, f["a"].precision, f["a"].units) == ("maximum", 8, "K")
    assert (f["b"].operation, f["b"].precision, f["b"].freq_op) == ("minimum", 8, "1ts")
    assert (f["c"].operation, f["c"].freq_op, f["c"].long_name) == ("maximum", "2ts", "A")
    assert (f["c"].name, f["c"].field_ref, f["c"].is_source) == ("a", "a", False)
    assert (f["d"].operation, f["d"].freq_op) == ("once", "2ts")
    assert (f["e"].operation, f["e"].precision, f["e"].freq_op) == ("instant", 4, "1ts")
    assert f["e"].enabled and f["e"].units is None


def test_a_reference_does_not_hide_the_groups_with_defaults():
    """A default the referenced field merely inherited is still below the groups."""
    raw = base()
    raw["fields"] = [{"id": "plain", "grid": "g"}]
    raw["field_groups"][0]["fields"].append({"id": "p2", "field_ref": "plain"})
    f = ioserver_from_dict(raw).fields
    assert f["p2"].operation == "average"  # from group atm; plain only had the default
    assert f["p2"].grid == "g"


def test_file_field_overrides():
    raw = base()
    raw["files"][0]["fields"] = [
        {"field_ref": "tas"},
        {"field_ref": "tas", "name": "tmax", "operation": "maximum", "precision": 8,
         "extract": {"lon": [0, 90], "lat": [-30, 30]}},
        {"field_ref": "pr", "name": "pr_gm", "mean": "global"},
        {"name": "tc", "expr": "tas - 273.15", "units": "degC"},
        {"name": "t3", "expr": "@tas", "grid": "g", "freq_op": "1d"},
    ]
    ff = {f.name: f for f in ioserver_from_dict(raw).files[0].fields}
    assert (ff["tas"].id, ff["tas"].operation, ff["tas"].units) == ("f/tas", "average", "K")
    assert ff["tas"].field_ref == "tas"
    assert (ff["tmax"].operation, ff["tmax"].precision, ff["tmax"].dtype) == ("maximum", 8, "f8")
    assert ff["tmax"].extract == Box(lon=(0.0, 90.0), lat=(-30.0, 30.0))
    assert (ff["pr_gm"].operation, ff["pr_gm"].mean) == ("accumulate", "global")
    assert (ff["tc"].grid, ff["tc"].units, ff["tc"].field_ref) == ("g", "degC", None)
    assert ff["tc"].operation == "instant"  # a file field without field_ref has defaults
    assert ff["t3"].freq_op == "1d"


def test_expression_refs():
    assert expression_refs("tas - 273.15 * 1e-3 + max(a, @b) + exp(c)") == (
        {"tas", "a", "c"}, {"b"})
    assert expression_refs("2.5E+3 * x") == ({"x"}, set())


def edit(path, value):
    """base() with the value at a dotted path (list items by index) replaced."""
    raw = base()
    *parents, last = path
    node = raw
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return raw


_DELETE = object()


@pytest.mark.parametrize("path,value,key", [
    (("nope",), 1, "ioserver.nope: unknown config key"),
    (("mode",), "xios", "ioserver.mode"),
    (("servers",), 0, "ioserver.servers"),
    (("client_buffer_mb",), 0, "ioserver.client_buffer_mb"),
    (("calendar", "type"), "martian", "ioserver.calendar.type"),
    (("calendar", "timestep"), "1mo", "ioserver.calendar.timestep"),
    (("calendar", "start"), "yesterday", "ioserver.calendar.start"),
    (("calendar", "zone"), "UTC", "ioserver.calendar.zone: unknown config key"),
    (("axes", 0, "n"), 0, "ioserver.axes.lev.n"),
    (("axes", 0, "values"), [1], "ioserver.axes.lev.values"),
    (("axes", 0, "colour"), 1, "ioserver.axes.lev.colour: unknown config key"),
    (("domains", 0, "ni_glo"), 0, "ioserver.domains.d"),
    (("domains", 0, "type"), "hexagonal", "ioserver.domains.d.type"),
    (("domains", 1, "nj_glo"), 2, "ioserver.domains.u.nj_glo"),
    (("grids", 0, "domain"), "zz", "ioserver.grids.g.domain: no domain 'zz'"),
    (("grids", 1, "axis"), "zz", "ioserver.grids.g3.axis: no axis 'zz'"),
    (("field_groups", 0, "colour"), 1, "ioserver.field_groups.atm.colour: unknown config key"),
    (("field_groups", 0, "grid"), "zz", "ioserver.field_groups.atm.fields.tas.grid: no grid"),
    (("field_groups", 0, "grid"), _DELETE, "ioserver.field_groups.atm.fields.tas.grid: required"),
    (("field_groups", 0, "operation"), "median", "ioserver.field_groups.atm.fields.tas.operation"),
    (("field_groups", 0, "precision"), 2, "ioserver.field_groups.atm.fields.tas.precision"),
    (("field_groups", 0, "freq_op"), "6x", "ioserver.field_groups.atm.fields.tas.freq_op"),
    (("field_groups", 0, "fields", 0, "size"), 1,
     "ioserver.field_groups.atm.fields.tas.size: unknown config key"),
    (("field_groups", 0, "fields", 0, "id"), "1tas", "ioserver.field_groups.atm.fields.1tas.id"),
    (("field_groups", 0, "fields", 0, "id"), _DELETE, "ioserver.field_groups.atm.fields[0].id"),
    (("field_groups", 0, "fields", 1, "id"), "tas", "duplicate field id 'tas'"),
    (("field_groups", 0, "fields", 1, "field_ref"), "zz",
     "ioserver.field_groups.atm.fields.pr.field_ref: no field 'zz'"),
    (("field_groups", 0, "fields", 1, "expr"), "tas + zz",
     "ioserver.field_groups.atm.fields.pr.expr: no field 'zz'"),
    (("field_groups", 0, "fields", 1, "expr"), "@zz",
     "ioserver.field_groups.atm.fields.pr.expr: no field 'zz'"),
    (("files", 0, "id"), _DELETE, "ioserver.files[0].id: required"),
    (("files", 0, "format"), "grib", "ioserver.files.f.format"),
    (("files", 0, "output_freq"), "daily", "ioserver.files.f.output_freq"),
    (("files", 0, "output_freq"), _DELETE, "ioserver.files.f.output_freq: required"),
    (("files", 0, "split_freq"), "1week", "ioserver.files.f.split_freq"),
    (("files", 0, "compression"), 10, "ioserver.files.f.compression"),
    (("files", 0, "time_units"), "weeks", "ioserver.files.f.time_units"),
    (("files", 0, "name"), "a/b", "ioserver.files.f.name"),
    (("files", 0, "name"), "x_{start:%Y}_{end:%Y}", "ioserver.files.f.name: {end} needs"),
    (("files", 0, "name"), "x_{date}", "ioserver.files.f.name: unknown placeholder"),
    (("files", 0, "colour"), 1, "ioserver.files.f.colour: unknown config key"),
    (("files", 0, "fields", 0, "field_ref"), "zz", "ioserver.files.f.fields.zz.field_ref"),
    (("files", 0, "fields", 0, "field_ref"), _DELETE, "ioserver.files.f.fields[0].field_ref"),
    (("files", 0, "fields", 0, "id"), "x", "ioserver.files.f.fields.tas.id: unknown config key"),
    (("files", 0, "fields", 0, "operation"), "mode", "ioserver.files.f.fields.tas.operation"),
    (("files", 0, "fields", 0, "mean"), "meridional", "ioserver.files.f.fields.tas.mean"),
    (("files", 0, "fields", 0, "extract"), {"lat": [30, -30]},
     "ioserver.files.f.fields.tas.extract: lat: south 30.0 is north of -30.0"),
    (("files", 0, "fields", 0, "expr"), "@zz + 1", "ioserver.files.f.fields.tas.expr: no field"),
])
def test_errors_name_the_key(path, value, key):
    with pytest.raises(ConfigError) as err:
        ioserver_from_dict(edit(path, value))
    msg = str(err.value)
    assert key in msg and "\n" not in msg


def test_more_errors():
    raw = base()
    raw["files"].append(copy.deepcopy(raw["files"][0]))
    with pytest.raises(ConfigError, match="ioserver.files.f: duplicate file id 'f'"):
        ioserver_from_dict(raw)
    raw = base()
    raw["axes"].append({"id": "lev", "n": 3})
    with pytest.raises(ConfigError, match="ioserver.axes.lev: duplicate id 'lev'"):
        ioserver_from_dict(raw)
    raw = base()
    raw["files"][0]["fields"].append({"field_ref": "pr", "name": "tas"})
    with pytest.raises(ConfigError, match="ioserver.files.f.fields: variable name 'tas' used"):
        ioserver_from_dict(raw)
    raw = base()
    raw["files"][0]["format"] = "cdf5"
    raw["files"][0]["compression"] = 4
    with pytest.raises(ConfigError, match="ioserver.files.f.compression: cdf5"):
        ioserver_from_dict(raw)
    raw = base()
    raw["field_groups"][0]["fields"].append({"id": "t3", "grid": "g3"})
    raw["field_groups"][0]["fields"][1]["expr"] = "t3 * 2"
    with pytest.raises(ConfigError, match="fields.pr.expr: field 't3' is on grid 'g3'"):
        ioserver_from_dict(raw)


def test_reference_cycles():
    raw = base()
    raw["field_groups"][0]["fields"] = [
        {"id": "a", "field_ref": "b"}, {"id": "b", "field_ref": "c"},
        {"id": "c", "field_ref": "a"}]
    with pytest.raises(ConfigError,
                       match=r"fields\.c\.field_ref: reference cycle a -> b -> c -> a"):
        ioserver_from_dict(raw)
    raw["field_groups"][0]["fields"] = [
        {"id": "a", "expr": "b + 1"}, {"id": "b", "expr": "@a"}, {"id": "tas"}]
    with pytest.raises(ConfigError, match=r"\.expr: reference cycle (a -> b -> a|b -> a -> b)"):
        ioserver_from_dict(raw)
    raw["field_groups"][0]["fields"] = [{"id": "a", "expr": "a * 2"}]
    with pytest.raises(ConfigError, match=r"fields\.a\.expr: reference cycle a -> a"):
        ioserver_from_dict(raw)


def test_loader_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_ioserver_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("ioserver: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_ioserver_config(bad)
    bad.write_text("model: {}\n")
    with pytest.raises(ConfigError, match="ioserver: required config section is missing"):
        load_ioserver_config(bad)
    with pytest.raises(ConfigError, match="ioserver: expected a mapping"):
        ioserver_from_dict([1])
