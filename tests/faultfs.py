"""A full disk without root: an LD_PRELOAD shim that refuses writes with ENOSPC.

Why a shim and not a small mounted file system: tests run without root (no
loop or tmpfs mounts). The shim (C, built here with gcc on first use) wraps
``write``, ``pwrite``, ``writev``, ``pwritev`` (and their 64-bit and ``2``
variants: what Python, netCDF-C and HDF5 call) for descriptors whose file
lies under ``ENSIO_TEST_ENOSPC_DIR``: once a process has written
``ENSIO_TEST_ENOSPC_BYTES`` bytes there, every further write there fails with
``errno = ENOSPC``, as a full disk does, so the code under test meets the real
errno path (``OSError: [Errno 28] No space left on device`` in Python, a
library error in netCDF/HDF5). Renames, unlinks and truncations pass (they need
no space on a real disk either). Other files (pytest's, MPI's) are untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["build_shim", "enospc_env"]

_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static const char *dir;
static size_t dirlen;
static long long budget = -1, used;  /* -1: not read yet; < -1: no limit */

/* ENSIO_TEST_ENOSPC_REPORT: a file that gets the bytes written under the directory */
__attribute__((destructor)) static void report(void) {
    const char *r = getenv("ENSIO_TEST_ENOSPC_REPORT");
    if (!r || !dir || used == 0) return;
    FILE *f = fopen(r, "a");
    if (f) { fprintf(f, "%lld\n", used); fclose(f); }
}

static void setup(void) {
    if (budget != -1) return;
    const char *d = getenv("ENSIO_TEST_ENOSPC_DIR"), *b = getenv("ENSIO_TEST_ENOSPC_BYTES");
    budget = b && *b ? atoll(b) : -2;  /* unset: count only */
    if (budget == -1) budget = -2;
    dir = d && *d ? d : NULL;
    dirlen = dir ? strlen(dir) : 0;
}

/* 1 (errno ENOSPC) if this write of n bytes to fd must fail */
static int refuse(int fd, size_t n) {
    char link[64], path[PATH_MAX];
    setup();
    if (!dir || n == 0) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, path, sizeof path - 1);
    if (len <= 0) return 0;
    path[len] = 0;
    if (strncmp(path, dir, dirlen) != 0 || (path[dirlen] != '/' && path[dirlen] != 0)) return 0;
    if (budget >= 0 && used + (long long)n > budget) { errno = ENOSPC; return 1; }
    used += (long long)n;
    return 0;
}

static size_t total(const struct iovec *iov, int cnt) {
    size_t n = 0;
    for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
    return n;
}

typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*pwritev_fn)(int, const struct iovec *, int, off_t);
typedef ssize_t (*pwritev2_fn)(int, const struct iovec *, int, off_t, int);

#define REAL(name, type) static type real_##name; \
    if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *buf, size_t n) {
    REAL(write, write_fn);
    return refuse(fd, n) ? -1 : real_write(fd, buf, n);
}
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite, pwrite_fn);
    return refuse(fd, n) ? -1 : real_pwrite(fd, buf, n, off);
}
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite64, pwrite_fn);
    return refuse(fd, n) ? -1 : real_pwrite64(fd, buf, n, off);
}
ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    REAL(writev, writev_fn);
    return refuse(fd, total(iov, cnt)) ? -1 : real_writev(fd, iov, cnt);
}
ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    REAL(pwritev, pwritev_fn);
    return refuse(fd, total(iov, cnt)) ? -1 : real_pwritev(fd, iov, cnt, off);
}
ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off) {
    REAL(pwritev64, pwritev_fn);
    return refuse(fd, total(iov, cnt)) ? -1 : real_pwritev64(fd, iov, cnt, off);
}
ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    REAL(pwritev2, pwritev2_fn);
    return refuse(fd, total(iov, cnt)) ? -1 : real_pwritev2(fd, iov, cnt, off, flags);
}
"""


def build_shim(where: Path) -> Path:
    """Compile the shim into ``where/libenospc.so`` (once per directory); its path."""
    lib = where / "libenospc.so"
    if not lib.exists():
        src = where / "enospc.c"
        src.write_text(_SOURCE)
        cc = shutil.which("gcc") or "cc"
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(lib),
                        str(src), "-ldl"], check=True, timeout=120)
    return lib


def enospc_env(shim: Path, directory: Path, budget: int | None,
               report: Path | None = None) -> dict[str, str]:
    """Environment variables: writes under ``directory`` fail after ``budget`` bytes.

    ``budget=None`` refuses nothing; with ``report`` each process appends the bytes
    it wrote under ``directory`` to that file at exit (to size a budget).
    """
    pre = os.environ.get("LD_PRELOAD", "")
    env = {"LD_PRELOAD": f"{shim}{' ' + pre if pre else ''}",
           "ENSIO_TEST_ENOSPC_DIR": os.path.realpath(directory),
           "ENSIO_TEST_ENOSPC_BYTES": "" if budget is None else str(budget)}
    if report is not None:
        env["ENSIO_TEST_ENOSPC_REPORT"] = str(report)
    return env
