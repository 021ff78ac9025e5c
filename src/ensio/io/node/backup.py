"""Asynchronous per-cycle backup of each rank's files, and the restore from it.

After the analysis of cycle N has written its files (each rank its tiles on
its node-local disk in ``io.mode: shuffle``; the member files otherwise),
:func:`start_backup` copies them to ``io.backup_dir`` (``{cycle}`` = N) in
the background and returns at once; :meth:`BackupHandle.wait` waits for it.

**A detached process per node, not a thread.** ``ensio analyse`` is a
command: the cycle driver starts the next cycle's forecasts when it exits,
and ``mpiexec`` returns only when every rank has exited. A thread would keep
the analysis alive (and the next cycle waiting) until the copy ends; a
process in a session of its own (:mod:`ensio.io.node.backupworker`, its output
in a log file, no descriptor of the launcher inherited) lets the command
exit at once while the copy goes on. One process per node (the node's
leader starts it for all the node's ranks) keeps one stream per local disk.
The price: a batch job that ends kills it; the backup then stays incomplete
(never falsely complete) and the next cycle's backup or a rerun replaces it.
Call :meth:`BackupHandle.wait` before a job's end to keep the last cycle's.

**Layout and commit.** Each attempt writes its files under
``BACKUP/data-TOKEN/`` (the path of each file relative to the directory the
member files share), so a new attempt never touches the files of the last
complete one. Each node's worker records its files in a part; the last one
writes ``BACKUP/COMPLETE`` (JSON: cycle, token, every file with member,
tile, rank, size and sha256) only when all parts exist, atomically and
flushed. The marker is the only commit point; an attempt is a
:class:`~ensio.io.node.backupworker.BackupAttempt` (a transaction: begun
here, staged and committed by the workers; see :mod:`ensio.io.node.backupworker`).
The next attempt of the same cycle first removes data directories no marker
names (killed attempts). One backup of a cycle at a time is assumed.

The source files must not change while they are copied (the next cycle must
not write them in place before :meth:`BackupHandle.wait` returns); a change
is detected (size, mtime, inode) and fails the attempt instead of recording
a mixed copy.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpi4py import MPI

from ...config.errors import ConfigError
from ...config.schema import Config
from ...durable import atomic_write
from ...errors import EnsioError, InputError
from ...parallel.agree import all_call, root_call
from ...parallel.nodes import NodeGroups, node_groups, this_host
from .backupworker import FORMAT, MARKER_NAME, BackupAttempt, data_dir
from .placecopy import Copy
from .placemap import PlacedFile
from .placenode import NodeCopyReport, copy_on_nodes, placement

__all__ = ["BackupHandle", "backup_dir_for", "backup_items", "ensure_cycle_backup",
           "find_backup", "restore_from_backup", "start_backup", "start_cycle_backup"]


def backup_dir_for(config: Config, cycle: int) -> Path:
    """``io.backup_dir`` of ``cycle`` (relative patterns from the config's directory)."""
    pattern = config.io.backup_dir
    if pattern is None:
        raise ConfigError("io.backup_dir: not set (a pattern with {cycle})")
    try:
        return config.resolve(pattern.format(cycle=cycle))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"io.backup_dir: pattern {pattern!r} takes only {{cycle}} "
                          f"({exc})") from None


def works_locally(config: Config) -> bool:
    """True if the analysis reads and writes the node-local copies (``io.mode: shuffle``,
    :data:`ensio.config.schema.LOCAL_MODES`)."""
    return config.io.works_locally


def _working_path(config: Config, p: PlacedFile) -> Path:
    """The copy of ``p`` the analysis writes: its local copy in shuffle mode, else global."""
    if works_locally(config):
        if p.local is None:
            raise ConfigError("io.local_dir: required with io.mode shuffle")
        return p.local
    return p.global_path


def backup_items(config: Config, placed: list[PlacedFile], rank: int) -> list[dict[str, Any]]:
    """The files of ``rank`` to back up (source, backup name, member, tile, rank)."""
    return [{"src": str(_working_path(config, p)), "path": p.rel, "member": p.member,
             "tile": p.tile, "rank": p.rank} for p in placed if p.rank == rank]


@dataclass
class BackupHandle:
    """A running backup; :meth:`wait` (collective) waits for it and checks the marker."""

    comm: MPI.Comm
    cycle: int
    backup_dir: Path
    token: str
    process: subprocess.Popen[bytes] | None  # the node's worker, on node leaders
    log: Path | None

    def done(self) -> bool:
        """Local, non-blocking: has this node's worker finished (True off the leaders)?"""
        return self.process is None or self.process.poll() is not None

    def wait(self, timeout: float | None = None) -> Path:
        """Collective: wait for every node's worker; return the marker's path.

        Raises :class:`EnsioError` (one line, the failing node's last log
        line) if a worker failed or the marker is missing or names another
        attempt.
        """
        def finish() -> None:
            if self.process is None:
                return
            code = self.process.wait(timeout)
            if code != 0:
                raise EnsioError(f"backup of cycle {self.cycle} to {self.backup_dir} failed "
                                 f"(exit {code}): {_last_line(self.log)}")
        all_call(self.comm, finish)

        def check() -> Path:
            marker = BackupAttempt.completed(self.backup_dir)
            if marker is None or marker["token"] != self.token:
                raise EnsioError(f"{self.backup_dir}: backup of cycle {self.cycle} has no "
                                 f"completion marker for attempt {self.token}")
            return self.backup_dir / MARKER_NAME
        return root_call(self.comm, check)


def _last_line(log: Path | None) -> str:
    try:
        lines = [ln for ln in (log.read_text().splitlines() if log else []) if ln.strip()]
    except OSError:
        lines = []
    return lines[-1] if lines else "no log"


def _spawn(job: dict[str, Any], nodes: NodeGroups, fsync: bool) -> tuple[subprocess.Popen[bytes],
                                                                         Path]:
    """Node leader: write the job file and start the detached worker."""
    data = data_dir(Path(job["backup_dir"]), job["token"])
    job_file = data / f".job-{nodes.node:05d}.json"
    log = data / f"backup-node{nodes.node:05d}.log"
    atomic_write(job_file, json.dumps(job), fsync=fsync, label="backup-job")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_",
                                                                    "MPIR_", "OMPI_"))}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ensio.io.node.backupworker", str(job_file)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, env=env,
        )
    return proc, log


def start_backup(items: list[dict[str, Any]], backup_dir: Path, cycle: int, comm: MPI.Comm,
                 *, host: str | None = None, threads: int = 4,
                 fsync: bool = True) -> BackupHandle:
    """Collective: start the background copy of every rank's ``items`` to ``backup_dir``.

    Returns as soon as each node's worker is started; errors before that
    (an unwritable backup directory) are raised on every rank.

    Parameters
    ----------
    items : list of dict
        This rank's files (:func:`backup_items`): ``src``, ``path`` (name in
        the backup), ``member``, ``tile``, ``rank``.
    backup_dir : Path
        The cycle's backup directory (created if missing).
    comm : MPI.Comm
        All ranks of the run; one worker per node of it.
    """
    nodes = node_groups(comm, host or this_host())
    try:
        token = root_call(comm, lambda: _new_attempt(backup_dir, fsync))
        expected = comm.allreduce(len(items), op=MPI.SUM)
        node_items = nodes.node_comm.gather(items, root=0)

        def spawn() -> tuple[subprocess.Popen[bytes], Path] | None:
            if not nodes.is_leader:
                return None
            assert node_items is not None
            job = {"format": FORMAT, "cycle": cycle, "token": token,
                   "backup_dir": str(os.path.abspath(backup_dir)), "node": nodes.node,
                   "n_nodes": nodes.n_nodes, "expected": expected, "threads": threads,
                   "fsync": fsync, "items": [it for part in node_items for it in part]}
            return _spawn(job, nodes, fsync)
        started = all_call(comm, spawn)
    finally:
        nodes.free()
    proc, log = started if started is not None else (None, None)
    return BackupHandle(comm, cycle, Path(backup_dir), token, proc, log)


def _new_attempt(backup_dir: Path, fsync: bool) -> str:
    """Rank 0: begin a new attempt (its data directory; dead attempts removed)."""
    attempt = BackupAttempt(backup_dir, secrets.token_hex(6), fsync=fsync)
    attempt.begin()
    return attempt.token


def start_cycle_backup(config: Config, comm: MPI.Comm, cycle: int,
                       host: str | None = None) -> BackupHandle:
    """Collective: back up cycle ``cycle``'s files of every rank to ``io.backup_dir``.

    What the offline analysis calls after its commit when ``io.backup_dir`` is set.
    """
    host = host or this_host()
    placed = placement(config, comm, host, None if comm.size > 1 else 1)
    return start_backup(backup_items(config, placed, comm.rank), backup_dir_for(config, cycle),
                        cycle, comm, host=host, fsync=True)


def ensure_cycle_backup(config: Config, comm: MPI.Comm, cycle: int,
                        host: str | None = None) -> BackupHandle | None:
    """Collective: :func:`start_cycle_backup` unless cycle ``cycle`` already has a complete one.

    What a rerun of an analysis the members already hold calls, so that a
    backup that failed to start (or was killed) the first time is made.
    """
    where = backup_dir_for(config, cycle)
    complete = root_call(comm, lambda: BackupAttempt.completed(where) is not None)
    return None if complete else start_cycle_backup(config, comm, cycle, host)


def backup_cycles(config: Config) -> list[tuple[int, Path]]:
    """Every (cycle, directory) the ``io.backup_dir`` pattern matches on disk, newest first."""
    pattern = config.io.backup_dir
    if pattern is None:
        raise ConfigError("io.backup_dir: not set (a pattern with {cycle})")
    full = str(config.resolve(pattern))
    parts = re.split(r"\{cycle(?::[^}]*)?\}", full)
    glob = "*".join(parts)
    regex = re.compile(r"(\d+)".join(re.escape(p) for p in parts) + r"\Z")
    root = Path(glob.split("*")[0]).parent if "*" in glob else Path(glob).parent
    rel = os.path.relpath(glob, root)
    found = []
    for path in root.glob(rel):
        m = regex.match(str(path))
        if m and len(set(m.groups())) == 1:
            found.append((int(m.group(1)), path))
    return sorted(found, reverse=True)


def find_backup(config: Config, cycle: int | None = None) -> tuple[int, Path, dict[str, Any]]:
    """The backup to restore: cycle ``cycle`` (must be complete) or the newest complete one."""
    if cycle is not None:
        where = backup_dir_for(config, cycle)
        if not where.is_dir():
            raise InputError(f"{where}: no backup of cycle {cycle}")
        marker = BackupAttempt.completed(where)
        if marker is None:
            raise InputError(f"{where}: backup of cycle {cycle} is incomplete (no {MARKER_NAME} "
                             "marker); refusing to restore it")
        return cycle, where, marker
    for n, where in backup_cycles(config):
        marker = BackupAttempt.completed(where)
        if marker is not None:
            return n, where, marker
    raise InputError(f"{config.io.backup_dir}: no complete backup (none with a {MARKER_NAME} "
                     "marker)")


def restore_from_backup(config: Config, comm: MPI.Comm, *, host: str, cycle: int | None = None,
                        n_ranks: int | None = None, threads: int = 4,
                        fsync: bool = True) -> tuple[int, NodeCopyReport]:
    """Collective: put a complete backup's files back where the analysis works on them.

    Every file of the ensemble must be in the marker; each copy is checked
    against the marker's sha256 before any file is replaced (nothing is
    modified if one does not match). Returns the cycle and what was copied.
    """
    found = root_call(comm, lambda: find_backup(config, cycle))
    n, where, marker = found
    placed = placement(config, comm, host, n_ranks)
    recorded = {(f["member"], f["tile"]): f for f in marker["files"]}
    data = where / marker["data"]
    pairs = []
    for p in placed:
        f = recorded.get((p.member, p.tile))
        if f is None:
            tile = f" tile {p.tile}" if p.tile is not None else ""
            raise InputError(f"{where / MARKER_NAME}: backup of cycle {n} has no member "
                             f"{p.member}{tile} of this ensemble; refusing to restore it")
        pairs.append((p, Copy(data / f["path"], _working_path(config, p), f["sha256"])))
    return n, copy_on_nodes(comm, host, pairs, threads=threads, fsync=fsync, label="restore")
