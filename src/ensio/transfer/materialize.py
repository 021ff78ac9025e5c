"""Write a memory file to its real path: persist (write-behind), spill (fallback), export.

Always through a temporary sibling and a rename (``durable.temporary_name``), so a
reader of the real path sees the old file or the whole new one, never a part, and a
crash leaves at most a ``.NAME.ensio-tmp.*`` file behind.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..durable import fsync_path, temporary_name

__all__ = ["copy_current", "copy_into", "publish", "write_temporary"]


def copy_current(path: str, source: int | None, memfd: int) -> None:
    """A rewrite that keeps the content (no ``O_TRUNC``): the new version starts as the
    held one (``source``), else as the real file at ``path`` (if there is one)."""
    if source is not None:
        copy_into(source, memfd)
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        copy_into(fd, memfd)
    finally:
        os.close(fd)


def copy_into(src_fd: int, dst_fd: int) -> int:
    """Copy all of ``src_fd`` (from offset 0) to ``dst_fd``'s current offset; bytes copied.

    ``sendfile`` moves the pages inside the kernel (memfd → file, file → memfd);
    ``src_fd``'s own offset is not used or changed.
    """
    size = os.fstat(src_fd).st_size
    offset = 0
    while offset < size:
        try:
            n = os.sendfile(dst_fd, src_fd, offset, size - offset)
        except OSError:
            n = _copy_chunk(src_fd, dst_fd, offset, size - offset)
        if n == 0:
            break  # the source shrank under us (only an unsealed file can)
        offset += n
    return offset


def _copy_chunk(src_fd: int, dst_fd: int, offset: int, count: int) -> int:
    """The portable fallback of :func:`copy_into` (a file system without sendfile)."""
    data = os.pread(src_fd, min(count, 1 << 24), offset)
    view = memoryview(data)
    while view:
        view = view[os.write(dst_fd, view):]
    return len(data)


def write_temporary(src_fd: int, path: str, mode: int, *, fsync: bool) -> Path:
    """Write the content of ``src_fd`` to a new temporary sibling of ``path``; return it.

    The caller renames it over ``path`` (under its own lock: whether the rename
    should still happen is its decision) or removes it.
    """
    tmp = temporary_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode & 0o7777)
    try:
        copy_into(src_fd, fd)
        os.fchmod(fd, mode & 0o7777)  # the creation mode went through the umask
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp


def publish(tmp: Path, path: str, *, fsync: bool) -> None:
    """Rename ``tmp`` over ``path`` (and make the directory entry durable with ``fsync``)."""
    os.replace(tmp, path)
    if fsync:
        fsync_path(os.path.dirname(path) or ".", directory=True)
