"""Verified, atomic, idempotent file copies in two phases (prepare all, then rename all).

The node-local copies of ``ensio stage``, the backup and the restore from a
backup copy whole files between
the global file system and node-local disks. Each copy is written to a hidden
temporary beside its destination (:func:`ensio.durable.temporary_name`),
flushed, checked (size; the source unchanged while it was read; a sha256
when asked for or expected) and only then renamed over the destination. The
two phases (:class:`CopySet`, a :class:`~ensio.io.txn.transaction.Transaction`)
let a collective caller prepare every copy on every node, agree that all
succeeded, and only then rename: a bad file anywhere leaves every
destination untouched (the temporaries are removed).

A copy whose destination already has the source's size and modification time
(the time is copied with the data) — or, with ``checksum``, the same sha256 —
is skipped, so running ``ensio stage`` twice copies nothing the second time.

Standard library only (the backup's detached worker imports it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import faults
from ...durable import copy_identity, fsync_path, temporary_name, temporary_of
from ...errors import InputError
from ..txn.transaction import RecoveryReport, Transaction

__all__ = ["Copy", "CopySet", "Prepared", "file_digest", "prepare"]

CHUNK = 4 << 20


def file_digest(path: str | Path) -> str:
    """The sha256 of a file's bytes, hex."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


@dataclass(frozen=True)
class Copy:
    """One copy to make; ``digest`` is the sha256 the source must have (a restore)."""

    src: Path
    dst: Path
    digest: str | None = None


@dataclass
class Prepared:
    """A copy written to ``tmp`` (None when skipped: the destination was already right)."""

    copy: Copy
    tmp: Path | None
    size: int
    digest: str | None


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _up_to_date(c: Copy, st: os.stat_result, checksum: bool) -> str | None:
    """The destination's digest ("" without checksums) if it already holds the source."""
    try:
        dst = os.stat(c.dst)
    except FileNotFoundError:
        return None
    if dst.st_size != st.st_size:
        return None
    if c.digest is not None or checksum:
        have = file_digest(c.dst)
        want = c.digest if c.digest is not None else file_digest(c.src)
        return have if have == want else None
    return "" if dst.st_mtime_ns == st.st_mtime_ns else None


def _stream(src: Path, tmp: Path, hashing: bool) -> tuple[int, str | None]:
    """Copy ``src`` into the new file ``tmp``; its size and (``hashing``) sha256."""
    h = hashlib.sha256() if hashing else None
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    size = 0
    with open(src, "rb", buffering=0) as fin:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            while n := fin.readinto(buf):
                if h is not None:
                    h.update(view[:n])
                out = view[:n]
                while out:
                    out = out[os.write(fd, out):]
                size += n
        finally:
            os.close(fd)
    return size, (h.hexdigest() if h is not None else None)


def prepare(c: Copy, *, checksum: bool = False, fsync: bool = True, label: str = "copy",
            hashing: bool = False) -> Prepared:
    """Write ``c.src`` to a temporary beside ``c.dst`` and check it (nothing replaced yet).

    ``checksum`` compares sha256 of source and destination for the skip test
    and reads the written copy back to compare it with the source's digest.
    Raises :class:`InputError` naming the file when the source changes while
    it is read, the sizes differ, or the source's digest is not ``c.digest``.
    ``hashing`` computes the digest while copying (:attr:`Prepared.digest`)
    without the read-back.
    """
    st = os.stat(c.src)
    have = _up_to_date(c, st, checksum)
    if have is not None:  # an earlier copy (e.g. of a killed run) is complete
        return Prepared(c, None, st.st_size, have or (file_digest(c.dst) if hashing else None))
    tmp = temporary_name(c.dst)
    try:
        size, digest = _stream(c.src, tmp, checksum or hashing or c.digest is not None)
        faults.point(f"{label}-written")
        after = os.stat(c.src)
        if _identity(after) != _identity(st) or size != st.st_size:
            raise InputError(f"{c.src}: changed while it was copied; copy not made")
        if c.digest is not None and digest != c.digest:
            raise InputError(f"{c.src}: sha256 {digest} is not the {c.digest} recorded for it")
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.chmod(tmp, st.st_mode & 0o7777)
        copy_identity(c.dst, tmp)
        if fsync:
            fsync_path(tmp)
            faults.point(f"{label}-synced")
        written = os.stat(tmp).st_size
        if written != size:
            raise InputError(f"{c.dst}: copy has {written} bytes, {c.src} has {size}")
        if checksum and file_digest(tmp) != digest:
            raise InputError(f"{c.dst}: copy reads back with another sha256 than {c.src}")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Prepared(c, tmp, size, digest)


class CopySet(Transaction):
    """Verified copies as one :class:`~ensio.io.txn.transaction.Transaction`.

    Staged: every copy is written to a temporary beside its destination
    (:meth:`prepare`, ``threads`` at a time: a copy waits on the disks, the
    GIL is released, and a node has several); committed: the temporaries
    are renamed over the destinations and the directories flushed. There
    is no marker: each rename is its own commit point, so a collective
    caller agrees that every node prepared before any node commits
    (:func:`ensio.io.node.placenode.copy_on_nodes`). Aborted: the
    temporaries are removed, every destination untouched.
    """

    def __init__(self, copies: Sequence[Copy], *, threads: int = 4, checksum: bool = False,
                 fsync: bool = True, label: str = "copy", hashing: bool = False,
                 sync_dirs: bool | None = None) -> None:
        self.copies, self.threads, self.checksum = list(copies), threads, checksum
        self.fsync, self.label, self.hashing = fsync, label, hashing
        # the commit flushes the directories (default: with fsync); off when the
        # caller flushes a whole tree once (the backup)
        self.sync_dirs = fsync if sync_dirs is None else sync_dirs
        self.prepared: list[Prepared] = []

    def begin(self) -> None:
        """Nothing to publish: a temporary is recognised by its name alone."""

    def stage(self, target: str | Path) -> Path:
        """The temporary the copy to ``target`` was written to (``target`` if skipped)."""
        for p in self.prepared:
            if p.copy.dst == Path(target):
                return p.tmp if p.tmp is not None else p.copy.dst
        raise KeyError(f"{target}: not a prepared copy")

    def prepare(self) -> list[Prepared]:
        """:func:`prepare` every copy; all or none.

        If any copy fails, the temporaries of all others are removed and the
        first failure (in the order of the copies) is raised.
        """
        if not self.copies:
            return []
        with ThreadPoolExecutor(max_workers=max(1, min(self.threads, len(self.copies)))) as pool:
            futures = [pool.submit(prepare, c, checksum=self.checksum, fsync=self.fsync,
                                   label=self.label, hashing=self.hashing) for c in self.copies]
            error = None
            for fut in futures:
                try:
                    self.prepared.append(fut.result())
                except BaseException as exc:  # noqa: BLE001 -- re-raised after the cleanup
                    error = error or exc
        if error is not None:
            self.abort()
            raise error
        return self.prepared

    def commit(self) -> int:
        """Rename every prepared copy into place; flush the directories. Returns how many moved."""
        dirs, moved = set[Path](), 0
        for p in self.prepared:
            if p.tmp is None:
                continue
            os.replace(p.tmp, p.copy.dst)
            faults.point(f"{self.label}-renamed")
            dirs.add(p.copy.dst.parent)
            moved += 1
        if self.sync_dirs:
            for d in sorted(dirs):
                fsync_path(d, directory=True)
        return moved

    def abort(self) -> None:
        """Remove the temporaries of prepared copies (their destinations stay untouched)."""
        for p in self.prepared:
            if p.tmp is not None:
                p.tmp.unlink(missing_ok=True)

    @classmethod
    def recover(cls, directory: Path, **options: Any) -> RecoveryReport:
        """Remove the temporaries a killed copy left beside the files of ``directory``
        (``options``: ``names``, the destinations' names to look for; default all).

        A destination is always the old or the new file (a rename is atomic), so
        there is nothing to roll forward; only call it when no copy runs there.
        """
        names = options.get("names")
        removed = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(directory):
                found = temporary_of(entry.name)
                if found is not None and found[1] == "tmp" and (names is None
                                                                or found[0] in names):
                    Path(entry.path).unlink(missing_ok=True)
                    removed += 1
        return RecoveryReport("rolled_back" if removed else "clean", staged=removed)
