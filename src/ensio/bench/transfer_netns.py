"""Two "hosts" on one machine for ``ensio bench transfer``: network namespaces and a veth pair.

The producer runs in one namespace and the consumer in the other, each under
``ensio run`` with its own daemon directory (``ENSIO_TRANSFER_DIR``; the mount
namespace is shared, so the directories must differ) and its own host name
(``ENSIO_TRANSFER_HOST``); the config's ``hosts`` key places the components and
gives each daemon its address on the veth pair. The daemons are started by the
first ``ensio run`` in each namespace (so they live there) and stopped, and the
namespaces deleted, when the benchmark ends, also after a failure.

Needs root and ``ip`` (iproute2); :func:`netns_unavailable` says why not otherwise.
The namespaces' addresses (10.231.8.1/30, .2) exist only inside them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["ADDRESSES", "NetnsPair", "link_namespaces", "netns_pair", "netns_unavailable",
           "remove_namespaces"]

ADDRESSES = ("10.231.8.1", "10.231.8.2")
PORT = 7790
ROLES = ("producer", "consumer")


def netns_unavailable() -> str | None:
    """Why two network namespaces cannot be made here (None: they can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    return None


def _ip(*args: str) -> None:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")


def link_namespaces(names: tuple[str, str], veths: tuple[str, str],
                    addresses: tuple[str, str], made: list[str]) -> None:
    """Create the namespaces ``names`` joined by the veth pair ``veths`` (``/30`` addresses).

    The bench and the two-host tests use the same two "hosts". Each namespace
    is appended to ``made`` as soon as it exists, so the caller removes exactly what
    was created even when a later ``ip`` command fails (``RuntimeError``).
    """
    for ns in names:
        _ip("netns", "add", ns)
        made.append(ns)
    _ip("link", "add", veths[0], "netns", names[0], "type", "veth", "peer", "name",
        veths[1], "netns", names[1])
    for ns, veth, addr in zip(names, veths, addresses, strict=True):
        _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", veth)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "set", veth, "up")


def remove_namespaces(made: list[str]) -> None:
    """Delete the namespaces ``link_namespaces`` made (the veth pair goes with them)."""
    for ns in made:
        with contextlib.suppress(Exception):
            _ip("netns", "del", ns)


class NetnsPair:
    """Where each program of a two-host case runs: namespace, daemon directory, host name."""

    def __init__(self, namespaces: tuple[str, str], dirs: tuple[Path, Path]) -> None:
        self.namespaces = dict(zip(ROLES, namespaces, strict=True))
        self.dirs = dict(zip(ROLES, dirs, strict=True))
        self.names = {"producer": "a", "consumer": "b"}

    def prefix(self, role: str) -> list[str]:
        """The argv prefix that runs a command in ``role``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[role]]

    def env(self, role: str) -> dict[str, str]:
        """The variables of ``role``'s host (daemon directory, host name)."""
        return {"ENSIO_TRANSFER_DIR": str(self.dirs[role]),
                "ENSIO_TRANSFER_HOST": self.names[role]}

    def config_keys(self) -> dict[str, Any]:
        """The config's ``hosts``: the producer on ``a``, the consumer on ``b``."""
        return {"hosts": {self.names[r]: {"address": a, "port": PORT, "components": [r]}
                          for r, a in zip(ROLES, ADDRESSES, strict=True)}}

    def forget(self, paths: list[str]) -> None:
        """Unlink ``paths`` at the producer's daemon: the consumer's unlink reached only its
        own host's daemon, and the producer's copy would stay held until the end."""
        from ..transfer.protocol import Client, encode

        with Client(self.dirs["producer"] / "daemon.sock") as c:
            for p in paths:
                c.request(encode("UNLINK", path=os.path.realpath(p)))

    def stop(self) -> None:
        """Stop both daemons (their Unix sockets are reachable from here)."""
        from ..transfer.runtime import stop_daemon

        for d in self.dirs.values():
            try:
                stop_daemon(d, timeout=60.0)
            except Exception:  # noqa: BLE001  (it did not stop: it must not outlive its namespace)
                _kill_daemon(d)
            shutil.rmtree(d, ignore_errors=True)


def _kill_daemon(directory: Path) -> None:
    """SIGKILL the daemon of ``directory`` (which did not stop when asked): the pid it wrote
    into its lock file, a process this benchmark started."""
    import signal

    with contextlib.suppress(OSError, ValueError, IndexError):
        os.kill(int((directory / "daemon.lock").read_text().split()[0]), signal.SIGKILL)


@contextlib.contextmanager
def netns_pair() -> Iterator[NetnsPair]:
    """Two fresh namespaces joined by a veth pair; removed at the end.

    Raises
    ------
    RuntimeError
        An ``ip`` command failed (its message).
    """
    tag = secrets.token_hex(3)
    names = (f"ensio-bt-{tag}-a", f"ensio-bt-{tag}-b")
    veths = (f"eb{tag}a", f"eb{tag}b")
    made: list[str] = []
    pair = None
    try:
        link_namespaces(names, veths, ADDRESSES, made)
        dirs = tuple(Path(tempfile.mkdtemp(prefix=f"ensio-bt-{r[0]}-", dir="/tmp"))
                     for r in ROLES)
        pair = NetnsPair(names, (dirs[0], dirs[1]))
        yield pair
    finally:
        if pair is not None:
            pair.stop()
        remove_namespaces(made)
