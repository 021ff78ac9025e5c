/* ensio transfer interposer: written ranges of async files (dirty-range tracking).
 *
 * Only for descriptors of files this process writes on an async connection with
 * other hosts (fdmap's FD_ASYNC bit, read without a lock): every other descriptor
 * costs one table lookup and goes straight to glibc. A write's range is known after
 * it returns (pwrite: its offset; write: the offset after it minus its length) and
 * goes into the file's batch (ei_wrote), reported to the daemon in one RANGES packet
 * per 1 MiB or 64 separate ranges: sequential writes merge into one range.
 *
 * A write longer than EI_SLICE (4 MiB) is made as several writes of EI_SLICE bytes,
 * each reported when it returns (the end of a write of 1 MiB or more at once, as
 * before): the daemon starts sending a large write (HDF5 writes a contiguous variable
 * in one pwrite, 16 MiB in the benchmark) while the rest of it is still being copied,
 * so less is left to send when the file's last write is followed by its close (which
 * waits for it). The result is the one write's: all the bytes, or, if a later slice
 * fails, the count written before it (a short write, which callers of write(2) must
 * handle anyway). pwrite on an O_APPEND descriptor is not sliced.
 *
 * Writes glibc makes internally (stdio's fwrite) are not seen here: files opened with
 * fopen are sent whole at close (ensio_interpose_stdio.c). ftruncate reports the bytes
 * between the old and new size. Not seen either: stores through a shared writable
 * mmap of the file (mmap is not interposed: dlsym itself maps memory). netCDF and
 * HDF5 write their files with write/pwrite.
 */
#include "ensio_interpose.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define REAL(type, name) \
    static __typeof__(type) real_##name; \
    if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

/* After a write at the descriptor's offset of r bytes: the range it covered. */
/* "off+len,..." of w's batch into out (which has room for EI_BATCH ranges). */
int ei_batch_text(struct wfile *w, char *out, size_t room)
{
    int n = 0;
    for (int i = 0; i < w->nranges && (size_t)n < room; i++)
        n += snprintf(out + n, room - (size_t)n, "%s%lld+%lld", i ? "," : "", w->ranges[i][0],
                      w->ranges[i][1]);
    return n;
}

/* Report w's batch to the daemon (lock held): one RANGES packet for many writes, not
 * answered (ack=0): the producer goes on writing at once, however busy the daemon is
 * (its sender threads share the CPU with it). A full socket buffer still holds the
 * producer back; the next request's answer is in order behind it (one connection). */
static void wfile_report(struct wfile *w)
{
    if (w->nranges == 0) return;
    char msg[64 + EI_BATCH * 44];
    int n = snprintf(msg, sizeof msg, "RANGES\nid=%ld\nack=0\nr=", w->id);
    n += ei_batch_text(w, msg + n, sizeof msg - (size_t)n);
    w->nranges = 0;
    w->bytes = 0;
    if ((size_t)n < sizeof msg) ei_send_oneway(msg, (size_t)n);
}

/* [off, off+n) of fd was written: into the batch, reported when full, or at once with
 * `now` (the end of a write of EI_BATCH_BYTES or more, as one such write would be). */
static void wrote(int fd, long long off, long long n, int now)
{
    if (n <= 0) return;
    pthread_mutex_lock(&ei_lock);
    int idx = ei_fd_tracked(fd);
    if (idx) {
        struct wfile *w = &ei_wfiles[idx - 1];
        long long (*last)[2] = w->nranges ? &w->ranges[w->nranges - 1] : NULL;
        if (last && (*last)[0] + (*last)[1] == off) {
            (*last)[1] += n;  /* sequential writes: one range */
        } else {
            if (w->nranges == EI_BATCH) wfile_report(w);
            w->ranges[w->nranges][0] = off;
            w->ranges[w->nranges][1] = n;
            w->nranges++;
        }
        w->bytes += n;
        if (now || w->bytes >= EI_BATCH_BYTES) wfile_report(w);
    }
    pthread_mutex_unlock(&ei_lock);
}

void ei_wrote(int fd, long long off, long long n) { wrote(fd, off, n, 0); }

void ei_mark_whole(int fd)
{
    pthread_mutex_lock(&ei_lock);
    int idx = ei_fd_tracked(fd);
    if (idx) ei_wfiles[idx - 1].whole = 1;
    pthread_mutex_unlock(&ei_lock);
}

/* The COMPLETE packet of w (lock held): async, with the ranges written since the last
 * report (sent after the close: the dirty remainder), or all of it when untracked. */
int ei_complete_text(struct wfile *w, char *msg, size_t room)
{
    int n = snprintf(msg, room, "COMPLETE\nid=%ld", w->id);
    if (w->whole) {
        struct stat st;
        if (fstat(w->keeper, &st) == 0)
            n += snprintf(msg + n, room - (size_t)n, "\nr=0+%lld", (long long)st.st_size);
    } else if (w->nranges) {
        n += snprintf(msg + n, room - (size_t)n, "\nr=");
        n += ei_batch_text(w, msg + n, room - (size_t)n);
    }
    w->nranges = 0;
    return n;
}

static void wrote_at_offset(int fd, ssize_t r)
{
    if (r <= 0) return;
    off_t end = lseek(fd, 0, SEEK_CUR);
    if (end >= r) ei_wrote(fd, (long long)end - r, r);
    else ei_mark_whole(fd);
}

#define EI_SLICE ((size_t)4 << 20)  /* async: longer writes go in slices, each reported */

/* write(2) of an async descriptor, in slices (see the top of this file). */
static ssize_t sliced_write(ssize_t (*real)(int, const void *, size_t), int fd,
                            const char *buf, size_t n)
{
    size_t done = 0;
    do {
        size_t k = n - done < EI_SLICE ? n - done : EI_SLICE;
        ssize_t r = real(fd, buf + done, k);
        if (r < 0) return done ? (ssize_t)done : -1;
        done += (size_t)r;
        off_t end = r > 0 ? lseek(fd, 0, SEEK_CUR) : 0;
        if (r > 0 && end >= r)
            wrote(fd, (long long)end - r, r, done == n && n >= EI_BATCH_BYTES);
        else if (r > 0)
            ei_mark_whole(fd);
        if ((size_t)r < k) break;
    } while (done < n);
    return (ssize_t)done;
}

/* pwrite(2) of an async descriptor, in slices. On an O_APPEND descriptor Linux appends
 * whatever the offset says: one write, and the whole file is sent at the close. */
static ssize_t sliced_pwrite(ssize_t (*real)(int, const void *, size_t, off_t), int fd,
                             const char *buf, size_t n, off_t off)
{
    if (ei_real.fcntl(fd, F_GETFL) & O_APPEND) {
        ssize_t r = real(fd, buf, n, off);
        if (r > 0) ei_mark_whole(fd);
        return r;
    }
    size_t done = 0;
    do {
        size_t k = n - done < EI_SLICE ? n - done : EI_SLICE;
        ssize_t r = real(fd, buf + done, k, off + (off_t)done);
        if (r < 0) return done ? (ssize_t)done : -1;
        if (r > 0) wrote(fd, (long long)off + (long long)done, r,
                         done + (size_t)r == n && n >= EI_BATCH_BYTES);
        done += (size_t)r;
        if ((size_t)r < k) break;
    } while (done < n);
    return (ssize_t)done;
}

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
    REAL(ssize_t (*)(int, const void *, size_t), write);
    if (!ei_fd_async(fd)) return real_write(fd, buf, n);
    return sliced_write(real_write, fd, buf, n);
}

EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    REAL(ssize_t (*)(int, const void *, size_t, off_t), pwrite);
    if (!ei_fd_async(fd)) return real_pwrite(fd, buf, n, off);
    return sliced_pwrite(real_pwrite, fd, buf, n, off);
}

EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
    REAL(ssize_t (*)(int, const void *, size_t, off_t), pwrite64);
    if (!ei_fd_async(fd)) return real_pwrite64(fd, buf, n, off);
    return sliced_pwrite(real_pwrite64, fd, buf, n, off);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
    REAL(ssize_t (*)(int, const struct iovec *, int), writev);
    if (!ei_fd_async(fd)) return real_writev(fd, iov, cnt);
    ssize_t r = real_writev(fd, iov, cnt);
    wrote_at_offset(fd, r);
    return r;
}

EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
    REAL(ssize_t (*)(int, const struct iovec *, int, off_t), pwritev);
    ssize_t r = real_pwritev(fd, iov, cnt, off);
    if (r > 0 && ei_fd_async(fd)) ei_wrote(fd, off, r);
    return r;
}

EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off)
{
    REAL(ssize_t (*)(int, const struct iovec *, int, off_t), pwritev64);
    ssize_t r = real_pwritev64(fd, iov, cnt, off);
    if (r > 0 && ei_fd_async(fd)) ei_wrote(fd, off, r);
    return r;
}

static int truncated(int fd, off_t len, int (*real)(int, off_t))
{
    if (!ei_fd_async(fd)) return real(fd, len);
    struct stat st;
    long long before = fstat(fd, &st) == 0 ? (long long)st.st_size : -1;
    int r = real(fd, len);
    if (r == 0 && before < 0) ei_mark_whole(fd);
    else if (r == 0 && before != len)
        ei_wrote(fd, before < len ? before : len, before < len ? len - before : before - len);
    return r;
}

EXPORT int ftruncate(int fd, off_t len)
{
    REAL(int (*)(int, off_t), ftruncate);
    return truncated(fd, len, real_ftruncate);
}

EXPORT int ftruncate64(int fd, off_t len)
{
    REAL(int (*)(int, off_t), ftruncate64);
    return truncated(fd, len, real_ftruncate64);
}
