/* ensio transfer interposer: the staging daemon's socket.
 *
 * One SOCK_SEQPACKET connection per process (ensio/transfer/protocol.py documents
 * the packets), opened on first need and moved above descriptor 500 so that a
 * program counting its own descriptors is not surprised. Its identity (device and
 * inode) is checked before each use: a program that closed "all descriptors" and
 * reused the number must not receive our packets. After fork the child opens its
 * own connection: the daemon sees each process's death separately.
 *
 * When the daemon cannot be reached (never started, killed), the process says so
 * once on stderr and uses real files for every new open from then on.
 *
 * A reply with say= is printed on stderr (one line: a refusal the program's own message
 * would not explain, e.g. another host refusing our secret); with fatal=1 the process's
 * run fails: an exit status of 0 becomes 1 (report_exit, fail_run, and _exit/_Exit for
 * programs that leave without exit(): dash), so a workflow never
 * takes a producer whose files did not reach their consumers for a success. A process
 * that opened a transferred file as a consumer and exits with status 0 tells the daemon
 * (EXIT): what it read is consumed (keep: until-consumed, ensio/transfer/budget.py).
 * A process whose async files to other hosts were still on their way at their close
 * waits for them at exit (SETTLE, settle below).
 */
#include "ensio_interpose.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int sock = -1;
static pid_t sock_pid;
static dev_t sock_dev;
static ino_t sock_ino;
static int down;  /* the daemon is unreachable: real files from now on */
static int fatal;         /* a reply said fatal=1: this run must not exit 0 */
static int consumed_any;  /* an OPEN answered with a descriptor: report EXIT */
static int pending_any;   /* a COMPLETE answered pending=1: SETTLE at exit */
static pid_t settled_pid; /* SETTLE was sent by this process */
static pid_t exit_pid;    /* on_exit registered in this process */
static int exit_status = -1;

void ei_say(const char *fmt, ...)
{
    char line[PATH_MAX + 256];
    int n = snprintf(line, sizeof line, "ensio-transfer (%s, pid %d): ", ei_component,
                     (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

static void gone(const char *why)
{
    if (!down)
        ei_say("staging daemon unreachable (%s): using real files for new opens", why);
    down = 1;
    if (sock >= 0) ei_real.close(sock);
    sock = -1;
}

static int send_packet(int s, const char *msg, size_t len, int fd)
{
    struct iovec iov = {(void *)msg, len};
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } ctl;
    struct msghdr mh = {0};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (fd >= 0) {
        memset(&ctl, 0, sizeof ctl);
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof ctl.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t n;
    do n = sendmsg(s, &mh, MSG_NOSIGNAL); while (n < 0 && errno == EINTR);
    return n == (ssize_t)len ? 0 : -1;
}

/* One reply packet (NUL-terminated) and its descriptors (up to nfds, -1 for none; more
 * are closed); -1: connection lost. */
static int recv_packet_fds(int s, char reply[EI_REPLY_MAX], int *fds, int nfds)
{
    struct iovec iov = {reply, EI_REPLY_MAX - 1};
    union { struct cmsghdr h; char buf[CMSG_SPACE(4 * sizeof(int))]; } ctl;
    struct msghdr mh = {0};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    ssize_t n;
    do n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
    if (n <= 0) return -1;
    reply[n] = '\0';
    for (int i = 0; i < nfds; i++) fds[i] = -1;
    int got_n = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t j = 0; j < k; j++) {
            int got;
            memcpy(&got, CMSG_DATA(c) + j * sizeof(int), sizeof got);
            if (got_n < nfds) fds[got_n++] = got;
            else ei_real.close(got);
        }
    }
    return 0;
}

static int recv_packet(int s, char reply[EI_REPLY_MAX], int *fd)
{
    int one;
    int rc = recv_packet_fds(s, reply, fd ? fd : &one, fd ? 1 : 0);
    return rc;
}

/* A new connection to the daemon, greeted (HELLO); -1 with the reason in why. */
static int open_connection(char *why, size_t whylen)
{
    const char *path = getenv("ENSIO_TRANSFER_SOCKET");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (path == NULL || strlen(path) >= sizeof addr.sun_path) {
        snprintf(why, whylen, "ENSIO_TRANSFER_SOCKET unset or too long");
        return -1;
    }
    strcpy(addr.sun_path, path);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) { snprintf(why, whylen, "%s", strerror(errno)); return -1; }
    if (connect(s, (struct sockaddr *)&addr, sizeof addr) != 0) {
        snprintf(why, whylen, "%s: %s", path, strerror(errno));
        ei_real.close(s);
        return -1;
    }
    int high = ei_real.fcntl(s, F_DUPFD_CLOEXEC, 500);
    if (high >= 0) { ei_real.close(s); s = high; }
    char hello[PATH_MAX + 256], reply[EI_REPLY_MAX];
    const char *rules = getenv("ENSIO_TRANSFER_RULES");  /* its keep lines: the daemon's */
    int n = snprintf(hello, sizeof hello, "HELLO\ncomponent=%s\npid=%d\nproto=1\nrules=%s",
                     ei_component, (int)getpid(), rules && !strchr(rules, '\n') ? rules : "");
    if (send_packet(s, hello, (size_t)n, -1) != 0 || recv_packet(s, reply, NULL) != 0
        || !ei_reply_is(reply, "OK")) {
        snprintf(why, whylen, "%s: no answer to HELLO", path);
        ei_real.close(s);
        return -1;
    }
    return s;
}

/* say= and fatal= of a reply; an OPEN answered with a descriptor marks this process as a
 * consumer (its exit with status 0 is reported). */
static void reply_notes(const char *msg, const char *reply, int got_fd)
{
    const char *say = strstr(reply, "\nsay=");
    if (say) {
        const char *end = strchrnul(say + 5, '\n');
        ei_say("%.*s", (int)(end - say - 5), say + 5);
    }
    if (ei_reply_long(reply, "fatal", 0)) fatal = 1;
    if (got_fd >= 0 && strncmp(msg, "OPEN\n", 5) == 0 && ei_reply_is(reply, "OK"))
        consumed_any = 1;
    if (strncmp(msg, "COMPLETE\n", 9) == 0 && ei_reply_long(reply, "pending", 0))
        pending_any = 1;
}

/* Async files to other hosts finish after their close (ensio/transfer/settle.py): before
 * the exit status is final, wait until they arrived; one that did not makes the run
 * fail (fatal, with the daemon's line). Once per process, on a connection of its own. */
static void settle(void)
{
    if (!pending_any || getpid() != exit_pid || settled_pid == getpid()) return;
    settled_pid = getpid();
    char why[PATH_MAX + 64], reply[EI_REPLY_MAX];
    int s = open_connection(why, sizeof why);
    if (s >= 0 && send_packet(s, "SETTLE", 6, -1) == 0 && recv_packet(s, reply, NULL) == 0) {
        reply_notes("SETTLE", reply, -1);
    } else {
        ei_say("cannot learn whether the files closed reached the other hosts (%s)",
               s < 0 ? why : "the staging daemon did not answer");
        fatal = 1;
    }
    if (s >= 0) ei_real.close(s);
}

/* Exit with status 0 of a consumer: tell the daemon (EXIT), on a connection of our own
 * (another thread may hold the lock forever). A fatal refusal turns status 0 into 1. */
static void report_exit(int status, void *arg)
{
    (void)arg;
    exit_status = status;
    settle();
    if (fatal && status == 0 && getpid() == exit_pid) {
        fflush(NULL);
        _exit(1);
    }
    if (status != 0 || !consumed_any || getpid() != exit_pid) return;
    char why[PATH_MAX + 64], reply[EI_REPLY_MAX];
    int s = open_connection(why, sizeof why);
    if (s < 0) return;
    if (send_packet(s, "EXIT\nstatus=0", 13, -1) == 0) recv_packet(s, reply, NULL);
    ei_real.close(s);
}

/* Late among the destructors (ei_destructor completes the files still open, and their
 * COMPLETE may fail): a fatal refusal fails the run. glibc may run the destructors before
 * the on_exit handlers (seen with Python), so the status may be unknown (-1) here: a
 * non-zero one becomes 1, which is a failure still. */
__attribute__((destructor(101))) static void fail_run(void)
{
    settle();
    if (fatal && exit_status <= 0 && getpid() == exit_pid) {
        fflush(NULL);
        _exit(1);
    }
}

/* _exit and _Exit skip on_exit and destructors (dash's exit builtin, children after
 * fork): a fatal refusal turns their status 0 into 1 as well. */
static void exit_now(const char *name, int status) __attribute__((noreturn));
static void exit_now(const char *name, int status)
{
    void (*real)(int) = (void (*)(int))dlsym(RTLD_NEXT, name);
    settle();
    if (fatal && status == 0 && getpid() == exit_pid) status = 1;
    if (real) real(status);
    syscall(SYS_exit_group, status);
    for (;;) {}
}

__attribute__((visibility("default"))) void _exit(int status) { exit_now("_exit", status); }
__attribute__((visibility("default"))) void _Exit(int status) { exit_now("_Exit", status); }

static int connect_daemon(void)
{
    char why[PATH_MAX + 64];
    int s = open_connection(why, sizeof why);
    if (s < 0) { gone(why); return -1; }
    struct stat st;
    fstat(s, &st);
    sock = s;
    sock_pid = getpid();
    sock_dev = st.st_dev;
    sock_ino = st.st_ino;
    if (exit_pid != getpid()) {  /* once per process (a child inherits the parent's) */
        exit_pid = getpid();
        on_exit(report_exit, NULL);
    }
    return 0;
}

int ei_request2_private(const char *msg, size_t len, char reply[EI_REPLY_MAX], int recv_fds[2])
{
    char why[PATH_MAX + 64];
    recv_fds[0] = recv_fds[1] = -1;
    int s = open_connection(why, sizeof why);
    if (s < 0) return -1;
    int rc = send_packet(s, msg, len, -1) == 0 && recv_packet_fds(s, reply, recv_fds, 2) == 0
             ? 0 : -1;
    ei_real.close(s);
    if (rc == 0) reply_notes(msg, reply, recv_fds[0]);
    return rc;
}

int ei_request_private(const char *msg, size_t len, char reply[EI_REPLY_MAX], int *recv_fd)
{
    int fds[2];
    int rc = ei_request2_private(msg, len, reply, fds);
    if (fds[1] >= 0) ei_real.close(fds[1]);
    *recv_fd = fds[0];
    return rc;
}

int ei_daemon_usable(void)
{
    if (down) return 0;
    if (sock >= 0 && sock_pid != getpid()) sock = -1;  /* inherited without our fork handler */
    if (sock >= 0) {
        struct stat st;
        if (fstat(sock, &st) != 0 || st.st_dev != sock_dev || st.st_ino != sock_ino)
            sock = -1;  /* the program closed it (and may have reused the number) */
    }
    return sock >= 0 || connect_daemon() == 0;
}

int ei_request(const char *msg, size_t len, int send_fd, char reply[EI_REPLY_MAX], int *recv_fd)
{
    if (recv_fd) *recv_fd = -1;
    if (!ei_daemon_usable()) return -1;
    if (send_packet(sock, msg, len, send_fd) != 0 || recv_packet(sock, reply, recv_fd) != 0) {
        gone("connection lost");
        return -1;
    }
    reply_notes(msg, reply, recv_fd ? *recv_fd : -1);
    return 0;
}

int ei_request2(const char *msg, size_t len, char reply[EI_REPLY_MAX], int recv_fds[2])
{
    recv_fds[0] = recv_fds[1] = -1;
    if (!ei_daemon_usable()) return -1;
    if (send_packet(sock, msg, len, -1) != 0 || recv_packet_fds(sock, reply, recv_fds, 2) != 0) {
        gone("connection lost");
        return -1;
    }
    reply_notes(msg, reply, recv_fds[0]);
    return 0;
}

int ei_send_oneway(const char *msg, size_t len)
{
    if (!ei_daemon_usable()) return -1;
    if (send_packet(sock, msg, len, -1) != 0) {
        gone("connection lost");
        return -1;
    }
    return 0;
}

int ei_reply_is(const char *reply, const char *verb)
{
    size_t n = strlen(verb);
    return strncmp(reply, verb, n) == 0 && (reply[n] == '\0' || reply[n] == '\n');
}

long ei_reply_long(const char *reply, const char *key, long dflt)
{
    size_t n = strlen(key);
    for (const char *p = strchr(reply, '\n'); p; p = strchr(p + 1, '\n'))
        if (strncmp(p + 1, key, n) == 0 && p[1 + n] == '=') return strtol(p + 2 + n, NULL, 0);
    return dflt;
}

void ei_after_fork_child(void)
{
    if (sock >= 0) ei_real.close(sock);
    sock = -1;
}

/* Write the memory file src_fd to path through a temporary sibling and a rename:
 * a producer whose daemon died keeps its data (the file falls back to disk). */
int ei_write_real_file(int src_fd, const char *path, mode_t mode)
{
    char tmp[PATH_MAX];
    const char *slash = strrchr(path, '/');
    int dirlen = slash ? (int)(slash - path) : 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (snprintf(tmp, sizeof tmp, "%.*s/.%s.ensio-tmp.%d.%08lx", dirlen, path,
                 slash ? slash + 1 : path, (int)getpid(), (unsigned long)ts.tv_nsec)
        >= (int)sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int out = ei_real.open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (out < 0) return -1;
    struct stat st;
    off_t off = 0;
    int ok = fstat(src_fd, &st) == 0;
    while (ok && off < st.st_size) {
        ssize_t n = sendfile(out, src_fd, &off, (size_t)(st.st_size - off));
        if (n <= 0 && !(n < 0 && errno == EINTR)) ok = 0;
    }
    int saved = errno;
    if (ei_real.close(out) != 0 && ok) { ok = 0; saved = errno; }
    if (ok && ei_real.rename(tmp, path) == 0) return 0;
    if (ok) saved = errno;
    ei_real.unlink(tmp);
    errno = saved;
    return -1;
}
