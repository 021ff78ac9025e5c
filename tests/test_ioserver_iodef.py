"""The iodef.xml reader (ensio.ioserver.iodef) and ``ensio ioserver convert``.

Each test writes a small iodef.xml the way an XIOS user would and checks the
resolved config the servers get (the same loader as YAML: every field already
final), so the expectations are XIOS's rules written out here, not the mapper's
output: inheritance from groups and the definition elements, field_ref, file
groups, group_ref in files, enabled, output_level, ``@`` expressions in the
element text, durations, includes, and bad input as one line naming the element
path and the attribute.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ensio.cli.main import main as cli_main
from ensio.config.errors import ConfigError
from ensio.ioserver.configload import load_ioserver_config
from ensio.ioserver.iodef import iodef_yaml, read_iodef
from ensio.ioserver.iodefattrs import supported

DATA = Path(__file__).parent / "data" / "xios_model"

HEAD = """<?xml version="1.0"?>
<simulation>
  <context id="m">
    <calendar type="Gregorian" start_date="2000-01-01 00:00:00" timestep="1h"/>
    <axis_definition><axis id="lev" n_glo="2" value="(0,1)[10 20]" unit="m"/></axis_definition>
    <domain_definition>
      <domain_group type="rectilinear">
        <domain id="d" ni_glo="4" nj_glo="3"/>
      </domain_group>
    </domain_definition>
    <grid_definition><grid id="g"><domain domain_ref="d"/></grid></grid_definition>
"""
TAIL = """  </context>
</simulation>
"""


def _xml(tmp: Path, body: str, name: str = "iodef.xml") -> Path:
    p = tmp / name
    p.write_text(HEAD + body + TAIL)
    return p


def _one_line_error(path: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        load_ioserver_config(path)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_field_group_and_definition_attributes_are_inherited(tmp_path):
    p = _xml(tmp_path, """
    <field_definition prec="8" operation="average" freq_op="2h">
      <field_group id="outer" grid_ref="g" unit="K">
        <field_group id="inner" operation="maximum">
          <field id="a"/>
          <field id="b" operation="minimum" unit="degC"/>
        </field_group>
        <field id="c" freq_op="1h"/>
      </field_group>
    </field_definition>
    <file_definition>
      <file id="f" output_freq="1d"><field field_ref="a"/></file>
    </file_definition>
""")
    cfg = load_ioserver_config(p)
    a, b, c = cfg.fields["a"], cfg.fields["b"], cfg.fields["c"]
    assert (a.operation, a.units, a.precision, a.freq_op, a.grid) == ("maximum", "K", 8, "2h", "g")
    assert (b.operation, b.units) == ("minimum", "degC")
    assert (c.operation, c.freq_op) == ("average", "1h")
    assert cfg.calendar.type == "gregorian" and cfg.calendar.timestep == "1h"
    assert cfg.axes["lev"].values == (10.0, 20.0) and cfg.axes["lev"].units == "m"
    assert cfg.domains["d"].type == "rectilinear" and cfg.domains["d"].shape == (3, 4)


def test_field_ref_inherits_and_own_attributes_win(tmp_path):
    p = _xml(tmp_path, """
    <field_definition>
      <field_group id="grp" grid_ref="g" operation="average">
        <field id="t" unit="K" long_name="temperature" prec="8"/>
      </field_group>
      <field id="tmax" field_ref="t" name="tmax" operation="maximum"/>
      <field id="tmax2" field_ref="tmax" name="tmax2" unit="degC"/>
    </field_definition>
    <file_definition>
      <file id="f" output_freq="1d">
        <field field_ref="tmax2"/>
        <field field_ref="t" name="t_inst" operation="instant" prec="4"/>
      </file>
    </file_definition>
""")
    cfg = load_ioserver_config(p)
    f = {x.name: x for x in cfg.files[0].fields}
    assert (f["tmax2"].operation, f["tmax2"].units, f["tmax2"].long_name) == \
        ("maximum", "degC", "temperature")
    assert f["tmax2"].precision == 8 and f["tmax2"].grid == "g"
    assert (f["t_inst"].operation, f["t_inst"].precision) == ("instant", 4)


def test_file_groups_pass_attributes_and_group_ref_expands(tmp_path):
    p = _xml(tmp_path, """
    <field_definition>
      <field_group id="sfc" grid_ref="g">
        <field id="u" unit="m s-1"/>
        <field id="v" operation="maximum"/>
        <field_group id="more"><field id="w"/></field_group>
      </field_group>
    </field_definition>
    <file_definition output_freq="6h" compression_level="2">
      <file_group id="fg" output_freq="1d">
        <file id="f1">
          <field_group group_ref="sfc" operation="average"/>
        </file>
        <file id="f2" output_freq="12h" name="two" name_suffix="_x"><field field_ref="u"/></file>
      </file_group>
      <file id="f3"><field field_ref="u"/></file>
    </file_definition>
""")
    cfg = load_ioserver_config(p)
    f1, f2, f3 = cfg.files
    assert (f1.output_freq, f2.output_freq, f3.output_freq) == ("1d", "12h", "6h")
    assert f1.compression == f2.compression == f3.compression == 2
    # XIOS's output name: name (or id) + name_suffix
    assert (f1.name, f2.name, f3.name) == ("f1", "two_x", "f3")
    ops = {x.name: x.operation for x in f1.fields}
    # the file group's operation applies where the field did not set one
    assert ops == {"u": "average", "v": "maximum", "w": "average"}


def test_enabled_false_and_output_level(tmp_path):
    p = _xml(tmp_path, """
    <field_definition level="1">
      <field_group id="grp" grid_ref="g">
        <field id="a"/>
        <field id="b" level="5"/>
        <field id="c" enabled=".FALSE."/>
      </field_group>
    </field_definition>
    <file_definition>
      <file id="on" output_freq="1h" output_level="2">
        <field field_ref="a"/><field field_ref="b"/><field field_ref="c"/>
        <field field_ref="a" name="a_off" enabled="false"/>
      </file>
      <file id="off" output_freq="1h" enabled=".false."><field field_ref="a"/></file>
    </file_definition>
""")
    cfg = load_ioserver_config(p)
    on = {x.name: x.enabled for x in cfg.files[0].fields}
    assert on == {"a": True, "b": False, "c": False, "a_off": False}
    assert [f.id for f in cfg.enabled_files] == ["on"]


def test_expressions_in_the_element_text_and_this(tmp_path):
    p = _xml(tmp_path, """
    <field_definition>
      <field_group id="grp" grid_ref="g">
        <field id="t"/>
        <field id="tmax" field_ref="t" name="tmax" operation="maximum"/>
        <field id="tk" field_ref="t" name="tk">this + 273.15</field>
      </field_group>
    </field_definition>
    <file_definition>
      <file id="f" output_freq="2d">
        <field name="ave_daily_max" operation="average" freq_op="1d">@tmax</field>
        <field field_ref="t" name="warm" expr="t &gt; 280 ? t - 280 : 0"/>
        <field field_ref="t" name="twice">
          2 * t
        </field>
      </file>
    </file_definition>
""")
    cfg = load_ioserver_config(p)
    assert cfg.fields["tk"].expr == "t + 273.15"
    f = {x.name: x for x in cfg.files[0].fields}
    assert f["ave_daily_max"].expr == "@tmax" and f["ave_daily_max"].freq_op == "1d"
    assert f["ave_daily_max"].grid == "g"
    assert f["warm"].expr == "t > 280 ? t - 280 : 0"
    assert f["twice"].expr == "2 * t"


def test_domain_and_axis_refs_make_a_grid(tmp_path):
    p = _xml(tmp_path, """
    <field_definition>
      <field_group id="grp" domain_ref="d">
        <field id="s"/>
        <field id="t3" axis_ref="lev"/>
      </field_group>
    </field_definition>
    <file_definition><file id="f" output_freq="1h">
      <field field_ref="s"/><field field_ref="t3"/></file></file_definition>
""")
    cfg = load_ioserver_config(p)
    assert cfg.grid_shape(cfg.fields["s"].grid) == (3, 4)
    assert cfg.grid_shape(cfg.fields["t3"].grid) == (2, 3, 4)


@pytest.mark.parametrize("text,freq", [("1d12h", "36h"), ("0.5h", "30mi"), ("1mo", "1mo"),
                                       ("90s", "90s"), ("2ts", "2ts"), ("1d 6h", "30h")])
def test_xios_durations(tmp_path, text, freq):
    p = _xml(tmp_path, f"""
    <field_definition><field id="a" grid_ref="g"/></field_definition>
    <file_definition><file id="f" output_freq="{text}"><field field_ref="a"/></file>
    </file_definition>
""")
    assert load_ioserver_config(p).files[0].output_freq == freq


def test_src_includes_are_followed(tmp_path):
    (tmp_path / "fields.xml").write_text(
        '<field_definition><field id="a" grid_ref="g" unit="K"/></field_definition>')
    (tmp_path / "ctx.xml").write_text(
        (HEAD.split("<context id=\"m\">")[1]).replace("<?xml", "")
        .join(['<context id="m">', ""])
        + '<field_definition src="fields.xml"/>'
        + '<file_definition><file id="f" output_freq="1h"><field field_ref="a"/></file>'
        + "</file_definition></context>")
    (tmp_path / "iodef.xml").write_text('<simulation><context id="m" src="./ctx.xml"/>'
                                        "</simulation>")
    cfg = load_ioserver_config(tmp_path / "iodef.xml")
    assert cfg.fields["a"].units == "K"
    (tmp_path / "loop.xml").write_text('<simulation><context id="m" src="loop2.xml"/>'
                                       "</simulation>")
    (tmp_path / "loop2.xml").write_text('<context id="m" src="loop2.xml"/>')
    msg = _one_line_error(tmp_path / "loop.xml")
    assert "attribute src" in msg and "includes itself" in msg


def test_round_trip_through_convert_gives_the_same_config(tmp_path):
    out = tmp_path / "elsewhere" / "iodef.yaml"
    out.parent.mkdir()
    assert cli_main(["ioserver", "convert", str(DATA / "iodef.xml"), "-o", str(out)]) == 0
    from_yaml = load_ioserver_config(out)
    from_xml = load_ioserver_config(DATA / "iodef.xml")
    assert from_yaml == from_xml
    assert from_xml.output_dir == DATA.resolve()
    text, _ = iodef_yaml(DATA / "iodef.xml")
    assert yaml.safe_load(text)["ioserver"]["files"][0]["id"] == "inst"


def test_convert_refuses_bad_xml_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.xml"
    bad.write_text("<simulation><context id='m'></simulation>")
    out = tmp_path / "out.yaml"
    assert cli_main(["ioserver", "convert", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not well-formed XML" in err and str(bad) in err
    assert not out.exists()


def test_entity_expansion_is_refused(tmp_path):
    p = tmp_path / "bomb.xml"
    p.write_text('<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol">'
                 '<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>\n'
                 "<simulation><context id='m'>&lol2;</context></simulation>")
    msg = _one_line_error(p)
    assert str(p) in msg and "refused" in msg


@pytest.mark.parametrize("body,where,attr", [
    ('<field_definition><field id="a" grid_ref="g" colour="red"/></field_definition>',
     "field_definition/field[a]", "colour"),
    ('<field_definition><field id="a" grid_ref="g"/></field_definition><file_definition>'
     '<file id="f" output_freq="6x"><field field_ref="a"/></file></file_definition>',
     "file[f]", "output_freq"),
    ('<field_definition><field id="a" grid_ref="g" ts_enabled="true"/></field_definition>',
     "field[a]", "ts_enabled"),
    ('<field_definition><field id="a" grid_ref="g"/></field_definition><file_definition>'
     '<file id="f" output_freq="1h" append="true"><field field_ref="a"/></file>'
     "</file_definition>", "file[f]", "append"),
    ('<field_definition><field id="a" grid_ref="g"/></field_definition><file_definition>'
     '<file id="f" output_freq="1h" name="@expname@_1h"><field field_ref="a"/></file>'
     "</file_definition>", "file[f]", "name"),
    ('<field_definition><field id="a" grid_ref="g"/></field_definition><file_definition>'
     '<file id="f" output_freq="1h" time_counter="exclusive"><field field_ref="a"/></file>'
     "</file_definition>", "file[f]", "time_counter"),
])
def test_unsupported_attributes_name_the_element_path(tmp_path, body, where, attr):
    msg = _one_line_error(_xml(tmp_path, body))
    assert where in msg and f"attribute {attr}" in msg and "iodef.xml" in msg


def test_loader_errors_are_the_yaml_loaders(tmp_path):
    p = _xml(tmp_path, """
    <field_definition><field id="a" grid_ref="nogrid"/></field_definition>
""")
    assert "no grid 'nogrid'" in _one_line_error(p)
    p = _xml(tmp_path, """
    <field_definition><field id="a" grid_ref="g"/></field_definition>
    <file_definition><file id="f" output_freq="1h"><field name="x">a +* 2</field></file>
    </file_definition>
""")
    assert "ioserver.files.f.fields.x.expr" in _one_line_error(p)


def test_structure_errors(tmp_path):
    no_cal = tmp_path / "nocal.xml"
    no_cal.write_text('<simulation><context id="m"><field_definition/></context></simulation>')
    assert "no <calendar>" in _one_line_error(no_cal)
    two = tmp_path / "two.xml"
    two.write_text('<simulation><context id="a"/><context id="b"/></simulation>')
    assert "2 model contexts (a, b)" in _one_line_error(two)
    sc = _xml(tmp_path, "<scalar_definition><scalar id='s'/></scalar_definition>"
              "<grid_definition><grid id='gs'><domain domain_ref='d'/><scalar scalar_ref='s'/>"
              "</grid></grid_definition>")
    msg = _one_line_error(sc)
    assert "grid[gs]/scalar[s]" in msg and "no scalars" in msg


def test_harmless_attributes_are_warnings(tmp_path):
    p = _xml(tmp_path, """
    <field_definition><field id="a" grid_ref="g" comment="x" cell_methods="time: mean"/>
    </field_definition>
    <file_definition type="multiple_file">
      <file id="f" output_freq="1h" uuid_name="uuid"><field field_ref="a"/></file>
    </file_definition>
""")
    m = read_iodef(p)
    joined = "\n".join(m.warnings)
    for attr in ("comment", "cell_methods", "type=multiple_file", "uuid_name"):
        assert f"attribute {attr}" in joined
    assert all("\n" not in w for w in m.warnings)
    load_ioserver_config(p)  # and it loads


def test_xios_context_using_server_false_is_attached_mode(tmp_path):
    p = tmp_path / "att.xml"
    p.write_text((HEAD + '<field_definition><field id="a" grid_ref="g"/></field_definition>'
                  + TAIL).replace(
        "<simulation>", '<simulation><context id="xios"><variable_definition>'
        '<variable id="using_server" type="bool">false</variable></variable_definition>'
        "</context>"))
    assert load_ioserver_config(p).mode == "attached"


def test_interpolate_domain_takes_its_source_from_the_fields(tmp_path):
    p = _xml(tmp_path, """
    <domain_definition>
      <domain id="coarse" type="rectilinear" ni_glo="2" nj_glo="3">
        <interpolate_domain order="1"/>
      </domain>
    </domain_definition>
    <grid_definition><grid id="gc"><domain domain_ref="coarse"/></grid></grid_definition>
    <field_definition><field id="a" grid_ref="g"/></field_definition>
    <file_definition><file id="f" output_freq="1h">
      <field field_ref="a" name="a_coarse" grid_ref="gc"/></file></file_definition>
""")
    if not supported("domain", "interpolate"):
        assert "not supported yet" in _one_line_error(p)
        return
    sec = read_iodef(p).section
    coarse = next(d for d in sec["domains"] if d["id"] == "coarse")
    assert coarse["interpolate"] == {"from": "d", "method": "conservative",
                                     "renormalize": False}


def test_keys_of_item_6_map_or_say_not_supported_yet(tmp_path):
    p = _xml(tmp_path, """
    <field_definition><field id="a" grid_ref="g" freq_offset="1ts" freq_op="2ts"/>
    </field_definition>
    <file_definition><file id="f" output_freq="6h" sync_freq="1d" time_counter="instant"
                           time_counter_name="time_c"><field field_ref="a"/></file>
    </file_definition>
""")
    expect = {("field", "freq_offset"): "1ts", ("file", "sync_freq"): "1d",
              ("file", "time_counter"): "instant", ("file", "time_counter_name"): "time_c"}
    if not all(supported(k, n) for k, n in expect if n != "sync_freq"):
        assert "not supported yet" in _one_line_error(p)
        return
    cfg = load_ioserver_config(p)
    assert cfg.fields["a"].freq_offset == "1ts"
    f = cfg.files[0]
    assert (f.time_counter, f.time_counter_name, f.time_naming) == ("instant", "time_c", "xios")
    if supported("file", "sync_freq"):
        assert f.sync_freq == "1d"


def test_set_overrides_apply_to_an_iodef_xml():
    cfg = load_ioserver_config(DATA / "iodef.xml", ["ioserver.calendar.timestep=1h",
                                                     "ioserver.servers=2"])
    assert (cfg.calendar.timestep, cfg.servers) == ("1h", 2)


def test_a_nemo_shaped_iodef_with_includes():
    m = read_iodef(DATA.parent / "xios_nemo" / "iodef.xml")
    assert m.context == "nemo"
    cfg = load_ioserver_config(DATA.parent / "xios_nemo" / "iodef.xml")
    assert cfg.calendar.type == "gregorian" and cfg.mode == "server"
    toce = cfg.fields["toce"]
    assert (toce.operation, toce.precision, toce.missing_value) == ("average", 4, 1e20)
    assert cfg.grid_shape(toce.grid) == (3, 8, 10)
    f1, f2 = cfg.files
    assert (f1.name, f1.output_freq) == ("ORCA2_grid_T", "1d")
    thetao = next(f for f in f1.fields if f.name == "thetao")
    assert (thetao.expr, thetao.freq_op) == ("@toce_e3t / @e3t", "1d")
    # output_level 1 in the monthly file: mldr10_1 (level 2) is off there, on in the daily one
    assert {f.name: f.enabled for f in f2.fields}["mldr10_1"] is False
    assert {f.name: f.enabled for f in f1.fields}["mldr10_1"] is True
    assert f2.name == "ORCA2_grid_T_1m_{start:%Y}-{end:%Y}" and f2.split_freq == "1y"
    assert any("type=multiple_file" in w for w in m.warnings)
