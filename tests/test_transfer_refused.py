"""Errors that reach the producer across hosts (issue 28 item 5), on two network namespaces.

The consumer host's daemon knows another secret than the producer's (each host's
``HOME`` holds its own ``~/exp.secret``, the config names ``secret: ~/exp.secret``), as
after a secret file was replaced on one host only. An unmodified producer (``cp``, a
shell that ignores the failed redirect and exits 0) must fail, with one line naming the
file and the refusing host, and the refused file must be held nowhere.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from transfer_hosts import ADDRESSES, PORT, NetHost, two_hosts_fixture  # noqa: F401
from transfer_support import interposer_cache_fixture  # noqa: F401


@pytest.fixture
def split_secret(two_hosts, tmp_path):
    """The config, and hosts a (model) and b (post) with different secrets; b is up."""
    a, b = two_hosts
    for h in (a, b):
        home = tmp_path / f"home-{h.name}"
        home.mkdir()
        h.env["HOME"] = str(home)
    cfg = a.work / "t.yaml"
    hosts = {h: {"address": ADDRESSES["ab".index(h)], "port": PORT, "components": [c]}
             for h, c in (("a", "model"), ("b", "post"))}
    cfg.write_text(yaml.safe_dump({
        "components": ["model", "post"], "hosts": hosts, "secret": "~/exp.secret",
        "connections": [{"name": "restarts", "from": "model", "to": "post",
                         "files": ["fc/mem*.nc"]}]}, sort_keys=False))
    (a.work / "fc").mkdir()
    (a.work / "src.bin").write_bytes(b"x" * 5000)
    up = b.run(cfg, "post", "true")
    assert up.returncode == 0, up.stderr
    return cfg, a, b


def _refusal(err: str, path: Path) -> list[str]:
    return [line for line in err.splitlines()
            if line.startswith("ensio-transfer (model") and str(path) in line]


def test_a_wrong_secret_fails_the_producer_with_one_line(split_secret):
    cfg, a, b = split_secret
    path = (a.work / "fc" / "mem001.nc").resolve()
    p = a.run(cfg, "model", "cp", "src.bin", "fc/mem001.nc")
    assert p.returncode != 0
    lines = _refusal(p.stderr, path)
    assert len(lines) == 1, p.stderr
    assert "host b (10.231.7.2:7790) refused this host" in lines[0]
    assert "Permission denied" in p.stderr  # cp's own line: its open failed (EACCES)
    assert not path.exists()
    assert not a.status() and not b.status()  # held nowhere
    assert f"{path}: open by model" in a.log()


IGNORES = {  # leaves through _exit (dash's exit builtin), through exit() (Python)
    "sh": ["sh", "-c", "echo data > fc/mem002.nc; echo went on; exit 0"],
    "python": [sys.executable, "-c", "try:\n    open('fc/mem002.nc', 'w')\n"
               "except OSError:\n    pass\nprint('went on')"],
}


@pytest.mark.parametrize("program", sorted(IGNORES))
def test_a_producer_that_ignores_the_refusal_does_not_exit_0(split_secret, program):
    cfg, a, _ = split_secret
    path = (a.work / "fc" / "mem002.nc").resolve()
    p = a.run(cfg, "model", *IGNORES[program])
    assert p.stdout == "went on\n"  # the program ran to its end (stdout flushed) ...
    assert p.returncode == 1        # ... and its run failed all the same
    assert len(_refusal(p.stderr, path)) == 1, p.stderr
