"""The cases of ``ensio bench transfer``, what each needs, and one run of one case.

A case is a name and how the producer's files reach the consumer (:class:`Case`):
through the file system (page cache only, or fsync'd before the consumer is told;
told through a pipe, or found by polling) or directly through the transfer layer
(a connection ``mode``, on one host or across two network namespaces). New modes
plug in by adding a :class:`Case` to :data:`CASES`; :func:`unavailable` decides at
run time, from what the installed transfer layer accepts and what the running
daemon advertises, whether a case can be measured, and says why not otherwise.

What the installed transfer layer supports is found out, not assumed: async if the
daemon advertises ``async`` in its ``HELLO`` reply (``features=a,b``) or ``ensio run``
routes an async connection (:func:`async_unsupported`); two hosts if the daemon
advertises ``tcp`` or the config accepts a ``hosts`` key, and root and ``ip`` are
there for the namespaces (:func:`cross_host_unsupported`, :mod:`.transfer_netns`).
The single-host foundation has neither, so its async and two-host cases are reported
as not measured rather than measured as something they are not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml

from .childenv import child_env

__all__ = ["CASES", "Case", "DirectHost", "Placement", "async_unsupported",
           "cross_host_unsupported", "daemon_features", "direct_host", "run_case", "unavailable"]


class Placement(Protocol):
    """Where the programs of a direct case run: :class:`DirectHost` (one host) or
    :class:`~.transfer_netns.NetnsPair` (two network namespaces)."""

    def prefix(self, role: str) -> list[str]:
        """Argv put before ``ensio run`` for ``role`` (``producer`` / ``consumer``)."""
        ...

    def env(self, role: str) -> dict[str, str]:
        """Variables added to ``role``'s environment."""
        ...

    def config_keys(self) -> dict[str, Any]:
        """Top-level keys added to the transfer config."""
        ...

    def forget(self, paths: list[str]) -> None:
        """Release what daemons other than the consumer's still hold of a finished run."""
        ...


@dataclass(frozen=True)
class Case:
    """One way of handing N files from the producer to the consumer.

    Attributes
    ----------
    exchange : "file" or "direct"
        Plain files in a directory, or the transfer layer (both programs under
        ``ensio run --transfer``).
    notify : "close", "poll" or "create"
        When the consumer learns a file's name (:mod:`.transfer_programs`).
    mode : str
        The connection's ``mode`` (direct cases).
    hosts : int
        2: producer and consumer in two network namespaces, each with its daemon.
    """

    name: str
    exchange: Literal["file", "direct"]
    notify: Literal["close", "poll", "create"]
    fsync: bool = False
    mode: str = "sync"
    hosts: int = 1
    label: str = ""


CASES: dict[str, Case] = {c.name: c for c in (
    Case("pagecache", "file", "close", label="files, page cache; pipe after close"),
    Case("fsync", "file", "close", fsync=True, label="files, fsync; pipe after fsync"),
    Case("pagecache-poll", "file", "poll", label="files, page cache; consumer polls"),
    Case("fsync-poll", "file", "poll", fsync=True, label="files, fsync; consumer polls"),
    Case("direct", "direct", "create", label="direct, sync, one host"),
    Case("direct-async", "direct", "create", mode="async", label="direct, async, one host"),
    Case("direct-2ns", "direct", "create", hosts=2,
         label="direct, sync, two network namespaces"),
    Case("direct-2ns-async", "direct", "create", mode="async", hosts=2,
         label="direct, async, two network namespaces"),
)}


def daemon_features(sock: str | os.PathLike) -> frozenset[str]:
    """What the daemon at ``sock`` advertises in its ``HELLO`` reply (``features=a,b``)."""
    from ..transfer.protocol import PROTOCOL_VERSION, encode, recv_message, send_message

    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as s:
        s.settimeout(30.0)
        s.connect(os.fspath(sock))
        send_message(s, encode("HELLO", component="bench", pid=os.getpid(),
                               proto=PROTOCOL_VERSION))
        reply = recv_message(s)
    if reply is None or reply.verb != "OK":
        return frozenset()
    return frozenset(f for f in reply.get("features").split(",") if f)


def _config_error(**keys: Any) -> str | None:
    """None if the installed transfer config accepts a two-component config with these
    top-level and connection keys (``conn``); else its one-line error."""
    from ..config.errors import ConfigError
    from ..transfer.config import transfer_from_dict

    conn = {"name": "c", "from": "a", "to": "b", "files": ["/x/*.nc"], **keys.pop("conn", {})}
    try:
        transfer_from_dict({"components": ["a", "b"], "connections": [conn], **keys})
    except ConfigError as exc:
        return str(exc)
    return None


def async_unsupported(features: frozenset[str]) -> str | None:
    """Why the installed transfer layer has no async mode (None: it has).

    It has one if the daemon advertises ``async``, or if ``ensio run`` routes an async
    connection's files (a ``route`` line in the producer's interposer rules: the
    interposer then reports written ranges); the single-host foundation accepts
    ``mode: async`` in the config but does neither.
    """
    refused = _config_error(conn={"mode": "async"})
    if refused is not None:
        return f"the transfer config refuses mode async: {refused}"
    if "async" in features:
        return None
    from ..transfer.config import transfer_from_dict
    from ..transfer.run import rules_text

    cfg = transfer_from_dict({"components": ["a", "b"], "connections": [
        {"name": "c", "from": "a", "to": "b", "files": ["/x/*.nc"], "mode": "async"}]})
    if any(line.startswith("route ") for line in rules_text(cfg, "a").splitlines()):
        return None
    return "the transfer layer does not implement mode async yet (it runs async as sync)"


def cross_host_unsupported(features: frozenset[str]) -> str | None:
    """Why two hosts cannot be measured here (None: they can): the config needs a ``hosts``
    key (or the daemon advertises ``tcp``), and the namespaces need root and ``ip``."""
    from .transfer_netns import netns_unavailable

    if "tcp" not in features:
        refused = _config_error(hosts={"h": {"address": "10.0.0.1", "components": ["a"]}})
        if refused is not None:
            return f"the transfer layer has no cross-host streaming yet ({refused})"
    return netns_unavailable()


class DirectHost:
    """The daemon of the one-host direct cases: a private socket directory, started once,
    stopped at the end. ``error`` says why there is none (no C compiler, a daemon that
    does not start); ``features`` is what the daemon advertises.
    """

    def __init__(self, directory: Path, pool_mb: float | None = None) -> None:
        from ..transfer.build import interposer
        from ..transfer.errors import TransferError
        from ..transfer.runtime import ensure_daemon

        self.dir = directory
        self.error: str | None = None
        self.features: frozenset[str] = frozenset()
        try:
            interposer()
            self.features = daemon_features(ensure_daemon(directory, idle_timeout=3600.0,
                                                          pool_mb=pool_mb))
        except (TransferError, OSError) as exc:
            self.error = f"the transfer layer is unavailable here: {exc}"

    def prefix(self, role: str) -> list[str]:
        return []

    def env(self, role: str) -> dict[str, str]:
        return {"ENSIO_TRANSFER_DIR": str(self.dir)}

    def config_keys(self) -> dict[str, Any]:
        return {}

    def forget(self, paths: list[str]) -> None:
        return None  # one daemon: the consumer's unlink released the files

    def stop(self) -> None:
        from ..transfer.runtime import stop_daemon

        with contextlib.suppress(Exception):
            stop_daemon(self.dir, timeout=60.0)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def direct_host(pool_mb: float | None = None) -> Iterator[DirectHost]:
    """A :class:`DirectHost` in a fresh 0700 directory under /tmp (a Unix socket path must
    stay under 108 bytes, which a deep ``--workdir`` may exceed)."""
    import tempfile

    host = DirectHost(Path(tempfile.mkdtemp(prefix="ensio-bt-", dir="/tmp")), pool_mb)
    try:
        yield host
    finally:
        host.stop()


def unavailable(case: Case, host: DirectHost | None) -> str | None:
    """Why ``case`` cannot be measured here (one line), or None if it can."""
    if case.exchange == "file":
        return None
    if host is None or host.error:
        return host.error if host is not None else "no transfer daemon was started"
    if case.mode == "async":
        why = async_unsupported(host.features)
        if why is not None:
            return why
    elif case.mode != "sync":
        return _config_error(conn={"mode": case.mode}) or f"unknown mode {case.mode}"
    if case.hosts > 1:
        return cross_host_unsupported(host.features)
    return None


def _env(place: Placement | None, role: str, pool_mb: float | None) -> dict[str, str]:
    env = child_env(drop_preload=True)
    if pool_mb is not None:  # a daemon that ensio run starts (two namespaces)
        env["ENSIO_TRANSFER_POOL_MB"] = str(pool_mb)
    if place is not None:
        env.update(place.env(role))
    return env


def _argv(case: Case, role: str, spec: Path, config: Path | None,
          place: Placement | None) -> list[str]:
    program = [sys.executable, "-m", "ensio.bench.transfer_programs", role, str(spec)]
    if case.exchange == "file" or place is None:
        return program
    return [*place.prefix(role), sys.executable, "-m", "ensio.cli.main", "run", "--transfer",
            str(config), "--component", role, "--", *program]


def _config(case: Case, path: Path, data: Path, place: Placement) -> Path:
    conn = {"name": "bench", "from": "producer", "to": "consumer",
            "files": [str(data / "mem*.nc")], "pattern": "1-1", "mode": case.mode}
    path.write_text(yaml.safe_dump({"components": ["producer", "consumer"],
                                    **place.config_keys(), "connections": [conn]},
                                   sort_keys=False))
    return path


def run_case(case: Case, settings: Mapping[str, Any], run_dir: Path,
             place: Placement | None) -> dict[str, Any]:
    """One run of ``case``: both programs started, waited for, their results joined.

    The consumer starts first and tells the producer it is ready through the ``go``
    pipe; the producer tells it each file through the ``notify`` pipe. Every pipe end a
    program does not use is closed here, so a program that dies gives its partner an
    end of file rather than a hang.

    Raises
    ------
    RuntimeError
        A program failed or did not finish within ``settings["timeout_s"]``; the
        message names its log.
    """
    data = run_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    paths = [str(data / f"mem{i + 1:03d}.nc") for i in range(settings["files"])]
    direct = case.exchange == "direct" and place is not None
    config = _config(case, run_dir / "transfer.yaml", data, place) if direct else None
    go_r, go_w = os.pipe()
    note_r, note_w = os.pipe()
    common = {"paths": paths, "size_mb": settings["size_mb"], "fields": settings["fields"],
              "seed": settings["seed"], "fsync": case.fsync, "notify": case.notify,
              "poll_s": settings["poll_ms"] / 1000.0, "deadline_s": settings["timeout_s"],
              "warm": settings["warm"], "compute_s": settings.get("compute_ms", 0.0) / 1000.0}
    procs: dict[str, subprocess.Popen] = {}
    try:
        for role, fds in (("consumer", (go_w, note_r)), ("producer", (go_r, note_w))):
            spec = run_dir / f"{role}.spec.json"
            spec.write_text(json.dumps({**common, "go_fd": fds[0], "notify_fd": fds[1],
                                        "result": str(run_dir / f"{role}.json")}))
            with (run_dir / f"{role}.log").open("w") as log:
                procs[role] = subprocess.Popen(
                    _argv(case, role, spec, config, place), stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT,
                    env=_env(place, role, settings.get("pool_mb")), cwd=run_dir, pass_fds=fds)
        for fd in (go_r, go_w, note_r, note_w):
            os.close(fd)
        go_r = go_w = note_r = note_w = -1
        _wait(procs, run_dir, settings["timeout_s"])
        if direct:
            place.forget(paths)
    finally:
        for fd in (go_r, go_w, note_r, note_w):
            if fd >= 0:
                os.close(fd)
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    prod = json.loads((run_dir / "producer.json").read_text())
    cons = json.loads((run_dir / "consumer.json").read_text())
    t0, t_end = prod["t0"], cons["t_end"]
    return {"seconds": t_end - t0, "producer_seconds": prod["closes"][-1] - t0,
            "after_close_seconds": t_end - prod["close_calls"][-1],
            "last_close_seconds": prod["closes"][-1] - prod["close_calls"][-1],
            "producer_cpu_seconds": prod.get("cpu"), "consumer_cpu_seconds": cons.get("cpu"),
            "bytes": cons["bytes"],
            "verified": cons["sha256"] == prod["sha256"], "sources": sorted(set(cons["sources"])),
            "backings": sorted(set(cons.get("backings", []))),
            "on_disk": cons["on_disk"], "run_dir": str(run_dir)}


def _wait(procs: Mapping[str, subprocess.Popen], run_dir: Path, timeout: float) -> None:
    """Wait for every program; a failure names the program and the tail of its log.

    The producer's failure is reported first: a consumer fails too when its producer
    dies (end of file on the pipe, EIO from the daemon), and the cause is the producer's.
    """
    deadline = time.monotonic() + timeout
    codes = {}
    for role, p in procs.items():
        try:
            codes[role] = p.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the {role} did not finish within {timeout:.0f} s "
                               f"(see {run_dir / (role + '.log')})") from None
    for role in ("producer", "consumer"):
        if codes.get(role, 0) != 0:
            tail = (run_dir / f"{role}.log").read_text().strip().splitlines()[-3:]
            raise RuntimeError(f"the {role} failed (exit {codes[role]}): {' | '.join(tail)}")
