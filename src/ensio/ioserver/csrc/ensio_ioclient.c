/* ensio_ioclient.c -- C client of the ensio I/O server (see ensio_ioclient.h).
 *
 * Mirrors ensio.ioserver.client: the setup steps of the protocol (role allgather,
 * split, dup), the field table the first server sends (tag 7702), local validation of
 * domain ids, field ids and sizes against it, a bounded buffer of outstanding
 * MPI_Isend requests (block only when full, time measured), server errors (tag 7704)
 * probed at every call, CLOSE + report (tag 7703) at finalize.
 *
 * The state is one static struct: a C API like this (as XIOS's) has one client per
 * process; finalize resets it so a program may initialise again.
 */
#include "ensio_ioclient_impl.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAGIC ((int64_t)0x314F494F49534E45LL)
enum { K_DOMAIN = 1, K_FIELD = 2, K_STEP = 3, K_CLOSE = 4, K_ABORT = 5, K_DEFINED = 6 };
enum { DT_F64 = 0, DT_F32 = 1, DT_TEXT = 3 };
enum { TAG_MSG = 7701, TAG_TABLE = 7702, TAG_REPORT = 7703, TAG_ERROR = 7704 };
/* the handshake's status word (ensio.ioserver.protocol.Status) */
enum { ST_SERVER = 1, ST_ERROR = 2, ST_PRINTS = 4 };
#define VERDICT_ERROR "ensio-ioserver error "
#define LINE_PREFIX "ensio ioserver: error: "
#define DEFAULT_TIMEOUT 300.0
enum { D_RECT = 0, D_CURV = 1, D_UNSTR = 2 };
#define HDR 128

typedef struct {
    int64_t magic, kind, step, dtype, count, a[7];
    char name[32];
} msg_header;

typedef struct {
    char id[32]; int type; int64_t ni_glo, nj_glo, nvertex;
    int set; int64_t ibegin, ni, jbegin, nj;
} domain_t;
typedef struct { char id[32]; int64_t n; } axis_t;
typedef struct { char id[32]; int domain; int axis; } grid_t;
typedef struct {
    char id[32]; int grid; int nsrv; int *srv; int nper; int64_t *per; int64_t last_step;
} field_t;
typedef struct { char *buf; int64_t size; int refs; } block_t;

static struct {
    int initialized, closed, server_failed, rank;
    int first_client;                  /* lowest world rank of the model: speaks for it */
    double timeout;                    /* seconds without progress before a server is given up */
    int timeout_env;                   /* ENSIO_IOSERVER_TIMEOUT set: it beats the table */
    MPI_Comm io, model;
    int nservers, *servers;            /* world ranks of the servers, ascending */
    domain_t *dom; int ndom;
    axis_t *axis; int naxis;
    grid_t *grid; int ngrid;
    field_t *field; int nfield;
    int ndomain_msgs;
    int64_t step;
    /* bounded send buffer: outstanding requests and the block each one sends */
    MPI_Request *req; block_t **req_block; int *idx, *req_dest; int nreq, capreq;
    int64_t buf_used, buf_cap;
    double blocked; int64_t bytes_sent, messages;
} S;

static char errbuf[1024];
static char server_err[1024];

static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    return 1;
}

const char *ensio_ioclient_errmsg(void) { return errbuf; }

/* ---------------------------------------------------------------- send buffer */

static void release(int i) {
    block_t *b = S.req_block[i];
    if (b && --b->refs == 0) {
        S.buf_used -= b->size;
        free(b->buf);
        free(b);
    }
    S.req_block[i] = NULL;
}

static void compact(void) {
    int j = 0;
    for (int i = 0; i < S.nreq; i++) {
        if (S.req[i] != MPI_REQUEST_NULL) {
            S.req[j] = S.req[i];
            S.req_block[j] = S.req_block[i];
            S.req_dest[j] = S.req_dest[i];
            j++;
        }
    }
    S.nreq = j;
}

/* Free the blocks of completed sends (never waits). */
static void reclaim(void) {
    int out = 0;
    if (S.nreq == 0) return;
    MPI_Testsome(S.nreq, S.req, &out, S.idx, MPI_STATUSES_IGNORE);
    if (out == MPI_UNDEFINED) return;
    for (int k = 0; k < out; k++) release(S.idx[k]);
    compact();
}

/* ---------------------------------------------------------------- a server that stopped */

/* Bytes written to pipe fd that its reader (mpiexec's proxy) has not read; 0 if no pipe. */
static int unread(int fd) {
    struct stat st;
    int n = 0;
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode) || ioctl(fd, FIONREAD, &n) != 0) return 0;
    return n;
}

/* MPICH removes its node's shared-memory segment name (/dev/shm/mpich_shm_*) in
 * MPI_Finalize; an aborted job left it, a few MB of RAM each. Every rank has it mapped
 * by now, so the name goes before MPI_Abort (as ensio/parallel/abort.py does). */
static void forget_shm_segments(void) {
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return;
    char line[PATH_MAX + 256];
    while (fgets(line, sizeof line, maps)) {
        char *path = strstr(line, "/dev/shm/mpich_shm_");
        if (!path) continue;
        path[strcspn(path, "\n")] = '\0';
        if (strstr(path, " (deleted)")) continue;
        unlink(path); /* ENOENT: another rank of this node was first */
    }
    fclose(maps);
}

/* MPI_Abort, and an exit should it return (MPICH's has been seen to, under load, with
 * a stopped process in the job): the launcher ends the others when a rank exits 2.
 * First the line that says why must be out of this process's pipes: MPI_Abort tears the
 * job down at once, and hydra drops what its proxy has not read (ensio/parallel/abort.py
 * does the same for the Python side); at most 2 s. */
static void end_job(void) {
    fflush(NULL);
    struct timespec ts = {0, 2000000};
    for (int i = 0; i < 1000 && (unread(1) > 0 || unread(2) > 0); i++) nanosleep(&ts, NULL);
    forget_shm_segments();
    MPI_Abort(MPI_COMM_WORLD, 2);
    _exit(2);
}

static void nap(void) {
    struct timespec ts = {0, 100000}; /* 0.1 ms: the model is blocked anyway */
    nanosleep(&ts, NULL);
}

/* No progress from server rank `server` for S.timeout seconds: it is stopped, hung or
 * its node is gone, and no rank of the job would ever return.  The first model rank
 * prints the one line and ends the job; the others give it a grace period to do so
 * (they may have noticed first), then speak themselves: one line in the normal case,
 * never a hang. */
static void server_lost(int server, const char *what) {
    if (S.rank != S.first_client) {
        double grace = S.timeout < 10.0 ? S.timeout : 10.0;
        double until = MPI_Wtime() + grace;
        while (MPI_Wtime() < until) nap();
    }
    fprintf(stderr, "ensio ioclient: error: model rank %d: ioserver rank %d did not answer "
            "for %g s (%s; stopped or hung? the limit is ioserver.timeout_s or "
            "ENSIO_IOSERVER_TIMEOUT)\n", S.rank, server, S.timeout, what);
    fflush(stderr);
    end_job();
}

/* Wait until any send request completes, at most S.timeout seconds (the model is
 * blocked: measured). */
static void wait_one(void) {
    int i = MPI_UNDEFINED, flag = 0;
    double t0 = MPI_Wtime(), last = t0;
    for (;;) {
        MPI_Testany(S.nreq, S.req, &i, &flag, MPI_STATUS_IGNORE);
        if (flag) break;
        if (MPI_Wtime() - last > S.timeout) server_lost(S.req_dest[0], "a send stays pending");
        nap();
    }
    S.blocked += MPI_Wtime() - t0;
    if (i != MPI_UNDEFINED) release(i);
    compact();
}

static void wait_all(void) {
    while (S.nreq > 0) wait_one();
}

static int grow_requests(int extra) {
    if (S.nreq + extra <= S.capreq) return 0;
    int cap = S.capreq ? S.capreq : 64;
    while (cap < S.nreq + extra) cap *= 2;
    MPI_Request *r = realloc(S.req, (size_t)cap * sizeof *r);
    if (r) S.req = r;
    block_t **b = realloc(S.req_block, (size_t)cap * sizeof *b);
    if (b) S.req_block = b;
    int *x = realloc(S.idx, (size_t)cap * sizeof *x);
    if (x) S.idx = x;
    int *dd = realloc(S.req_dest, (size_t)cap * sizeof *dd);
    if (dd) S.req_dest = dd;
    if (!r || !b || !x || !dd) return fail("out of memory for send requests on rank %d", S.rank);
    S.capreq = cap;
    return 0;
}

static void header(msg_header *h, int64_t kind, int64_t dtype, int64_t count, const char *name) {
    memset(h, 0, sizeof *h);
    h->magic = MAGIC;
    h->kind = kind;
    h->step = S.step;
    h->dtype = dtype;
    h->count = count;
    if (name) strncpy(h->name, name, sizeof h->name - 1);
}

/* Copy header + payload into the buffer and Isend it to dests (world ranks).
 * Waits (measured) only while the buffer cannot hold it; a message larger than the
 * whole buffer waits until the buffer is empty. */
static int post(const msg_header *h, const void *payload, int64_t nbytes,
                const int *dests, int ndest) {
    int64_t size = HDR + nbytes;
    if (ndest == 0) return 0;
    if (size > INT_MAX)
        return fail("message '%s' of %lld bytes is too large for one MPI message on rank %d",
                    h->name, (long long)size, S.rank);
    reclaim();
    while (S.nreq > 0 && S.buf_used + size > S.buf_cap) wait_one();
    if (grow_requests(ndest)) return 1;
    block_t *b = malloc(sizeof *b);
    char *buf = malloc((size_t)size);
    if (!b || !buf) {
        free(b);
        free(buf);
        return fail("out of memory for a %lld-byte message on rank %d", (long long)size, S.rank);
    }
    memcpy(buf, h, HDR);
    if (nbytes) memcpy(buf + HDR, payload, (size_t)nbytes);
    b->buf = buf;
    b->size = size;
    b->refs = ndest;
    S.buf_used += size;
    for (int d = 0; d < ndest; d++) {
        /* CLOSE synchronously: its completion proves that server took it (finalize) */
        if (h->kind == K_CLOSE)
            MPI_Issend(buf, (int)size, MPI_BYTE, dests[d], TAG_MSG, S.io, &S.req[S.nreq]);
        else
            MPI_Isend(buf, (int)size, MPI_BYTE, dests[d], TAG_MSG, S.io, &S.req[S.nreq]);
        S.req_dest[S.nreq] = dests[d];
        S.req_block[S.nreq++] = b;
        S.bytes_sent += size;
        S.messages++;
    }
    return 0;
}

/* ---------------------------------------------------------------- errors */

/* Receive one server error (tag 7704) announced by st; the first one is kept. */
static void recv_error(const MPI_Status *st) {
    int n = 0;
    MPI_Get_count(st, MPI_CHAR, &n);
    char *text = calloc((size_t)n + 1, 1);
    MPI_Recv(text, n, MPI_CHAR, st->MPI_SOURCE, TAG_ERROR, S.io, MPI_STATUS_IGNORE);
    if (!S.server_failed)
        snprintf(server_err, sizeof server_err, "ioserver (rank %d): %s", st->MPI_SOURCE,
                 text ? text : "?");
    free(text);
    S.server_failed = 1;
}

/* Receive every server error already arrived. */
static void drain_errors(void) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_ERROR, S.io, &flag, &st);
        if (!flag) return;
        recv_error(&st);
    }
}

/* A server's error (tag 7704) turns every later call into that error. */
static int server_error(void) {
    if (!S.server_failed) drain_errors();
    if (S.server_failed) return fail("%s", server_err);
    return 0;
}

static int ready(const char *fn, int need_closed, int need_step) {
    if (!S.initialized) return fail("%s: call ensio_ioclient_init first", fn);
    if (server_error()) return 1;
    if (need_closed == 1 && !S.closed)
        return fail("%s on rank %d: call ensio_ioclient_close_definition first", fn, S.rank);
    if (need_closed == 0 && S.closed)
        return fail("%s on rank %d: the definition is already closed", fn, S.rank);
    if (need_step && S.step < 1)
        return fail("%s on rank %d: call ensio_ioclient_update_timestep first", fn, S.rank);
    return 0;
}

/* ---------------------------------------------------------------- field table */

static int split_words(char *line, char **w, int max) {
    int n = 0;
    for (char *save = NULL, *t = strtok_r(line, " \t\r", &save); t && n < max;
         t = strtok_r(NULL, " \t\r", &save))
        w[n++] = t;
    return n;
}

static int find(const void *arr, int n, size_t stride, const char *id) {
    for (int i = 0; i < n; i++)
        if (strcmp((const char *)arr + (size_t)i * stride, id) == 0) return i;
    return -1;
}

static int copy_id(char dst[32], const char *src, const char *what) {
    if (strlen(src) > ENSIO_IOCLIENT_ID_MAX)
        return fail("field table: %s id '%s' is longer than %d bytes", what, src,
                    ENSIO_IOCLIENT_ID_MAX);
    strcpy(dst, src);
    return 0;
}

#define PUSH(arr, n) ((arr) = realloc((arr), (size_t)((n) + 1) * sizeof *(arr)))

static int parse_list(const char *text, int64_t **out, int *n) {
    *out = NULL;
    *n = 0;
    if (strcmp(text, "-") == 0) return 0;
    const char *p = text;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ',')) return 1;
        if (!PUSH(*out, *n)) return 1;
        (*out)[(*n)++] = v;
        p = *end ? end + 1 : end;
    }
    return 0;
}

static int parse_field(char **w, int n) {
    field_t f;
    int64_t *srv = NULL;
    memset(&f, 0, sizeof f);
    if (n != 5) return fail("field table: bad field line");
    if (copy_id(f.id, w[1], "field")) return 1;
    f.grid = find(S.grid, S.ngrid, sizeof *S.grid, w[2]);
    if (f.grid < 0) return fail("field table: field '%s' on unknown grid '%s'", w[1], w[2]);
    if (parse_list(w[3], &srv, &f.nsrv) || parse_list(w[4], &f.per, &f.nper))
        return fail("field table: bad server or period list of field '%s'", w[1]);
    f.srv = malloc((size_t)(f.nsrv ? f.nsrv : 1) * sizeof *f.srv);
    for (int i = 0; i < f.nsrv; i++) {
        int ok = 0;
        for (int k = 0; k < S.nservers; k++) ok |= S.servers[k] == srv[i];
        if (!ok) return fail("field table: field '%s' names rank %lld, not a server", w[1],
                             (long long)srv[i]);
        f.srv[i] = (int)srv[i];
    }
    free(srv);
    for (int i = 0; i < f.nper; i++)
        if (f.per[i] < 1) return fail("field table: field '%s' has a period < 1", w[1]);
    if (!PUSH(S.field, S.nfield)) return fail("out of memory");
    S.field[S.nfield++] = f;
    return 0;
}

static int parse_line(char **w, int n) {
    if (strcmp(w[0], "domain") == 0) {
        domain_t d;
        memset(&d, 0, sizeof d);
        if (n != 6) return fail("field table: bad domain line");
        if (copy_id(d.id, w[1], "domain")) return 1;
        if (strcmp(w[2], "rectilinear") == 0) d.type = D_RECT;
        else if (strcmp(w[2], "curvilinear") == 0) d.type = D_CURV;
        else if (strcmp(w[2], "unstructured") == 0) d.type = D_UNSTR;
        else return fail("field table: domain '%s' of unknown type '%s'", w[1], w[2]);
        d.ni_glo = strtoll(w[3], NULL, 10);
        d.nj_glo = d.type == D_UNSTR ? 1 : strtoll(w[4], NULL, 10);
        d.nvertex = strcmp(w[5], "-") ? strtoll(w[5], NULL, 10) : 0;
        if (!PUSH(S.dom, S.ndom)) return fail("out of memory");
        S.dom[S.ndom++] = d;
    } else if (strcmp(w[0], "axis") == 0) {
        axis_t a;
        if (n != 3) return fail("field table: bad axis line");
        if (copy_id(a.id, w[1], "axis")) return 1;
        a.n = strtoll(w[2], NULL, 10);
        if (!PUSH(S.axis, S.naxis)) return fail("out of memory");
        S.axis[S.naxis++] = a;
    } else if (strcmp(w[0], "grid") == 0) {
        grid_t g;
        if (n != 4) return fail("field table: bad grid line");
        if (copy_id(g.id, w[1], "grid")) return 1;
        g.domain = find(S.dom, S.ndom, sizeof *S.dom, w[2]);
        g.axis = strcmp(w[3], "-") ? find(S.axis, S.naxis, sizeof *S.axis, w[3]) : -1;
        if (g.domain < 0 || (g.axis < 0 && strcmp(w[3], "-")))
            return fail("field table: grid '%s' names an unknown domain or axis", w[1]);
        if (!PUSH(S.grid, S.ngrid)) return fail("out of memory");
        S.grid[S.ngrid++] = g;
    } else if (strcmp(w[0], "field") == 0) {
        return parse_field(w, n);
    } else if (strcmp(w[0], "timeout") == 0 && n == 2) {
        double t = strtod(w[1], NULL);
        if (!S.timeout_env && t > 0) S.timeout = t; /* the environment beats the config */
    }
    return 0; /* calendar and lines of later versions: not needed by the client */
}

static int parse_table(char *text) {
    char *save = NULL, *w[8];
    int nline = 0, ended = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int n = split_words(line, w, 8);
        if (n == 0) continue;
        if (nline++ == 0) {
            if (n != 2 || strcmp(w[0], "ensio-ioserver") || strcmp(w[1], "1"))
                return fail("field table: expected 'ensio-ioserver 1' (a server of another "
                            "protocol version?), got '%s'", w[0]);
            continue;
        }
        if (strcmp(w[0], "end") == 0) {
            ended = 1;
            break;
        }
        if (parse_line(w, n)) return 1;
    }
    if (!ended) return fail("field table: truncated (no 'end' line)");
    return 0;
}

/* ---------------------------------------------------------------- init */

static int buffer_size(void) {
    const char *env = getenv("ENSIO_IOCLIENT_BUFFER_MB");
    double mb = 64.0;
    if (env && *env) {
        char *end;
        mb = strtod(env, &end);
        if (*end || !(mb > 0))
            return fail("ensio_ioclient_init: ENSIO_IOCLIENT_BUFFER_MB: expected a positive "
                        "number of MiB, got '%s' (model rank %d)", env, S.rank);
    }
    S.buf_cap = (int64_t)(mb * 1048576.0);
    if (S.buf_cap < HDR) S.buf_cap = HDR;
    return 0;
}

static int timeout_env(void) {
    const char *env = getenv("ENSIO_IOSERVER_TIMEOUT");
    S.timeout = DEFAULT_TIMEOUT;
    if (env && *env) {
        char *end;
        double t = strtod(env, &end);
        if (*end || !(t > 0))
            return fail("ensio_ioclient_init: ENSIO_IOSERVER_TIMEOUT: expected a positive "
                        "number of seconds, got '%s' (model rank %d)", env, S.rank);
        S.timeout = t;
        S.timeout_env = 1;
    }
    return 0;
}

/* Receive one text message of `tag` from `src` on `comm`, waiting at most S.timeout
 * seconds (then the server is lost: the job ends).  Returns a malloc'ed string. */
static char *recv_text(MPI_Comm comm, int src, int tag, const char *what) {
    MPI_Status st;
    int flag = 0, n = 0;
    double t0 = MPI_Wtime();
    for (;;) {
        MPI_Iprobe(src, tag, comm, &flag, &st);
        if (flag) break;
        if (MPI_Wtime() - t0 > S.timeout) server_lost(src, what);
        nap();
    }
    MPI_Get_count(&st, MPI_CHAR, &n);
    char *text = calloc((size_t)n + 1, 1);
    MPI_Recv(text, n, MPI_CHAR, src, tag, comm, MPI_STATUS_IGNORE);
    return text;
}

/* The job's setup failed (protocol: ensio.ioserver.handshake): the lowest C client
 * prints the one line, every rank meets in a barrier (the line is out before anyone
 * exits) and ends with status 2.  A failed setup has no rank that could go on. */
static void setup_failed(MPI_Comm world, const int *states, int size, const char *text) {
    int printer = -1;
    for (int r = 0; r < size && printer < 0; r++)
        if (states[r] & ST_PRINTS) printer = r;
    if (S.rank == printer) {
        fprintf(stderr, LINE_PREFIX "%s\n", text);
        fflush(stderr);
    }
    MPI_Barrier(world);
    MPI_Finalize();
    exit(2);
}

/* Some rank's setup failed: the lowest failed rank's text reaches every rank. */
static void verdict_exchange(MPI_Comm world, const int *states, int size) {
    int src = 0;
    MPI_Comm comm;
    while (!(states[src] & ST_ERROR)) src++;
    MPI_Comm_dup(world, &comm);
    char own[1100];
    snprintf(own, sizeof own, VERDICT_ERROR "%s", errbuf);
    if (S.rank == src) {
        MPI_Request *r = malloc((size_t)size * sizeof *r);
        int nr = 0;
        for (int d = 0; d < size; d++)
            if (d != src) MPI_Isend(own, (int)strlen(own), MPI_CHAR, d, TAG_TABLE, comm, &r[nr++]);
        MPI_Waitall(nr, r, MPI_STATUSES_IGNORE);
        free(r);
        setup_failed(world, states, size, own + strlen(VERDICT_ERROR));
    }
    char *text = recv_text(comm, src, TAG_TABLE, "the setup's verdict did not come");
    const char *body = strncmp(text, VERDICT_ERROR, strlen(VERDICT_ERROR)) ? text
                                                                            : text + strlen(VERDICT_ERROR);
    setup_failed(world, states, size, body);
}

/* Steps 1-2 of the protocol: every rank's status word; the servers' world ranks.
 * Ends the job (one line, every rank exits 2) when any rank's setup failed. */
static int *exchange_status(MPI_Comm world, int size, int local_error) {
    int mine = ST_PRINTS | (local_error ? ST_ERROR : 0), any = 0;
    int *states = malloc((size_t)size * sizeof *states);
    MPI_Allgather(&mine, 1, MPI_INT, states, 1, MPI_INT, world);       /* step 1 */
    S.first_client = -1;
    for (int r = 0; r < size; r++) {
        any |= states[r] & ST_ERROR;
        if (!(states[r] & ST_SERVER) && S.first_client < 0) S.first_client = r;
    }
    if (any) verdict_exchange(world, states, size);
    S.servers = malloc((size_t)size * sizeof *S.servers);
    for (int r = 0; r < size; r++)
        if (states[r] & ST_SERVER) S.servers[S.nservers++] = r;      /* step 2 */
    return states;
}

int ensio_ioclient_init(MPI_Comm world, const char *context, MPI_Comm *model_comm) {
    int flag = 0, size;
    (void)context; /* the servers' config names what is written; kept for XIOS-like calls */
    if (S.initialized) return fail("ensio_ioclient_init: already initialised on rank %d", S.rank);
    MPI_Initialized(&flag);
    if (!flag) return fail("ensio_ioclient_init: call MPI_Init first");
    if (!model_comm) return fail("ensio_ioclient_init: model_comm is NULL");
    MPI_Comm_rank(world, &S.rank);
    MPI_Comm_size(world, &size);
    int local_error = timeout_env();
    if (!local_error) local_error = buffer_size();
    int *states = exchange_status(world, size, local_error);
    if (S.nservers == 0) {
        fail("ensio_ioclient_init: no ioserver ranks in the job; start the model MPMD: "
             "mpiexec -n P MODEL : -n S ensio ioserver CONFIG");
        setup_failed(world, states, size, errbuf);
    }
    MPI_Comm_split(world, 0, S.rank, &S.model);                          /* step 3 */
    MPI_Comm_dup(world, &S.io);                                          /* step 4 */
    char *text = recv_text(S.io, S.servers[0], TAG_TABLE, "no field table at start");
    if (strncmp(text, VERDICT_ERROR, strlen(VERDICT_ERROR)) == 0)       /* planning failed */
        setup_failed(world, states, size, text + strlen(VERDICT_ERROR));
    free(states);
    S.initialized = 1;
    *model_comm = S.model;
    int rc = parse_table(text);
    free(text);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", errbuf);
        return fail("ensio_ioclient_init on rank %d: %s", S.rank, msg);
    }
    return 0;
}

/* ---------------------------------------------------------------- definition */

static int64_t grid_points(const field_t *f, int64_t *nk) {
    const grid_t *g = &S.grid[f->grid];
    const domain_t *d = &S.dom[g->domain];
    *nk = g->axis >= 0 ? S.axis[g->axis].n : 1;
    return *nk * d->ni * d->nj;
}

static int check_range(const char *id, const char *c, int64_t begin, int64_t n, int64_t glo) {
    if (begin < 0 || n < 0 || begin + n > glo)
        return fail("ensio_ioclient_set_domain: domain '%s' on rank %d: %sbegin=%lld n%s=%lld "
                    "outside 0..%lld", id, S.rank, c, (long long)begin, c, (long long)n,
                    (long long)glo);
    return 0;
}

/* Payload (float64) of a DOMAIN message: lon, lat, bounds, mask, area as present. */
static double *domain_payload(const domain_t *d, const double *lon, const double *lat,
                              const double *lonb, const double *latb, const int *mask,
                              const double *area, int64_t *count, int64_t *flags) {
    int64_t np = d->ni * d->nj, nlon, nlat, nvx;
    nlon = d->type == D_RECT ? d->ni : np;
    nlat = d->type == D_RECT ? d->nj : np;
    nvx = d->type == D_RECT ? 2 : d->type == D_CURV ? 4 : d->nvertex;
    *flags = (lon ? 1 : 0) | (lonb ? 2 : 0) | (mask ? 4 : 0) | (area ? 8 : 0);
    *count = (lon ? nlon + nlat : 0) + (lonb ? (nlon + nlat) * nvx : 0) + (mask ? np : 0) +
             (area ? np : 0);
    double *p = malloc((size_t)(*count ? *count : 1) * sizeof *p), *q = p;
    if (!p) return NULL;
    if (lon) {
        memcpy(q, lon, (size_t)nlon * sizeof *q), q += nlon;
        memcpy(q, lat, (size_t)nlat * sizeof *q), q += nlat;
    }
    if (lonb) {
        memcpy(q, lonb, (size_t)(nlon * nvx) * sizeof *q), q += nlon * nvx;
        memcpy(q, latb, (size_t)(nlat * nvx) * sizeof *q), q += nlat * nvx;
    }
    if (mask)
        for (int64_t i = 0; i < np; i++) *q++ = mask[i] ? 1.0 : 0.0;
    if (area) memcpy(q, area, (size_t)np * sizeof *q);
    return p;
}

int ensio_ioclient_set_domain(const char *domain_id, int64_t ibegin, int64_t ni,
                              int64_t jbegin, int64_t nj,
                              const double *lon, const double *lat,
                              const double *lon_bounds, const double *lat_bounds,
                              const int *mask, const double *area) {
    const char *fn = "ensio_ioclient_set_domain";
    if (ensio_ioclient__embedded)
        return ensio_ioclient__py_set_domain(domain_id, ibegin, ni, jbegin, nj, lon, lat,
                                             lon_bounds, lat_bounds, mask, area);
    if (ready(fn, 0, 0)) return 1;
    int k = domain_id ? find(S.dom, S.ndom, sizeof *S.dom, domain_id) : -1;
    if (k < 0)
        return fail("%s: unknown domain id '%s' on rank %d (not in the server's field table)",
                    fn, domain_id ? domain_id : "(null)", S.rank);
    domain_t *d = &S.dom[k];
    if (d->set) return fail("%s: domain '%s' set twice on rank %d", fn, domain_id, S.rank);
    if (d->type == D_UNSTR && (jbegin != 0 || nj != 1))
        return fail("%s: unstructured domain '%s' on rank %d needs jbegin=0, nj=1", fn,
                    domain_id, S.rank);
    if (check_range(domain_id, "i", ibegin, ni, d->ni_glo) ||
        check_range(domain_id, "j", jbegin, nj, d->nj_glo))
        return 1;
    if (!lon != !lat || !lon_bounds != !lat_bounds)
        return fail("%s: domain '%s' on rank %d: give lon with lat and lon_bounds with lat_bounds",
                    fn, domain_id, S.rank);
    if (lon_bounds && d->type == D_UNSTR && d->nvertex < 1)
        return fail("%s: domain '%s' on rank %d: bounds given but nvertex is 0", fn, domain_id,
                    S.rank);
    d->ibegin = ibegin, d->ni = ni, d->jbegin = jbegin, d->nj = nj;
    int64_t count, flags;
    double *payload = domain_payload(d, lon, lat, lon_bounds, lat_bounds, mask, area, &count, &flags);
    if (!payload) return fail("%s: out of memory on rank %d", fn, S.rank);
    msg_header h;
    header(&h, K_DOMAIN, DT_F64, count, domain_id);
    int64_t a[7] = {ibegin, ni, jbegin, nj, d->nvertex, flags, 0};
    memcpy(h.a, a, sizeof a);
    int rc = post(&h, payload, count * (int64_t)sizeof(double), S.servers, S.nservers);
    free(payload);
    if (rc) return 1;
    d->set = 1;
    S.ndomain_msgs++;
    return 0;
}

static int wanted(const field_t *f) { return f->nsrv > 0 && f->nper > 0; }

int ensio_ioclient_close_definition(void) {
    const char *fn = "ensio_ioclient_close_definition";
    if (ensio_ioclient__embedded) return ensio_ioclient__py_simple("close_definition");
    if (ready(fn, 0, 0)) return 1;
    for (int i = 0; i < S.nfield; i++) {
        const domain_t *d = &S.dom[S.grid[S.field[i].grid].domain];
        if (wanted(&S.field[i]) && !d->set)
            return fail("%s: domain '%s' (of field '%s') was not set on rank %d", fn, d->id,
                        S.field[i].id, S.rank);
    }
    msg_header h;
    header(&h, K_DEFINED, DT_F64, 0, NULL);
    h.a[0] = S.ndomain_msgs;
    if (post(&h, NULL, 0, S.servers, S.nservers)) return 1;
    S.closed = 1;
    return 0;
}

/* ---------------------------------------------------------------- time steps and fields */

int ensio_ioclient_update_timestep(int64_t step) {
    const char *fn = "ensio_ioclient_update_timestep";
    if (ensio_ioclient__embedded) return ensio_ioclient__py_step(step);
    if (ready(fn, 1, 0)) return 1;
    if (step <= S.step)
        return fail("%s on rank %d: step %lld after step %lld (steps increase from 1)", fn,
                    S.rank, (long long)step, (long long)S.step);
    S.step = step;
    msg_header h;
    header(&h, K_STEP, DT_F64, 0, NULL);
    return post(&h, NULL, 0, S.servers, S.nservers);
}

static int active(const field_t *f, int64_t step) {
    if (f->nsrv == 0) return 0;
    for (int i = 0; i < f->nper; i++)
        if (step % f->per[i] == 0) return 1;
    return 0;
}

static int find_field(const char *fn, const char *id) {
    int k = id ? find(S.field, S.nfield, sizeof *S.field, id) : -1;
    if (k < 0)
        fail("%s: unknown field id '%s' on rank %d (not a source field of the server's "
             "field table)", fn, id ? id : "(null)", S.rank);
    return k;
}

static int send_field(const char *fn, const char *id, const void *data, int64_t count,
                      int dtype, size_t elsize) {
    if (ensio_ioclient__embedded) return ensio_ioclient__py_send(id, data, count, dtype);
    if (ready(fn, 1, 1)) return 1;
    reclaim();
    int k = find_field(fn, id);
    if (k < 0) return 1;
    field_t *f = &S.field[k];
    const domain_t *d = &S.dom[S.grid[f->grid].domain];
    int64_t nk, expect;
    if (!d->set)
        return fail("%s: field '%s' on rank %d: its domain '%s' was not set", fn, id, S.rank,
                    d->id);
    expect = grid_points(f, &nk);
    if (count != expect)
        return fail("%s: field '%s' on rank %d: %lld values, expected %lld (%lld x %lld x %lld "
                    "levels x nj x ni)", fn, id, S.rank, (long long)count, (long long)expect,
                    (long long)nk, (long long)d->nj, (long long)d->ni);
    if (count > 0 && !data) return fail("%s: field '%s' on rank %d: data is NULL", fn, id, S.rank);
    if (f->last_step == S.step)
        return fail("%s: field '%s' sent twice at step %lld on rank %d", fn, id,
                    (long long)S.step, S.rank);
    f->last_step = S.step;
    if (!active(f, S.step)) return 0; /* no file wants it at this step */
    msg_header h;
    header(&h, K_FIELD, dtype, count, id);
    return post(&h, data, count * (int64_t)elsize, f->srv, f->nsrv);
}

int ensio_ioclient_send_double(const char *field_id, const double *data, int64_t count) {
    return send_field("ensio_ioclient_send_double", field_id, data, count, DT_F64, sizeof(double));
}

int ensio_ioclient_send_float(const char *field_id, const float *data, int64_t count) {
    return send_field("ensio_ioclient_send_float", field_id, data, count, DT_F32, sizeof(float));
}

int ensio_ioclient_is_active(const char *field_id, int64_t step) {
    const char *fn = "ensio_ioclient_is_active";
    if (ensio_ioclient__embedded) return ensio_ioclient__py_is_active(field_id, step);
    if (ready(fn, -1, 0)) return -1;
    int k = find_field(fn, field_id);
    if (k < 0) return -1;
    if (step < 1) step = S.step;
    if (step < 1) {
        fail("%s: field '%s' on rank %d: no step yet (pass step >= 1 or call "
             "ensio_ioclient_update_timestep first)", fn, field_id, S.rank);
        return -1;
    }
    return active(&S.field[k], step);
}

/* ---------------------------------------------------------------- end */

static void reset(void) {
    for (int i = 0; i < S.nfield; i++) {
        free(S.field[i].srv);
        free(S.field[i].per);
    }
    free(S.field), free(S.grid), free(S.axis), free(S.dom), free(S.servers);
    free(S.req), free(S.req_block), free(S.idx), free(S.req_dest);
    memset(&S, 0, sizeof S);
    ensio_ioclient__restart_reset();
}

static void parse_report(char *text, ensio_ioclient_report *rep) {
    char *save = NULL, *w[4];
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (split_words(line, w, 4) != 2) continue;
        double v = strtod(w[1], NULL);
        if (strcmp(w[0], "server_busy_fraction") == 0) rep->server_busy_fraction = v;
        else if (strcmp(w[0], "server_memory_hwm_bytes") == 0) rep->server_memory_hwm_bytes = (int64_t)v;
        else if (strcmp(w[0], "bytes_written") == 0) rep->bytes_written = (int64_t)v;
        else if (strcmp(w[0], "files_written") == 0) rep->files_written = (int64_t)v;
    }
}

/* The report of the first server (tag 7703), receiving the server errors before it:
 * every message sent to this client is matched before its communicator is freed. */
static void receive_report(ensio_ioclient_report *rep) {
    for (;;) {
        MPI_Status st;
        int n = 0, flag = 0;
        double t0 = MPI_Wtime();
        for (;;) {
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, S.io, &flag, &st);
            if (flag) break;
            /* twice the timeout: the servers may wait that long for a silent model rank
             * (they end the job naming it, ensio.ioserver.server) before they report */
            if (MPI_Wtime() - t0 > 2 * S.timeout)
                server_lost(S.servers[0], "no report after this rank closed");
            nap();
        }
        if (st.MPI_TAG == TAG_ERROR) {
            recv_error(&st);
            continue;
        }
        MPI_Get_count(&st, MPI_CHAR, &n);
        char *text = calloc((size_t)n + 1, 1);
        MPI_Recv(text, n, MPI_CHAR, st.MPI_SOURCE, st.MPI_TAG, S.io, MPI_STATUS_IGNORE);
        if (st.MPI_TAG == TAG_REPORT) parse_report(text, rep);
        free(text); /* nothing else is sent to clients: ignore */
        if (st.MPI_TAG == TAG_REPORT) break;
    }
    drain_errors();
}

int ensio_ioclient_finalize(ensio_ioclient_report *report) {
    ensio_ioclient_report rep;
    int rc;
    if (ensio_ioclient__embedded) return ensio_ioclient__py_finalize(report);
    if (!S.initialized) return fail("ensio_ioclient_finalize: call ensio_ioclient_init first");
    /* as Python's Client.close: a model that declared nothing (restarts only) ends it here */
    if (!S.closed && ensio_ioclient_close_definition()) return 1;
    memset(&rep, 0, sizeof rep);
    msg_header h;
    header(&h, K_CLOSE, DT_F64, 0, NULL);
    h.a[0] = (int64_t)(S.blocked * 1e9);
    h.a[1] = S.bytes_sent + HDR * (int64_t)S.nservers;
    h.a[2] = S.messages + S.nservers;
    rc = post(&h, NULL, 0, S.servers, S.nservers);
    wait_all();  /* every server took this rank's CLOSE (or the timeout names one) */
    receive_report(&rep); /* within the timeout (counted from here: ranks close together) */
    if (server_error()) rc = 1;
    rep.blocked_seconds = S.blocked;
    rep.bytes_sent = S.bytes_sent;
    if (report) *report = rep;
    MPI_Comm_free(&S.io);
    MPI_Comm_free(&S.model);
    reset();
    return rc;
}

int ensio_ioclient_abort(const char *reason) {
    if (ensio_ioclient__embedded) return ensio_ioclient__py_abort(reason);
    if (!S.initialized) return fail("ensio_ioclient_abort: call ensio_ioclient_init first");
    char text[1024];
    snprintf(text, sizeof text, "%s", reason ? reason : "model aborted");
    msg_header h;
    header(&h, K_ABORT, DT_TEXT, (int64_t)strlen(text), NULL);
    int rc = post(&h, text, (int64_t)strlen(text), S.servers, S.nservers);
    wait_all();
    /* Wait (bounded) for the servers' verdict: they drain the other ranks' messages and
       close the files first; exiting at once lets mpiexec kill them before that. */
    double deadline = MPI_Wtime() + 50.0;
    while (rc == 0 && !S.server_failed && MPI_Wtime() < deadline) {
        drain_errors();
        if (!S.server_failed) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    reset(); /* the communicators are not freed: MPI_Comm_free is collective */
    return rc;
}

/* ---------------------------------------------------------------- Fortran shim */

/* An error the Fortran caller did not ask for (no ierr): the job ends.  The servers are
 * told (ABORT: they close the files, print "ensio ioserver: model rank R failed: <error>"
 * once and end the job with MPI_Abort); this rank waits for that, bounded, and never
 * exits first (the launcher would kill the servers before their line is out).  Without
 * servers to tell, this rank prints the line itself. */
void ensio_ioclient_fatal_f(void) {
    char text[1024];
    int rank = S.rank; /* abort resets the state */
    snprintf(text, sizeof text, "%s", S.server_failed ? server_err : errbuf);
    if (S.initialized && !S.server_failed) ensio_ioclient_abort(text);
    else if (!S.initialized) {
        fprintf(stderr, "ensio ioclient: error: %s\n", text);
        fflush(stderr);
        end_job();
    }
    double until = MPI_Wtime() + 30.0;
    while (MPI_Wtime() < until) nap();
    fprintf(stderr, "ensio ioclient: error: model rank %d: %s (the servers did not end the job)\n",
            rank, text);
    fflush(stderr);
    end_job();
}

int ensio_ioclient_init_f(MPI_Fint world, const char *context, MPI_Fint *model_comm) {
    MPI_Comm c = MPI_COMM_NULL;
    int rc = ensio_ioclient_init(MPI_Comm_f2c(world), context, &c);
    if (model_comm) *model_comm = MPI_Comm_c2f(c);
    return rc;
}

int ensio_ioclient_mpi_init_f(void) {
    int flag = 0;
    MPI_Initialized(&flag);
    return flag ? 0 : MPI_Init(NULL, NULL);
}

int ensio_ioclient_mpi_finalize_f(void) { return MPI_Finalize(); }

MPI_Fint ensio_ioclient_comm_world_f(void) { return MPI_Comm_c2f(MPI_COMM_WORLD); }

int ensio_ioclient_comm_rank_f(MPI_Fint comm, int *rank) {
    return MPI_Comm_rank(MPI_Comm_f2c(comm), rank);
}

int ensio_ioclient_comm_size_f(MPI_Fint comm, int *size) {
    return MPI_Comm_size(MPI_Comm_f2c(comm), size);
}

/* ---------------------------------------------------------------- for ensio_ioclient_modes.c */

int ensio_ioclient__fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    return 1;
}

int ensio_ioclient__ready(const char *fn) { return ready(fn, -1, 0); }

int ensio_ioclient__rank(void) { return S.rank; }

int ensio_ioclient__post_one(int64_t kind, const int64_t a[7], int64_t dtype, int64_t count,
                             const char *name, const void *payload, int64_t nbytes,
                             int64_t index) {
    msg_header h;
    header(&h, kind, dtype, count, name);
    h.step = 0; /* as the Python client's restart messages */
    memcpy(h.a, a, sizeof h.a);
    return post(&h, payload, nbytes, &S.servers[index % S.nservers], 1);
}
