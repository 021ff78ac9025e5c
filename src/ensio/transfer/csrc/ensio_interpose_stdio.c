/* ensio transfer interposer: stdio. netCDF reads a file's magic number through fopen, and
 * glibc's fclose closes the descriptor internally (not through close()), so both are
 * interposed for transferred names; fopen is open() plus fdopen().
 *
 * A partial descriptor (serve_partial, ensio_interpose_partial.c) gets a fopencookie
 * stream instead: glibc's fread reads with its internal read, which cannot be
 * interposed, while the cookie reads through read() and so waits for its bytes. A
 * cookie stream has no descriptor of its own, so fileno() is interposed to answer the
 * one behind it (netCDF takes the file's size with fstat(fileno(fp))).
 */
#include "ensio_interpose.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static int fopen_flags(const char *mode)
{
    int f;
    switch (mode[0]) {
    case 'r': f = 0; break;
    case 'w': f = O_CREAT | O_TRUNC; break;
    case 'a': f = O_CREAT | O_APPEND; break;
    default: return -1;
    }
    int plus = strchr(mode, '+') != NULL;
    f |= plus ? O_RDWR : mode[0] == 'r' ? O_RDONLY : O_WRONLY;
    if (strchr(mode, 'e')) f |= O_CLOEXEC;
    if (strchr(mode, 'x')) f |= O_EXCL;
    return f;
}

/* ---- cookie streams of partial descriptors ----------------------------------------- */

struct cookie { FILE *fp; int fd; };
static struct cookie *cookies;  /* guarded by ei_lock */
static int ncookies, cookie_room;
static int any_cookie;          /* read without the lock: fileno's fast path */

static ssize_t cookie_read(void *c, char *buf, size_t n)
{
    return read((int)(intptr_t)c, buf, n);  /* the interposed read: it waits */
}

static int cookie_seek(void *c, off64_t *pos, int whence)
{
    off64_t r = lseek64((int)(intptr_t)c, *pos, whence);
    if (r < 0) return -1;
    *pos = r;
    return 0;
}

static int cookie_close(void *c)
{
    int fd = (int)(intptr_t)c;
    pthread_mutex_lock(&ei_lock);
    for (int i = 0; i < ncookies; i++)
        if (cookies[i].fd == fd) { cookies[i] = cookies[--ncookies]; break; }
    pthread_mutex_unlock(&ei_lock);
    return close(fd);  /* the interposed close: the descriptor stops being partial */
}

static FILE *cookie_stream(int fd, const char *mode)
{
    cookie_io_functions_t io = {cookie_read, NULL, cookie_seek, cookie_close};
    pthread_mutex_lock(&ei_lock);
    if (ncookies == cookie_room) {
        struct cookie *grown = realloc(cookies, (size_t)(cookie_room + 16) * sizeof *grown);
        if (grown == NULL) { pthread_mutex_unlock(&ei_lock); errno = ENOMEM; return NULL; }
        cookies = grown;
        cookie_room += 16;
    }
    FILE *fp = fopencookie((void *)(intptr_t)fd, mode, io);
    if (fp != NULL) {
        cookies[ncookies++] = (struct cookie){fp, fd};
        __atomic_store_n(&any_cookie, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ei_lock);
    return fp;
}

static int cookie_fd(FILE *fp)
{
    int fd = -1;
    pthread_mutex_lock(&ei_lock);
    for (int i = 0; i < ncookies; i++)
        if (cookies[i].fp == fp) { fd = cookies[i].fd; break; }
    pthread_mutex_unlock(&ei_lock);
    return fd;
}

EXPORT int fileno(FILE *fp)
{
    static int (*real_fileno)(FILE *);
    if (!real_fileno) real_fileno = dlsym(RTLD_NEXT, "fileno");
    int saved = errno;
    int fd = real_fileno(fp);
    if (fd < 0 && __atomic_load_n(&any_cookie, __ATOMIC_ACQUIRE)) {
        int found = cookie_fd(fp);
        if (found >= 0) { errno = saved; return found; }
    }
    return fd;
}

EXPORT int fileno_unlocked(FILE *fp) { return fileno(fp); }

/* ---- fopen, fclose -------------------------------------------------------------------- */

static FILE *fopen_common(const char *path, const char *mode, int large)
{
    static FILE *(*real_fopen)(const char *, const char *);
    static FILE *(*real_fopen64)(const char *, const char *);
    if (!real_fopen) {
        real_fopen = dlsym(RTLD_NEXT, "fopen");
        real_fopen64 = dlsym(RTLD_NEXT, "fopen64");
    }
    int flags = fopen_flags(mode);
    int fd = flags < 0 ? -2 : ei_open_path(AT_FDCWD, path, flags, 0666);
    if (fd == -2) return large && real_fopen64 ? real_fopen64(path, mode) : real_fopen(path, mode);
    if (fd < 0) return NULL;
    if (flags & (O_WRONLY | O_RDWR)) ei_mark_whole(fd);  /* fwrite's writes are glibc's own */
    FILE *fp = ei_fd_partial(fd) ? cookie_stream(fd, mode) : fdopen(fd, mode);
    if (fp == NULL) {
        int saved = errno;
        close(fd);
        errno = saved;
    }
    return fp;
}

EXPORT FILE *fopen(const char *path, const char *mode) { return fopen_common(path, mode, 0); }
EXPORT FILE *fopen64(const char *path, const char *mode) { return fopen_common(path, mode, 1); }

EXPORT int fclose(FILE *fp)
{
    static int (*real_fclose)(FILE *);
    if (!real_fclose) real_fclose = dlsym(RTLD_NEXT, "fclose");
    int fd = fp ? fileno(fp) : -1;
    if (ei_fd_tracked(fd) == 0) return real_fclose(fp);
    pthread_mutex_lock(&ei_lock);
    int rc = real_fclose(fp);  /* closes fd inside glibc, not through close() */
    int saved = errno;
    if (ei_untrack(fd) != 0) { rc = EOF; saved = errno; }
    pthread_mutex_unlock(&ei_lock);
    errno = saved;
    return rc;
}
