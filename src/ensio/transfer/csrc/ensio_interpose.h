/* ensio transfer interposer: declarations shared by its three source files.
 *
 *   ensio_interpose.c         open, fopen, close, dup: the descriptors of transferred files
 *   ensio_interpose_consume.c a consumer's open (OPEN, and the wait for a file being written)
 *   ensio_interpose_names.c   stat, access, chmod, unlink/remove, link, rename: the names of
 *                             transferred files
 *   ensio_interpose_stdio.c   fopen, fclose
 *   ensio_interpose_writes.c  write, pwrite, writev, ftruncate, mmap: async dirty ranges
 *   ensio_interpose_partial.c read, pread, readv, mmap, exec: partial descriptors
 *   ensio_interpose_paths.c   the rules file, path canonicalization, glob matching
 *   ensio_interpose_dirs.c    opendir/readdir/getdents64: held names listed
 *   ensio_interpose_glob.c    glob, scandir, wordexp on those listings
 *   ensio_interpose_xattr.c   *xattr of transferred names
 *   ensio_interpose_daemon.c  the staging daemon's socket (protocol: ensio/transfer/protocol.py)
 *
 * Built into one shared object by `ensio run` (ensio/transfer/build.py); loaded with
 * LD_PRELOAD; configured by two environment variables set by `ensio run`:
 *   ENSIO_TRANSFER_RULES   the rules file (component and connection patterns)
 *   ENSIO_TRANSFER_SOCKET  the daemon's socket
 * Without them every function passes straight through to glibc.
 */
#ifndef ENSIO_INTERPOSE_H
#define ENSIO_INTERPOSE_H

#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

#define EI_HIDDEN __attribute__((visibility("hidden")))

/* Pattern bytes (ensio/transfer/config.py writes the same): any run of characters
 * but '/', one or more digits, exactly one digit. Everything else is literal. */
#define EI_STAR '\x01'
#define EI_DIGITS '\x02'
#define EI_DIGIT '\x03'

#define EI_PRODUCER 1
#define EI_CONSUMER 2
#define EI_MAX_RULES 256

struct ei_rule {
    int role;             /* EI_PRODUCER | EI_CONSUMER */
    long long budget;     /* bytes, -1: no limit */
    char fallback[8];     /* "files" | "error" */
    int persist;
    long timeout_ms;      /* consumer wait for a file being written */
    char conn[160];       /* "<config id>:<connection name>" */
    int async;            /* route line: the connection's mode is async */
    char targets[256];    /* route line: hosts receiving this process's files, "" none */
    int partial;          /* partial line: serve_partial (consumers) */
    char *pattern;        /* absolute, encoded */
    size_t prefix_len;    /* literal bytes before the first wildcard */
    const char *last;     /* the pattern's last path component */
};

/* Global state, guarded by ei_lock except where noted. */
extern EI_HIDDEN int ei_active;            /* rules loaded (set once at init) */
extern EI_HIDDEN pthread_mutex_t ei_lock;
extern EI_HIDDEN char ei_component[128];
extern EI_HIDDEN mode_t ei_umask;

/* The real glibc functions (resolved once with dlsym(RTLD_NEXT)). */
struct ei_real {
    int (*open)(const char *, int, ...);
    int (*openat)(int, const char *, int, ...);
    int (*close)(int);
    int (*dup)(int);
    int (*dup2)(int, int);
    int (*dup3)(int, int, int);
    int (*fcntl)(int, int, ...);
    int (*rename)(const char *, const char *);
    int (*unlink)(const char *);
};
extern EI_HIDDEN struct ei_real ei_real;
EI_HIDDEN void ei_init(void);

#define EI_BATCH 64            /* ranges per RANGES report */
#define EI_BATCH_BYTES (1 << 20) /* report once this much is written */

struct wfile {
    int used;
    int keeper;   /* our own descriptor of the memfd (reopen, fallback write) */
    int refs;     /* program descriptors referring to it */
    long id;      /* the daemon's id */
    mode_t mode;
    int async;    /* report written ranges (async connection with other hosts) */
    int whole;    /* written in untracked ways (stdio, shared mmap): all of it at close */
    int nranges;
    long long bytes;                  /* in the batch */
    long long ranges[EI_BATCH][2];    /* written and not reported yet: offset, length */
    char path[PATH_MAX];
};
extern EI_HIDDEN struct wfile *ei_wfiles;  /* guarded by ei_lock; index = fdmap value - 1 */

/* descriptors (ensio_interpose.c) */
EI_HIDDEN int ei_open_path(int dirfd, const char *path, int flags, mode_t mode); /* -2: real */
EI_HIDDEN int ei_set_cloexec(int fd, int want);  /* fd, with FD_CLOEXEC as wanted */
/* a consumer's open (ensio_interpose_consume.c): lock held; the descriptor, -1 with errno,
 * -2: the real path, -3: being written, call ei_consume_wait after unlocking */
EI_HIDDEN int ei_consume(const struct ei_rule *r, const char *path, int flags);
EI_HIDDEN int ei_consume_wait(const struct ei_rule *r, const char *path, int flags);
EI_HIDDEN int ei_fd_tracked(int fd);  /* lock-free: nonzero if fd is a file this process writes */
EI_HIDDEN int ei_fd_async(int fd);    /* lock-free: ... and its connection is async */
/* async: fd's file was written at [off, off+n) (takes the lock; reports in batches) */
EI_HIDDEN void ei_wrote(int fd, long long off, long long n);
EI_HIDDEN void ei_mark_whole(int fd); /* written in ways not tracked: send it all at close */
/* "off+len,..." of w's unreported ranges into out (lock held); the length written */
EI_HIDDEN int ei_batch_text(struct wfile *w, char *out, size_t room);
EI_HIDDEN int ei_complete_text(struct wfile *w, char *msg, size_t room);
EI_HIDDEN int ei_untrack(int fd);     /* lock held: fd is gone; the file completes at its last */

/* files this process writes (lock held): its own descriptor of the memory, or -1 */
EI_HIDDEN int ei_local_file(const char *path, mode_t *mode);
EI_HIDDEN void ei_local_chmod(const char *path, mode_t mode);  /* chmod of a held file */
EI_HIDDEN void ei_local_forget(const char *path);  /* unlinked: a new open creates anew */

/* partial descriptors (ensio_interpose_partial.c) */
EI_HIDDEN int ei_fd_partial(int fd);  /* lock-free: nonzero if fd is partial */
/* lock held: fd is a partial file, mapfd its progress map (closed here); -1 with errno */
EI_HIDDEN int ei_partial_open(int fd, int mapfd);
EI_HIDDEN void ei_partial_untrack(int fd);            /* lock held: fd is gone */
EI_HIDDEN void ei_partial_copy(int oldfd, int newfd); /* lock held: newfd is a dup */
/* without the lock: wait for [off, off+n) (off < 0: at the offset; n < 0: the whole file) */
EI_HIDDEN int ei_partial_wait(int fd, long long off, long long n);

/* paths */
EI_HIDDEN int ei_load_rules(const char *file);
/* The rule of (dirfd, path) (out: its canonical form), NULL if none matches. Of several
 * matching rules (one path in two connections, e.g. restarts model->analysis and
 * analyses analysis->model), the first with a role in `want`, else the first. */
EI_HIDDEN const struct ei_rule *ei_classify(int dirfd, const char *path, char out[PATH_MAX],
                                            int want);
EI_HIDDEN int ei_glob_match(const char *pat, const char *s);
EI_HIDDEN int ei_canonical(int dirfd, const char *path, char out[PATH_MAX]);
EI_HIDDEN int ei_dir_may_hold(const char *dir);  /* dir absolute, normalized */
/* Is (dirfd, path) a held file (ensio_interpose_names.c)? 1: *fd a read-only descriptor
 * of it and *mode its bits; 0: not ours; -1 errno. A consumer-only name not produced yet
 * is waited for. */
EI_HIDDEN int ei_held(int dirfd, const char *path, int *fd, mode_t *mode,
                      const struct ei_rule **rule, int want);
EI_HIDDEN int ei_only_consumes(const char *canon);  /* no matching rule produces it */
EI_HIDDEN void ei_announce_run(void);  /* RUN: this program's connections, at start-up */

/* daemon: every call with ei_lock held */
#define EI_REPLY_MAX 1024
EI_HIDDEN int ei_request(const char *msg, size_t len, int send_fd, char reply[EI_REPLY_MAX],
                         int *recv_fd);
/* a packet the daemon does not answer (RANGES with ack=0): the writer never waits */
EI_HIDDEN int ei_send_oneway(const char *msg, size_t len);
/* without the lock: one request on a connection of its own (a consumer's long wait) */
EI_HIDDEN int ei_request_private(const char *msg, size_t len, char reply[EI_REPLY_MAX],
                                 int *recv_fd);
/* the same two, receiving up to two descriptors (recv_fds[1]: a partial file's map) */
EI_HIDDEN int ei_request2(const char *msg, size_t len, char reply[EI_REPLY_MAX],
                          int recv_fds[2]);
EI_HIDDEN int ei_request2_private(const char *msg, size_t len, char reply[EI_REPLY_MAX],
                                  int recv_fds[2]);
EI_HIDDEN long ei_reply_long(const char *reply, const char *key, long dflt);
EI_HIDDEN int ei_reply_is(const char *reply, const char *verb);
EI_HIDDEN int ei_daemon_usable(void);
EI_HIDDEN void ei_after_fork_child(void);
EI_HIDDEN int ei_write_real_file(int src_fd, const char *path, mode_t mode);
EI_HIDDEN void ei_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
