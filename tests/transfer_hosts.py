"""Two "hosts" for the cross-host transfer tests: network namespaces joined by a veth pair.

The fixture ``two_hosts`` (import ``two_hosts_fixture``) creates two network
namespaces with unique names, a veth pair between them with the addresses
10.231.7.1/30 and 10.231.7.2/30 (used only inside these namespaces), and loopback up
in each. A :class:`NetHost` runs commands "on" its host with ``ip netns exec``; the
mount namespace is shared, so each host has its own daemon directory
(``ENSIO_TRANSFER_DIR``) and its own name (``ENSIO_TRANSFER_HOST``). The namespaces
(and with them the veth pair and the daemons' listeners) are removed at teardown,
also after a failure; the daemons are stopped (or killed) first.

Needs root and ``ip`` (iproute2). Without them the tests skip with the reason; with
``CI=true`` they FAIL with the reason instead (CI must run them, .ci/run installs
iproute2).
"""

from __future__ import annotations

import random
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import needs
import pytest
from transfer_support import Host, teardown_daemon

from ensio.bench.transfer_netns import link_namespaces, netns_unavailable, remove_namespaces

ADDRESSES = ("10.231.7.1", "10.231.7.2")
PORT = 7790


def require_netns(reason: str | None = None) -> None:
    """Skip (or, with CI=true, fail) a test that needs two namespaces and cannot have them."""
    needs.capability("network namespaces for the two-host transfer tests",
                     reason or netns_unavailable())


class NetHost(Host):
    """A daemon directory, a host name and a network namespace: one host of the test."""

    def __init__(self, name: str, ns: str, address: str, sock_dir: Path, cache: Path,
                 work: Path) -> None:
        super().__init__(sock_dir, cache, work)
        self.name, self.ns, self.address = name, ns, address
        self.env["ENSIO_TRANSFER_HOST"] = name

    def _argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def ensio(self, *args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self._argv([sys.executable, "-m", "ensio.cli.main", *args]),
                              env={**self.env, **(env or {})}, cwd=self.work,
                              capture_output=True, text=kw.pop("text", True),
                              timeout=kw.pop("timeout", 120), **kw)

    def run(self, config: Path, component: str, *cmd: str, rank: int = 0,
            **kw) -> subprocess.CompletedProcess:
        """``ensio run`` on this host as process ``rank`` of ``component``, finished."""
        return self.ensio("run", "--transfer", str(config), "--component", component, "--",
                          *cmd, env={"ENSIO_TRANSFER_RANK": str(rank)}, **kw)

    def start(self, config: Path, component: str, *cmd: str, rank: int = 0,
              **kw) -> subprocess.Popen:
        """The same, started (stdin/stdout/stderr pipes)."""
        return subprocess.Popen(
            self._argv([sys.executable, "-m", "ensio.cli.main", "run", "--transfer",
                        str(config), "--component", component, "--", *cmd]),
            env={**self.env, "ENSIO_TRANSFER_RANK": str(rank)}, cwd=self.work,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            **kw)

    def up(self, config: Path, component: str) -> None:
        """Start this host's daemon and register the experiment (it listens from now on)."""
        p = self.run(config, component, "true")
        assert p.returncode == 0, p.stderr


@pytest.fixture(name="two_hosts")
def two_hosts_fixture(interposer_cache: Path, tmp_path: Path) -> Iterator[tuple[NetHost, NetHost]]:
    """Hosts ``a`` (10.231.7.1) and ``b`` (10.231.7.2), one work directory for both."""
    require_netns()
    tag = secrets.token_hex(3)
    names = (f"ensio-{tag}-a", f"ensio-{tag}-b")
    veths = (f"ev{tag}a", f"ev{tag}b")
    work = tmp_path / "work"
    work.mkdir()
    made: list[str] = []
    dirs: list[Path] = []
    try:
        try:
            link_namespaces(names, veths, ADDRESSES, made)
        except RuntimeError as exc:  # root without CAP_SYS_ADMIN/CAP_NET_ADMIN (containers)
            require_netns(f"cannot create network namespaces here: {exc}")
        hosts = []
        for ns, addr, name in zip(names, ADDRESSES, ("a", "b"), strict=True):
            d = Path(tempfile.mkdtemp(prefix=f"ensio-{name}-", dir="/tmp"))
            dirs.append(d)
            hosts.append(NetHost(name, ns, addr, d, interposer_cache, work))
        yield hosts[0], hosts[1]
    finally:  # every daemon stopped and the namespaces removed; then the first error
        errors = []
        for d in dirs:
            try:
                teardown_daemon(d)
            except BaseException as exc:  # noqa: BLE001 - raised below, after the cleanup
                errors.append(exc)
        remove_namespaces(made)
        if errors:
            raise errors[0]


def hosts_config(path: Path, placement: dict[str, list[str]], pattern: str,
                 files: list[str], mode: str = "sync", **conn: object) -> Path:
    """A model → post config over hosts a and b; ``placement``: host → its components."""
    import yaml

    connection = {"name": "restarts", "from": "model", "to": "post", "files": files,
                  "pattern": pattern, "mode": mode, **conn}
    hosts = {h: {"address": ADDRESSES["ab".index(h)], "port": PORT, "components": comps}
             for h, comps in placement.items()}
    path.write_text(yaml.safe_dump({"components": ["model", "post"], "hosts": hosts,
                                    "connections": [connection]}, sort_keys=False))
    return path


#: writes SIZE seeded random bytes; on a line from stdin rewrites N bytes at AT (async:
#: the dirty bytes sent after the close), closes (sync: the close waits for the other
#: host; async: the exit does) and says so. argv: PATH SIZE AT N
REWRITING_PRODUCER = r"""
import os, random, sys
size, at, n = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
data = random.Random(12).randbytes(size)
os.write(fd, data)
print("written", flush=True)
sys.stdin.readline()
os.pwrite(fd, bytes(255 - b for b in data[at:at + n]), at)
os.close(fd)
print("closed", flush=True)
"""


def rewritten(size: int, at: int, n: int) -> bytes:
    """What REWRITING_PRODUCER's file holds once closed (computed independently)."""
    data = bytearray(random.Random(12).randbytes(size))
    data[at:at + n] = bytes(255 - b for b in data[at:at + n])
    return bytes(data)


def held(host: NetHost) -> dict[str, object]:
    """The host daemon's held files by base name (``ensio transfer status``)."""
    return {Path(s.path).name: s for s in host.status() or []}


def in_syscall(pid: int, number: str) -> bool:
    """Whether a thread of ``pid`` sleeps in system call ``number`` (/proc/PID/task/*/syscall)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "syscall").read_text().split()[0] == number:
                return True
        except (OSError, IndexError):
            continue
    return False


def release(fifo: Path, word: str) -> None:
    """Tell a daemon held by ``ENSIO_TRANSFER_TEST_HOLD`` to go on (``go``) or break off."""
    with open(fifo, "w", encoding="utf-8") as f:  # blocks until the daemon reads it
        f.write(word + "\n")
