"""Undo journal that makes in-place analysis writes all-or-nothing.

N_io tasks overwrite state bytes *in place* in N_e member files; a crash half-way
would leave a silent mix of forecast and analysis. So before a task overwrites a
byte range it appends the *prior* bytes to its own undo log (tasks never
coordinate), and only after every task has finished one rank marks the journal
``COMMITTED`` and deletes it. :func:`recover` turns any crash into all files
entirely prior (no marker) or entirely new (marker).

``<root>/.ensio-journal/`` holds ``task-<t>.undo`` (``_LOG_MAGIC``, then records
``header(kind, path length, offset, length) | path | data | crc32``: a record
torn by a kill fails its CRC and is ignored -- its data write had not started;
without ``fsync`` the CRC covers header and path only (kind ``ERNF``): a process
kill cannot garble what reached the page cache, only cut it short, which the
length and the trailer written last detect, and a CRC over gigabytes of prior
bytes would cost a third of the journal's time),
``task-<t>.<n>.bak`` whole-file backups (hard links when possible) and
``COMMITTED``. The directory is renamed to a trash name before it is deleted,
so a half-deleted journal can never be mistaken for an incomplete one.

A *run transaction* (:mod:`ensio.io.commit`) extends the journal to the
products of a run: :func:`begin` creates the directory with ``TRANSACTION``
(the owner) and ``STAGED`` (files written beside their targets, renamed at
the commit; :mod:`ensio.io.staging`). The ensemble writer's :func:`commit`
then leaves the commit to the transaction (``commit(..., transaction=True)``),
which renames the staged files after the marker; recovery rolls such a
journal back (members restored, staged files deleted) or forward (staged
files renamed into place). Recovery runs under the ensemble lock
(:mod:`ensio.io.lock`): taken for its duration unless this process holds it.

Kill tests: every survivable step calls :func:`ensio.faults.point`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import struct
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np

from .. import faults
from ..durable import fsync_path
from ..errors import EnsioError
from . import staging
from .lock import EnsembleLock, command_line, held_by_me

__all__ = ["COMMITTED_NAME", "JOURNAL_DIRNAME", "JournalError", "RecoveryReport", "UndoLog",
           "abort", "begin", "commit", "journal_root", "recover"]

JOURNAL_DIRNAME = ".ensio-journal"
COMMITTED_NAME = "COMMITTED"
_TRASH_PREFIX = JOURNAL_DIRNAME + ".trash-"
_LOG_MAGIC = b"ENSIOUL1"
_REC_RANGE, _REC_FILE = b"ERNG", b"EBAK"
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


def journal_root(first_member: Path) -> Path:
    """The first member's absolute parent: one known place ``ensio recover DIR`` finds."""
    return Path(os.path.abspath(first_member)).parent


# --------------------------------------------------------------------------- writing
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
        if (jdir / COMMITTED_NAME).exists():
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
        self._append(_REC_FILE, enc, 0, memoryview(name.encode()))

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


def begin(root: Path, staged: Sequence[tuple[Path, Path]], *, fsync: bool) -> None:
    """Open a run transaction: the journal directory with its owner and staged files.

    ``staged`` lists (staged name, target) of every file the run will write
    beside its target and rename at the commit, *before* any of them exists.
    Raises :class:`JournalError` if a journal exists (recover first).
    """
    root = Path(os.path.abspath(root))
    try:
        staging.write_transaction(root / JOURNAL_DIRNAME, staged, fsync=fsync)
    except FileExistsError:
        raise JournalError(f"stale journal in {root / JOURNAL_DIRNAME}: "
                           f"run `ensio recover {root}`") from None


def commit(root: Path, *, fsync: bool, transaction: bool = False) -> int:
    """Declare the write complete and delete the journal (one rank, after all tasks).

    Creating ``COMMITTED`` is the single atomic commit point; staged files are
    then renamed into place and the directory is renamed away and removed. No
    journal: nothing was written, no-op. A transaction's journal is committed
    only by the transaction (``transaction=True``); the ensemble writer's call
    is then a no-op. Returns the number of staged files moved into place.
    """
    root = Path(os.path.abspath(root))
    jdir = root / JOURNAL_DIRNAME
    if not jdir.is_dir() or (staging.is_transaction(jdir) and not transaction):
        return 0
    with open(jdir / COMMITTED_NAME, "wb") as marker:
        faults.point("commit-marker")
        if fsync:
            os.fsync(marker.fileno())
    if fsync:
        fsync_path(jdir, directory=True)
        faults.point("commit-fsync")
    moved = staging.roll_forward(jdir, fsync=fsync)
    _remove_journal(root, jdir, fsync)
    return moved


# --------------------------------------------------------------------------- recovery
@dataclass(frozen=True)
class RecoveryReport:
    """What :func:`recover` found and did.

    Attributes
    ----------
    state : {"clean", "rolled_back", "committed", "open"}
        No journal / an incomplete write was undone / the write was complete
        (staged files moved into place) / the journal is this process's own
        open transaction (left alone).
    files : int
        Files whose prior content was restored (ranges or whole-file backups).
    ranges : int
        Undo records (byte ranges) written back.
    bytes : int
        Bytes written back (ranges plus sizes of restored whole-file backups).
    missing : tuple of str
        Journaled files that no longer exist, so could not be restored.
    staged : int
        Staged files renamed into place ("committed") or deleted ("rolled_back").
    """

    state: Literal["clean", "rolled_back", "committed", "open"]
    files: int = 0
    ranges: int = 0
    bytes: int = 0
    missing: tuple[str, ...] = ()
    staged: int = 0


class _Record(NamedTuple):
    kind: bytes
    path: str
    offset: int
    length: int
    data_pos: int  # where the data starts in the log file
    name: str = ""  # backup file name (EBAK records)


def _scan(log: Path) -> list[_Record]:
    """Valid records of one log, in order; stops at the first torn/corrupt one."""
    records: list[_Record] = []
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
            if (kind not in (_REC_RANGE, _REC_RANGE_FAST, _REC_FILE) or plen > _MAX_PATH
                    or end > size
                    or (kind == _REC_FILE and length > _MAX_NAME)):
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
                name = chunk if kind == _REC_FILE else b""
            if f.read(_CRC.size) != _CRC.pack(crc):
                break
            records.append(_Record(kind, os.fsdecode(path), offset, length,
                                   pos + _HEAD.size + plen, os.fsdecode(name)))
            pos = end
    return records


def _restore_backup(backup: Path, target: str, fsync: bool) -> bool:
    """Put ``backup`` back at ``target``; False if ``target`` was never replaced.

    Idempotent: a backup that was already moved back no longer exists.
    """
    if os.path.exists(target) and os.path.samefile(backup, target):
        os.unlink(backup)  # the caller crashed before replacing the file
        return False
    try:
        os.replace(backup, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.ensio-restore")
        shutil.copyfile(backup, tmp)
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, target)
        os.unlink(backup)
    faults.point("restore-backup")
    return True


def _replay(log: Path, records: list[_Record], fsync: bool,
            missing: set[str]) -> tuple[set[str], int, int]:
    """Write back the prior bytes of one log's range records, newest first.

    Newest first makes a range journaled twice end at its oldest bytes. Range
    records that follow a backup of the same file in this log targeted the
    rewritten copy, which restoring the backup discarded: skip them. Writing
    prior bytes is idempotent, so a crash in here is harmless.
    """
    backed, todo = set[str](), list[_Record]()
    for rec in records:
        if rec.kind == _REC_FILE:
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


def _remove_journal(root: Path, jdir: Path, fsync: bool) -> None:
    """Atomically retire ``jdir`` (rename), then delete it at leisure."""
    trash = root / f"{_TRASH_PREFIX}{uuid.uuid4().hex}"
    os.rename(jdir, trash)
    faults.point("journal-rename")
    if fsync:
        fsync_path(root, directory=True)
    shutil.rmtree(trash, ignore_errors=True)
    faults.point("journal-remove")


def recover(root: Path, *, fsync: bool = True, force: bool = False) -> RecoveryReport:
    """Bring the files under ``root`` to a consistent state after any crash.

    No journal: ``"clean"``. ``COMMITTED``: the analysis is complete; rename
    its staged files into place, delete the journal (``"committed"``). Else
    restore backups, write back every undo record, delete staged files, make
    that durable, and only then delete the journal (``"rolled_back"``): a
    crash during recovery leaves a journal from which it simply runs again.

    Runs under the ensemble lock (taken for the recovery unless this process
    holds it; :class:`~ensio.io.lock.LockError` if a live run holds it). The
    journal of this process's own open transaction is left alone
    (``"open"``) unless ``force`` (:func:`abort`).
    """
    root = Path(os.path.abspath(root))
    jdir = root / JOURNAL_DIRNAME
    if not jdir.is_dir():
        report = RecoveryReport("clean")
    elif staging.is_own(jdir) and not force:
        return RecoveryReport("open")
    elif held_by_me(root):
        report = _recover_locked(root, jdir, fsync)
    else:
        with EnsembleLock(root, f"journal recovery in {command_line()}"):
            report = _recover_locked(root, jdir, fsync)
    for trash in root.glob(_TRASH_PREFIX + "*"):  # deletions a crash interrupted
        shutil.rmtree(trash, ignore_errors=True)
    return report


def _recover_locked(root: Path, jdir: Path, fsync: bool) -> RecoveryReport:
    if not jdir.is_dir():  # recovered by the run whose lock we waited for
        return RecoveryReport("clean")
    if (jdir / COMMITTED_NAME).exists():
        moved = staging.roll_forward(jdir, fsync=fsync)
        _remove_journal(root, jdir, fsync)
        return RecoveryReport("committed", staged=moved)
    return _rollback(root, jdir, fsync)


def _rollback(root: Path, jdir: Path, fsync: bool) -> RecoveryReport:
    # Log order is irrelevant: different tasks journal disjoint byte ranges.
    scanned = [(log, _scan(log)) for log in sorted(jdir.glob("task-*.undo"))]
    files, dirs, missing = set[str](), set[str](), set[str]()
    nbytes = nranges = 0
    for _, records in scanned:  # backups first (newest first: the oldest wins), then
        for rec in reversed(records):  # the ranges journaled before them are replayed
            backup = jdir / rec.name
            if rec.kind != _REC_FILE or not backup.exists():
                continue  # a missing backup was restored by an interrupted recovery
            size = backup.stat().st_size
            if _restore_backup(backup, rec.path, fsync):
                files.add(rec.path)
                dirs.add(os.path.dirname(rec.path))
                nbytes += size
    for log, records in scanned:
        touched, n, b = _replay(log, records, fsync, missing)
        files |= touched
        nranges += n
        nbytes += b
    for _, records in scanned:  # temporaries of a library-path rewrite a kill left
        for path in {rec.path for rec in records if rec.kind == _REC_FILE}:
            staging.remove_temporaries(path)
    staged = staging.discard(jdir)
    if fsync:
        for d in sorted(dirs):
            fsync_path(d, directory=True)
    faults.point("recover-synced")
    _remove_journal(root, jdir, fsync)
    return RecoveryReport("rolled_back", len(files), nranges, nbytes,
                          tuple(sorted(missing - files)), staged)


def abort(root: Path, *, fsync: bool = True) -> RecoveryReport:
    """Roll back now, after a task failed mid-write (same rules as :func:`recover`).

    Call it from one rank once *all* tasks have stopped writing (a committed
    journal means the analysis is complete: it is kept). Unlike
    :func:`recover` it also rolls back this process's own open transaction.
    """
    return recover(root, fsync=fsync, force=True)
