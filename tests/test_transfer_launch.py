"""``ensio run --transfer``'s hot path: the launch record (issue 28 item 2).

The first launch of a (config, component) does the full preparation and records it;
later ones exec COMMAND from the record after checking it, importing neither YAML,
argparse, pathlib nor typing. Which path a launch took is read from what Python
imported (``-X importtime`` on its standard error, printed before the exec). No timing
is asserted; ``launch_ms`` is the benchmark's.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    SRC,
    Host,
    host_fixture,
    interposer_cache_fixture,
    write_config,
)

from ensio.transfer import hosts, launch, runtime

#: Modules only the full path imports (the YAML loader and what the hot path avoids).
FULL_ONLY = ("yaml", "argparse", "pathlib", "typing", "ensio.transfer.config")
ENV_KEYS = ("LD_PRELOAD", "ENSIO_TRANSFER_RULES", "ENSIO_TRANSFER_SOCKET")


@pytest.fixture(scope="session", name="native")
def native_fixture(interposer_cache: Path) -> Path:
    """``ensio-launch``, built once into the session's cache (``ensio run --launcher``)."""
    env = dict(os.environ, XDG_CACHE_HOME=str(interposer_cache), PYTHONPATH=str(SRC))
    out = subprocess.run([sys.executable, "-m", "ensio.cli.main", "run", "--launcher"], env=env,
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@pytest.fixture(name="via", params=["python", "native"])
def via_fixture(request: pytest.FixtureRequest) -> list[str]:
    """The launcher: ``python -m ensio.cli.main`` (as the ``ensio`` command) or ensio-launch."""
    if request.param == "python":
        return [sys.executable, "-m", "ensio.cli.main"]
    return [str(request.getfixturevalue("native"))]


def launch_run(host: Host, config: Path, *cmd: str, env: dict[str, str] | None = None,
               via: list[str] | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``ensio run --transfer config --component model -- cmd``; and the modules Python
    imported (none if no Python ran)."""
    proc = subprocess.run(
        [*(via or [sys.executable, "-m", "ensio.cli.main"]), "run", "--transfer", str(config),
         "--component", "model", "--", *cmd],
        env=dict(env or host.env, PYTHONPROFILEIMPORTTIME="1"), cwd=host.work,
        capture_output=True, text=True, timeout=120)
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    return proc, imported


def printed_env(proc: subprocess.CompletedProcess) -> dict[str, str]:
    pairs = (line.partition("=") for line in proc.stdout.splitlines())
    return {k: v for k, _, v in pairs if k in ENV_KEYS}


def took_hot_path(imported: set[str]) -> bool:
    return not imported & set(FULL_ONLY)


def records(host: Host) -> list[Path]:
    return sorted((host.dir / "launch").glob("*.rec"))


@pytest.fixture(name="config")
def config_fixture(host: Host) -> Path:
    return write_config(host.work / "t.yaml", [str(host.work / "fc" / "mem*.nc")])


def test_second_launch_takes_the_hot_path_with_the_same_environment(host: Host, config: Path,
        via: list[str]):
    first, imported = launch_run(host, config, "env", via=via)
    assert first.returncode == 0, first.stderr
    assert not took_hot_path(imported)  # the control: the full path is seen as such
    rules = Path(printed_env(first)["ENSIO_TRANSFER_RULES"])
    before = rules.stat()
    assert len(records(host)) == 1
    second, imported = launch_run(host, config, "env", via=via)
    assert second.returncode == 0, second.stderr
    assert took_hot_path(imported), sorted(imported & set(FULL_ONLY))
    if via[0] == sys.executable:
        assert "ensio.transfer.launch" in imported
    else:
        assert not imported  # ensio-launch: no Python at all
    assert printed_env(second) == printed_env(first)
    assert rules.stat().st_ino == before.st_ino  # the same rules file, untouched
    env = printed_env(second)
    assert env["LD_PRELOAD"].split()[0].endswith(".so")
    assert env["ENSIO_TRANSFER_SOCKET"] == str(host.dir / "daemon.sock")


def test_hot_path_keeps_an_earlier_preload_and_the_exit_status(host: Host, config: Path,
        via: list[str]):
    assert launch_run(host, config, "true", via=via)[0].returncode == 0
    env = dict(host.env, LD_PRELOAD="/opt/other.so:/x/ensio_interpose-old.so")
    proc, imported = launch_run(host, config, "env", env=env, via=via)
    assert took_hot_path(imported)
    lib, *rest = printed_env(proc)["LD_PRELOAD"].split()
    assert "ensio_interpose-old" not in lib and rest == ["/opt/other.so"]
    proc, imported = launch_run(host, config, "sh", "-c", "exit 7", via=via)
    assert took_hot_path(imported) and proc.returncode == 7


def test_a_changed_config_takes_the_full_path_once(host: Host, config: Path,
        via: list[str]):
    launch_run(host, config, "true", via=via)
    first = printed_env(launch_run(host, config, "env", via=via)[0])
    write_config(config, [str(host.work / "out" / "mem*.nc")])
    proc, imported = launch_run(host, config, "env", via=via)
    assert proc.returncode == 0, proc.stderr
    assert not took_hot_path(imported)
    rules = printed_env(proc)["ENSIO_TRANSFER_RULES"]
    assert rules != first["ENSIO_TRANSFER_RULES"]  # a new identity: new rules
    assert str(host.work / "out") in Path(rules).read_text()
    proc, imported = launch_run(host, config, "env", via=via)
    assert took_hot_path(imported) and printed_env(proc)["ENSIO_TRANSFER_RULES"] == rules


def test_another_cache_component_or_rank_is_another_record(host: Host, config: Path,
        via: list[str]):
    launch_run(host, config, "true", via=via)
    env = dict(host.env, XDG_CACHE_HOME=host.env["XDG_CACHE_HOME"])
    env["CC"] = "cc"  # recorded unset: the full path decides which compiler (and library)
    proc, imported = launch_run(host, config, "true", env=env, via=via)
    assert proc.returncode == 0 and not took_hot_path(imported)
    assert took_hot_path(launch_run(host, config, "true", env=env, via=via)[1])
    ranked = dict(env, ENSIO_TRANSFER_RANK="3")
    assert not took_hot_path(launch_run(host, config, "true", env=ranked, via=via)[1])
    assert took_hot_path(launch_run(host, config, "true", env=ranked, via=via)[1])
    assert len(records(host)) == 2  # rank 0 (rewritten for CC) and rank 3
    # ranks share the rules file: one rank's full path must not make another's record stale
    assert took_hot_path(launch_run(host, config, "true", env=env, via=via)[1])
    assert took_hot_path(launch_run(host, config, "true", env=ranked, via=via)[1])


def test_a_hosts_config_is_recorded_per_rank_and_a_new_secret_is_sent(host: Host):
    with socket.socket() as s:  # a free port (the daemon binds it after this closes)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = host.work / "h.yaml"
    config.write_text(yaml.safe_dump({
        "components": ["model", "post"],
        "hosts": {"a": {"address": "127.0.0.1", "port": port, "components": ["model", "post"]}},
        "connections": [{"name": "restarts", "from": "model", "to": "post",
                         "files": [str(host.work / "fc" / "mem*.nc")]}]}))
    env = dict(host.env, ENSIO_TRANSFER_HOST="a", ENSIO_TRANSFER_RANK="1")
    proc, imported = launch_run(host, config, "env", env=env)
    assert proc.returncode == 0, proc.stderr
    assert not took_hot_path(imported)
    assert printed_env(proc)["ENSIO_TRANSFER_RULES"].endswith("-model-1.rules")
    proc, imported = launch_run(host, config, "env", env=env)
    assert took_hot_path(imported) and proc.returncode == 0
    secret = host.work / "h.yaml.secret"
    secret.write_text(secrets.token_hex(32) + "\n")  # stays 0600
    proc, imported = launch_run(host, config, "true", env=env)
    assert proc.returncode == 0, proc.stderr
    assert not took_hot_path(imported)  # the daemon got the new secret (NETWORK again)


def test_a_restarted_daemon_takes_the_full_path(host: Host, config: Path,
        via: list[str]):
    launch_run(host, config, "true", via=via)
    assert runtime.stop_daemon(host.dir, timeout=30)
    proc, imported = launch_run(host, config, "true", via=via)
    assert proc.returncode == 0, proc.stderr
    assert not took_hot_path(imported)  # no daemon answered: the full path started one
    assert took_hot_path(launch_run(host, config, "true", via=via)[1])


def test_a_broken_record_or_unsafe_directory_falls_back(host: Host, config: Path,
        via: list[str]):
    launch_run(host, config, "true", via=via)
    (rec,) = records(host)
    text = rec.read_text()
    rec.write_text(text[: len(text) // 2])  # cut short: no "end" line
    proc, imported = launch_run(host, config, "true", via=via)
    assert proc.returncode == 0 and not took_hot_path(imported)
    assert rec.read_text().endswith("\nend\n")  # rewritten whole
    assert took_hot_path(launch_run(host, config, "true", via=via)[1])
    os.chmod(host.dir, 0o755)
    try:
        proc, imported = launch_run(host, config, "true", via=via)
    finally:
        os.chmod(host.dir, 0o700)
    assert proc.returncode == 2 and not took_hot_path(imported)
    assert "must be 0700" in proc.stderr


def test_a_command_that_cannot_run_is_reported_by_the_full_path(host: Host, config: Path,
        via: list[str]):
    launch_run(host, config, "true", via=via)
    proc, imported = launch_run(host, config, "ensio-no-such-command", via=via)
    assert proc.returncode == 127
    assert "command not found: ensio-no-such-command" in proc.stderr
    assert not took_hot_path(imported)


@pytest.mark.parametrize(("argv", "expected"), [
    (["--transfer", "t.yaml", "--component", "m", "--", "ls", "-l"],
     ("t.yaml", "m", None, ["ls", "-l"])),
    (["--component=m", "--socket-dir", "/s", "--transfer=t.yaml", "true"],
     ("t.yaml", "m", "/s", ["true"])),
    (["--transfer", "t.yaml", "--component", "m", "sh", "--", "-c"],
     ("t.yaml", "m", None, ["sh", "--", "-c"])),
    (["--transfer", "t.yaml", "--component", "m", "--"], None),  # no command
    (["--transfer", "t.yaml", "--"], None),  # no component
    (["--transfer", "t.yaml", "--component", "m", "--help", "x"], None),  # argparse's
    (["--trans", "t.yaml", "--component", "m", "x"], None),  # abbreviations: argparse's
    (["--transfer", "a", "--transfer", "b", "--component", "m", "x"], None),
    (["--transfer", "t.yaml", "--component"], None),
])
def test_parse_run_args(argv, expected):
    assert launch.parse_run_args(argv) == expected


def test_socket_dir_and_rank_rules_agree_with_the_full_path(monkeypatch, tmp_path):
    assert launch.RANK_VARS == hosts._RANK_VARS
    for var in ("ENSIO_TRANSFER_DIR", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(var, raising=False)
    assert str(runtime.socket_dir()) == launch.socket_dir_path() == \
        f"/tmp/ensio-transfer-{os.getuid()}"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert str(runtime.socket_dir()) == launch.socket_dir_path() == f"{tmp_path}/ensio-transfer"
    monkeypatch.setenv("ENSIO_TRANSFER_DIR", "/x/y")
    assert str(runtime.socket_dir()) == launch.socket_dir_path() == "/x/y"
    assert str(runtime.socket_dir("/given")) == launch.socket_dir_path("/given") == "/given"


def test_preload_value():
    assert launch.preload_value("/c/lib.so", "") == "/c/lib.so"
    assert launch.preload_value("/c/lib.so", "/a.so:/c/ensio_interpose-1.so /b.so") == \
        "/c/lib.so /a.so /b.so"
