"""Write-behind of ``persist`` files: completed files also go to their real paths.

A job of its own beside the table of held files (:mod:`ensio.transfer.table`):
one daemon thread takes completed ``persist`` entries from the table's queue
and writes each to its real path (temporary, fsync, rename), so a restart
that must survive a crash does, while consumers keep reading from memory.
"""

from __future__ import annotations

import os
import time

from . import materialize
from .table import Table

__all__ = ["persist_loop", "wait_persisted"]


def persist_loop(table: Table) -> None:
    """Write completed ``persist`` files to their real paths, in order; None stops."""
    while (e := table.persist_queue.get()) is not None:
        with table.cond:
            if table.entries.get(e.path) is not e or e.fd is None:
                continue
            source, target = os.dup(e.fd), e.path
        try:
            tmp = materialize.write_temporary(source, target, e.mode, fsync=True)
        except OSError as exc:
            table.log.error(
                "%s: persist failed: %s (the file stays in memory)", target, exc.strerror
            )
            with table.cond:
                e.persist_state = "failed"
            continue
        finally:
            os.close(source)
        with table.cond:
            if table.entries.get(e.path) is e and e.path == target:
                materialize.publish(tmp, target, fsync=True)
                e.persist_state = "done"
                table.ours.add(target)  # ours: a later version shadowing it is no stale file
            else:
                tmp.unlink(missing_ok=True)
                if table.entries.get(e.path) is e:  # renamed meanwhile: its new name
                    table.persist_queue.put(e)
            table.cond.notify_all()


def wait_persisted(table: Table, timeout: float) -> bool:
    """Wait until no write-behind is pending (stop, tests); False at the deadline."""
    deadline = time.monotonic() + timeout
    with table.cond:
        while any(e.persist_state == "pending" for e in table.entries.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            table.cond.wait(left)
    return True
