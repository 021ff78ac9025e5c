"""The transfer config: one-line errors naming the key, glob language, the interposer's rules."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from transfer_support import SRC

from ensio.config.errors import ConfigError
from ensio.transfer.config import FilePattern, load_transfer_config, transfer_from_dict
from ensio.transfer.run import rules_text


def conn(**over):
    c = {"name": "restarts", "from": "model", "to": "post", "files": ["/x/mem*.nc"]}
    c.update(over)
    return c


def cfg(**over):
    raw = {"components": ["model", "post"], "connections": [conn()]}
    raw.update(over)
    return raw


def error_of(raw) -> str:
    with pytest.raises(ConfigError) as info:
        transfer_from_dict(raw)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("raw, key", [
    (cfg(extra=1), "extra: unknown config key"),
    ({"connections": [conn()]}, "components: required"),
    ({"components": ["model"]}, "connections: required"),
    (cfg(connections=[conn(bogus=3)]), "connections[0].bogus: unknown config key"),
    (cfg(connections=[conn(source="model")]), "connections[0].source: unknown config key"),
    (cfg(connections=[{k: v for k, v in conn().items() if k != "from"}]),
     "connections[0].from: required config key is missing"),
    (cfg(connections=[conn(**{"from": "modle"})]),
     "connections[0].from: 'modle' is not a component (model, post)"),
    (cfg(connections=[conn(to="pots")]), "connections[0].to: 'pots' is not a component"),
    (cfg(connections=[conn(to=["post", "x"])]), "connections[0].to[1]: 'x' is not a component"),
    (cfg(connections=[conn(), conn(files=["/y/*.nc"])]), "connections[1].name: 'restarts' appears"),
    (cfg(components=["model", "model"]), "components[1]: 'model' appears twice"),
    (cfg(components=["a b"]), "components[0]: 'a b' is not a simple name"),
    (cfg(connections=[conn(pattern="2-2")]), "connections[0].pattern: '2-2' is not one of"),
    (cfg(connections=[conn(mode="fast")]), "connections[0].mode: 'fast' is not one of sync"),
    (cfg(connections=[conn(fallback="disk")]), "connections[0].fallback: 'disk' is not one of"),
    (cfg(connections=[conn(persist="yes")]), "connections[0].persist: expected true or false"),
    (cfg(connections=[conn(memory_mb=0)]), "connections[0].memory_mb: must be positive"),
    (cfg(connections=[conn(memory_mb="lots")]), "connections[0].memory_mb:"),
    (cfg(connections=[conn(consumer_timeout_s=-1)]), "connections[0].consumer_timeout_s: must be"),
    (cfg(connections=[conn(files=[])]), "connections[0].files: list at least one"),
    (cfg(connections=[conn(files=["/x/mem?.nc"])]), "connections[0].files[0]: '/x/mem?.nc': '?'"),
    (cfg(connections=[conn(files=["/x/**/a.nc"])]), "connections[0].files[0]:"),
    (cfg(connections=[conn(files=["/x/{member:3}.nc"])]), "connections[0].files[0]:"),
    (cfg(connections=[conn(files=["/x/"])]), "connections[0].files[0]: '/x/' names a directory"),
    (cfg(connections=[]), "connections: expected a non-empty list"),
    (cfg(connections=["restarts"]), "connections[0]: expected a mapping"),
    (cfg(pool_mb=-1), "pool_mb: must be 0 or more"),
    (cfg(pool_mb="big"), "pool_mb: expected a number"),
])
def test_config_errors_name_the_key(raw, key):
    assert key in error_of(raw)


def test_config_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("components: [model]\nconnections:\n  - name: r\n    from: model\n"
                   "    to: post\n    files: [a.nc]\n")
    with pytest.raises(ConfigError, match=r"t\.yaml: connections\[0\]\.to: 'post' is not"):
        load_transfer_config(bad)
    bad.write_text("components: [model\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_transfer_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_transfer_config(tmp_path / "missing.yaml")


def test_defaults_relative_globs_and_identity(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("components: [model, post]\nconnections:\n  - name: restarts\n"
                    "    from: model\n    to: post\n    files: ['fc/mem{member:03d}.nc']\n")
    c = load_transfer_config(path)
    r = c.connections[0]
    assert (r.pattern, r.mode, r.fallback, r.persist, r.memory_mb) == ("1-1", "sync", "files",
                                                                       False, None)
    assert r.to == ("post",) and r.source == "model"
    assert r.files == (str(tmp_path.resolve() / "fc" / "mem{member:03d}.nc"),)
    assert c.for_path(str(tmp_path.resolve() / "fc" / "mem007.nc")) is r
    first = c.identity
    path.write_text(path.read_text().replace("restarts", "other"))
    assert load_transfer_config(path).identity != first


def _reference(glob: str, path: str) -> bool:
    """An independent matcher: fnmatch per path component, {member} spelt as regex."""
    gparts, pparts = glob.split("/"), path.split("/")
    if len(gparts) != len(pparts):
        return False
    for g, p in zip(gparts, pparts, strict=True):
        pieces = re.split(r"(\{member(?::0?\d+d)?\})", g)
        rx = ""
        for piece in pieces:
            m = re.fullmatch(r"\{member(?::0?(\d+)d)?\}", piece)
            if m:
                rx += f"[0-9]{{{m.group(1)}}}" if m.group(1) else "[0-9]+"
            elif piece:
                rx += fnmatch.translate(piece)[4:-3]  # strip (?s: ... )\Z
        if not re.fullmatch(rx, p):
            return False
    return True


@pytest.mark.parametrize("glob", ["/s/fc/mem*.nc", "/s/fc/mem{member}.nc",
                                  "/s/fc/mem{member:03d}_*.nc", "/s/*/out.nc", "/s/fc/*",
                                  "/s/fc/a*b*c.nc"])
def test_glob_language_agrees_with_an_independent_matcher(glob, rng):
    alphabet = list("0123456789abcmen_./")
    names = ["mem001.nc", "mem1.nc", "mem.nc", "mem001_x.nc", "mem01_.nc", "memx.nc", "abc.nc",
             "aXbYc.nc", "out.nc"]
    names += ["".join(rng.choice(alphabet, size=rng.integers(1, 12))) for _ in range(300)]
    pattern = FilePattern.parse(glob, "files")
    for name in names:
        for path in (f"/s/fc/{name}", f"/s/{name}/out.nc", f"/s/fc/sub/{name}"):
            assert pattern.match(path) == _reference(glob, path), (glob, path)


def test_rules_name_roles_and_settings(tmp_path):
    raw = cfg(components=["model", "post", "other"], connections=[
        conn(memory_mb=2, fallback="error", persist=True, consumer_timeout_s=1.5),
        conn(name="back", **{"from": "post"}, to="model", files=["/y/an*.nc"])])
    c = transfer_from_dict(raw)
    model = rules_text(c, "model").splitlines()
    assert model[:2] == ["ensio-transfer-rules 1", "component model"]
    assert model[2] == "rule P 2097152 error 1 1500 local:restarts /x/mem\x01.nc"
    assert model[3] == "rule C -1 files 0 600000 local:back /y/an\x01.nc"
    assert rules_text(c, "other").splitlines() == ["ensio-transfer-rules 1", "component other"]


def test_rules_name_a_linked_directory_twice(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    c = transfer_from_dict(cfg(connections=[conn(files=[str(tmp_path / "link" / "m*.nc")])]))
    patterns = [line.split(" ", 7)[7] for line in rules_text(c, "post").splitlines()[2:]]
    assert patterns == [f"{tmp_path}/link/m\x01.nc", f"{os.path.realpath(real)}/m\x01.nc"]


def _ensio(*args, env=None, cwd=None):
    e = dict(os.environ, PYTHONPATH=str(SRC), **(env or {}))
    return subprocess.run([sys.executable, "-m", "ensio.cli.main", *args], env=e, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_run_refuses_an_unknown_component_and_a_bad_config(tmp_path):
    t = tmp_path / "t.yaml"
    t.write_text("components: [model, post]\nconnections:\n  - {name: r, from: model, to: post,"
                 " files: [a.nc], colour: red}\n")
    p = _ensio("run", "--transfer", str(t), "--component", "model", "--", "true")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"ensio: error: {t.resolve()}: connections[0].colour: unknown config key"]
    t.write_text(t.read_text().replace(", colour: red", ""))
    p = _ensio("run", "--transfer", str(t), "--component", "postt", "--", "true")
    assert p.returncode == 2
    assert "--component 'postt' is not one of the components (model, post)" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_missing_compiler_is_one_line(tmp_path):
    t = tmp_path / "t.yaml"
    t.write_text("components: [model, post]\nconnections:\n"
                 "  - {name: r, from: model, to: post, files: [a.nc]}\n")
    p = _ensio("run", "--transfer", str(t), "--component", "model", "--", "true",
               env={"CC": "no-such-cc-ensio", "XDG_CACHE_HOME": str(tmp_path / "cache"),
                    "ENSIO_TRANSFER_DIR": str(tmp_path / "d")})
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "no C compiler found (no-such-cc-ensio)" in lines[0]
    assert not (tmp_path / "d").exists()  # nothing started


def test_unsafe_socket_directory_is_refused(tmp_path):
    from ensio.transfer.errors import TransferError
    from ensio.transfer.runtime import prepare_dir

    d = tmp_path / "open"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    with pytest.raises(TransferError, match="mode 0755, must be 0700"):
        prepare_dir(d)
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(TransferError, match="not a directory"):
        prepare_dir(f)
    made = prepare_dir(tmp_path / "new" / "dir")
    assert (made.stat().st_mode & 0o777) == 0o700


def test_interposer_is_rebuilt_when_a_source_changes(tmp_path, monkeypatch):
    from ensio.transfer import build

    src = tmp_path / "csrc"
    src.mkdir()
    for name in build.SOURCES:
        (src / name).write_bytes((build.csrc_dir() / name).read_bytes())
    monkeypatch.setattr(build, "csrc_dir", lambda: src)
    first = build.interposer(cache=tmp_path / "cache")
    assert build.interposer(cache=tmp_path / "cache") == first
    with open(src / "ensio_interpose.c", "a") as f:
        f.write("\n/* changed */\n")
    second = build.interposer(cache=tmp_path / "cache")
    assert second != first and second.exists() and first.exists()
    assert Path(second).stat().st_size > 0
