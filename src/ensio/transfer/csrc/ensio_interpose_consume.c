/* ensio transfer interposer: a consumer's open of a transferred file.
 *
 * OPEN on the process's shared connection, with defer=1: the daemon answers at once, with
 * the read-only descriptor of a complete file, ABSENT (a real file), or BUSY (still being
 * written): the wait then happens on a connection of its own, without the lock. With
 * serve_partial the reply may carry a second descriptor, the progress map of a file still
 * arriving from another host: the first becomes partial (ensio_interpose_partial.c).
 */
#include "ensio_interpose.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The consumer's reply: the descriptor, -1 with errno, -2: the real path, -3: BUSY.
 * fds[1] is a partial file's progress map (serve_partial): fds[0] becomes partial. Lock
 * held. */
static int consumer_reply(int rc, const char *reply, const int fds[2], int flags)
{
    int fd = fds[0];
    int partial = rc == 0 && ei_reply_is(reply, "OK") && fd >= 0
                  && ei_reply_long(reply, "partial", 0);
    if (!partial && fds[1] >= 0) ei_real.close(fds[1]);  /* nothing to attach it to */
    if (rc != 0 || ei_reply_is(reply, "ABSENT") || ei_reply_is(reply, "BUSY")) {
        if (fd >= 0) ei_real.close(fd);
        return rc == 0 && ei_reply_is(reply, "BUSY") ? -3 : -2;
    }
    if (!ei_reply_is(reply, "OK") || fd < 0) {
        if (fd >= 0) ei_real.close(fd);
        errno = (int)ei_reply_long(reply, "errno", EIO);
        return -1;
    }
    if (partial && (fds[1] < 0 || ei_partial_open(fd, fds[1]) != 0)) {
        ei_real.close(fd);  /* its holes would read as zeros: never without the map */
        errno = EIO;
        return -1;
    }
    return ei_set_cloexec(fd, flags & O_CLOEXEC);
}

/* The OPEN request of a consumer's open (defer: answer BUSY instead of waiting). A
 * process that only consumes the connection waits for a name not produced yet (await=1);
 * one that also produces it would wait for itself. */
static int open_text(char *msg, size_t room, const struct ei_rule *r, const char *path,
                     int defer)
{
    return snprintf(msg, room, "OPEN\npath=%s\nwait_ms=%ld\nconn=%s%s%s%s", path,
                    r->timeout_ms, r->conn, defer ? "\ndefer=1" : "",
                    r->partial ? "\npartial=1" : "",
                    ei_only_consumes(path) ? "\nawait=1" : "");
}

/* A consumer's open (lock held): the daemon's read-only descriptor, -2: use the real
 * path, -3: the file is being written, wait with ei_consume_wait() after unlocking. */
int ei_consume(const struct ei_rule *r, const char *path, int flags)
{
    char msg[PATH_MAX + 256], reply[EI_REPLY_MAX];
    int n = open_text(msg, sizeof msg, r, path, 1);
    int fds[2];
    int rc = ei_request2(msg, (size_t)n, reply, fds);
    return consumer_reply(rc, reply, fds, flags);
}

/* The sync wait for a file still being written, on a connection of its own and without
 * the lock: the process's other threads (and its exit) are not held up. */
int ei_consume_wait(const struct ei_rule *r, const char *path, int flags)
{
    char msg[PATH_MAX + 256], reply[EI_REPLY_MAX];
    int n = open_text(msg, sizeof msg, r, path, 0);
    int fds[2];
    int rc = ei_request2_private(msg, (size_t)n, reply, fds);
    pthread_mutex_lock(&ei_lock);
    int got = consumer_reply(rc, reply, fds, flags);
    pthread_mutex_unlock(&ei_lock);
    if (got == -1 && errno == ETIMEDOUT) {  /* the program may say only "timed out" */
        const char *conn = strrchr(r->conn, ':');
        ei_say("%s: not complete within consumer_timeout_s = %ld s (connection %s): ETIMEDOUT",
               path, r->timeout_ms / 1000, conn ? conn + 1 : r->conn);
        errno = ETIMEDOUT;
    }
    return got == -3 ? -2 : got;
}
