"""Bounded memory of the staging daemon: the default budget, and when a file is consumed.

Three decisions of :class:`~.table.Table` that need facts from outside the protocol:

* The **default budget**. A connection without ``memory_mb`` shares one budget with
  every other such connection on the host: half the memory the daemon may use, that
  is half of the smaller of the host's ``MemTotal`` and the memory limit of the
  daemon's cgroup (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``; a batch
  job's allocation), computed once by the daemon on the producer's host
  (:func:`default_budget_bytes`). Past it, ``fallback`` decides as for an explicit
  ``memory_mb``: the default ``files`` spills to the real path, so a run that never
  set a budget still cannot take the host's memory.
* **Consumption** (``keep: until-consumed``, the default). The producer's rules file
  (``run.rules_text``) has one ``keep CONN POLICY TO,TO`` line per connection it
  produces; the interposer names that file in its ``HELLO`` and the daemon reads the
  lines there (:func:`read_keep_lines`), so each new file knows its declared consumer
  components. A process of such a component that opened the file (``OPEN``, not
  ``STAT``) and then exits with status 0 (the interposer's ``on_exit`` report,
  ``EXIT``) has consumed it for its component. Once every declared component has, the
  file is *releasable* (:func:`releasable`): when a new file of the same budget needs
  the memory, the table releases consumed files, oldest first, before it would spill
  the new one or refuse it; ``ensio transfer stop`` does not write them. A later open
  of a released file sees the real path.

  Why at exit with status 0: a process that crashes or exits non-zero consumed nothing,
  so a retried job finds its input again; and a program may open a file twice (a
  metadata pass, then the data: ``ensio analyse``, CDO). Why only under the budget's
  pressure: a component often reads one file with several programs one after the other
  (``ncdump -h``, then ``cdo``), each its own process; released at once, the second
  would find nothing. Memory stays bounded by the budget either way, and consumed
  files are what gives way first.
* **Recycling**. A complete file leaving the table (unlinked, a new version, released)
  gives its memory to the pool for the next new file (:func:`let_go`, :mod:`.pool`) as
  long as its budget's files and that memory fit in the budget together
  (:func:`recycled_room`).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .entries import Entry, Peer, Reply
from .pool import exclusive_writable

if TYPE_CHECKING:
    from .table import Table

__all__ = ["KEEP_DEFAULT", "default_budget_bytes", "let_go", "over_budget", "read_keep_lines",
           "recycled_room", "release_consumed", "releasable", "warn_stale"]

KEEP_DEFAULT = ("until-unlinked", frozenset())  # no keep line: held until unlinked


def _meminfo_total() -> int | None:
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


def cgroup_limit_bytes() -> int | None:
    """The memory limit of this process's cgroup (v2 or v1), None when unlimited."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/cgroup") as f:
        for line in f:
            hid, controllers, rel = line.rstrip("\n").split(":", 2)
            if hid == "0" and controllers == "":
                text = Path("/sys/fs/cgroup", rel.lstrip("/"), "memory.max").read_text()
            elif "memory" in controllers.split(","):
                text = Path("/sys/fs/cgroup/memory", rel.lstrip("/"),
                            "memory.limit_in_bytes").read_text()
            else:
                continue
            text = text.strip()
            if text != "max" and int(text) < (1 << 60):
                return int(text)
    return None


def default_budget_bytes() -> int:
    """Half of min(MemTotal, the cgroup's memory limit): the shared budget of the
    connections without ``memory_mb`` on this host (at least 64 MiB)."""
    sizes = [s for s in (_meminfo_total(), cgroup_limit_bytes()) if s]
    return max(64 << 20, min(sizes) // 2) if sizes else 4 << 30


def read_keep_lines(rules: str) -> dict[str, tuple[str, frozenset[str]]]:
    """``keep CONN POLICY TO,TO`` lines of a rules file: conn → (policy, consumers).

    A missing or unreadable file gives {} (its files are then kept until unlinked):
    it is only ever the daemon's own socket directory's file, written by ``ensio run``.
    """
    out: dict[str, tuple[str, frozenset[str]]] = {}
    if not rules:
        return out
    with contextlib.suppress(OSError, UnicodeDecodeError), open(rules, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "keep" and \
                    parts[2] in ("until-consumed", "until-unlinked"):
                out[parts[1]] = (parts[2], frozenset(filter(None, parts[3].split(","))))
    return out


def releasable(e: Entry) -> bool:
    """Whether ``e`` may be released for a new file (``keep: until-consumed``, complete,
    every declared component consumed it, no write-behind pending)."""
    return (e.keep == "until-consumed" and e.state == "complete" and bool(e.consumers)
            and e.consumers <= e.consumed and e.persist_state != "pending")


def newer_on_disk(path: str, since: float) -> bool:
    """Whether a real file at ``path`` was modified after ``since`` (wall-clock seconds):
    written after a copy from another host was lost, so it is the file to read."""
    try:
        return os.stat(path).st_mtime > since
    except OSError:
        return False


def release_consumed(table: Table, key: str, target: int, why: str, skip: Entry | None,
                     uncounted: Entry | None = None) -> bool:
    """(table lock held) Release consumed files of budget ``key`` (never ``skip``), oldest
    first, until its usage (without ``uncounted``) is at most ``target``; whether it is
    still above. ``why``: the file that needs the memory (logged)."""
    for e in sorted((e for e in table.entries.values() if e.budget_key == key
                     and e is not skip and releasable(e)), key=lambda x: x.id):
        if table.usage(key, exclude=uncounted) <= target:
            break
        table.log.info("%s: consumed by %s: memory released for %s (keep: until-consumed)",
                       e.path, ", ".join(sorted(e.consumers)), why)
        table.drop(e.path)  # the table's lock is re-entrant
    return table.usage(key, exclude=uncounted) > target


def warn_stale(table: Table, path: str, cur: Entry | None, origin: str, keep: bool) -> None:
    """(table lock held) A real file a new held file shadows (not one the daemon wrote
    itself, not a rewrite that keeps its content): a warning, once per path. Programs
    under ``ensio run`` read memory, every other program the disk."""
    if cur is not None or origin or keep or path in table.stale_warned \
            or path in table.ours or not os.path.lexists(path):
        return
    table.stale_warned.add(path)
    table.log.warning("%s: a real file exists at this transferred path: programs under "
                      "ensio run read the transferred file, other programs the stale real "
                      "one (reported once)", path)


def recycled_room(table: Table, e: Entry) -> int:
    """(table lock held) Bytes of recycled memory ``e``'s budget may keep beside its files
    (:mod:`.pool`): the budget bounds the files and the memory kept for the next ones
    together."""
    limit = e.budget if e.budget >= 0 else table.default_budget
    return limit - table.usage(e.budget_key)


def let_go(table: Table, e: Entry) -> None:
    """(table lock held) The memory of ``e``, which has left the table: kept by the pool
    for the next new file (recycled) when ``e`` is complete, no one else has it open and
    its budget has room for it beside its files; else released (readers that have it
    open keep it until they close)."""
    if table.pool is None or e.fd is None or e.state != "complete":
        e.release()
        return
    size, fd = e.size(), e.fd
    e.fd = None
    rw = exclusive_writable(fd)  # closes fd
    if rw is not None:
        table.pool.recycle(rw, size, e.budget_key, e.path, recycled_room(table, e))


def over_budget(table: Table, peer: Peer, path: str, conn: str, fallback: str) -> Reply:
    """The reply to a create that does not fit its connection's budget (after consumed
    files were released): the real file (``fallback: files``) or ENOSPC, logged."""
    name = conn.split(":", 1)[-1] if conn else \
        f"(default budget of the host: {table.default_budget >> 20} MiB)"
    if fallback == "files":
        table.log.warning("%s: connection %s is at its memory budget: %s writes the real "
                          "file (fallback: files)", path, name, peer)
        return Reply("FALLBACK")
    table.log.error("%s: connection %s is at its memory budget: open by %s fails with "
                    "ENOSPC (fallback: error)", path, name, peer)
    return Reply.err(errno.ENOSPC)
