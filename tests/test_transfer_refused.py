"""Errors that reach the producer across hosts (issue 28 item 5), on two network namespaces.

The consumer host's daemon knows another secret than the producer's (each host's
``HOME`` holds its own ``~/exp.secret``, the config names ``secret: ~/exp.secret``), as
after a secret file was replaced on one host only. An unmodified producer (``cp``, a
shell that ignores the failed redirect and exits 0) must fail, with one line naming the
file and the refusing host, and the refused file must be held nowhere.
"""

from __future__ import annotations

import re
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


HALF = r"""
import sys
f = open(sys.argv[1], "wb", buffering=0)
f.write(b"CDF\x01" + bytes(1 << 20))
print("written", flush=True)
sys.stdin.readline()
"""

READ = "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())"


def test_a_dead_sending_daemon_loses_only_its_incomplete_files(two_hosts, tmp_path):
    """a's daemon is killed while a producer still writes y.nc: b keeps serving the
    complete x.nc, fails y.nc (EIO), and once a real y.nc is written after the loss,
    serves that."""
    import hashlib
    import os
    import signal

    from transfer_support import daemon_pid, process_gone, wait_for

    a, b = two_hosts
    cfg = a.work / "t.yaml"
    hosts = {h: {"address": ADDRESSES["ab".index(h)], "port": PORT, "components": [c]}
             for h, c in (("a", "model"), ("b", "post"))}
    cfg.write_text(yaml.safe_dump({
        "components": ["model", "post"], "hosts": hosts,
        "connections": [{"name": "restarts", "from": "model", "to": "post",
                         "files": ["fc/*.nc"], "keep": "until-unlinked"}]}, sort_keys=False))
    (a.work / "fc").mkdir()
    data = os.urandom(300_000)
    (a.work / "x.src").write_bytes(data)
    assert b.run(cfg, "post", "true").returncode == 0
    assert a.run(cfg, "model", "cp", "x.src", "fc/x.nc").returncode == 0
    prod = a.start(cfg, "model", sys.executable, "-c", HALF, "fc/y.nc")
    try:
        assert prod.stdout.readline() == "written\n"
        wait_for(lambda: {Path(s.path).name for s in b.status() or []} >= {"x.nc", "y.nc"},
                 what="both files held on b")
        pid = daemon_pid(a.dir)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: process_gone(pid), what="a's daemon's death")
    finally:
        prod.kill()
        prod.communicate(timeout=60)
    got = b.run(cfg, "post", sys.executable, "-c", READ, "fc/x.nc")
    assert got.stdout.strip() == hashlib.sha256(data).hexdigest(), got.stderr
    lost = b.run(cfg, "post", sys.executable, "-c", READ, "fc/y.nc")
    assert lost.returncode != 0 and "Input/output error" in lost.stderr
    (a.work / "fc" / "y.nc").write_bytes(b"written later")  # e.g. a fallback write on a
    later = b.run(cfg, "post", sys.executable, "-c", READ, "fc/y.nc")
    assert later.stdout.strip() == hashlib.sha256(b"written later").hexdigest(), later.stderr
    # y.nc is lost either by its broken stream or by the lost control connection,
    # whichever b's threads notice first: the count is 0 in the one order, 1 in the other
    lost_line = re.compile(r"lost contact with host a: [01] incomplete copies from it are "
                           r"lost; complete ones stay served")
    wait_for(lambda: lost_line.search(b.log()), what="b's log of the lost contact")
