"""Memory for held files: a private tmpfs with transparent huge pages, else plain memfds.

Why: a memfd lives on the kernel's internal shmem mount, which uses huge pages only if
``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` says so (``never`` by default).
With 4 KiB pages every ``read`` of a consumer looks up and locks each page, so reading
a memfd cost about twice the CPU of reading the page cache (issue 28), and every write
of a producer allocates page by page. A tmpfs mounted with ``huge=within_size`` holds
a file in 2 MiB pages whatever ``shmem_enabled`` says (only ``deny`` forbids it): on
the benchmark machine reads went from 2.8 to 8.8 GB/s and writes into fresh memory
from about 1 to 9 GB/s. Nothing needs reserving (unlike ``MFD_HUGETLB``, whose files
also refuse ``write``), but the kernel must have transparent huge pages
(``/sys/kernel/mm/transparent_hugepage`` exists) and enough free contiguous memory;
otherwise it falls back to small pages by itself.

How, without touching the host's mounts: a short-lived helper (``unshare --mount``;
``--user --map-root-user`` added when not root, for kernels that allow unprivileged
user namespaces) mounts the tmpfs in a mount namespace of its own, on an empty
directory beside the daemon's socket, and waits. The daemon opens that directory
through ``/proc/PID/root`` (which resolves in the helper's namespace), keeps the
descriptor, and lets the helper exit: the mount is then detached from every
namespace but lives as long as the descriptor or any file of it is open, and is gone
with the daemon, also after a crash. A file is ``O_TMPFILE`` in that directory: no
name, like a memfd; consumers reopen it through ``/proc/self/fd`` as before.

What differs from a memfd: a tmpfs file cannot be sealed (only ``memfd_create``
allows seals), so the daemon holds a completed file by a read-only descriptor and the
producer's descriptors are closed, but a producer that keeps a writable *mapping*
after its close could still change the bytes (a memfd's ``F_SEAL_WRITE`` refuses to
seal then and the daemon copies). Set ``ENSIO_TRANSFER_HUGE_PAGES=off`` (read by the
daemon when it starts) to keep memfds.

Imports: nothing of ensio (the daemon's leaf).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HUGE_ENV", "MemorySource", "open_memory_source", "thp_available"]

HUGE_ENV = "ENSIO_TRANSFER_HUGE_PAGES"
_THP = Path("/sys/kernel/mm/transparent_hugepage")
_MOUNT_DIR = "huge"
_HELPER_TIMEOUT_S = 10.0


def thp_available() -> str | None:
    """Why a tmpfs cannot have transparent huge pages here (None: it can)."""
    if not _THP.is_dir():
        return "the kernel has no transparent huge pages"
    with contextlib.suppress(OSError):
        if "[deny]" in (_THP / "shmem_enabled").read_text():
            return "shmem_enabled is 'deny'"
    if shutil.which("unshare") is None:
        return "the unshare command (util-linux) is not installed"
    return None


@dataclass
class MemorySource:
    """Where the daemon's new files get their memory.

    ``dirfd`` is the private huge-page tmpfs (None: memfds); ``kind`` says which, for
    logs and ``ensio bench transfer``: ``"tmpfs-huge"`` or ``"memfd"``; ``why`` is the
    reason a huge-page tmpfs is not used (None when it is).
    """

    dirfd: int | None = None
    kind: str = "memfd"
    why: str | None = None

    def new(self, name: str) -> int:
        """A new, empty, read-write file of memory (close-on-exec). A huge-page tmpfs
        that refuses (full, gone) gives a memfd instead."""
        if self.dirfd is not None:
            try:
                return os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600,
                               dir_fd=self.dirfd)
            except OSError:
                pass
        return os.memfd_create(os.path.basename(name) or "ensio",
                               os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)

    def close(self) -> None:
        """Let go of the tmpfs (files still open keep their memory)."""
        if self.dirfd is not None:
            os.close(self.dirfd)
            self.dirfd = None


def open_memory_source(directory: str | os.PathLike, log: logging.Logger,
                       mode: str | None = None) -> MemorySource:
    """The memory of a daemon serving ``directory``: a private huge-page tmpfs if ``mode``
    (default: ``$ENSIO_TRANSFER_HUGE_PAGES``, else ``auto``) is ``auto`` and the machine
    allows one, else memfds. One log line says which and why.
    """
    mode = (mode if mode is not None else os.environ.get(HUGE_ENV, "auto")).strip().lower()
    if mode in ("off", "0", "no", "false", "never"):
        src = MemorySource(why=f"{HUGE_ENV}={mode}")
    else:
        why = thp_available()
        dirfd = None
        if why is None:
            try:
                dirfd = _mount_private_tmpfs(Path(directory) / _MOUNT_DIR)
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                why = str(exc)
        src = (MemorySource(dirfd, "tmpfs-huge") if dirfd is not None
               else MemorySource(why=why))
    if src.dirfd is not None:
        log.info("memory: a private tmpfs with transparent huge pages (huge=within_size)")
    else:
        log.info("memory: memfds with the kernel's default pages (%s)", src.why)
    return src


def _mount_private_tmpfs(mountpoint: Path) -> int:
    """Mount a ``huge=within_size`` tmpfs on ``mountpoint`` in a helper's own mount
    namespace; an ``O_PATH`` descriptor of its root (the helper has exited).

    Raises
    ------
    RuntimeError
        The helper could not mount it (its message: no privilege, no user namespaces).
    """
    mountpoint.mkdir(mode=0o700, exist_ok=True)
    script = ('mount -t tmpfs -o huge=within_size,mode=0700,size=100% ensio-transfer "$0" '
              '&& echo mounted && exec cat >/dev/null')
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
            str(mountpoint)]
    if os.geteuid() != 0:
        argv[1:1] = ["--user", "--map-root-user"]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, close_fds=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()  # the helper's "mounted", or EOF when it failed
        if line.strip() != b"mounted":
            p.wait(_HELPER_TIMEOUT_S)
            err = p.stderr.read().decode(errors="replace").strip() if p.stderr else ""
            raise RuntimeError("cannot mount a private tmpfs with huge pages: "
                               + (err.splitlines()[-1] if err else f"exit {p.returncode}"))
        fd = os.open(f"/proc/{p.pid}/root{mountpoint}", os.O_PATH | os.O_DIRECTORY
                     | os.O_CLOEXEC)
        if os.fstat(fd).st_dev == os.stat(mountpoint).st_dev:
            os.close(fd)
            raise RuntimeError("the helper's tmpfs is not visible through /proc/PID/root")
        return fd
    finally:
        if p.stdin is not None:
            p.stdin.close()  # the helper's cat ends: it exits, the mount stays referenced
        try:
            p.wait(_HELPER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()
