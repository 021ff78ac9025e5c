/* ensio transfer interposer: partial descriptors (serve_partial).
 *
 * A consumer of a serve_partial connection may open a file still arriving from another
 * host once its final size is known: the daemon then sends two descriptors, the memory
 * file (already at its final size, its missing bytes holes of zeros) and a progress map
 * (ensio/transfer/progress.py documents its layout): one page the receiving daemon
 * writes, mapped read-only here. Such a descriptor, and every dup of it, is "partial":
 * before any call that reads its bytes (read, pread, readv, preadv and their _chk,
 * 64-bit and v2 forms; sendfile, splice and copy_file_range from it) the range is
 * waited for until the watermark passes its end (a futex on the map's sequence word,
 * woken by the daemon; a timed wake-up every 200 ms checks the daemon is alive), so a
 * read never returns the zeros of a missing byte: EIO if the stream broke off or the
 * daemon died. mmap of a partial descriptor, and exec (execve, execv, execvp, execvpe,
 * fexecve, posix_spawn, posix_spawnp) while partial descriptors are open, wait for the
 * whole file: neither a mapping's loads nor another program's reads can be intercepted.
 * stdio streams of partial descriptors are fopencookie streams reading through read().
 *
 * Once a read finds the file complete its descriptor stops being partial: every later
 * call costs one table lookup (pmap, read without the lock), as for any descriptor.
 * execl, execlp and execle are not interposed (glibc reaches execve internally there).
 */
#include "ensio_interpose.h"

#include <errno.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define REAL(type, name) \
    static __typeof__(type) real_##name; \
    if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

#define P_MAGIC 0x45495047u
#define P_COMPLETE 1u
#define P_FAILED 2u
#define P_PAGE 4096
#define P_CHUNK 1024
#define P_CHUNKS 1024

struct pfile {
    int refs;               /* descriptors referring to it (lock held) */
    const uint32_t *head;   /* the mapped progress page */
    long long size;
    dev_t dev;              /* the memory file: a stale number (closed behind our back) */
    ino_t ino;
};

static struct pfile **pmap[P_CHUNKS];  /* fd -> its pfile; chunks never freed */

static struct pfile *pfile_of(int fd)
{
    if (fd < 0 || fd >= P_CHUNK * P_CHUNKS) return NULL;
    struct pfile **chunk = __atomic_load_n(&pmap[fd / P_CHUNK], __ATOMIC_ACQUIRE);
    return chunk ? __atomic_load_n(&chunk[fd % P_CHUNK], __ATOMIC_ACQUIRE) : NULL;
}

int ei_fd_partial(int fd) { return pfile_of(fd) != NULL; }

static int pmap_set(int fd, struct pfile *p)  /* lock held */
{
    if (fd < 0 || fd >= P_CHUNK * P_CHUNKS) return -1;
    struct pfile **chunk = pmap[fd / P_CHUNK];
    if (chunk == NULL) {
        if (p == NULL) return 0;
        chunk = calloc(P_CHUNK, sizeof *chunk);
        if (chunk == NULL) return -1;
        __atomic_store_n(&pmap[fd / P_CHUNK], chunk, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&chunk[fd % P_CHUNK], p, __ATOMIC_RELEASE);
    return 0;
}

static void *map_page(int fd)
{
    return (void *)syscall(SYS_mmap, NULL, (size_t)P_PAGE, PROT_READ, MAP_SHARED, fd, (off_t)0);
}

int ei_partial_open(int fd, int mapfd)
{
    struct stat st;
    void *head = fstat(fd, &st) == 0 ? map_page(mapfd) : MAP_FAILED;
    ei_real.close(mapfd);
    struct pfile *p = head == MAP_FAILED ? NULL : malloc(sizeof *p);
    if (p == NULL || ((const uint32_t *)head)[0] != P_MAGIC) {
        if (head != MAP_FAILED) munmap(head, P_PAGE);
        free(p);
        errno = EIO;
        return -1;
    }
    p->refs = 0;
    p->head = head;
    p->size = (long long)st.st_size;
    p->dev = st.st_dev;
    p->ino = st.st_ino;
    if (pmap_set(fd, p) != 0) {
        munmap(head, P_PAGE);
        free(p);
        errno = ENOMEM;
        return -1;
    }
    p->refs = 1;
    return 0;
}

void ei_partial_untrack(int fd)
{
    struct pfile *p = pfile_of(fd);
    if (p == NULL) return;
    pmap_set(fd, NULL);
    if (--p->refs == 0) {
        munmap((void *)p->head, P_PAGE);
        free(p);
    }
}

void ei_partial_copy(int oldfd, int newfd)
{
    struct pfile *p = pfile_of(oldfd);
    if (p != NULL && pmap_set(newfd, p) == 0) p->refs++;
}

/* The file is complete: this descriptor is an ordinary one from now on. */
static void settled(int fd, struct pfile *p)
{
    pthread_mutex_lock(&ei_lock);
    if (pfile_of(fd) == p) ei_partial_untrack(fd);
    pthread_mutex_unlock(&ei_lock);
}

/* Whether fd still refers to p's memory file (not closed and reused behind our back). */
static int same_file(int fd, const struct pfile *p)
{
    struct stat st;
    return fstat(fd, &st) == 0 && st.st_dev == p->dev && st.st_ino == p->ino;
}

/* Wait until bytes [off, end) of fd's file are final: 0, or -1 with errno (EIO). */
static int wait_range(int fd, struct pfile *p, long long off, long long end)
{
    const uint32_t *state = p->head + 1, *seq = p->head + 2, *pid = p->head + 3;
    const uint64_t *mark = (const uint64_t *)(p->head + 6);
    if (end > p->size) end = p->size;
    if (off >= end) return 0;  /* nothing to read (at or past the end) */
    int checked = 0;
    for (;;) {
        uint32_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
        uint32_t st = __atomic_load_n(state, __ATOMIC_ACQUIRE);
        uint64_t wm = __atomic_load_n(mark, __ATOMIC_ACQUIRE);
        uint32_t s2 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
        if (s1 != s2) continue;  /* changed while we looked: look again */
        if (!(s1 & 1)) {  /* stable (even); odd: the daemon is writing, wait below */
            if (st == P_COMPLETE) { settled(fd, p); return 0; }
            if ((long long)wm >= end) return 0;  /* arrived (also of a file failed later) */
            if (!checked) {
                if (!same_file(fd, p)) { settled(fd, p); return 0; }  /* a stale number */
                checked = 1;
            }
            if (st == P_FAILED) { errno = EIO; return -1; }
        }
        struct timespec ts = {0, 200 * 1000 * 1000};
        long r = syscall(SYS_futex, seq, FUTEX_WAIT, s2, &ts, NULL, 0);
        if (r != 0 && errno == ETIMEDOUT && kill((pid_t)*pid, 0) != 0 && errno == ESRCH) {
            ei_say("the staging daemon (pid %u) died while this file arrived: EIO", *pid);
            errno = EIO;
            return -1;
        }
    }
}

int ei_partial_wait(int fd, long long off, long long n)
{
    struct pfile *p = pfile_of(fd);
    if (p == NULL) return 0;
    if (n < 0) return wait_range(fd, p, 0, p->size);  /* the whole file */
    if (off < 0) {  /* at the descriptor's offset */
        off = (long long)lseek(fd, 0, SEEK_CUR);
        if (off < 0) return wait_range(fd, p, 0, p->size);
    }
    return wait_range(fd, p, off, off + n);
}

/* Every partial descriptor (cloexec_too: also those closed by exec) waits for its
 * whole file: another program's reads would see the holes. */
static int settle_all(int cloexec_too)
{
    for (int c = 0; c < P_CHUNKS; c++) {
        struct pfile **chunk = __atomic_load_n(&pmap[c], __ATOMIC_ACQUIRE);
        for (int i = 0; chunk && i < P_CHUNK; i++) {
            int fd = c * P_CHUNK + i;
            if (chunk[i] == NULL) continue;
            int fl = ei_real.fcntl(fd, F_GETFD);
            if (fl < 0 || (!cloexec_too && (fl & FD_CLOEXEC))) continue;
            if (ei_partial_wait(fd, 0, -1) != 0) return -1;
        }
    }
    return 0;
}

static size_t iov_len(const struct iovec *iov, int cnt)
{
    size_t n = 0;
    for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
    return n;
}

#define WAIT_OR_FAIL(fd, off, n, fail) \
    if (pfile_of(fd) && ei_partial_wait(fd, off, n) != 0) return fail

/* ---- reads ------------------------------------------------------------------------ */

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
    REAL(ssize_t (*)(int, void *, size_t), read);
    WAIT_OR_FAIL(fd, -1, (long long)n, -1);
    return real_read(fd, buf, n);
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
    REAL(ssize_t (*)(int, void *, size_t, size_t), __read_chk);
    WAIT_OR_FAIL(fd, -1, (long long)n, -1);
    return real___read_chk(fd, buf, n, buflen);
}

EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    REAL(ssize_t (*)(int, void *, size_t, off_t), pread);
    WAIT_OR_FAIL(fd, off, (long long)n, -1);
    return real_pread(fd, buf, n, off);
}

EXPORT ssize_t pread64(int fd, void *buf, size_t n, off_t off)
{
    REAL(ssize_t (*)(int, void *, size_t, off_t), pread64);
    WAIT_OR_FAIL(fd, off, (long long)n, -1);
    return real_pread64(fd, buf, n, off);
}

EXPORT ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
    REAL(ssize_t (*)(int, void *, size_t, off_t, size_t), __pread_chk);
    WAIT_OR_FAIL(fd, off, (long long)n, -1);
    return real___pread_chk(fd, buf, n, off, buflen);
}

EXPORT ssize_t __pread64_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
    REAL(ssize_t (*)(int, void *, size_t, off_t, size_t), __pread64_chk);
    WAIT_OR_FAIL(fd, off, (long long)n, -1);
    return real___pread64_chk(fd, buf, n, off, buflen);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
    REAL(ssize_t (*)(int, const struct iovec *, int), readv);
    WAIT_OR_FAIL(fd, -1, (long long)iov_len(iov, cnt), -1);
    return real_readv(fd, iov, cnt);
}

EXPORT ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
    REAL(ssize_t (*)(int, const struct iovec *, int, off_t), preadv);
    WAIT_OR_FAIL(fd, off, (long long)iov_len(iov, cnt), -1);
    return real_preadv(fd, iov, cnt, off);
}

EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off_t off)
{
    REAL(ssize_t (*)(int, const struct iovec *, int, off_t), preadv64);
    WAIT_OR_FAIL(fd, off, (long long)iov_len(iov, cnt), -1);
    return real_preadv64(fd, iov, cnt, off);
}

EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
    REAL(ssize_t (*)(int, const struct iovec *, int, off_t, int), preadv2);
    WAIT_OR_FAIL(fd, off, (long long)iov_len(iov, cnt), -1);  /* off -1: the offset */
    return real_preadv2(fd, iov, cnt, off, flags);
}

EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
    REAL(ssize_t (*)(int, const struct iovec *, int, off_t, int), preadv64v2);
    WAIT_OR_FAIL(fd, off, (long long)iov_len(iov, cnt), -1);
    return real_preadv64v2(fd, iov, cnt, off, flags);
}

/* Kernel-side copies out of a partial file: the whole file first (simple, and rare). */
EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t n)
{
    REAL(ssize_t (*)(int, int, off_t *, size_t), sendfile);
    WAIT_OR_FAIL(in, 0, -1, -1);
    return real_sendfile(out, in, off, n);
}

EXPORT ssize_t sendfile64(int out, int in, off_t *off, size_t n)
{
    REAL(ssize_t (*)(int, int, off_t *, size_t), sendfile64);
    WAIT_OR_FAIL(in, 0, -1, -1);
    return real_sendfile64(out, in, off, n);
}

EXPORT ssize_t copy_file_range(int in, off_t *in_off, int out, off_t *out_off, size_t n,
                               unsigned flags)
{
    REAL(ssize_t (*)(int, off_t *, int, off_t *, size_t, unsigned), copy_file_range);
    WAIT_OR_FAIL(in, 0, -1, -1);
    return real_copy_file_range(in, in_off, out, out_off, n, flags);
}

EXPORT ssize_t splice(int in, off_t *in_off, int out, off_t *out_off, size_t n, unsigned flags)
{
    REAL(ssize_t (*)(int, off_t *, int, off_t *, size_t, unsigned), splice);
    WAIT_OR_FAIL(in, 0, -1, -1);
    return real_splice(in, in_off, out, out_off, n, flags);
}

/* mmap: the real one is the system call itself (dlsym may map memory: no recursion). */
EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    WAIT_OR_FAIL(fd, 0, -1, MAP_FAILED);
    return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return mmap(addr, len, prot, flags, fd, off);
}

/* ---- exec: another program cannot wait for the bytes ------------------------------ */

#define SETTLE(cloexec_too) \
    if (settle_all(cloexec_too) != 0) return -1

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    REAL(int (*)(const char *, char *const[], char *const[]), execve);
    SETTLE(0);
    return real_execve(path, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[])
{
    REAL(int (*)(const char *, char *const[]), execv);
    SETTLE(0);
    return real_execv(path, argv);
}

EXPORT int execvp(const char *file, char *const argv[])
{
    REAL(int (*)(const char *, char *const[]), execvp);
    SETTLE(0);
    return real_execvp(file, argv);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    REAL(int (*)(const char *, char *const[], char *const[]), execvpe);
    SETTLE(0);
    return real_execvpe(file, argv, envp);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    REAL(int (*)(int, char *const[], char *const[]), fexecve);
    SETTLE(0);
    return real_fexecve(fd, argv, envp);
}

/* posix_spawn's file actions may dup a close-on-exec descriptor: all of them settle. */
EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    REAL(int (*)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                 const posix_spawnattr_t *, char *const[], char *const[]), posix_spawn);
    if (settle_all(1) != 0) return errno;
    return real_posix_spawn(pid, path, fa, attr, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    REAL(int (*)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                 const posix_spawnattr_t *, char *const[], char *const[]), posix_spawnp);
    if (settle_all(1) != 0) return errno;
    return real_posix_spawnp(pid, file, fa, attr, argv, envp);
}
