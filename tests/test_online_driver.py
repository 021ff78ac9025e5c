"""The online cycle driver's pure parts and the config keys it adds (no MPI job)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ensio.config import config_from_dict
from ensio.config.errors import ConfigError
from ensio.workflow.online import online_argv

EXAMPLE = Path(__file__).parents[1] / "examples" / "lorenz96" / "cycle.yaml"


def _config(**online):
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["workflow"]["online"] = {**raw["workflow"]["online"], **online}
    return config_from_dict(raw, base_dir=EXAMPLE.parent)


def test_argv_of_first_cycle_starts_from_the_initial_ensemble(tmp_path):
    cfg = _config(tasks_per_member=2)
    argv = online_argv(cfg, "mpiexec", tmp_path, 1, 3)
    assert argv[:3] == ["mpiexec", "-n", str(2 * cfg.ensemble.size)]
    i = argv.index("--initial")
    assert argv[i + 1] == str(tmp_path / "init" / "mem{member:03d}.nc")
    assert argv[argv.index("--first") + 1] == "1"
    assert argv[argv.index("--cycles") + 1] == "3"
    assert argv[argv.index("--tasks-per-member") + 1] == "2"


def test_argv_of_a_resumed_run_starts_from_the_last_analysis(tmp_path):
    argv = online_argv(_config(), "mpiexec", tmp_path, 3, 4)
    i = argv.index("--initial")
    assert argv[i + 1] == str(tmp_path / "cycle_002" / "analysis" / "mem{member:03d}.nc")
    assert argv[argv.index("--first") + 1] == "3"


@pytest.mark.parametrize(
    ("online", "key"),
    [
        ({"command": "prog {bogus}"}, "workflow.online.command"),
        ({"tasks_per_member": 0}, "workflow.online.tasks_per_member"),
        ({"timeout": -1}, "workflow.online.timeout"),
        ({"ranks": 2}, "workflow.online.ranks"),
    ],
)
def test_bad_online_keys_name_the_key(online, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _config(**online)


@pytest.mark.parametrize(
    ("ids", "size", "match"),
    [((1, 1), 2, "distinct"), ((0, 2), 2, "distinct"), ((1, 2, 3), 2, "3 member numbers")],
)
def test_bad_ensemble_ids(ids, size, match):
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["ensemble"] = {**raw["ensemble"], "ids": list(ids), "size": size}
    with pytest.raises(ConfigError, match=f"ensemble.ids: .*{match}"):
        config_from_dict(raw, base_dir=EXAMPLE.parent)


def test_ensemble_ids_select_member_files():
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["ensemble"] = {**raw["ensemble"], "ids": [2, 5], "size": 2}
    raw["io"] = {"in_place": False}
    raw["output"] = {"members": "out/m{member}.nc"}
    cfg = config_from_dict(raw, base_dir="/x")
    assert [p.name for p in cfg.member_paths()] == ["mem002.nc", "mem005.nc"]
    assert [p.name for p in cfg.output_member_paths()] == ["m2.nc", "m5.nc"]


def test_analyse_members_flag_rejects_duplicates(tmp_path):
    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump({
        "ensemble": {"members": "m{member}.nc", "size": 3, "variables": ["x"]},
        "analysis": {"filter": "etkf"},
    }))  # fmt: skip
    res = subprocess.run([sys.executable, "-m", "ensio", "analyse", str(cfg), "--members", "1,1"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert "--members: ensemble.ids" in last and "distinct" in last
