import pytest

from ensio.config import ConfigError, config_from_dict, load_config

BASE = {"ensemble": {"members": "fc/mem{member:03d}.nc", "size": 4, "variables": ["state"]}}


def test_defaults_and_types(tmp_path):
    cfg = config_from_dict(BASE, base_dir=tmp_path)
    assert cfg.io.tasks is None and cfg.io.journal is True and cfg.io.fsync is False
    assert cfg.member_paths()[0] == tmp_path / "fc/mem001.nc"
    assert cfg.member_paths()[-1] == tmp_path / "fc/mem004.nc"
    assert cfg.ensemble.variables[0].name == "state"


@pytest.mark.parametrize(
    "patch, key",
    [
        ({"bogus": 1}, "bogus"),
        ({"io": {"task": 2}}, "io.task"),
        ({"ensemble": {**BASE["ensemble"], "sizes": 3}}, "ensemble.sizes"),
        ({"io": {"tasks": "two"}}, "io.tasks"),
        ({"io": {"tasks": 0}}, "io.tasks"),
        ({"io": {"journal": "yes"}}, "io.journal"),
        ({"ensemble": {**BASE["ensemble"], "size": 0}}, "ensemble.size"),
        ({"ensemble": {"members": "x{member}.nc", "variables": ["a"]}}, "ensemble.size"),
        ({"ensemble": {**BASE["ensemble"], "members": "fc.nc"}}, "ensemble.members"),
        (
            {"ensemble": {**BASE["ensemble"], "variables": [{"name": "a", "msk": "m"}]}},
            "ensemble.variables[0].msk",
        ),
    ],
)
def test_errors_name_the_key(patch, key):
    with pytest.raises(ConfigError) as err:
        config_from_dict({**BASE, **patch})
    assert str(err.value).startswith(key + ":"), str(err.value)
    assert "\n" not in str(err.value)


def test_yaml_file_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(
        "ensemble:\n  members: m{member}.nc\n  size: 3\n"
        "  variables: [state, {name: soil, mask: land}]\n"
        "io: {tasks: 1}\n"
    )
    cfg = load_config(p, ["io.tasks=2", "io.journal=false", "ensemble.size=5"])
    assert cfg.io.tasks == 2 and cfg.io.journal is False and cfg.ensemble.size == 5
    assert cfg.ensemble.variables[1].mask == "land"
    assert cfg.base_dir == tmp_path
    with pytest.raises(ConfigError, match="^io.nope: unknown config key"):
        load_config(p, ["io.nope=1"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(p, ["io.tasks"])


def test_yaml_is_loaded_safely(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("ensemble: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


def test_config_is_frozen():
    cfg = config_from_dict(BASE)
    with pytest.raises(AttributeError):
        cfg.io.tasks = 3  # type: ignore[misc]
