"""The staging daemon's held files: states, versions, budgets and waiting consumers.

One :class:`Table` per daemon; every method is one request of :mod:`.protocol`
(the daemon's client threads call them concurrently). A file is held as the
daemon's own descriptor of the producer's memfd, so it outlives the producer.

States of a held file (:class:`Entry`)::

    writing ──COMPLETE──► complete   (sealed: its bytes never change again)
       │                     │
       └─producer's socket───┴─► failed (memory released; consumers get EIO)
         closed first

A new ``CREATE`` of a held path makes a new version: the old one leaves the table at
once (readers that have it open keep their descriptors, and sealed bytes), and
consumers then wait for the new one. ``spilling`` is a complete file on its way to
the real path (budget exceeded with ``fallback: files``); consumers wait for it too
and then read the real file.

A file arriving from another host gets a progress map (:mod:`.progress`) once its
final size is known: an open with ``partial`` (``serve_partial``) then returns at once
with the memory and a descriptor of the map, even while the file is ``writing``.

Every blocking wait has a deadline; nothing here sleeps.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import queue
import threading
import time

from . import materialize
from .budget import (
    default_budget_bytes,
    let_go,
    newer_on_disk,
    over_budget,
    recycled_room,
    release_consumed,
    warn_stale,
)
from .entries import Entry, Peer, Reply
from .pool import MemfdPool, supply_memfd
from .progress import Progress

__all__ = ["Entry", "Peer", "Reply", "Table"]


class Table:
    """The held files of one daemon, guarded by one lock (``cond``)."""

    def __init__(self, log: logging.Logger, pool: MemfdPool | None = None,
                 default_budget: int | None = None) -> None:
        self.log = log
        self.pool = pool
        #: the shared budget of connections without ``memory_mb`` (:mod:`.budget`)
        self.default_budget = default_budget_bytes() if default_budget is None \
            else default_budget
        self.stale_warned: set[str] = set()    # real files shadowed, reported once
        self.ours: set[str] = set()            # real paths this daemon wrote itself
        self.cond = threading.Condition()
        self.entries: dict[str, Entry] = {}
        self._ids = itertools.count(1)
        self._by_id: dict[int, Entry] = {}
        self.persist_queue: queue.Queue[Entry | None] = queue.Queue()

    # -- producers ---------------------------------------------------------------------

    def create(self, peer: Peer, path: str, memfd: int | None, *, conn: str, budget: int,
               fallback: str, persist: bool, mode: int, excl: bool, keep: bool,
               exist: bool = False, origin: str = "",
               policy: tuple[str, frozenset[str]] = ("until-unlinked", frozenset())
               ) -> Reply:
        """Register ``memfd`` as the new version of ``path`` being written by ``peer``.

        ``memfd`` None: the daemon supplies the memory, pre-faulted from the pool when
        it has some (:mod:`.pool`), and an ``OK`` reply carries a descriptor of it for
        the producer. ``exist``: the open had no ``O_CREAT``, so the file must exist
        (held or on disk). The caller keeps ownership of ``memfd`` unless the reply is
        ``OK``. ``budget`` -1: the host's default budget (:mod:`.budget`), except for a
        copy from another host (``origin``: budgets apply on the producer's host).
        ``policy``: the connection's ``keep`` and its ``to`` components.
        """
        key = conn
        if budget < 0 and not origin:
            budget, key = self.default_budget, ""
        with self.cond:
            cur = self.entries.get(path)
            if excl and ((cur is not None and cur.state != "failed") or os.path.lexists(path)):
                return Reply.err(errno.EEXIST)
            if exist and cur is None and not os.path.exists(path):
                return Reply.err(errno.ENOENT)
            if keep and cur is not None and cur.state == "failed":
                return Reply.err(errno.EIO)
            if cur is not None and cur.state in ("writing", "spilling"):
                self.log.warning("%s: %s opened it for writing while %s still writes it: refused "
                                 "(EBUSY)", path, peer, cur.writer or cur.component)
                return Reply.err(errno.EBUSY)
            if budget >= 0 and self.usage(key, exclude=cur) >= budget and \
                    release_consumed(self, key, budget - 1, path, skip=cur, uncounted=cur):
                return over_budget(self, peer, path, key, fallback)
            warn_stale(self, path, cur, origin, keep)
            source = os.dup(cur.fd) if keep and cur is not None and cur.fd is not None else None
            mode = self._existing_mode(path, cur, mode)
        supplied = memfd is None
        came_from: str | None = None
        if supplied and keep:  # else below: the old version's memory may serve the new one
            memfd, came_from = supply_memfd(self.pool, path, key)
        try:
            if keep:
                materialize.copy_current(path, source, memfd)
                os.lseek(memfd, 0, os.SEEK_SET)  # the offset is the producer's (one description)
        except OSError as exc:
            self.log.warning("%s: cannot copy the current content for %s: %s", path, peer,
                             exc.strerror)
            if supplied:
                os.close(memfd)
            return Reply.err(exc.errno or errno.EIO)
        finally:
            if source is not None:
                os.close(source)
        with self.cond:
            self._drop(path)  # the old version: its memory to the pool if no one has it open
            if memfd is None:
                memfd, came_from = supply_memfd(self.pool, path, key)
            if came_from:
                self.log.info("%s: written into the recycled memory of %s", path, came_from)
            entry = Entry(id=next(self._ids), path=path, fd=memfd, conn=conn,
                          component=peer.component, writer=peer, mode=mode, budget=budget,
                          fallback=fallback, persist=persist, pooled=came_from is not None,
                          origin=origin, budget_key=key, keep=policy[0], consumers=policy[1])
            self.entries[path] = entry
            self._by_id[entry.id] = entry
            self._note_writers()
            self.cond.notify_all()
        return Reply("OK", {"id": entry.id, "mode": f"0{mode:o}"},
                     os.dup(memfd) if supplied else None)

    @staticmethod
    def _existing_mode(path: str, cur: Entry | None, mode: int) -> int:
        """An open of an existing file keeps its permission bits (``mode`` is for creating)."""
        if cur is not None and cur.state != "failed":
            return cur.mode
        try:
            return os.stat(path).st_mode & 0o7777
        except OSError:
            return mode

    def usage(self, key: str, exclude: Entry | None = None) -> int:
        return sum(e.size() for e in self.entries.values()
                   if e.budget_key == key and e is not exclude)

    def complete(self, peer: Peer, entry_id: int) -> Reply:
        """The producer closed the file: seal it, check the budget, wake the consumers."""
        with self.cond:
            e = self._by_id.get(entry_id)
            if e is None or self.entries.get(e.path) is not e or e.state != "writing":
                return Reply("OK")  # unlinked or replaced meanwhile: nothing to hold
            if e.writer is None or e.writer.id != peer.id:
                return Reply.err(errno.EPERM)
            try:
                e.seal()
            except OSError as exc:
                self._fail(e, f"cannot seal it ({exc.strerror})")
                return Reply.err(errno.EIO)
            e.writer = None
            if self.pool is not None:
                self.pool.learn(e.size())
                self.pool.trim_recycled(e.budget_key, recycled_room(self, e))
            over = e.budget >= 0 and self.usage(e.budget_key) > e.budget and \
                release_consumed(self, e.budget_key, e.budget, e.path, skip=e)
            if over and e.fallback == "error":
                # Kept: failing the close would lose a complete file (and netCDF 4.9
                # crashes on a failed close); the connection's next open fails instead.
                self.log.warning("%s: written by %s, takes connection %s past its memory "
                                 "budget: kept; new files fail with ENOSPC until memory is "
                                 "freed", e.path, peer, e.conn.split(":", 1)[-1])
                over = False
            e.state = "spilling" if over else "complete"
            self._note_writers()
            if e.persist and not over:
                e.persist_state = "pending"
                self.persist_queue.put(e)
            self.cond.notify_all()
        if over:
            self._spill(e, f"over the memory budget of connection {e.conn.split(':', 1)[-1]}"
                        if e.budget_key else "over the host's default transfer budget")
        return Reply("OK")

    def _spill(self, e: Entry, why: str) -> None:
        """``fallback: files`` (over the budget, daemon exit): the file goes to its real path."""
        assert e.fd is not None
        try:
            tmp = materialize.write_temporary(e.fd, e.path, e.mode, fsync=False)
        except OSError as exc:
            with self.cond:
                self._fail(e, f"{why}, and cannot be written to disk ({exc.strerror})")
            return
        with self.cond:
            if self.entries.get(e.path) is e:
                materialize.publish(tmp, e.path, fsync=False)
                self.ours.add(e.path)
                self.log.warning("%s: %s: written to the real path (fallback: files)", e.path,
                                 why)
                self._drop(e.path)
            else:
                tmp.unlink(missing_ok=True)
            self.cond.notify_all()

    def _fail(self, e: Entry, why: str) -> None:
        """Mark ``e`` failed (lock held): its memory is released, consumers get EIO."""
        e.state = "failed"
        e.why = why
        e.failed_at = time.time()
        e.writer = None
        e.release()
        self._note_writers()
        self.log.error("%s: %s: consumers get EIO (component %s)", e.path, why, e.component)
        self.cond.notify_all()

    def peer_gone(self, peer: Peer) -> None:
        """A connection closed: files it was still writing are failed (the producer died)."""
        with self.cond:
            for e in list(self.entries.values()):
                if e.state == "writing" and e.writer is not None and e.writer.id == peer.id:
                    self._fail(e, f"the producer {peer} died before closing it")

    # -- consumers ---------------------------------------------------------------------

    def open(self, peer: Peer, path: str, wait_s: float | None, defer: bool = False,
             partial: bool = False) -> Reply:
        """A read-only descriptor of ``path`` (``wait_s`` None: STAT, never wait).

        ``defer``: answer ``BUSY`` at once instead of waiting (the interposer then waits on
        a connection of its own, so the process's other threads are not held up).
        ``partial`` (``serve_partial``): a file still arriving from another host whose
        final size is known is answered at once, ``partial=1`` with a second descriptor,
        of its progress map; before its size is known the open waits as any other. The
        size is known only after the producer's close: before it, a file's bytes may
        still change, and a netCDF-4/HDF5 file is not readable anyway (its superblock
        and metadata are final only at ``nc_close``). A file held here because a local
        producer writes it is never partial: it is complete at its close.
        """
        deadline = None if wait_s is None else time.monotonic() + wait_s
        with self.cond:
            while True:
                e = self.entries.get(path)
                if e is None:
                    return Reply("ABSENT")
                if e.state == "failed" and e.origin and newer_on_disk(path, e.failed_at):
                    self._drop(path)  # written to disk after its host was lost: that file
                    return Reply("ABSENT")
                if e.state == "failed":
                    if wait_s is not None:
                        self.log.error("%s: open by %s fails with EIO: %s (component %s)", path,
                                       peer, e.why, e.component)
                    return Reply.err(errno.EIO)
                mine = e.writer is not None and e.writer.id == peer.id
                if e.state == "complete" or wait_s is None or mine:
                    assert e.fd is not None
                    if wait_s is not None and not mine and peer.component in e.consumers:
                        e.readers.add((peer.pid, peer.component))  # consumed at its exit
                    fd = os.open(f"/proc/self/fd/{e.fd}", os.O_RDONLY | os.O_CLOEXEC)
                    return Reply("OK", {"mode": f"0{e.mode:o}"}, fd)
                if partial and e.state == "writing" and e.progress is not None:
                    return self._partial(e)
                if defer:
                    return Reply("BUSY")
                left = deadline - time.monotonic() if deadline is not None else 0.0
                if left <= 0:
                    self.log.error("%s: open by %s timed out (ETIMEDOUT) after %.0f s: still "
                                   "being written by %s", path, peer, wait_s, e.writer or "?")
                    return Reply.err(errno.ETIMEDOUT)
                e.waiters += 1
                try:
                    self.cond.wait(left)
                finally:
                    e.waiters -= 1

    @staticmethod
    def _partial(e: Entry) -> Reply:
        """(lock held) The memory at its final size and the progress map, both read-only."""
        assert e.fd is not None and e.progress is not None
        fd = os.open(f"/proc/self/fd/{e.fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            progress = e.progress.reader_fd()
        except OSError:
            os.close(fd)
            raise
        return Reply("OK", {"mode": f"0{e.mode:o}", "partial": 1}, fd, progress)

    def set_progress(self, entry_id: int, progress: Progress | None) -> None:
        """Entry ``entry_id`` now has its final size and a progress map (None: no longer)."""
        with self.cond:
            e = self._by_id.get(entry_id)
            if e is not None:
                e.progress = progress
                self.cond.notify_all()  # partial opens waiting for the size

    # -- names -------------------------------------------------------------------------

    def chmod(self, path: str, mode: int) -> Reply:
        """New permission bits of a held file (what ``stat`` answers and the disk gets)."""
        with self.cond:
            e = self.entries.get(path)
            if e is None:
                return Reply("ABSENT")
            if e.state == "failed":
                return Reply.err(errno.EIO)
            e.mode = mode & 0o7777
            return Reply("OK")

    def unlink(self, path: str) -> Reply:
        """Forget ``path``; say whether a persisted copy is on disk."""
        with self.cond:
            e = self.entries.get(path)
            if e is None:
                return Reply("ABSENT")
            ondisk = e.persist_state == "done"
            self._drop(path)
            self.cond.notify_all()
            return Reply("OK", {"ondisk": int(ondisk)})

    def rename(self, old: str, new: str, export: bool, copy: bool = False,
               excl: bool = False) -> Reply:
        """Move a held file to another transferred name, or write it out (``export``).

        ``copy``: another host's rename of its file (:mod:`.names`): our copy moves in
        whatever state it is (a failed one stays failed under the new name). ``excl``:
        ``RENAME_NOREPLACE``, EEXIST if ``new`` is held or on disk.
        """
        with self.cond:
            e = self.entries.get(old)
            held = self.entries.get(new)
            if excl and e is not None and ((held is not None and held.state != "failed")
                                           or os.path.lexists(new)):
                return Reply.err(errno.EEXIST)
            if e is None:
                if not export:
                    self._drop(new)
                    self.cond.notify_all()
                return Reply("ABSENT")
            if e.state != "complete" and not copy:
                return Reply.err(errno.EBUSY)
            if not export:
                self._drop(new)
                del self.entries[old]
                if e.persist_state == "done":
                    try:
                        os.replace(old, new)
                    except OSError:
                        e.persist_state = ""
                e.path = new
                self.entries[new] = e
                self.cond.notify_all()
                return Reply("OK")
            assert e.fd is not None
            source = os.dup(e.fd)
        try:
            tmp = materialize.write_temporary(source, new, e.mode, fsync=False)
        except OSError as exc:
            return Reply.err(exc.errno or errno.EIO)
        finally:
            os.close(source)
        with self.cond:
            materialize.publish(tmp, new, fsync=False)
            if self.entries.get(old) is e:
                self._drop(old)
            if e.persist_state == "done":  # its write-behind copy moves too, as on disk
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(old)
            self.cond.notify_all()
        return Reply("OK")

    def lose_origin(self, origin: str, why: str, drop: bool = False,
                    everything: bool = False) -> int:
        """The copies from ``origin`` still arriving are lost (new opens get EIO), with
        ``everything`` the complete ones too, or with ``drop`` every copy is forgotten
        (new opens see the real files); readers that have one open keep their bytes.
        How many copies that was."""
        lost = ("failed",) if everything else ("failed", "complete")
        with self.cond:
            gone = [e for e in self.entries.values() if e.origin == origin and
                    (drop or e.state not in lost)]
            for e in gone:
                if drop:
                    self._drop(e.path)
                else:
                    self._fail(e, why)
            self.cond.notify_all()
            return len(gone)

    # -- consumption (keep: until-consumed, budget.py) ----------------------------------------

    def consumer_exited(self, pid: int) -> None:
        """Process ``pid`` exited with status 0: the files it opened are consumed for its
        component (released when their budget needs the memory, :mod:`.budget`)."""
        with self.cond:
            for e in self.entries.values():
                mine = {r for r in e.readers if r[0] == pid}
                e.readers -= mine
                e.consumed.update(component for _, component in mine)

    def drop(self, path: str) -> Reply:
        with self.cond:
            self._drop(path)
            self.cond.notify_all()
        return Reply("OK")

    def _drop(self, path: str) -> None:
        """Remove ``path``'s entry (lock held)."""
        e = self.entries.pop(path, None)
        if e is not None:
            self._by_id.pop(e.id, None)
            let_go(self, e)  # its memory: to the pool for the next file, or released
            self._note_writers()

    def _note_writers(self) -> None:
        """(lock held) Tell the pool how many files are being written: it fills only in
        the gaps between them."""
        if self.pool is not None:
            self.pool.set_writing(sum(e.state == "writing" for e in self.entries.values()))

    # -- cross-host streams (network.py) ----------------------------------------------------

    def dup_fd(self, entry_id: int) -> int | None:
        """A descriptor of the memory of entry ``entry_id`` (the caller closes it)."""
        with self.cond:
            e = self._by_id.get(entry_id)
            return None if e is None or e.fd is None else os.dup(e.fd)

    def is_current(self, entry_id: int) -> bool:
        """Whether ``entry_id`` is still the held version of its path (not unlinked or
        replaced)."""
        with self.cond:
            e = self._by_id.get(entry_id)
            return e is not None and self.entries.get(e.path) is e

    def component_of(self, path: str) -> str:
        """The component that wrote the held ``path`` ("?" if none is held)."""
        with self.cond:
            e = self.entries.get(path)
            return e.component if e is not None else "?"

    def add_sent(self, entry_id: int, sent: int, after_close: int) -> None:
        """Count bytes streamed for ``entry_id`` (``ensio transfer status``)."""
        with self.cond:
            e = self._by_id.get(entry_id)
            if e is not None:
                e.sent += sent
                e.after_close += after_close

    # -- the whole table -------------------------------------------------------------------

    def status(self) -> list[dict[str, object]]:
        with self.cond:
            return [{"path": e.path, "size": e.size(), "state": e.state,
                     "component": e.component, "conn": e.conn.split(":", 1)[-1],
                     "persist": e.persist_state or ("no" if not e.persist else ""),
                     "consumed": ",".join(sorted(e.consumed)),
                     "waiters": e.waiters, "sent": e.sent, "after_close": e.after_close}
                    for e in sorted(self.entries.values(), key=lambda x: x.path)]

    def __len__(self) -> int:
        with self.cond:
            return len(self.entries)

    def shut(self) -> None:
        """Daemon exit: complete files of ``fallback: files`` that are not on disk yet and
        that some declared consumer has not consumed are written to their real paths;
        consumed ones are released; every other held file is logged as lost."""
        self.persist_queue.put(None)
        with self.cond:
            held = list(self.entries.values())
        for e in held:
            consumed = bool(e.consumers) and e.consumers <= e.consumed
            if e.state == "complete" and e.persist_state != "done" and consumed:
                self.log.info("%s: consumed by %s: released at daemon exit, not written",
                              e.path, ", ".join(sorted(e.consumers)))
            elif e.state == "complete" and e.persist_state != "done" and e.fallback == "files":
                e.state = "spilling"
                self._spill(e, "held at daemon exit")
            elif e.persist_state != "done":
                self.log.warning("%s: lost at daemon exit (state %s, component %s)",
                                 e.path, e.state, e.component)
        with self.cond:
            for path in list(self.entries):
                self._drop(path)
            self.cond.notify_all()  # consumers still waiting find nothing: real files
