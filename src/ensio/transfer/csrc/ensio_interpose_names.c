/* ensio transfer interposer: stat, access, chmod, unlink/remove, link, rename of transferred
 * names.
 *
 * A transferred file the daemon holds answers stat from its memory (the daemon's
 * read-only descriptor, or this process's own while it writes the file): size and
 * times are the memory file's, the permission bits those of the producer's create.
 * Names the daemon does not hold are real files, so fallback and persisted files
 * behave as files. The glibc-internal __xstat family is interposed as well: programs
 * built against glibc < 2.33 call it instead of stat. Extended attributes:
 * ensio_interpose_xattr.c.
 */
#include "ensio_interpose.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define REAL(type, name) \
    static __typeof__(type) real_##name; \
    if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

int __xstat(int, const char *, struct stat *);
int __lxstat(int, const char *, struct stat *);
int __fxstatat(int, int, const char *, struct stat *, int);
int __xstat64(int, const char *, struct stat64 *);
int __lxstat64(int, const char *, struct stat64 *);
int __fxstatat64(int, int, const char *, struct stat64 *, int);

/* The daemon's answer for canon (lock taken here), as ei_held() answers; *absent: the
 * daemon answered that it holds no such file. */
static int lookup(const char *canon, int *fd, mode_t *mode, int *absent)
{
    int rc = 0;
    *absent = 0;
    pthread_mutex_lock(&ei_lock);
    int keeper = ei_local_file(canon, mode);
    if (keeper >= 0) {
        *fd = ei_real.fcntl(keeper, F_DUPFD_CLOEXEC, 0);
        rc = *fd >= 0 ? 1 : -1;
    } else if (ei_daemon_usable()) {
        char msg[PATH_MAX + 16], reply[EI_REPLY_MAX];
        int n = snprintf(msg, sizeof msg, "STAT\npath=%s", canon);
        if (ei_request(msg, (size_t)n, -1, reply, fd) == 0) {
            if (ei_reply_is(reply, "OK") && *fd >= 0) {
                *mode = (mode_t)ei_reply_long(reply, "mode", 0644);
                rc = 1;
            } else if (!ei_reply_is(reply, "ABSENT")) {
                if (*fd >= 0) ei_real.close(*fd);
                errno = (int)ei_reply_long(reply, "errno", EIO);
                rc = -1;
            } else {
                *absent = 1;
                if (*fd >= 0) ei_real.close(*fd);
            }
        }
    }
    pthread_mutex_unlock(&ei_lock);
    return rc;
}

/* A name this process only consumes, neither held nor on disk: its producer may not
 * have started yet (workflow jobs often start consumers first), so stat and access wait
 * for it as open does (OPEN await=1, up to the connection's consumer_timeout_s): tools
 * such as ncks stat a file before they open it. Lock not held; as ei_held() answers. */
static int not_yet(const struct ei_rule *r, const char *canon, int *fd, mode_t *mode)
{
    REAL(int (*)(int, const char *, struct stat *, int), fstatat);
    struct stat st;
    if (real_fstatat(AT_FDCWD, canon, &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT)
        return 0;  /* a real file (or a directory we cannot search): the real call answers */
    int waited = ei_consume_wait(r, canon, O_RDONLY | O_CLOEXEC);
    if (waited == -2) return 0;  /* a real file appeared */
    if (waited < 0) return -1;   /* ETIMEDOUT, EIO: errno */
    ei_real.close(waited);
    int absent;
    return lookup(canon, fd, mode, &absent);  /* complete now: its permission bits */
}

/* Is (dirfd, path) a held transferred file? 1: *fd is a read-only descriptor of it
 * (close it) and *mode its permission bits; 0: not ours, call the real function;
 * -1: error (errno, e.g. EIO for a file whose producer died). A name this process only
 * consumes and nobody produced yet is waited for (not_yet). */
int ei_held(int dirfd, const char *path, int *fd, mode_t *mode, const struct ei_rule **rule,
            int want)
{
    ei_init();
    char canon[PATH_MAX];
    const struct ei_rule *r = ei_classify(dirfd, path, canon, want);
    if (rule) *rule = r;
    if (r == NULL) return 0;
    int absent;
    int rc = lookup(canon, fd, mode, &absent);
    if (rc == 0 && absent && (want & EI_CONSUMER) && ei_only_consumes(canon))
        rc = not_yet(r, canon, fd, mode);
    return rc;
}

#define STAT_BODY(dirfd, path, buf, fstatfn, realcall)                   \
    int fd_;                                                             \
    mode_t mode_;                                                        \
    int h_ = ei_held(dirfd, path, &fd_, &mode_, NULL, EI_CONSUMER);         \
    if (h_ == 0) return (realcall);                                      \
    if (h_ < 0) return -1;                                               \
    int rc_ = fstatfn(fd_, buf);                                         \
    ei_real.close(fd_);                                                  \
    if (rc_ == 0) {                                                      \
        (buf)->st_mode = S_IFREG | (mode_ & 07777);                      \
        (buf)->st_nlink = 1;                                             \
    }                                                                    \
    return rc_

static int empty(const char *path, int flags)
{
    return (flags & AT_EMPTY_PATH) && path && path[0] == '\0';
}

EXPORT int stat(const char *path, struct stat *buf)
{
    REAL(int (*)(const char *, struct stat *), stat);
    STAT_BODY(AT_FDCWD, path, buf, fstat, real_stat(path, buf));
}

EXPORT int lstat(const char *path, struct stat *buf)
{
    REAL(int (*)(const char *, struct stat *), lstat);
    STAT_BODY(AT_FDCWD, path, buf, fstat, real_lstat(path, buf));
}

EXPORT int fstatat(int dirfd, const char *path, struct stat *buf, int flags)
{
    REAL(int (*)(int, const char *, struct stat *, int), fstatat);
    if (empty(path, flags)) return real_fstatat(dirfd, path, buf, flags);
    STAT_BODY(dirfd, path, buf, fstat, real_fstatat(dirfd, path, buf, flags));
}

EXPORT int stat64(const char *path, struct stat64 *buf)
{
    REAL(int (*)(const char *, struct stat64 *), stat64);
    STAT_BODY(AT_FDCWD, path, buf, fstat64, real_stat64(path, buf));
}

EXPORT int lstat64(const char *path, struct stat64 *buf)
{
    REAL(int (*)(const char *, struct stat64 *), lstat64);
    STAT_BODY(AT_FDCWD, path, buf, fstat64, real_lstat64(path, buf));
}

EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *buf, int flags)
{
    REAL(int (*)(int, const char *, struct stat64 *, int), fstatat64);
    if (empty(path, flags)) return real_fstatat64(dirfd, path, buf, flags);
    STAT_BODY(dirfd, path, buf, fstat64, real_fstatat64(dirfd, path, buf, flags));
}

/* The glibc-internal entry points (ver is _STAT_VER; the struct is the current one). */
EXPORT int __xstat(int ver, const char *path, struct stat *buf)
{
    REAL(int (*)(int, const char *, struct stat *), __xstat);
    STAT_BODY(AT_FDCWD, path, buf, fstat,
              real___xstat ? real___xstat(ver, path, buf) : stat(path, buf));
}

EXPORT int __lxstat(int ver, const char *path, struct stat *buf)
{
    REAL(int (*)(int, const char *, struct stat *), __lxstat);
    STAT_BODY(AT_FDCWD, path, buf, fstat,
              real___lxstat ? real___lxstat(ver, path, buf) : lstat(path, buf));
}

EXPORT int __fxstatat(int ver, int dirfd, const char *path, struct stat *buf, int flags)
{
    REAL(int (*)(int, int, const char *, struct stat *, int), __fxstatat);
    if (empty(path, flags) || real___fxstatat == NULL) {
        if (real___fxstatat) return real___fxstatat(ver, dirfd, path, buf, flags);
        return fstatat(dirfd, path, buf, flags);
    }
    STAT_BODY(dirfd, path, buf, fstat, real___fxstatat(ver, dirfd, path, buf, flags));
}

EXPORT int __xstat64(int ver, const char *path, struct stat64 *buf)
{
    REAL(int (*)(int, const char *, struct stat64 *), __xstat64);
    STAT_BODY(AT_FDCWD, path, buf, fstat64,
              real___xstat64 ? real___xstat64(ver, path, buf) : stat64(path, buf));
}

EXPORT int __lxstat64(int ver, const char *path, struct stat64 *buf)
{
    REAL(int (*)(int, const char *, struct stat64 *), __lxstat64);
    STAT_BODY(AT_FDCWD, path, buf, fstat64,
              real___lxstat64 ? real___lxstat64(ver, path, buf) : lstat64(path, buf));
}

EXPORT int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *buf, int flags)
{
    REAL(int (*)(int, int, const char *, struct stat64 *, int), __fxstatat64);
    if (empty(path, flags) || real___fxstatat64 == NULL) {
        if (real___fxstatat64) return real___fxstatat64(ver, dirfd, path, buf, flags);
        return fstatat64(dirfd, path, buf, flags);
    }
    STAT_BODY(dirfd, path, buf, fstat64, real___fxstatat64(ver, dirfd, path, buf, flags));
}

EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf)
{
    REAL(int (*)(int, const char *, int, unsigned int, struct statx *), statx);
    if (empty(path, flags)) return real_statx(dirfd, path, flags, mask, buf);
    int fd;
    mode_t mode;
    int h = ei_held(dirfd, path, &fd, &mode, NULL, EI_CONSUMER);
    if (h == 0) return real_statx(dirfd, path, flags, mask, buf);
    if (h < 0) return -1;
    int rc = real_statx(fd, "", AT_EMPTY_PATH, mask, buf);
    ei_real.close(fd);
    if (rc == 0) {
        buf->stx_mode = (unsigned short)(S_IFREG | (mode & 07777));
        buf->stx_nlink = 1;
    }
    return rc;
}

/* ---- access ----------------------------------------------------------------------- */

static int access_held(int dirfd, const char *path, int amode, int *answered)
{
    int fd;
    mode_t mode;
    const struct ei_rule *r;
    int h = ei_held(dirfd, path, &fd, &mode, &r, (amode & W_OK) ? EI_PRODUCER : EI_CONSUMER);
    *answered = h != 0;
    if (h <= 0) return -1;
    ei_real.close(fd);
    if (amode & X_OK) { errno = EACCES; return -1; }
    if ((amode & W_OK) && !(r->role & EI_PRODUCER)) { errno = EROFS; return -1; }
    return 0;
}

EXPORT int access(const char *path, int amode)
{
    REAL(int (*)(const char *, int), access);
    int answered, rc = access_held(AT_FDCWD, path, amode, &answered);
    return answered ? rc : real_access(path, amode);
}

EXPORT int faccessat(int dirfd, const char *path, int amode, int flags)
{
    REAL(int (*)(int, const char *, int, int), faccessat);
    int answered, rc = access_held(dirfd, path, amode, &answered);
    return answered ? rc : real_faccessat(dirfd, path, amode, flags);
}

/* ---- chmod ------------------------------------------------------------------------ */

/* A held file's permission bits live in the daemon (stat answers them, and they go with
 * the file to disk): 1 answered (rc in *rc), 0 not ours. Programs that replace a file
 * give the new one the old one's bits (cp -p, atomic-rename writers) by path. */
static int chmod_held(int dirfd, const char *path, mode_t m, int *rc)
{
    ei_init();
    char canon[PATH_MAX];
    if (ei_classify(dirfd, path, canon, EI_PRODUCER) == NULL) return 0;
    int answered = 0;
    pthread_mutex_lock(&ei_lock);
    char msg[PATH_MAX + 32], reply[EI_REPLY_MAX];
    int n = snprintf(msg, sizeof msg, "CHMOD\npath=%s\nmode=%o", canon, (unsigned)(m & 07777));
    if (ei_daemon_usable() && ei_request(msg, (size_t)n, -1, reply, NULL) == 0
        && !ei_reply_is(reply, "ABSENT")) {
        answered = 1;
        if (ei_reply_is(reply, "OK")) {
            ei_local_chmod(canon, m & 07777);
            *rc = 0;
        } else {
            errno = (int)ei_reply_long(reply, "errno", EIO);
            *rc = -1;
        }
    }
    pthread_mutex_unlock(&ei_lock);
    return answered;
}

EXPORT int chmod(const char *path, mode_t mode)
{
    REAL(int (*)(const char *, mode_t), chmod);
    int rc;
    return chmod_held(AT_FDCWD, path, mode, &rc) ? rc : real_chmod(path, mode);
}

EXPORT int fchmodat(int dirfd, const char *path, mode_t mode, int flags)
{
    REAL(int (*)(int, const char *, mode_t, int), fchmodat);
    int rc;
    return chmod_held(dirfd, path, mode, &rc) ? rc : real_fchmodat(dirfd, path, mode, flags);
}

/* ---- unlink ----------------------------------------------------------------------- */

/* 1: the daemon forgot the file (and its persisted copy must go too: *ondisk);
 * 0: not held, the real call decides. */
static int unlink_held(int dirfd, const char *path, int *ondisk)
{
    ei_init();
    char canon[PATH_MAX];
    if (ei_classify(dirfd, path, canon, EI_PRODUCER) == NULL) return 0;
    int rc = 0;
    pthread_mutex_lock(&ei_lock);
    ei_local_forget(canon);
    char msg[PATH_MAX + 16], reply[EI_REPLY_MAX];
    int n = snprintf(msg, sizeof msg, "UNLINK\npath=%s", canon);
    if (ei_daemon_usable() && ei_request(msg, (size_t)n, -1, reply, NULL) == 0
        && ei_reply_is(reply, "OK")) {
        rc = 1;
        *ondisk = (int)ei_reply_long(reply, "ondisk", 0);
    }
    pthread_mutex_unlock(&ei_lock);
    return rc;
}

EXPORT int unlink(const char *path)
{
    int ondisk = 0;
    if (unlink_held(AT_FDCWD, path, &ondisk) == 0) return ei_real.unlink(path);
    if (ondisk) ei_real.unlink(path);
    return 0;
}

EXPORT int unlinkat(int dirfd, const char *path, int flags)
{
    REAL(int (*)(int, const char *, int), unlinkat);
    int ondisk = 0;
    if ((flags & AT_REMOVEDIR) || unlink_held(dirfd, path, &ondisk) == 0)
        return real_unlinkat(dirfd, path, flags);
    if (ondisk) real_unlinkat(dirfd, path, flags);
    return 0;
}

/* glibc's remove() unlinks through an internal call the interposer never sees (HDF5's
 * H5Fdelete, and C programs deleting a file, call remove) */
EXPORT int remove(const char *path)
{
    REAL(int (*)(const char *), remove);
    int ondisk = 0;
    if (unlink_held(AT_FDCWD, path, &ondisk) == 0) return real_remove(path);
    if (ondisk) ei_real.unlink(path);
    return 0;
}

/* ---- link ------------------------------------------------------------------------- */

/* A hard link to a held file cannot exist: its memory belongs to no file system, so link
 * answers EXDEV, as between two file systems, and programs that back a file up by linking
 * it (ensio's undo journal before a rewrite, cp -l, rsync --link-dest) copy it instead. A
 * new name the daemon holds is an existing file (EEXIST). Returns 1 when answered (-1 and
 * errno in *rc), 0 when the real call decides (names not held: real files). */
static int link_held(int od, const char *old, int nd, const char *new, int flags, int *rc)
{
    int fd;
    mode_t mode;
    int want = EI_CONSUMER | EI_PRODUCER;
    *rc = -1;
    int h = empty(old, flags) ? 0 : ei_held(od, old, &fd, &mode, NULL, want);
    if (h > 0) {
        ei_real.close(fd);
        errno = EXDEV;
    }
    if (h != 0) return 1;
    h = ei_held(nd, new, &fd, &mode, NULL, want);
    if (h > 0) {
        ei_real.close(fd);
        errno = EEXIST;
    }
    return h != 0;
}

EXPORT int link(const char *old, const char *new)
{
    REAL(int (*)(const char *, const char *), link);
    int rc;
    return link_held(AT_FDCWD, old, AT_FDCWD, new, 0, &rc) ? rc : real_link(old, new);
}

EXPORT int linkat(int od, const char *old, int nd, const char *new, int flags)
{
    REAL(int (*)(int, const char *, int, const char *, int), linkat);
    int rc;
    return link_held(od, old, nd, new, flags, &rc) ? rc : real_linkat(od, old, nd, new, flags);
}

/* ---- rename ----------------------------------------------------------------------- */

/* Returns the result, or -2: let the real call run (then DROP the new name if it is ours). */
static int rename_held(int od, const char *old, int nd, const char *new, unsigned flags,
                       int *drop, char cnew[PATH_MAX])
{
    ei_init();
    char cold[PATH_MAX];
    const struct ei_rule *ro = ei_classify(od, old, cold, EI_PRODUCER);
    const struct ei_rule *rn = ei_classify(nd, new, cnew, EI_PRODUCER);
    *drop = 0;
    if (ro == NULL && rn == NULL) return -2;
    /* RENAME_NOREPLACE (what coreutils mv tries first) is the daemon's check; EXCHANGE and
     * WHITEOUT are not for these names */
    if (flags & ~(unsigned)RENAME_NOREPLACE) { errno = EINVAL; return -1; }
    if (ro == NULL) {
        if (flags) { errno = EINVAL; return -1; }
        *drop = 1;
        return -2;
    }
    int rc = -2;
    pthread_mutex_lock(&ei_lock);
    char msg[2 * PATH_MAX + 64], reply[EI_REPLY_MAX];
    char target[PATH_MAX];  /* the daemon needs the absolute target */
    int n = -1;
    if (rn || ei_canonical(nd, new, target) == 0)
        n = snprintf(msg, sizeof msg, "RENAME\nold=%s\nnew=%s\nexport=%d\nexcl=%d", cold,
                     rn ? cnew : target, rn == NULL, (flags & RENAME_NOREPLACE) != 0);
    if (n > 0 && (size_t)n < sizeof msg && ei_daemon_usable()
        && ei_request(msg, (size_t)n, -1, reply, NULL) == 0) {
        if (ei_reply_is(reply, "OK")) {
            rc = 0;
        } else if (!ei_reply_is(reply, "ABSENT")) {
            errno = (int)ei_reply_long(reply, "errno", EIO);
            rc = -1;
        }
    }
    pthread_mutex_unlock(&ei_lock);
    return rc;
}

static int after_real_rename(int rc, int drop, const char *cnew)
{
    if (rc != 0 || !drop) return rc;
    pthread_mutex_lock(&ei_lock);
    char msg[PATH_MAX + 16], reply[EI_REPLY_MAX];
    int n = snprintf(msg, sizeof msg, "DROP\npath=%s", cnew);
    if (ei_daemon_usable()) ei_request(msg, (size_t)n, -1, reply, NULL);
    pthread_mutex_unlock(&ei_lock);
    return 0;
}

EXPORT int rename(const char *old, const char *new)
{
    char cnew[PATH_MAX];
    int drop, rc = rename_held(AT_FDCWD, old, AT_FDCWD, new, 0, &drop, cnew);
    return rc != -2 ? rc : after_real_rename(ei_real.rename(old, new), drop, cnew);
}

EXPORT int renameat(int od, const char *old, int nd, const char *new)
{
    REAL(int (*)(int, const char *, int, const char *), renameat);
    char cnew[PATH_MAX];
    int drop, rc = rename_held(od, old, nd, new, 0, &drop, cnew);
    return rc != -2 ? rc : after_real_rename(real_renameat(od, old, nd, new), drop, cnew);
}

EXPORT int renameat2(int od, const char *old, int nd, const char *new, unsigned int flags)
{
    REAL(int (*)(int, const char *, int, const char *, unsigned int), renameat2);
    char cnew[PATH_MAX];
    int drop, rc = rename_held(od, old, nd, new, flags, &drop, cnew);
    if (rc != -2) return rc;
    if (real_renameat2 == NULL) { errno = ENOSYS; return -1; }
    return after_real_rename(real_renameat2(od, old, nd, new, flags), drop, cnew);
}
