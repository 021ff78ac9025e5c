"""Durable file updates: fsync by path and write-then-rename.

One home for every room that replaces a file atomically or needs it to
survive a power loss (the journal and the library-path rewrite of ``io/``,
the products, the to-do list, job files, staged outputs and sbatch scripts of
``workflow/``, the example models' restarts). Standard library only, so a
worker job's start-up imports nothing heavy for it.

Why one helper: a crash between "write the new file" and "rename it over the
old one" must leave the old or the new file and no stray temporary; every
hand-written copy of that sequence is a chance to forget the unlink, the
unique name (two writers in one directory), the directory fsync, or the
replaced file's identity: a replacement keeps the permission bits and owner
of the file it replaces, and a symbolic link stays a link (its target is
replaced).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import faults

__all__ = ["TEMPORARY_KINDS", "atomic_write", "copy_identity", "fsync_path", "replacing",
           "temporary_name", "temporary_of"]

#: Every temporary sibling ensio writes is ``.NAME.ensio-KIND[.TOKEN]``, beside ``NAME``
#: (same directory: the final rename is atomic), made by :func:`temporary_name` and
#: recognised by :func:`temporary_of`. ``tmp``: a write-then-rename in progress (token
#: ``PID.HEX``; the transfer interposer's C daemon spells the same name); ``staged``: a
#: run transaction's new file until its commit (io/txn/staging.py, token: the
#: transaction's); ``partial``: a member copy or shuffle product tile until its rename
#: (io/products, no token: a rerun reuses it). The spellings on disk are those of
#: earlier versions, so what an older run left is recognised and recovered alike.
TEMPORARY_KINDS = ("tmp", "staged", "partial")


def fsync_path(path: str | Path, *, directory: bool = False) -> None:
    """Flush ``path`` to stable storage.

    With ``directory=True`` ``path`` is a directory, and its entries (files
    created, renamed into or removed from it) become durable; a file's own
    fsync does not cover its name.
    """
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_name(path: str | Path, kind: str = "tmp", token: str | None = None) -> Path:
    """A hidden sibling of ``path`` of kind ``kind`` (:data:`TEMPORARY_KINDS`).

    Same directory, so the rename is atomic. ``tmp`` without a token is
    unique per process and call, so two writers (or a writer whose lock was
    broken) never mix their bytes in one temporary file.
    """
    if kind not in TEMPORARY_KINDS:
        raise ValueError(f"unknown temporary kind {kind!r} (one of {TEMPORARY_KINDS})")
    path = Path(path)
    if token is None and kind == "tmp":
        # os.urandom(4).hex() is secrets.token_hex(4) without importing secrets (hmac,
        # random) into every process that writes a file (start-up time, issue 24)
        token = f"{os.getpid()}.{os.urandom(4).hex()}"
    return path.with_name(f".{path.name}.ensio-{kind}" + (f".{token}" if token else ""))


def temporary_of(name: str) -> tuple[str, str, str] | None:
    """``(target name, kind, token)`` if ``name`` is one of ensio's temporaries, else None.

    The inverse of :func:`temporary_name` (``token`` "" when it has none); the
    one place that tells a temporary from a user's file, for every cleaner
    and recovery, whichever version of ensio left it.
    """
    if not name.startswith("."):
        return None
    for kind in TEMPORARY_KINDS:  # the last mark counts: a temporary of a temporary
        mark = f".ensio-{kind}"
        if name.endswith(mark):
            at, token = len(name) - len(mark), ""
        else:
            at = name.rfind(mark + ".")
            token = name[at + len(mark) + 1 :]
        if at > 1 and (token or name.endswith(mark)):
            return name[1:at], kind, token
    return None


def copy_identity(existing: str | Path, new: str | Path) -> None:
    """Give ``new`` the permission bits and owner/group of ``existing`` (if it exists).

    The owner is copied only where the kernel allows it (root, or the group of
    a file this user owns); otherwise ``new`` keeps this user's, as any write
    by this user would. Called on a temporary file before it replaces ``existing``.
    """
    try:
        st = os.stat(existing)
    except FileNotFoundError:
        return
    os.chmod(new, st.st_mode & 0o7777)
    own = os.stat(new)
    if (own.st_uid, own.st_gid) != (st.st_uid, st.st_gid):
        try:
            os.chown(new, st.st_uid, st.st_gid)
        except PermissionError:
            pass  # not root: the replacement is this user's file
        else:
            os.chmod(new, st.st_mode & 0o7777)  # chown clears set-id bits


@contextmanager
def replacing(path: str | Path, *, fsync: bool = False, label: str = "replace") -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path`` atomically.

    If the block raises, the temporary file is removed and ``path`` is
    untouched. If ``path`` is a symbolic link, the file it points to is
    replaced and the link stays; the new file gets the permission bits and
    owner of the file it replaces (:func:`copy_identity`). With ``fsync`` the
    new file and the directory entry are flushed (power-loss durability; a
    process kill needs neither). Fault points
    ``<label>-written``, ``-renamed`` (and ``-synced``, ``-dir-synced`` with
    ``fsync``) mark the survivable steps for crash tests.

    Parameters
    ----------
    path : path-like
        The file to replace (or create); its directory must exist.
    fsync : bool
        Flush the data before and the directory entry after the rename.
    label : str
        Prefix of the fault-point labels.
    """
    path = Path(os.path.realpath(path))
    tmp = temporary_name(path)
    try:
        yield tmp
        faults.point(f"{label}-written")
        copy_identity(path, tmp)
        if fsync:
            fsync_path(tmp)
            faults.point(f"{label}-synced")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    faults.point(f"{label}-renamed")
    if fsync:
        fsync_path(path.parent, directory=True)
        faults.point(f"{label}-dir-synced")


def atomic_write(
    path: str | Path, data: bytes | str, *, fsync: bool = True, label: str = "replace"
) -> None:
    """Write ``data`` to ``path`` so that a crash at any instant leaves the old or the new file.

    ``str`` is written as UTF-8. See :func:`replacing` for ``fsync`` and ``label``.
    """
    raw = data.encode() if isinstance(data, str) else data
    with replacing(path, fsync=fsync, label=label) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
