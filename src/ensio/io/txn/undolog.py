"""The undo log of one I/O task: prior bytes appended before they are overwritten.

The record format of :mod:`ensio.io.txn.journal`'s ``task-<t>.undo`` files
(``LOG_MAGIC``, then records ``header(kind, path length, offset, length) |
path | data | crc32``; see that module for why the CRC of a fast record
covers its header only), the writer (:class:`UndoLog`) and the reader
(:func:`scan_log`, :func:`replay_log`). The journal directory protocol
(begin, commit, recover, roll back) stays in :mod:`ensio.io.txn.journal`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ... import faults
from ...durable import fsync_path
from ...errors import EnsioError
from .marker import read_marker

__all__ = ["COMMITTED_NAME", "JOURNAL_DIRNAME", "JournalError", "REC_FILE", "Record",
           "UndoLog", "is_committed", "replay_log", "scan_log"]

JOURNAL_DIRNAME = ".ensio-journal"
COMMITTED_NAME = "COMMITTED"
_LOG_MAGIC = b"ENSIOUL1"
_REC_RANGE, REC_FILE = b"ERNG", b"EBAK"
_REC_RANGE_FAST = b"ERNF"  # range record whose CRC covers header + path only (fsync=False)
_HEAD = struct.Struct("<4sIQQ")  # kind, path length, offset, data length
_CRC = struct.Struct("<I")
_MAX_PATH, _MAX_NAME, _CHUNK = 1 << 16, 4096, 1 << 24
_LINK_FALLBACK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}



class JournalError(EnsioError):
    """The journal cannot be used as asked (stale journal, unknown log format)."""


# --------------------------------------------------------------------------- helpers
def _close_target(fd: int, fsync: bool) -> None:
    if fd >= 0:
        try:
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)


def _write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """One ``writev``; finish piecewise only after a short write (>2 GiB, signals)."""
    done = os.writev(fd, parts)
    for part in map(memoryview, parts):
        if done >= part.nbytes:
            done -= part.nbytes
            continue
        part, done = part[done:], 0
        while part:
            part = part[os.write(fd, part):]


def _byte_view(prior: bytes | memoryview | np.ndarray) -> memoryview:
    """Flat unsigned-byte view of ``prior``, without a copy when it is contiguous."""
    if isinstance(prior, np.ndarray):
        return memoryview(np.ascontiguousarray(prior).reshape(-1).view(np.uint8))
    view = memoryview(prior)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def is_committed(jdir: Path) -> bool:
    """True if the journal ``jdir`` holds its (empty) commit marker ``COMMITTED``."""
    return read_marker(jdir / COMMITTED_NAME, what="commit marker", error=JournalError) is not None


class UndoLog:
    """Append-only undo log of one I/O task for one ensemble write.

    Use :meth:`create`; call :meth:`save` (or :meth:`save_file`) *before* each
    overwrite and :meth:`close` after the task's last data write.
    """

    def __init__(self, jdir: Path, task: int, fd: int, fsync: bool) -> None:
        self.dir, self.task, self._fd, self._fsync = jdir, task, fd, fsync
        self._paths: dict[object, bytes] = {}
        self._targets, self._dirs, self._nbak = set[str](), set[str](), 0

    @classmethod
    def create(cls, root: Path, task: int, *, fsync: bool) -> UndoLog:
        """Create ``root/.ensio-journal/task-<task>.undo`` (and the directory).

        Raises :class:`JournalError` if this task's log or a ``COMMITTED`` marker
        already exists: that is an earlier, unrecovered write, and mixing two
        writes in one journal would make recovery ambiguous. So one rank must
        run :func:`recover` before the tasks create their logs.
        """
        root = Path(os.path.abspath(root))
        jdir = root / JOURNAL_DIRNAME
        with contextlib.suppress(FileExistsError):
            os.mkdir(jdir)
        # every task passes this point once, whoever created the directory, so
        # the fault points of a run do not depend on which task raced first
        faults.point("journal-mkdir")
        if fsync:  # every task: its records must not outlive a lost directory entry
            fsync_path(root, directory=True)
        hint = f"run `ensio recover {root}`"
        if is_committed(jdir):
            raise JournalError(f"stale committed journal in {jdir}: {hint}")
        log = jdir / f"task-{task}.undo"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        try:
            fd = os.open(log, flags, 0o644)
        except FileExistsError:
            raise JournalError(f"{log} exists: an earlier write was interrupted; {hint}") from None
        _write_all(fd, [_LOG_MAGIC])
        faults.point("log-create")
        if fsync:
            os.fsync(fd)
            fsync_path(jdir, directory=True)
        return cls(jdir, task, fd, fsync)

    def _encode(self, path: Path | str) -> bytes:
        enc = self._paths.get(path)
        if enc is None:
            absolute = os.path.abspath(path)
            self._targets.add(absolute)
            enc = self._paths[path] = os.fsencode(absolute)
        return enc

    def _append(self, kind: bytes, path: bytes, offset: int, data: memoryview) -> None:
        if kind == _REC_RANGE and not self._fsync:
            kind = _REC_RANGE_FAST
        head = _HEAD.pack(kind, len(path), offset, data.nbytes) + path
        crc = zlib.crc32(head)
        crc = _CRC.pack(crc if kind == _REC_RANGE_FAST else zlib.crc32(data, crc))
        if faults.active():  # split the record so that kills can tear it
            _write_all(self._fd, [head])
            faults.point("record-head")
            _write_all(self._fd, [data])
            faults.point("record-data")
            _write_all(self._fd, [crc])
        else:
            _write_all(self._fd, [head, data, crc])
        faults.point("record-written")
        if self._fsync:
            os.fdatasync(self._fd)
            faults.point("record-fsync")

    def save(self, path: Path, offset: int, prior: bytes | memoryview | np.ndarray) -> None:
        """Record ``prior``, the bytes now at ``[offset, offset+len)`` of ``path``.

        Call it before pwriting there: once it returns the record is complete
        (and durable with ``fsync=True``), so recovery can undo the write.
        """
        if offset < 0:
            raise ValueError(f"negative offset {offset} for {path}")
        data = _byte_view(prior)
        if data.nbytes:
            self._append(_REC_RANGE, self._encode(path), offset, data)

    def save_file(self, path: Path) -> None:
        """Back up all of ``path`` before it is replaced by a rewritten copy.

        The backup is a hard link (free) when the journal is on the same file
        system, else a copy. The caller must then write a *new* file and
        ``os.replace`` it over ``path``, and never modify ``path`` in place
        afterwards (that would modify the hard-linked backup too).
        """
        enc = self._encode(path)
        src = os.fsdecode(enc)
        self._nbak += 1
        name = f"task-{self.task}.{self._nbak}.bak"
        dst = self.dir / name
        try:
            os.link(src, dst)
            faults.point("backup-link")
        except OSError as exc:
            if exc.errno not in _LINK_FALLBACK:
                raise
            tmp = dst.with_name(name + ".tmp")  # a torn copy must never look like a backup
            shutil.copyfile(src, tmp)
            if self._fsync:
                fsync_path(tmp)
            faults.point("backup-copy")
            os.replace(tmp, dst)
        if self._fsync:
            fsync_path(self.dir, directory=True)
        self._dirs.add(os.path.dirname(src))
        self._append(REC_FILE, enc, 0, memoryview(name.encode()))

    def close(self) -> None:
        """Finish this task's part; with ``fsync``, make its data writes durable.

        The commit marker may only exist once the new bytes are on disk, so each
        task fsyncs the files it journaled (and the directories of replaced
        files) here, before the barrier that precedes :func:`commit`.
        """
        if self._fd < 0:
            return
        try:
            if self._fsync:
                for target in sorted(self._targets):
                    with contextlib.suppress(FileNotFoundError):
                        fsync_path(target)
                for d in sorted(self._dirs):
                    fsync_path(d, directory=True)
                faults.point("close-fsync")
        finally:
            os.close(self._fd)
            self._fd = -1

    def abandon(self) -> None:
        """Drop the log as a crash would: close its descriptor, nothing made durable.

        For crash simulations in one process (the kernel closes the files of a
        killed process; no :meth:`close` step runs).
        """
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> UndoLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Record(NamedTuple):
    kind: bytes
    path: str
    offset: int
    length: int
    data_pos: int  # where the data starts in the log file
    name: str = ""  # backup file name (EBAK records)


def scan_log(log: Path) -> list[Record]:
    """Valid records of one log, in order; stops at the first torn/corrupt one."""
    records: list[Record] = []
    with open(log, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        magic = f.read(len(_LOG_MAGIC))  # shorter: killed while creating, no records
        if magic != _LOG_MAGIC and len(magic) == len(_LOG_MAGIC):
            raise JournalError(f"{log}: not an ensio undo log (or an unknown version)")
        pos = len(magic)
        while pos + _HEAD.size <= size:
            head = f.read(_HEAD.size)
            kind, plen, offset, length = _HEAD.unpack(head)
            end = pos + _HEAD.size + plen + length + _CRC.size
            if (kind not in (_REC_RANGE, _REC_RANGE_FAST, REC_FILE) or plen > _MAX_PATH
                    or end > size
                    or (kind == REC_FILE and length > _MAX_NAME)):
                break
            path = f.read(plen)
            crc, name = zlib.crc32(path, zlib.crc32(head)), b""
            if kind == _REC_RANGE_FAST:
                f.seek(length, os.SEEK_CUR)
                kind, length_to_check = _REC_RANGE, 0
            else:
                length_to_check = length
            for left in range(length_to_check, 0, -_CHUNK):
                chunk = f.read(min(left, _CHUNK))
                crc = zlib.crc32(chunk, crc)
                name = chunk if kind == REC_FILE else b""
            if f.read(_CRC.size) != _CRC.pack(crc):
                break
            records.append(Record(kind, os.fsdecode(path), offset, length,
                                   pos + _HEAD.size + plen, os.fsdecode(name)))
            pos = end
    return records


def replay_log(log: Path, records: list[Record], fsync: bool,
            missing: set[str]) -> tuple[set[str], int, int]:
    """Write back the prior bytes of one log's range records, newest first.

    Newest first makes a range journaled twice end at its oldest bytes. Range
    records that follow a backup of the same file in this log targeted the
    rewritten copy, which restoring the backup discarded: skip them. Writing
    prior bytes is idempotent, so a crash in here is harmless.
    """
    backed, todo = set[str](), list[Record]()
    for rec in records:
        if rec.kind == REC_FILE:
            backed.add(rec.path)
        elif rec.path not in backed:
            todo.append(rec)
    touched: set[str] = set()
    nranges = nbytes = 0
    lfd, path, fd = os.open(log, os.O_RDONLY), "", -1
    try:
        for rec in reversed(todo):  # grouped by file: one open target at a time
            if rec.path != path:
                _close_target(fd, fsync)
                path, fd = rec.path, -1
                try:
                    fd = os.open(path, os.O_WRONLY)
                except FileNotFoundError:
                    missing.add(path)
            if fd < 0:
                continue
            for pos in range(0, rec.length, _CHUNK):
                chunk = os.pread(lfd, min(rec.length - pos, _CHUNK), rec.data_pos + pos)
                os.pwrite(fd, chunk, rec.offset + pos)
            faults.point("restore-range")
            touched.add(path)
            nranges += 1
            nbytes += rec.length
    finally:
        _close_target(fd, fsync)
        os.close(lfd)
    return touched, nranges, nbytes
