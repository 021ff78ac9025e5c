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
   written atomically and flushed.

A marker therefore never exists before all files it names are durable. A
killed worker leaves no part (or a part without a marker); its attempt stays
incomplete and a restore refuses it.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from ... import faults
from ...durable import atomic_write, fsync_path
from ..txn.marker import write_marker
from .stagecopy import Copy, commit_all, prepare_all

__all__ = ["MARKER_NAME", "data_dir", "main", "run_job", "try_complete"]

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


def run_job(job: dict[str, Any]) -> bool:
    """Copy one node's files and write its part; returns True if this call wrote the marker."""
    backup_dir, token = Path(job["backup_dir"]), str(job["token"])
    data, fsync = data_dir(backup_dir, token), bool(job.get("fsync", True))
    items = job["items"]
    copies = []
    for it in items:
        dst = data / it["path"]
        dst.parent.mkdir(parents=True, exist_ok=True)
        copies.append(Copy(Path(it["src"]), dst))
    prepared = prepare_all(copies, threads=int(job.get("threads", 4)), fsync=fsync,
                           label="backup", hashing=True)
    commit_all(prepared, fsync=False, label="backup")
    _flush_tree(backup_dir, {c.dst.parent for c in copies} | {data}, fsync)
    faults.point("backup-files-durable")
    files = [{"member": it["member"], "tile": it["tile"], "rank": it["rank"],
              "path": it["path"], "size": p.size, "sha256": p.digest}
             for it, p in zip(items, prepared, strict=True)]
    part = {"format": FORMAT, "token": token, "node": job["node"], "files": files}
    atomic_write(part_path(backup_dir, token, int(job["node"])), json.dumps(part),
                 fsync=fsync, label="backup-part")
    return try_complete(backup_dir, token, int(job["cycle"]), int(job["n_nodes"]),
                        int(job["expected"]), fsync=fsync)


def try_complete(backup_dir: Path, token: str, cycle: int, n_nodes: int, expected: int, *,
                 fsync: bool = True) -> bool:
    """Write the marker if all ``n_nodes`` parts of ``token`` exist; True if written.

    Two nodes finishing together may both write it; both write the same content.
    """
    parts = []
    for node in range(n_nodes):
        try:
            parts.append(json.loads(part_path(backup_dir, token, node).read_text()))
        except FileNotFoundError:
            return False
    files = sorted((f for p in parts for f in p["files"]),
                   key=lambda f: (f["member"], -1 if f["tile"] is None else f["tile"]))
    if len(files) != expected:
        raise RuntimeError(f"{backup_dir}: the parts of attempt {token} list {len(files)} "
                           f"files, not {expected}; no marker written")
    data = data_dir(backup_dir, token)
    for f in files:
        size = os.stat(data / f["path"]).st_size
        if size != f["size"]:
            raise RuntimeError(f"{data / f['path']}: {size} bytes, part says {f['size']}")
    marker = {"format": FORMAT, "cycle": cycle, "token": token, "nodes": n_nodes,
              "data": data.name, "files": files}
    write_marker(backup_dir / MARKER_NAME, marker, fsync=fsync, label="backup-marker", indent=1)
    return True


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
