"""Issue 26: the config keys of the stored axes (ensemble.dims, halo, cyclic, time_level,
grid, variables[].dims / also): accepted as the interface spells them, and every wrong
value one ConfigError naming its key."""

from __future__ import annotations

import copy

import pytest

from ensio.config.errors import ConfigError
from ensio.config.load import config_from_dict

BASE = {
    "ensemble": {
        "members": "m{member:02d}/restart.h5",
        "size": 2,
        "dims": ["xt", "yt", "zt", "level"],
        "halo": {"xt": 2, "yt": 2},
        "cyclic": ["xt"],
        "time_level": {"dim": "level", "from": "core/tau", "increment": "all"},
        "grid": "grid.nc",
        "coordinates": {"lon": "xt", "lat": "yt", "level": "zt"},
        "variables": [{"name": "core/temp", "mask": "maskT"},
                      {"name": "core/salt", "mask": "maskT", "also": ["core/salt_b"],
                       "dims": ["xt", "yt", "zt", "level"]}],
    }
}


def test_interface_spelling():
    ens = config_from_dict(BASE).ensemble
    assert ens.dims == ("xt", "yt", "zt", "level")
    assert ens.halo == {"xt": 2, "yt": 2} and ens.cyclic == ("xt",)
    tl = ens.time_level
    assert (tl.dim, tl.index, tl.from_, tl.increment) == ("level", None, "core/tau", "all")
    assert ens.grid == "grid.nc"
    assert ens.variables[1].also == ("core/salt_b",)
    assert ens.variables[1].dims == ("xt", "yt", "zt", "level")
    d = copy.deepcopy(BASE)
    d["ensemble"]["time_level"] = {"dim": "level", "index": 1}
    tl = config_from_dict(d).ensemble.time_level
    assert (tl.index, tl.from_, tl.increment) == (1, None, "current")


def _set(path: str, value):
    d = copy.deepcopy(BASE)
    node = d["ensemble"]
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    if value is None:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return d


@pytest.mark.parametrize(
    "path, value, key",
    [
        ("halo.zz", 1, "ensemble.halo.zz"),
        ("halo.xt", -1, "ensemble.halo.xt"),
        ("halo.xt", "two", "ensemble.halo.xt"),
        ("time_level.index", 1, "ensemble.time_level"),  # both index and from
        ("time_level.from", None, "ensemble.time_level"),  # neither
        ("time_level.increment", "some", "ensemble.time_level.increment"),
        ("time_level.dim", "xt", "ensemble.time_level.dim"),  # has a halo
        ("time_level.dim", "t", "ensemble.time_level.dim"),  # no such dim
        ("time_level.step", 1, "ensemble.time_level.step"),
        ("cyclic", ["zt"], "ensemble.cyclic"),
        ("cyclic", ["xt", "xt"], "ensemble.cyclic"),
        ("dims", ["xt", "xt", "zt", "level"], "ensemble.dims"),
        ("variables.0.also", ["core/salt"], "ensemble.variables[0].also"),
        ("variables.0.also", ["core/salt_b"], "ensemble.variables[1].also"),
        ("variables.0.dims", ["a", ""], "ensemble.variables[0].dims"),
        ("members", "m{member}_{tile}.h5", "ensemble.dims"),
    ],
)
def test_bad_value_names_key(path, value, key):
    with pytest.raises(ConfigError) as err:
        config_from_dict(_set(path, value))
    assert str(err.value).startswith(key + ":"), str(err.value)
    assert "\n" not in str(err.value)


def test_halo_dim_unknown_without_declared_dims_waits_for_the_file():
    d = _set("dims", None)
    d["ensemble"]["variables"] = [{"name": "core/temp"}]
    config_from_dict(d)  # checked when the layout is built (tests/test_restart_layout.py)


def test_shuffle_mode_refused():
    d = copy.deepcopy(BASE)
    d["io"] = {"mode": "shuffle", "local_dir": "/tmp/x"}
    with pytest.raises(ConfigError, match=r"^ensemble.dims: not supported with io.mode shuffle"):
        config_from_dict(d)


def test_grid_is_relative_to_the_config_also_in_a_cycle(tmp_path):
    """ensio cycle writes each cycle's analysis.yaml elsewhere: the grid stays the user's."""
    import yaml

    from ensio.config.load import load_config
    from ensio.workflow.cycle import write_analysis_config

    raw = copy.deepcopy(BASE)
    raw["workflow"] = {"member_command": "true {analysis} {forecast}"}
    raw["analysis"] = {"filter": "letkf", "localization": {"radius_km": 500.0}}
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "cycle.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    assert config.ensemble.grid == str(tmp_path / "sub" / "grid.nc")
    out = write_analysis_config(raw, config, tmp_path / "run", 1)
    assert load_config(out).ensemble.grid == str(tmp_path / "sub" / "grid.nc")
