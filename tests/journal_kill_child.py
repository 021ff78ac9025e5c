"""Child process of test_journal_kill.py: journal and write an "analysis" in place.

Usage: ``python journal_kill_child.py PLAN.json``. Does what the real writer
does -- per file: save prior bytes, pwrite new bytes (two tasks' logs
interleaved); the library-path file is backed up and replaced by a rewritten
copy -- then commits (or aborts). It dies wherever ``ENSIO_FAULT_KILL_AT``
says (fault points of ensio.io.txn.journal plus its own around the data writes),
or wherever the parent SIGKILLs it after the "ready" line on stdout. With
``ENSIO_TEST_REPORT_POINTS`` set it writes ``point LABEL`` to stdout at every
fault point, so the parent can kill it right after a chosen one and know where
the kill landed (kill_support.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ensio import faults
from ensio.io.txn import journal


def main(plan_file: str) -> None:
    plan = json.loads(Path(plan_file).read_text())
    root, fsync = Path(plan["root"]), plan["fsync"]
    if os.environ.get("ENSIO_TEST_REPORT_POINTS"):  # unbuffered: no report lost at a kill
        faults.set_hook(lambda label: os.write(1, f"point {label}\n".encode()))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    logs = [journal.UndoLog.create(root, t, fsync=fsync) for t in range(plan["tasks"])]
    for f in plan["files"]:
        path, new = Path(f["path"]), Path(f["new"]).read_bytes()
        fd = os.open(path, os.O_RDWR)
        for offset, length, task in f["ranges"]:
            logs[task].save(path, offset, os.pread(fd, length, offset))
            os.pwrite(fd, new[offset:offset + length], offset)
            faults.point("data-pwrite")
        os.close(fd)
        if f["library"]:
            logs[0].save_file(path)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(new)
            faults.point("library-write")
            os.replace(tmp, path)
            faults.point("library-replace")
    for log in logs:
        log.close()
    if plan["finish"] == "commit":
        journal.commit(root, fsync=fsync)
    else:
        journal.abort(root, fsync=fsync)


if __name__ == "__main__":
    main(sys.argv[1])
