"""The detached backup process of one node: ``python -m ensio.io.node.backupworker JOB``.

Started by :func:`ensio.io.node.backup.start_backup` in a session of its own, it
outlives the analysis command (why: see :mod:`ensio.io.node.backup`). It copies its
node's files into the attempt's data directory, then records them in a
*part* file; the worker that finds every node's part writes the cycle's
completion marker. The order makes a kill at any instant safe:

1. every file is copied to a temporary, hashed while read (sha256), checked
   (size; the source unchanged while read), flushed and renamed;
2. the directories are flushed, so the files and their names are durable;
3. the part (this node's files, sizes, digests) is written atomically;
4. if the parts of all nodes exist and list the expected number of files,
   each file is checked to have its recorded size, and the marker
   ``COMPLETE`` (naming the attempt and every file with its digest) is
   written atomically and flushed (:meth:`BackupAttempt.commit`).

A marker therefore never exists before all files it names are durable. A
killed worker leaves no part (or a part without a marker); its attempt stays
incomplete and a restore refuses it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

from ... import faults
from ...durable import atomic_write, fsync_path
from ...errors import InputError
from ..txn.marker import read_marker, write_marker
from ..txn.transaction import RecoveryReport, Transaction
from .placecopy import Copy, CopySet

__all__ = ["MARKER_NAME", "BackupAttempt", "data_dir", "main", "run_job"]

MARKER_NAME = "COMPLETE"
FORMAT = "ensio-backup-1"


def data_dir(backup_dir: Path, token: str) -> Path:
    """Where the files of attempt ``token`` are written."""
    return backup_dir / f"data-{token}"


def part_path(backup_dir: Path, token: str, node: int) -> Path:
    return data_dir(backup_dir, token) / f".part-{node:05d}.json"


def _flush_tree(root: Path, dirs: set[Path], fsync: bool) -> None:
    """Flush ``dirs`` and every directory between them and ``root`` (created entries too)."""
    if not fsync:
        return
    todo = set[Path]()
    for d in dirs:
        while d != root and root in d.parents:
            todo.add(d)
            d = d.parent
    for d in sorted(todo, key=lambda p: -len(p.parts)):
        fsync_path(d, directory=True)
    fsync_path(root, directory=True)
    fsync_path(root.parent, directory=True)


class BackupAttempt(Transaction):
    """One attempt at a cycle's backup, as a :class:`~ensio.io.txn.transaction.Transaction`.

    Begun on rank 0 of the analysis (:meth:`begin`: the attempt's own data
    directory, after removing those of killed attempts); staged by the
    node workers (:meth:`stage`: a file's place in that directory, written
    through :class:`~ensio.io.node.placecopy.CopySet`); committed by the
    worker that finds every node's part (:meth:`commit`: the ``COMPLETE``
    marker, the only commit point). A new attempt never touches the files
    of the last complete one, so an abort or a kill leaves the backup as it
    was; :meth:`recover` removes what killed attempts left.

    ``cycle``, ``n_nodes`` and ``expected`` (the files of every node) are
    what the marker records; needed for :meth:`commit` only.
    """

    def __init__(self, backup_dir: Path, token: str, *, fsync: bool = True, cycle: int = 0,
                 n_nodes: int = 1, expected: int = 0) -> None:
        self.backup_dir, self.token, self.fsync = Path(backup_dir), token, fsync
        self.cycle, self.n_nodes, self.expected = cycle, n_nodes, expected
        self.marked = False  # this object wrote the marker

    @property
    def data(self) -> Path:
        return data_dir(self.backup_dir, self.token)

    def begin(self) -> None:
        """The backup directory and this attempt's data directory; dead attempts removed."""
        self.backup_dir.mkdir(parents=True, exist_ok=True)
        self.recover(self.backup_dir)
        self.data.mkdir()
        if self.fsync:
            fsync_path(self.backup_dir, directory=True)

    def stage(self, target: str | Path) -> Path:
        """Where the file named ``target`` in the backup (relative) is written."""
        return self.data / target

    def commit(self) -> int:
        """Write the marker if every node's part exists (:attr:`marked`); the files it names.

        Two nodes finishing together may both write it; both write the same content.
        """
        parts = []
        for node in range(self.n_nodes):
            try:
                parts.append(json.loads(part_path(self.backup_dir, self.token, node).read_text()))
            except FileNotFoundError:
                return 0
        files = sorted((f for p in parts for f in p["files"]),
                       key=lambda f: (f["member"], -1 if f["tile"] is None else f["tile"]))
        if len(files) != self.expected:
            raise RuntimeError(f"{self.backup_dir}: the parts of attempt {self.token} list "
                               f"{len(files)} files, not {self.expected}; no marker written")
        for f in files:
            size = os.stat(self.data / f["path"]).st_size
            if size != f["size"]:
                raise RuntimeError(f"{self.data / f['path']}: {size} bytes, part says "
                                   f"{f['size']}")
        marker = {"format": FORMAT, "cycle": self.cycle, "token": self.token,
                  "nodes": self.n_nodes, "data": self.data.name, "files": files}
        write_marker(self.backup_dir / MARKER_NAME, marker, fsync=self.fsync,
                     label="backup-marker", indent=1)
        self.marked = True
        return len(files)

    def abort(self) -> None:
        """Remove this attempt's data directory unless the marker names it."""
        record = self.completed(self.backup_dir)
        if record is None or record["data"] != self.data.name:
            shutil.rmtree(self.data, ignore_errors=True)

    @classmethod
    def recover(cls, directory: Path, **options: Any) -> RecoveryReport:
        """Remove the data directories of ``directory`` that no marker names (killed
        attempts); the complete backup, if any, stays."""
        record = cls.completed(directory)
        keep = {record["data"]} if record is not None else set()
        removed = 0
        for old in directory.glob("data-*"):
            if old.name not in keep:
                shutil.rmtree(old)
                removed += 1
        return RecoveryReport("rolled_back" if removed else "clean", staged=removed)

    @staticmethod
    def completed(directory: Path) -> dict[str, Any] | None:
        """The completion marker of the backup directory ``directory``, or None if it has none
        (read through the one marker reader, :func:`ensio.io.txn.marker.read_marker`)."""
        marker = read_marker(directory / MARKER_NAME, what="marker", error=InputError)
        if marker is None:
            return None
        if marker.get("format") != FORMAT:
            raise InputError(f"{directory / MARKER_NAME}: not an ensio backup marker")
        return marker


def run_job(job: dict[str, Any]) -> bool:
    """Copy one node's files and write its part; returns True if this call wrote the marker."""
    attempt = BackupAttempt(Path(job["backup_dir"]), str(job["token"]),
                            fsync=bool(job.get("fsync", True)), cycle=int(job["cycle"]),
                            n_nodes=int(job["n_nodes"]), expected=int(job["expected"]))
    backup_dir, token, data, fsync = attempt.backup_dir, attempt.token, attempt.data, attempt.fsync
    items = job["items"]
    copies = []
    for it in items:
        dst = attempt.stage(it["path"])
        dst.parent.mkdir(parents=True, exist_ok=True)
        copies.append(Copy(Path(it["src"]), dst))
    copyset = CopySet(copies, threads=int(job.get("threads", 4)), fsync=fsync,
                      label="backup", hashing=True, sync_dirs=False)  # the tree: flushed below
    prepared = copyset.prepare()
    copyset.commit()
    _flush_tree(backup_dir, {c.dst.parent for c in copies} | {data}, fsync)
    faults.point("backup-files-durable")
    files = [{"member": it["member"], "tile": it["tile"], "rank": it["rank"],
              "path": it["path"], "size": p.size, "sha256": p.digest}
             for it, p in zip(items, prepared, strict=True)]
    part = {"format": FORMAT, "token": token, "node": job["node"], "files": files}
    atomic_write(part_path(backup_dir, token, int(job["node"])), json.dumps(part),
                 fsync=fsync, label="backup-part")
    attempt.commit()
    return attempt.marked


def main(argv: list[str] | None = None) -> int:
    """Run the job file named on the command line; remove it when done. Exit 1 on error."""
    argv = sys.argv[1:] if argv is None else argv
    job_file = Path(argv[0])
    try:
        job = json.loads(job_file.read_text())
        wrote = run_job(job)
    except Exception:  # the log (stderr) is all a detached process has
        traceback.print_exc()
        print(f"ensio backup: error: {sys.exc_info()[1]}", file=sys.stderr, flush=True)
        return 1
    job_file.unlink(missing_ok=True)
    print(f"ensio backup: cycle {job['cycle']} node {job['node']}: "
          f"{len(job['items'])} files durable" + ("; marker written" if wrote else ""),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
