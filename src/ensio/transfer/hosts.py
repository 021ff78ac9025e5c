"""The hosts of a multi-host transfer config, and which hosts receive which files.

The config's optional top-level ``hosts`` names each host's staging daemon and the
components whose processes run there::

    hosts:
      node1: {address: 10.231.7.1, port: 7790, components: [model]}
      node2: {address: 10.231.7.2, components: [post]}
    secret: exp.secret        # default: <config file>.secret, next to the config

A daemon knows its own host by ``$ENSIO_TRANSFER_HOST`` (else the short host name).
Process *i* of a component runs on the *i*-th of the hosts that list it (in the order
of ``hosts``, cycled); a process's index is ``$ENSIO_TRANSFER_RANK``, else the MPI or
SLURM rank variables, else 0. Without ``hosts`` everything happens on one host.

The daemon listens on ``address:port`` only: a wildcard address (``0.0.0.0``, ``::``)
is refused, so the listener never appears on an interface nobody configured.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config.errors import ConfigError
from ..config.plain import from_plain

__all__ = ["DEFAULT_PORT", "HostDef", "consumer_hosts", "parse_hosts", "process_rank",
           "this_host"]

DEFAULT_PORT = 7790
_RANK_VARS = ("ENSIO_TRANSFER_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
              "SLURM_PROCID")


@dataclass(frozen=True)
class HostDef:
    """One host: its daemon's TCP address and the components running there."""

    name: str
    address: str
    port: int = DEFAULT_PORT
    components: tuple[str, ...] = ()

    @property
    def endpoint(self) -> str:
        """``address:port`` (IPv6 addresses in brackets)."""
        return f"[{self.address}]:{self.port}" if ":" in self.address else \
            f"{self.address}:{self.port}"


def parse_hosts(raw: Any, components: tuple[str, ...]) -> tuple[HostDef, ...]:
    """The ``hosts`` key: ConfigError naming ``hosts.NAME.KEY`` for each problem."""
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError("hosts: expected a non-empty mapping of host name to "
                          "{address, port, components}")
    out = []
    for name, body in raw.items():
        key = f"hosts.{name}"
        if not isinstance(name, str) or not name or any(c in name for c in " ,=\n:"):
            raise ConfigError(f"{key}: {name!r} is not a simple host name")
        if not isinstance(body, Mapping):
            raise ConfigError(f"{key}: expected a mapping (address, port, components)")
        if "name" in body:
            raise ConfigError(f"{key}.name: unknown config key")
        host = from_plain(HostDef, {**body, "name": name}, key)
        try:
            ip = ipaddress.ip_address(host.address)
        except ValueError:
            raise ConfigError(f"{key}.address: {host.address!r} is not an IP address") from None
        if ip.is_unspecified:
            raise ConfigError(f"{key}.address: {host.address} would listen on every interface: "
                              "name the interface's own address")
        if not 0 < host.port < 65536:
            raise ConfigError(f"{key}.port: {host.port} is not a TCP port")
        for i, c in enumerate(host.components):
            if c not in components:
                raise ConfigError(f"{key}.components[{i}]: {c!r} is not a component "
                                  f"({', '.join(components)})")
        out.append(host)
    return tuple(out)


def hosts_of(hosts: tuple[HostDef, ...], component: str) -> list[str]:
    """The hosts of ``component``'s processes, in process order."""
    return [h.name for h in hosts if component in h.components]


def consumer_hosts(hosts: tuple[HostDef, ...], pattern: str, to: tuple[str, ...],
                   rank: int) -> tuple[str, ...]:
    """The hosts a file of producer process ``rank`` goes to, by the connection's pattern.

    ``1-1``: consumer process ``rank``'s host (per consumer component); ``N-1``: the
    host of each consumer component's first process; ``1-N`` and ``all-to-all``: every
    host of a consumer process. Each host once, in order.
    """
    out: list[str] = []
    for comp in to:
        names = hosts_of(hosts, comp)
        if not names:
            continue
        if pattern == "1-1":
            pick = [names[rank % len(names)]]
        elif pattern == "N-1":
            pick = names[:1]
        else:
            pick = names
        out.extend(n for n in pick if n not in out)
    return tuple(out)


def this_host() -> str:
    """The name this host has in ``hosts``: ``$ENSIO_TRANSFER_HOST``, else the short host
    name."""
    return os.environ.get("ENSIO_TRANSFER_HOST") or socket.gethostname().split(".")[0]


def process_rank() -> int:
    """This process's index in its component (the first rank variable set, else 0)."""
    for var in _RANK_VARS:
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return 0
