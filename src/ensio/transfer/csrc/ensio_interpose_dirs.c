/* ensio transfer interposer: directory listings that show the held files.
 *
 * A transferred file lives in the daemon's memory, not in its directory, yet `ls`,
 * glob(3), shell wildcards and CDO's file-name expansion find files by listing the
 * directory. So opendir/fdopendir of a directory some rule's pattern can hold files in
 * (ensio_interpose_paths.c, ei_dir_may_hold) asks the daemon for its held names (LIST,
 * ensio/transfer/view.py), and readdir/readdir64 return the real entries first, then
 * the held names the real listing did not have (DT_REG; stat answers size and times
 * from the memory, ensio_interpose_names.c). getdents64 (programs that read the
 * directory themselves) does the same per descriptor. The listing is taken once per
 * opendir (or rewinddir): a file created afterwards appears at the next opendir, as a
 * kernel directory stream may or may not show it.
 *
 * glibc's own glob(), scandir() and wordexp() read directories through internal calls
 * that no LD_PRELOAD library sees: ensio_interpose_glob.c puts them on these functions.
 *
 * Every other directory costs one test (no listing kept) per readdir.
 */
#include "ensio_interpose.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define REAL(type, name) \
    static __typeof__(type) real_##name; \
    if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

/* The held names of one directory stream (a DIR, or a descriptor read by getdents64). */
struct view {
    struct view *next;
    DIR *dir;              /* NULL: a getdents64 descriptor */
    int fd;
    dev_t dev;
    ino_t ino;
    char dirpath[PATH_MAX];
    char *text;            /* the names, each '\0'-terminated */
    char **names;
    unsigned char *seen;   /* the real listing had the name */
    size_t n, emit;        /* names, next held name to return */
    int real_done;
    struct dirent64 ent;
};

static struct view *views;  /* guarded by ei_lock */
static int nviews;          /* read without the lock: 0 means no view to look up */

static void view_free(struct view *v)
{
    free(v->text);
    free(v->names);
    free(v->seen);
    free(v);
}

/* The daemon's held names of dir into v (lock held); -1 without a daemon. */
static int fetch(struct view *v)
{
    char msg[PATH_MAX + 16], reply[EI_REPLY_MAX];
    int fd = -1;
    int n = snprintf(msg, sizeof msg, "LIST\ndir=%s", v->dirpath);
    if (n <= 0 || (size_t)n >= sizeof msg || !ei_daemon_usable()
        || ei_request(msg, (size_t)n, -1, reply, &fd) != 0 || !ei_reply_is(reply, "OK")
        || fd < 0) {
        if (fd >= 0) ei_real.close(fd);
        return -1;
    }
    long bytes = ei_reply_long(reply, "bytes", 0), got = 0;
    v->text = malloc((size_t)bytes + 1);
    while (v->text && got < bytes) {
        ssize_t r = pread(fd, v->text + got, (size_t)(bytes - got), got);
        if (r <= 0) break;
        got += r;
    }
    ei_real.close(fd);
    if (v->text == NULL || got != bytes) return -1;
    size_t count = 0;
    for (long i = 0; i < bytes; i++)
        if (v->text[i] == '\n') count++;
    v->names = calloc(count + 1, sizeof *v->names);
    v->seen = calloc(count + 1, 1);
    if (v->names == NULL || v->seen == NULL) return -1;
    for (char *p = v->text, *end = v->text + bytes; p < end && v->n < count;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL) break;
        *nl = '\0';
        v->names[v->n++] = p;
        p = nl + 1;
    }
    return 0;
}

/* A view of the directory (dirfd, path) if a rule can hold files there and the daemon
 * holds some; NULL otherwise (lock not held). */
static struct view *view_new(int dirfd, const char *path)
{
    ei_init();
    if (!ei_active) return NULL;
    struct view *v = calloc(1, sizeof *v);
    if (v == NULL) return NULL;
    if (ei_canonical(dirfd, path, v->dirpath) != 0 || !ei_dir_may_hold(v->dirpath)) {
        free(v);
        return NULL;
    }
    pthread_mutex_lock(&ei_lock);
    int ok = fetch(v) == 0 && v->n > 0;
    pthread_mutex_unlock(&ei_lock);
    if (!ok) {
        view_free(v);
        return NULL;
    }
    return v;
}

static void view_add(struct view *v)
{
    pthread_mutex_lock(&ei_lock);
    v->next = views;
    views = v;
    __atomic_add_fetch(&nviews, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ei_lock);
}

/* Lock held. */
static struct view **view_slot_dir(DIR *d)
{
    for (struct view **s = &views; *s; s = &(*s)->next)
        if ((*s)->dir == d) return s;
    return NULL;
}

static struct view *view_take(DIR *d)  /* removed from the list */
{
    if (__atomic_load_n(&nviews, __ATOMIC_ACQUIRE) == 0 || d == NULL) return NULL;
    pthread_mutex_lock(&ei_lock);
    struct view **s = view_slot_dir(d), *v = NULL;
    if (s) {
        v = *s;
        *s = v->next;
        __atomic_sub_fetch(&nviews, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ei_lock);
    return v;
}

static struct view *view_of(DIR *d)
{
    if (__atomic_load_n(&nviews, __ATOMIC_ACQUIRE) == 0 || d == NULL) return NULL;
    pthread_mutex_lock(&ei_lock);
    struct view **s = view_slot_dir(d);
    pthread_mutex_unlock(&ei_lock);
    return s ? *s : NULL;  /* a DIR is used by one thread at a time (POSIX) */
}

static void mark_seen(struct view *v, const char *name)
{
    for (size_t i = 0; i < v->n; i++)
        if (!v->seen[i] && strcmp(v->names[i], name) == 0) { v->seen[i] = 1; return; }
}

static unsigned long long name_ino(const struct view *v, const char *name)
{
    unsigned long long h = 1469598103934665603ULL ^ (unsigned long long)v->ino;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    return h | 1;  /* 0 would read as a deleted entry */
}

/* The next held name the real listing did not have, as v->ent; NULL at the end. */
static struct dirent64 *next_held(struct view *v)
{
    while (v->emit < v->n) {
        size_t i = v->emit++;
        if (v->seen[i]) continue;
        size_t len = strlen(v->names[i]);
        if (len >= sizeof v->ent.d_name) continue;
        memset(&v->ent, 0, sizeof v->ent);
        v->ent.d_ino = name_ino(v, v->names[i]);
        v->ent.d_off = (off64_t)(v->emit + (1ULL << 40));
        v->ent.d_reclen = sizeof v->ent;
        v->ent.d_type = DT_REG;
        memcpy(v->ent.d_name, v->names[i], len + 1);
        return &v->ent;
    }
    return NULL;
}

/* ---- DIR streams ----------------------------------------------------------------- */

static DIR *with_view(DIR *d, struct view *v)
{
    if (d == NULL || v == NULL) {
        if (v) view_free(v);
        return d;
    }
    struct stat st;
    int fd = dirfd(d);
    if (fd >= 0 && fstat(fd, &st) == 0) { v->dev = st.st_dev; v->ino = st.st_ino; }
    v->dir = d;
    v->fd = -1;
    view_add(v);
    return d;
}

EXPORT DIR *opendir(const char *path)
{
    REAL(DIR *(*)(const char *), opendir);
    DIR *d = real_opendir(path);
    if (d == NULL || path[0] == '\0') return d;
    int saved = errno;
    d = with_view(d, view_new(AT_FDCWD, path));
    errno = saved;
    return d;
}

EXPORT DIR *fdopendir(int fd)
{
    REAL(DIR *(*)(int), fdopendir);
    DIR *d = real_fdopendir(fd);
    if (d == NULL) return d;
    int saved = errno;
    d = with_view(d, view_new(fd, "."));
    errno = saved;
    return d;
}

EXPORT struct dirent64 *readdir64(DIR *d)
{
    REAL(struct dirent64 *(*)(DIR *), readdir64);
    struct view *v = view_of(d);
    if (v == NULL) return real_readdir64(d);
    if (!v->real_done) {
        int saved = errno;
        struct dirent64 *e = real_readdir64(d);
        if (e) {
            mark_seen(v, e->d_name);
            return e;
        }
        if (errno != saved) return NULL;  /* a read error, not the end */
        v->real_done = 1;
    }
    return next_held(v);
}

/* On 64-bit glibc struct dirent and struct dirent64 are the same. */
_Static_assert(sizeof(struct dirent) == sizeof(struct dirent64), "dirent is dirent64");

EXPORT struct dirent *readdir(DIR *d)
{
    REAL(struct dirent *(*)(DIR *), readdir);
    if (view_of(d) == NULL) return real_readdir(d);
    return (struct dirent *)readdir64(d);
}

EXPORT void rewinddir(DIR *d)
{
    REAL(void (*)(DIR *), rewinddir);
    real_rewinddir(d);
    struct view *v = view_of(d);
    if (v == NULL) return;
    v->real_done = 0;
    v->emit = 0;
    memset(v->seen, 0, v->n);
}

EXPORT int closedir(DIR *d)
{
    REAL(int (*)(DIR *), closedir);
    struct view *v = view_take(d);
    if (v) view_free(v);
    return real_closedir(d);
}

/* ---- getdents64: programs that read directories themselves --------------------- */

struct linux_dirent64_ {
    unsigned long long d_ino;
    long long d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* The getdents view of fd (lock held): a new one when fd reads a new directory or
 * starts again at its beginning. */
static struct view *fd_view(int fd, off_t pos)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
    struct view **s = &views;
    for (; *s; s = &(*s)->next)
        if ((*s)->dir == NULL && (*s)->fd == fd) break;
    if (*s && ((*s)->dev != st.st_dev || (*s)->ino != st.st_ino || pos == 0)) {
        struct view *old = *s;
        *s = old->next;
        __atomic_sub_fetch(&nviews, 1, __ATOMIC_RELEASE);
        view_free(old);
    }
    for (struct view *v = views; v; v = v->next)
        if (v->dir == NULL && v->fd == fd) return v;
    if (pos != 0) return NULL;  /* a stream we did not see start */
    struct view *v = calloc(1, sizeof *v);
    if (v == NULL) return NULL;
    if (ei_canonical(fd, ".", v->dirpath) != 0 || !ei_dir_may_hold(v->dirpath)
        || fetch(v) != 0 || v->n == 0) {
        view_free(v);
        return NULL;
    }
    v->fd = fd;
    v->dev = st.st_dev;
    v->ino = st.st_ino;
    v->next = views;
    views = v;
    __atomic_add_fetch(&nviews, 1, __ATOMIC_RELEASE);
    return v;
}

EXPORT ssize_t getdents64(int fd, void *buf, size_t count)
{
    REAL(ssize_t (*)(int, void *, size_t), getdents64);
    ei_init();
    if (!ei_active) return real_getdents64(fd, buf, count);
    off_t pos = lseek(fd, 0, SEEK_CUR);  /* 0: the listing starts (again) */
    ssize_t got = real_getdents64(fd, buf, count);
    if (got < 0) return got;
    int saved = errno;
    pthread_mutex_lock(&ei_lock);
    struct view *v = fd_view(fd, pos);
    if (v && got > 0) {
        for (ssize_t off = 0; off < got;) {
            struct linux_dirent64_ *e = (struct linux_dirent64_ *)((char *)buf + off);
            mark_seen(v, e->d_name);
            off += e->d_reclen;
        }
    } else if (v) {
        size_t used = 0;
        for (size_t i = v->emit; i < v->n; i = v->emit) {
            size_t len = strlen(v->names[i]);
            size_t reclen = (offsetof(struct linux_dirent64_, d_name) + len + 1 + 7) & ~(size_t)7;
            if (v->seen[i] || len > 255) { v->emit++; continue; }
            if (used + reclen > count) break;
            struct linux_dirent64_ *e = (struct linux_dirent64_ *)((char *)buf + used);
            memset(e, 0, reclen);
            e->d_ino = name_ino(v, v->names[i]);
            e->d_off = (long long)(i + 1 + (1ULL << 40));
            e->d_reclen = (unsigned short)reclen;
            e->d_type = DT_REG;
            memcpy(e->d_name, v->names[i], len + 1);
            used += reclen;
            v->emit++;
        }
        if (used == 0 && v->emit < v->n) {
            pthread_mutex_unlock(&ei_lock);
            errno = EINVAL;  /* as the kernel: the buffer cannot hold the next entry */
            return -1;
        }
        got = (ssize_t)used;
    }
    pthread_mutex_unlock(&ei_lock);
    errno = saved;
    return got;
}
