/* ensio transfer interposer: the interposed glibc functions.
 *
 * Only path-level calls are interposed (open/creat and their 64-bit and fortify
 * variants, fopen, the stat family, access, chmod, unlink, remove, link, rename) plus
 * the calls that end a descriptor's life (close, fclose, dup2 onto it) and the ones that
 * copy it (dup, fcntl F_DUPFD). read, write, pread, fstat, mmap, lseek, ftruncate, flock
 * work on the memory file directly and are not touched, except for a partial file
 * (serve_partial: a file still arriving from another host, ensio_interpose_partial.c)
 * whose reads wait for their bytes.
 *
 * A matching path of a connection this component produces: the open returns a memfd
 * registered with the daemon (CREATE); when the last descriptor of it in this process
 * closes, the daemon seals it (COMPLETE). A matching path of a connection this
 * component consumes: the open returns the daemon's new read-only descriptor of the
 * memory (OPEN), waiting while it is still being written. Files the daemon does not
 * hold are real files. Any path no rule matches costs a test of its last component.
 *
 * Files being written by this process (struct wfile) are found by path (a reopen gets
 * the same memory) and by descriptor (fdmap: a two-level table read without the lock,
 * so close() of an ordinary descriptor takes no lock).
 */
#include "ensio_interpose.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

int ei_active;
pthread_mutex_t ei_lock = PTHREAD_MUTEX_INITIALIZER;
char ei_component[128] = "?";
mode_t ei_umask = 022;
struct ei_real ei_real;

static pthread_once_t once = PTHREAD_ONCE_INIT;

/* ---- files being written by this process ------------------------------------------ */

struct wfile *ei_wfiles;
static int nwfiles;

#define FD_CHUNK 1024
#define FD_CHUNKS 1024
#define FD_ASYNC (1 << 24)
static int *fdmap[FD_CHUNKS];  /* fd -> wfile index + 1 (| FD_ASYNC); chunks never freed */

static int fdmap_get(int fd)
{
    if (fd < 0 || fd >= FD_CHUNK * FD_CHUNKS) return 0;
    int *chunk = __atomic_load_n(&fdmap[fd / FD_CHUNK], __ATOMIC_ACQUIRE);
    return chunk ? __atomic_load_n(&chunk[fd % FD_CHUNK], __ATOMIC_RELAXED) : 0;
}

int ei_fd_tracked(int fd) { return fdmap_get(fd) & (FD_ASYNC - 1); }
int ei_fd_async(int fd) { return fdmap_get(fd) & FD_ASYNC; }

static int fdmap_set(int fd, int value)  /* lock held */
{
    if (fd < 0 || fd >= FD_CHUNK * FD_CHUNKS) return -1;
    int *chunk = fdmap[fd / FD_CHUNK];
    if (chunk == NULL) {
        if (value == 0) return 0;
        chunk = calloc(FD_CHUNK, sizeof *chunk);
        if (chunk == NULL) return -1;
        __atomic_store_n(&fdmap[fd / FD_CHUNK], chunk, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&chunk[fd % FD_CHUNK], value, __ATOMIC_RELAXED);
    return 0;
}

static struct wfile *wfile_by_path(const char *path)
{
    for (int i = 0; i < nwfiles; i++)
        if (ei_wfiles[i].used && strcmp(ei_wfiles[i].path, path) == 0) return &ei_wfiles[i];
    return NULL;
}

int ei_local_file(const char *path, mode_t *mode)
{
    struct wfile *w = wfile_by_path(path);
    if (w == NULL) return -1;
    *mode = w->mode;
    return w->keeper;
}

static int wfile_new(void)
{
    for (int i = 0; i < nwfiles; i++)
        if (!ei_wfiles[i].used) return i;
    struct wfile *grown = realloc(ei_wfiles, (size_t)(nwfiles + 8) * sizeof *grown);
    if (grown == NULL) return -1;
    memset(grown + nwfiles, 0, 8 * sizeof *grown);
    ei_wfiles = grown;
    nwfiles += 8;
    return nwfiles - 8;
}

void ei_local_chmod(const char *path, mode_t mode)
{
    struct wfile *w = wfile_by_path(path);
    if (w) w->mode = mode;
}

void ei_local_forget(const char *path)
{
    struct wfile *w = wfile_by_path(path);
    if (w) w->path[0] = '\0';
}

/* The last descriptor of w closed (or the process exits): tell the daemon, which seals
 * the file. Without a daemon the file is written to its real path instead. Async: the
 * ranges written since the last report go with it (the daemon sends them after the
 * close: the dirty remainder). */
static int wfile_finish(struct wfile *w)
{
    int rc = 0;
    char msg[96 + EI_BATCH * 44], reply[EI_REPLY_MAX];
    int n = ei_complete_text(w, msg, sizeof msg);
    /* flock() locks (HDF5 takes one) belong to the open file description, which the
     * daemon shares: release them, or no consumer could lock the file. */
    flock(w->keeper, LOCK_UN);
    if (ei_request(msg, (size_t)n, -1, reply, NULL) == 0) {
        if (!ei_reply_is(reply, "OK")) {
            errno = (int)ei_reply_long(reply, "errno", EIO);
            rc = -1;
        }
    } else if (w->path[0] == '\0') {
        /* unlinked while written, and no daemon: nothing to keep */
    } else if (ei_write_real_file(w->keeper, w->path, w->mode) == 0) {
        ei_say("%s: written to the real file", w->path);
    } else {
        ei_say("%s: cannot write the real file: %s", w->path, strerror(errno));
        errno = EIO;
        rc = -1;
    }
    int saved = errno;
    for (int c = 0; c < FD_CHUNKS; c++)  /* exit path: descriptors still mapped to w */
        if (fdmap[c] && w->refs > 0)
            for (int i = 0; i < FD_CHUNK; i++)
                if ((fdmap[c][i] & (FD_ASYNC - 1)) == (int)(w - ei_wfiles) + 1) fdmap[c][i] = 0;
    ei_real.close(w->keeper);
    w->used = 0;
    errno = saved;
    return rc;
}

/* A program descriptor of a written file went away (lock held). */
int ei_untrack(int fd)
{
    int idx = ei_fd_tracked(fd);
    if (idx == 0) return 0;
    fdmap_set(fd, 0);
    struct wfile *w = &ei_wfiles[idx - 1];
    return --w->refs == 0 ? wfile_finish(w) : 0;
}

static void track(int fd, int idx)
{
    if (fdmap_set(fd, (idx + 1) | (ei_wfiles[idx].async ? FD_ASYNC : 0)) == 0) ei_wfiles[idx].refs++;
}

/* ---- initialization --------------------------------------------------------------- */

static mode_t read_umask(void)
{
    int fd = ei_real.open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 022;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    ei_real.close(fd);
    if (n <= 0) return 022;
    buf[n] = '\0';
    char *p = strstr(buf, "\nUmask:");
    return p ? (mode_t)strtol(p + 7, NULL, 8) : 022;
}

static void atfork_prepare(void) { pthread_mutex_lock(&ei_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&ei_lock); }

static void atfork_child(void)
{
    /* The child gets its own daemon connection; the files stay the parent's: the
     * child's copies of their descriptors are plain descriptors. */
    ei_after_fork_child();
    for (int i = 0; i < nwfiles; i++)
        if (ei_wfiles[i].used) { ei_real.close(ei_wfiles[i].keeper); ei_wfiles[i].used = 0; }
    for (int c = 0; c < FD_CHUNKS; c++)
        if (fdmap[c]) memset(fdmap[c], 0, FD_CHUNK * sizeof(int));
    pthread_mutex_init(&ei_lock, NULL);
}

static void init_once(void)
{
    ei_real.open = dlsym(RTLD_NEXT, "open");
    ei_real.openat = dlsym(RTLD_NEXT, "openat");
    ei_real.close = dlsym(RTLD_NEXT, "close");
    ei_real.dup = dlsym(RTLD_NEXT, "dup");
    ei_real.dup2 = dlsym(RTLD_NEXT, "dup2");
    ei_real.dup3 = dlsym(RTLD_NEXT, "dup3");
    ei_real.fcntl = dlsym(RTLD_NEXT, "fcntl");
    ei_real.rename = dlsym(RTLD_NEXT, "rename");
    ei_real.unlink = dlsym(RTLD_NEXT, "unlink");
    const char *rules = getenv("ENSIO_TRANSFER_RULES");
    if (rules == NULL || getenv("ENSIO_TRANSFER_SOCKET") == NULL) return;
    if (ei_load_rules(rules) != 0) {
        ei_say("cannot read the rules file %s: no file is transferred", rules);
        return;
    }
    ei_umask = read_umask();
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    ei_active = 1;
}

void ei_init(void) { pthread_once(&once, init_once); }

__attribute__((constructor)) static void ei_constructor(void)
{
    ei_init();
    if (ei_active) ei_announce_run();  /* outside the once: it talks to the daemon */
}

/* Normal exit with a written file still open: complete it, as the kernel's close
 * would have made the file complete on disk. (A killed producer runs no destructor:
 * its files fail, which is the point.) */
__attribute__((destructor)) static void ei_destructor(void)
{
    if (!ei_active) return;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;  /* another thread stuck in a request: its files fail, as on a kill */
    if (pthread_mutex_timedlock(&ei_lock, &until) != 0) return;
    for (int i = 0; i < nwfiles; i++)
        if (ei_wfiles[i].used) wfile_finish(&ei_wfiles[i]);
    pthread_mutex_unlock(&ei_lock);
}

/* ---- open ------------------------------------------------------------------------- */

int ei_set_cloexec(int fd, int want)
{
    int fl = ei_real.fcntl(fd, F_GETFD);
    if (fl >= 0 && !!(fl & FD_CLOEXEC) != !!want)
        ei_real.fcntl(fd, F_SETFD, want ? fl | FD_CLOEXEC : fl & ~FD_CLOEXEC);
    return fd;
}

static int reopen_local(struct wfile *w, int flags, int writing)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", w->keeper);
    int fd = ei_real.open(proc, (writing ? O_RDWR : O_RDONLY) | (flags & (O_APPEND | O_CLOEXEC)));
    if (fd < 0) return -1;
    if (writing) {
        if ((flags & O_TRUNC) && ftruncate(fd, 0) != 0) { ei_real.close(fd); return -1; }
        if (flags & O_TRUNC) w->whole = w->async;  /* content gone untracked: send it all */
        track(fd, (int)(w - ei_wfiles));
    }
    return fd;
}

/* A producer's open for writing: a memfd the daemon supplies and registers (pre-faulted
 * from its pool when it has one ready: the writes then copy into existing pages).
 * Returns the descriptor, -1 with errno, or -2: use the real path. */
static int produce(const struct ei_rule *r, const char *path, int flags, mode_t mode)
{
    int mfd = -1;
    char msg[PATH_MAX + 1024], reply[EI_REPLY_MAX];
    mode_t perm = (flags & O_CREAT ? mode : 0666) & ~ei_umask & 07777;
    int n = snprintf(msg, sizeof msg,
                     "CREATE\npath=%s\nconn=%s\nbudget=%lld\nfallback=%s\npersist=%d\n"
                     "mode=%o\nexcl=%d\nkeep=%d\nexist=%d",
                     path, r->conn, r->budget, r->fallback, r->persist, (unsigned)perm,
                     (flags & O_CREAT) && (flags & O_EXCL), !(flags & O_TRUNC),
                     !(flags & O_CREAT));
    if (r->targets[0])  /* streamed to other hosts (sync or async) */
        n += snprintf(msg + n, sizeof msg - (size_t)n, "\ntargets=%s\nxmode=%s", r->targets,
                      r->async ? "async" : "sync");
    if (ei_request(msg, (size_t)n, -1, reply, &mfd) != 0 || ei_reply_is(reply, "FALLBACK")) {
        if (mfd >= 0) ei_real.close(mfd);
        return -2;
    }
    if (!ei_reply_is(reply, "OK") || mfd < 0) {
        if (mfd >= 0) ei_real.close(mfd);
        errno = (int)ei_reply_long(reply, "errno", EIO);
        return -1;
    }
    int idx = wfile_new();
    int keeper = idx < 0 ? -1 : ei_real.fcntl(mfd, F_DUPFD_CLOEXEC, 500);
    if (keeper < 0) keeper = idx < 0 ? -1 : ei_real.dup(mfd);
    if (keeper < 0) {  /* cannot track it: the daemon sees the file fail at our exit */
        ei_real.close(mfd);
        errno = EMFILE;
        return -1;
    }
    struct wfile *w = &ei_wfiles[idx];
    w->used = 1;
    w->keeper = keeper;
    w->refs = 0;
    w->async = r->async && r->targets[0];
    w->whole = !(flags & O_TRUNC) && w->async;  /* kept content: never reported as written */
    w->nranges = 0;
    w->bytes = 0;
    w->id = ei_reply_long(reply, "id", 0);
    w->mode = (mode_t)ei_reply_long(reply, "mode", (long)perm);
    snprintf(w->path, sizeof w->path, "%s", path);
    if (flags & O_APPEND) ei_real.fcntl(mfd, F_SETFL, O_APPEND);
    track(mfd, idx);
    return ei_set_cloexec(mfd, flags & O_CLOEXEC);
}

/* Every open variant ends here. Returns -2 when the real function should run. */
int ei_open_path(int dirfd, const char *path, int flags, mode_t mode)
{
    ei_init();
    char canon[PATH_MAX];
    int writing = (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC));
    const struct ei_rule *r = ei_classify(dirfd, path, canon,
                                          writing ? EI_PRODUCER : EI_CONSUMER);
    if (r == NULL || (flags & (O_DIRECTORY | O_PATH))) return -2;
    pthread_mutex_lock(&ei_lock);
    int fd = -2;
    struct wfile *w = wfile_by_path(canon);
    if (w && (flags & O_CREAT) && (flags & O_EXCL)) {
        errno = EEXIST;
        fd = -1;
    } else if (w) {
        fd = reopen_local(w, flags, writing);
    } else if (writing && !(r->role & EI_PRODUCER)) {
        errno = EROFS;  /* a consumer reads transferred files; it does not write them */
        fd = -1;
    } else if (ei_daemon_usable()) {
        fd = writing ? produce(r, canon, flags, mode) : ei_consume(r, canon, flags);
    }
    pthread_mutex_unlock(&ei_lock);
    return fd == -3 ? ei_consume_wait(r, canon, flags) : fd;
}

static mode_t va_mode(int flags, va_list ap)
{
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

#define OPEN_BODY(dirfd, path, flags, mode, realcall)  \
    int fd_ = ei_open_path(dirfd, path, flags, mode);  \
    return fd_ != -2 ? fd_ : (realcall)

EXPORT int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = va_mode(flags, ap);
    va_end(ap);
    OPEN_BODY(AT_FDCWD, path, flags, mode, ei_real.open(path, flags, mode));
}

EXPORT int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = va_mode(flags, ap);
    va_end(ap);
    OPEN_BODY(AT_FDCWD, path, flags, mode, ei_real.open(path, flags | O_LARGEFILE, mode));
}

EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = va_mode(flags, ap);
    va_end(ap);
    OPEN_BODY(dirfd, path, flags, mode, ei_real.openat(dirfd, path, flags, mode));
}

EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = va_mode(flags, ap);
    va_end(ap);
    OPEN_BODY(dirfd, path, flags, mode, ei_real.openat(dirfd, path, flags | O_LARGEFILE, mode));
}

EXPORT int creat(const char *path, mode_t mode)
{
    return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

EXPORT int creat64(const char *path, mode_t mode)
{
    return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

/* _FORTIFY_SOURCE variants: open without a mode argument (O_CREAT is refused there). */
EXPORT int __open_2(const char *path, int flags) { return open(path, flags); }
EXPORT int __open64_2(const char *path, int flags) { return open(path, flags); }
EXPORT int __openat_2(int dirfd, const char *path, int flags) { return openat(dirfd, path, flags); }
EXPORT int __openat64_2(int dirfd, const char *path, int flags)
{
    return openat(dirfd, path, flags);
}

/* ---- close and the descriptor copies ---------------------------------------------- */

EXPORT int close(int fd)
{
    ei_init();
    if (ei_fd_tracked(fd) == 0 && !ei_fd_partial(fd)) return ei_real.close(fd);
    pthread_mutex_lock(&ei_lock);
    int rc = ei_real.close(fd);
    int saved = errno;
    ei_partial_untrack(fd);
    if (ei_untrack(fd) != 0) { rc = -1; saved = errno; }
    pthread_mutex_unlock(&ei_lock);
    errno = saved;
    return rc;
}

/* newfd now refers to what oldfd refers to; newfd's previous file (if any) lost a reference. */
static int copied(int oldfd, int newfd, int result)
{
    if (result < 0 || oldfd == newfd) return result;
    pthread_mutex_lock(&ei_lock);
    int saved = errno;
    ei_untrack(newfd);
    ei_partial_untrack(newfd);
    int idx = ei_fd_tracked(oldfd);
    if (idx) track(newfd, idx - 1);
    ei_partial_copy(oldfd, newfd);
    pthread_mutex_unlock(&ei_lock);
    errno = saved;
    return result;
}

EXPORT int dup(int fd)
{
    ei_init();
    int r = ei_real.dup(fd);
    return ei_fd_tracked(fd) || ei_fd_partial(fd) ? copied(fd, r, r) : r;
}

EXPORT int dup2(int oldfd, int newfd)
{
    ei_init();
    int r = ei_real.dup2(oldfd, newfd);
    return ei_fd_tracked(oldfd) || ei_fd_tracked(newfd) || ei_fd_partial(oldfd)
           || ei_fd_partial(newfd) ? copied(oldfd, newfd, r) : r;
}

EXPORT int dup3(int oldfd, int newfd, int flags)
{
    ei_init();
    int r = ei_real.dup3(oldfd, newfd, flags);
    return ei_fd_tracked(oldfd) || ei_fd_tracked(newfd) || ei_fd_partial(oldfd)
           || ei_fd_partial(newfd) ? copied(oldfd, newfd, r) : r;
}

static int fcntl_common(int fd, int cmd, void *arg)
{
    ei_init();
    int r = ei_real.fcntl(fd, cmd, arg);
    if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && r >= 0
        && (ei_fd_tracked(fd) || ei_fd_partial(fd)))
        return copied(fd, r, r);
    return r;
}

EXPORT int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return fcntl_common(fd, cmd, arg);
}

EXPORT int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return fcntl_common(fd, cmd, arg);
}
