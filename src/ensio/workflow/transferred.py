"""``workflow.transfer``: member forecasts and the analysis under the transfer layer.

With ``workflow.transfer: t.yaml`` ``ensio cycle`` runs every member task as the
transfer component ``members`` and the analysis task as ``analysis``
(:data:`ensio.config.workflow.TRANSFER_COMPONENTS`), each started with the
environment of :func:`ensio.transfer.run.prepare` (the interposer, the rules of
its component, the daemon's socket), so the forecasts go from the models to
``ensio analyse`` and the analysis members back to the next cycle's models through
memory. This module is the workflow room's only door to the transfer room (the
exception is written in ``workflow/__init__``'s docstring).

The run's transfer config
-------------------------
The user's file is copied to ``DIR/transfer.yaml`` and read from there, so its
relative file patterns are taken from the run directory (one file serves every
``--workdir``). It must have a connection from ``members`` to ``analysis`` whose
files include the forecasts (``cycle_*/forecast/mem*.nc``) and one from
``analysis`` to ``members`` whose files include the analysis members
(``cycle_*/analysis/mem*.nc``); the temporary siblings the programs write first
(``.mem001.nc.ensio-tmp.*`` of ``ensio model``, ``.mem001.nc.ensio-partial`` of
``ensio analyse``) must match too, or they are written to disk and renamed: so
``*mem*.nc*`` is the pattern to use. ``mean.nc`` and ``spread.nc`` are not members:
leave them to the disk. Under transfer a member writes ``{forecast}`` directly (no
staging directory): the daemon refuses a second writer of a file being written.

What reaches the disk
---------------------
* Each connection's ``persist`` governs its files while the run goes on (write
  behind: they survive a crash of the daemon).
* The analysis members of the run's **last cycle** are written to their real
  paths (fsynced) before its ``.done`` marker, so a finished run leaves
  ``cycle_K/analysis/mem*.nc`` on disk, as the file-based run does, and a later
  ``--cycles K+1`` starts from them.
* Memory is released as the run goes: once cycle ``c`` is done, its forecasts and
  the analysis members of cycle ``c-1`` are dropped from the daemon (files that
  ``persist`` wrote stay on disk).

Resuming
--------
The daemon's memory does not survive it. Before a cycle's tasks run, the driver
checks that the members already done have their forecasts (held complete by the
daemon, or on disk), and that the restarts of the members still to run exist;
anything lost is a one-line error naming the files and the way out
(``persist: true``), never a silent use of other data. A file is read from disk
only where it is not held, and it is on disk only because ``persist``,
``fallback: files`` or the final write put this very version there.

One host. Every task asks :func:`~ensio.transfer.run.prepare` on the host it runs
on, and the driver pins the jobs' socket directory (``ENSIO_TRANSFER_DIR``), so
SLURM jobs on the driver's host share its daemon; across hosts the daemons must
hand files between them (the connection's ``pattern``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..config.errors import ConfigError
from ..config.workflow import TRANSFER_COMPONENTS
from ..durable import atomic_write
from ..errors import EnsioError

__all__ = [
    "RUN_CONFIG",
    "RunTransfer",
    "available",
    "check",
    "export",
    "release",
    "start",
    "task_env",
]

#: The run's copy of the transfer config, in the run directory.
RUN_CONFIG = "transfer.yaml"
MEMBERS, ANALYSIS = TRANSFER_COMPONENTS
_KEY = "workflow.transfer"


@dataclass(frozen=True)
class RunTransfer:
    """The transfer layer of one run: its config copy and the daemon's socket directory."""

    config: Path
    socket_dir: Path


def check(user_config: Path, workdir: Path, samples: tuple[str, str]) -> None:
    """Resolve the user's transfer config as the run will (patterns from ``workdir``) and
    check that its connections carry ``samples`` (a forecast and an analysis member path
    of the run); nothing is written.

    Raises
    ------
    ConfigError
        ``workflow.transfer: FILE: …`` naming the key.
    """
    from ..config.yamlfile import read_yaml
    from ..transfer.config import transfer_from_dict

    where = f"{_KEY}: {user_config}"
    raw = read_yaml(user_config, "", prefix=f"{_KEY}: ")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: top level must be a mapping (components, connections)")
    try:
        cfg = transfer_from_dict(raw, base_dir=workdir)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    for path, src, dst, what in ((samples[0], MEMBERS, ANALYSIS, "forecasts"),
                                 (samples[1], ANALYSIS, MEMBERS, "analysis members")):
        conn = cfg.for_path(os.path.realpath(path))
        if conn is None or conn.source != src or dst not in conn.to:
            got = "no connection" if conn is None else f"connection {conn.name!r}"
            raise ConfigError(f"{where}: the {what} ({path}) need a connection from {src} to "
                              f"{dst} whose files include them; {got} matches (relative "
                              "patterns are taken from the run directory)")


def start(user_config: Path, workdir: Path) -> RunTransfer:
    """Copy the (checked) config into the run directory, build the interposer, start the
    daemon.

    Raises
    ------
    TransferError
        No compiler, an unsafe socket directory, a daemon that does not start.
    """
    from ..transfer.run import prepare

    path = workdir / RUN_CONFIG
    atomic_write(path, user_config.read_text())
    env = prepare(path, MEMBERS)
    return RunTransfer(config=path, socket_dir=Path(env["ENSIO_TRANSFER_SOCKET"]).parent)


def task_env(config: str, component: str) -> dict[str, str]:
    """What a task's command needs to run as ``component`` (:func:`ensio.transfer.run.prepare`)."""
    from ..transfer.run import prepare

    return prepare(config, component)


def _held(socket_dir: Path | None) -> dict[str, str] | None:
    """State of every file the daemon holds (path → state); None if no daemon answers."""
    from ..transfer.runtime import daemon_status

    files = daemon_status(socket_dir)
    return None if files is None else {f.path: f.state for f in files}


def available(paths: Iterable[str | os.PathLike], socket_dir: Path | None = None
              ) -> dict[str, bool]:
    """Whether each path can be read: held complete by the daemon, else on disk.

    A file held but not complete (being written, or its producer died) is not
    available, even if an older copy lies on disk.
    """
    held = _held(socket_dir) or {}
    out = {}
    for p in paths:
        real = os.path.realpath(p)
        state = held.get(real)
        out[os.fspath(p)] = (state in ("complete", "spilling") if state is not None
                             else os.path.exists(real))
    return out


def export(paths: Iterable[str | os.PathLike], socket_dir: Path | None = None) -> None:
    """Write held files to their real paths (fsynced), then release them from memory.

    Files not held must already be on disk (written by ``persist`` or a fallback).

    Raises
    ------
    EnsioError
        Files that are neither held complete nor on disk (lost with a daemon).
    """
    from ..transfer import materialize
    from ..transfer.protocol import Client, DaemonUnavailable, encode
    from ..transfer.runtime import socket_dir as default_dir

    sock = default_dir(socket_dir) / "daemon.sock"
    lost = []
    try:
        client: Client | None = Client(sock, component="ensio-cycle")
    except DaemonUnavailable:
        client = None
    try:
        for p in map(os.path.realpath, paths):
            reply = client.request(encode("STAT", path=p)) if client is not None else None
            if reply is not None and reply.verb == "OK" and reply.fd is not None:
                try:
                    tmp = materialize.write_temporary(reply.fd, p, int(reply.get("mode"), 8),
                                                      fsync=True)
                finally:
                    os.close(reply.fd)
                materialize.publish(tmp, p, fsync=True)
                client.request(encode("DROP", path=p))  # type: ignore[union-attr]
            elif not os.path.exists(p):
                lost.append(p)
    finally:
        if client is not None:
            client.close()
    if lost:
        raise EnsioError(f"{lost[0]}" + (f" (and {len(lost) - 1} more)" if len(lost) > 1 else "")
                         + ": lost with the staging daemon, not on disk (set persist: true on "
                         f"the connection in {_KEY} so files survive the daemon)")


def release(paths: Iterable[str | os.PathLike], socket_dir: Path | None = None) -> None:
    """Forget held files (their memory is freed; copies ``persist`` wrote stay on disk)."""
    from ..transfer.protocol import Client, DaemonUnavailable, encode
    from ..transfer.runtime import socket_dir as default_dir

    try:
        with Client(default_dir(socket_dir) / "daemon.sock", component="ensio-cycle") as c:
            for p in paths:
                c.request(encode("DROP", path=os.path.realpath(p)))
    except DaemonUnavailable as exc:
        if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.ECONNRESET):
            raise
