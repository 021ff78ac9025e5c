/* ensio transfer interposer: stdio. netCDF reads a file's magic number through fopen, and
 * glibc's fclose closes the descriptor internally (not through close()), so both are
 * interposed for transferred names; fopen is open() plus fdopen().
 */
#include "ensio_interpose.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
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
    FILE *fp = fdopen(fd, mode);
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
