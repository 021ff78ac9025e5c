/* ensio transfer interposer: extended attributes of transferred names.
 *
 * `ls -l` asks for a file's SELinux label and ACL (lgetxattr, listxattr) after its
 * statx: a held file must answer as the memory file it is, not ENOENT from the real
 * path where nothing is.
 */
#include "ensio_interpose.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define REAL(type, name) \
    static __typeof__(type) real_##name; \
    if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

/* ---- extended attributes ---------------------------------------------------------- */

/* A held file answers as the memory file it is: get and list come from the memfd itself
 * (ENODATA, an empty list: what `ls -l` and SELinux/ACL probes expect of a tmpfs file),
 * set is ENOTSUP (nothing would carry them to disk or to other hosts). Other names are
 * the real call's. */
#define XATTR_BODY(follow, realcall, fcall)                              \
    int fd_;                                                             \
    mode_t mode_;                                                        \
    int h_ = ei_held(AT_FDCWD, path, &fd_, &mode_, NULL, EI_CONSUMER | EI_PRODUCER); \
    (void)(follow);                                                      \
    if (h_ == 0) return (realcall);                                      \
    if (h_ < 0) return -1;                                               \
    ssize_t rc_ = (fcall);                                               \
    int saved_ = errno;                                                  \
    ei_real.close(fd_);                                                  \
    errno = saved_;                                                      \
    return rc_

EXPORT ssize_t getxattr(const char *path, const char *name, void *value, size_t size)
{
    REAL(ssize_t (*)(const char *, const char *, void *, size_t), getxattr);
    XATTR_BODY(1, real_getxattr(path, name, value, size), fgetxattr(fd_, name, value, size));
}

EXPORT ssize_t lgetxattr(const char *path, const char *name, void *value, size_t size)
{
    REAL(ssize_t (*)(const char *, const char *, void *, size_t), lgetxattr);
    XATTR_BODY(0, real_lgetxattr(path, name, value, size), fgetxattr(fd_, name, value, size));
}

EXPORT ssize_t listxattr(const char *path, char *list, size_t size)
{
    REAL(ssize_t (*)(const char *, char *, size_t), listxattr);
    XATTR_BODY(1, real_listxattr(path, list, size), flistxattr(fd_, list, size));
}

EXPORT ssize_t llistxattr(const char *path, char *list, size_t size)
{
    REAL(ssize_t (*)(const char *, char *, size_t), llistxattr);
    XATTR_BODY(0, real_llistxattr(path, list, size), flistxattr(fd_, list, size));
}

static ssize_t not_supported(void)
{
    errno = ENOTSUP;
    return -1;
}

EXPORT int setxattr(const char *path, const char *name, const void *value, size_t size,
                    int flags)
{
    REAL(int (*)(const char *, const char *, const void *, size_t, int), setxattr);
    XATTR_BODY(1, real_setxattr(path, name, value, size, flags), not_supported());
}

EXPORT int lsetxattr(const char *path, const char *name, const void *value, size_t size,
                     int flags)
{
    REAL(int (*)(const char *, const char *, const void *, size_t, int), lsetxattr);
    XATTR_BODY(0, real_lsetxattr(path, name, value, size, flags), not_supported());
}

EXPORT int removexattr(const char *path, const char *name)
{
    REAL(int (*)(const char *, const char *), removexattr);
    XATTR_BODY(1, real_removexattr(path, name), fremovexattr(fd_, name));
}

EXPORT int lremovexattr(const char *path, const char *name)
{
    REAL(int (*)(const char *, const char *), lremovexattr);
    XATTR_BODY(0, real_lremovexattr(path, name), fremovexattr(fd_, name));
}
