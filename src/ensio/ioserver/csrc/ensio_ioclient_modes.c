/* ensio_ioclient_modes.c -- attached/sync modes and restarts of the C client.
 *
 * Attached and sync (no server ranks in the job; ioserver.mode from the config the model
 * names) go through the embedded Python: libensio_ioclient_py.so (ensio_ioclient_py.c)
 * is dlopen()ed here, RTLD_GLOBAL so that numpy, mpi4py and netCDF4 find libpython, and
 * every call is forwarded to ensio.ioserver.embed.Session, i.e. to the Python Client:
 * same checks, same graph, same files as a Python model.
 *
 * Restarts (seed 003, the Python Client.write_restart/read_restart): begin, put the
 * rank's blocks, write.  Server mode sends RESTART_BEGIN / PART / END exactly as the
 * Python ServerLink (ensio.ioserver.protocol): the server servers[rid % S] assembles
 * the blocks of every model rank (the remapping) and writes the file as a copy of the
 * template renamed into place.  Attached/sync hand the blocks to the Python client.
 * read_restart reads this rank's box of the file directly, in every mode, through the
 * embedded Python's netCDF4 (the mirror of the writer, so a round trip is bitwise).
 */
#include "ensio_ioclient_impl.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef ENSIO_IOCLIENT_PYLIB
#define ENSIO_IOCLIENT_PYLIB "libensio_ioclient_py.so"
#endif

enum { K_RESTART_BEGIN = 7, K_RESTART_PART = 8, K_RESTART_END = 9 };
enum { W_F64 = 0, W_F32 = 1, W_TEXT = 3 };
#define MAXDIM 8
#define F32_EXACT 16777216LL /* 2**24: index values exact in float32 below it */

int ensio_ioclient__embedded = 0;

typedef int (*start_fn)(int, const char *, const char *, char *, size_t);
typedef int (*call_fn)(int, const char *, double *, int, char *, size_t, const char *, ...);
typedef void (*end_fn)(void);
static struct { void *lib; start_fn start; call_fn call; end_fn end; } P;
static char pyerr[1024];
static int rank_of(void);

/* ---------------------------------------------------------------- the embedded Python */

static int load_python(const char *fn) {
    if (P.lib) return 0;
    const char *path = getenv("ENSIO_IOCLIENT_PYLIB");
    if (!path || !*path) path = ENSIO_IOCLIENT_PYLIB;
    P.lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!P.lib)
        return ensio_ioclient__fail("%s on rank %d: cannot load the embedded-Python part of "
                                    "the client (%s): %s", fn, rank_of(), path,
                                    dlerror());
    P.start = (start_fn)dlsym(P.lib, "ensio_ioclient_py_start");
    P.call = (call_fn)dlsym(P.lib, "ensio_ioclient_py_call");
    P.end = (end_fn)dlsym(P.lib, "ensio_ioclient_py_end");
    if (!P.start || !P.call || !P.end) {
        dlclose(P.lib);
        P.lib = NULL;
        return ensio_ioclient__fail("%s: %s is not the embedded-Python client (rebuild with "
                                    "ensio ioclient build)", fn, path);
    }
    return 0;
}

/* The Python error of the last call, as the client's error message. */
static int py_failed(const char *fn) {
    if (strncmp(pyerr, "model rank", 10) == 0) return ensio_ioclient__fail("%s: %s", fn, pyerr);
    return ensio_ioclient__fail("%s on rank %d: %s", fn, rank_of(), pyerr);
}

#define ADDR(p) ((unsigned long long)(uintptr_t)(p))

/* This rank in the world given to init (the C state's rank is set only in server mode). */
static int my_rank;
static int rank_of(void) {
    return ensio_ioclient__embedded ? my_rank : ensio_ioclient__rank();
}

int ensio_ioclient_init_config(MPI_Comm world, const char *context, const char *config,
                               MPI_Comm *model_comm) {
    const char *fn = "ensio_ioclient_init_config";
    double mode = 0, comm = 0;
    int flag = 0;
    if (!config || !*config) return ensio_ioclient_init(world, context, model_comm);
    if (ensio_ioclient__embedded)
        return ensio_ioclient__fail("%s: already initialised on rank %d", fn, my_rank);
    MPI_Initialized(&flag);
    if (!flag) return ensio_ioclient__fail("%s: call MPI_Init first", fn);
    if (!model_comm) return ensio_ioclient__fail("%s: model_comm is NULL", fn);
    MPI_Comm_rank(world, &my_rank);
    if (load_python(fn)) return 1;
    /* ioserver.mode decides, as in Python's start: server = today's pure-C path */
    if (P.call(1, "config_mode", &mode, 1, pyerr, sizeof pyerr, "(s)", config))
        return py_failed(fn);
    if (mode == 0) return ensio_ioclient_init(world, context, model_comm);
    if (P.start((int)MPI_Comm_c2f(world), config, context ? context : "model", pyerr,
                sizeof pyerr))
        return py_failed(fn);
    ensio_ioclient__embedded = 1;
    if (P.call(0, "model_comm", &comm, 1, pyerr, sizeof pyerr, "()")) {
        ensio_ioclient__embedded = 0;
        return py_failed(fn);
    }
    *model_comm = MPI_Comm_f2c((MPI_Fint)comm);
    return 0;
}

int ensio_ioclient_init_config_f(MPI_Fint world, const char *context, const char *config,
                                 MPI_Fint *model_comm) {
    MPI_Comm c = MPI_COMM_NULL;
    int rc = ensio_ioclient_init_config(MPI_Comm_f2c(world), context, config, &c);
    if (model_comm) *model_comm = MPI_Comm_c2f(c);
    return rc;
}

int ensio_ioclient__py_set_domain(const char *domain_id, int64_t ibegin, int64_t ni,
                                  int64_t jbegin, int64_t nj, const double *lon,
                                  const double *lat, const double *lon_bounds,
                                  const double *lat_bounds, const int *mask, const double *area) {
    if (!domain_id) return ensio_ioclient__fail("ensio_ioclient_set_domain: domain id is NULL");
    if (P.call(0, "set_domain", NULL, 0, pyerr, sizeof pyerr, "(sLLLLKKKKKK)", domain_id,
               (long long)ibegin, (long long)ni, (long long)jbegin, (long long)nj, ADDR(lon),
               ADDR(lat), ADDR(lon_bounds), ADDR(lat_bounds), ADDR(mask), ADDR(area)))
        return py_failed("ensio_ioclient_set_domain");
    return 0;
}

int ensio_ioclient__py_simple(const char *method) {
    if (P.call(0, method, NULL, 0, pyerr, sizeof pyerr, "()")) {
        char fn[64];
        snprintf(fn, sizeof fn, "ensio_ioclient_%s", method);
        return py_failed(fn);
    }
    return 0;
}

int ensio_ioclient__py_step(int64_t step) {
    if (P.call(0, "update_timestep", NULL, 0, pyerr, sizeof pyerr, "(L)", (long long)step))
        return py_failed("ensio_ioclient_update_timestep");
    return 0;
}

int ensio_ioclient__py_send(const char *field_id, const void *data, int64_t count, int dtype) {
    const char *fn = dtype ? "ensio_ioclient_send_float" : "ensio_ioclient_send_double";
    if (!field_id) return ensio_ioclient__fail("%s: field id is NULL", fn);
    if (count > 0 && !data)
        return ensio_ioclient__fail("%s: field '%s' on rank %d: data is NULL", fn, field_id,
                                    rank_of());
    if (P.call(0, "send", NULL, 0, pyerr, sizeof pyerr, "(sKLi)", field_id, ADDR(data),
               (long long)count, dtype))
        return py_failed(fn);
    return 0;
}

int ensio_ioclient__py_is_active(const char *field_id, int64_t step) {
    double on = 0;
    if (!field_id) {
        ensio_ioclient__fail("ensio_ioclient_is_active: field id is NULL");
        return -1;
    }
    if (P.call(0, "is_active", &on, 1, pyerr, sizeof pyerr, "(sL)", field_id, (long long)step)) {
        py_failed("ensio_ioclient_is_active");
        return -1;
    }
    return on != 0;
}

int ensio_ioclient__py_finalize(ensio_ioclient_report *report) {
    double r[6] = {0, 0, 0, 0, 0, 0};
    int rc = P.call(0, "finalize", r, 6, pyerr, sizeof pyerr, "()");
    P.end();
    ensio_ioclient__embedded = 0;
    ensio_ioclient__restart_reset();
    if (report) {
        report->blocked_seconds = r[0];
        report->bytes_sent = (int64_t)r[1];
        report->server_busy_fraction = r[2];
        report->server_memory_hwm_bytes = (int64_t)r[3];
        report->bytes_written = (int64_t)r[4];
        report->files_written = (int64_t)r[5];
    }
    return rc ? py_failed("ensio_ioclient_finalize") : 0;
}

int ensio_ioclient__py_abort(const char *reason) {
    /* Session.abort closes this rank's files and ends the job (MPI_Abort). */
    if (P.call(0, "abort", NULL, 0, pyerr, sizeof pyerr, "(s)", reason ? reason : "model aborted"))
        return py_failed("ensio_ioclient_abort");
    return 0;
}

/* The Fortran module's own argument errors, as the client's error message. */
int ensio_ioclient_fail_f(const char *text) {
    return ensio_ioclient__fail("%s on rank %d", text, rank_of());
}

/* ---------------------------------------------------------------- restarts */

typedef struct {
    char name[32];
    int ndim, dtype;                   /* 0 f64, 1 f32, 2 int32 */
    int64_t start[MAXDIM], shape[MAXDIM], n;
    void *data;
} rblock;

static struct {
    char *path, *tmpl;
    rblock *b;
    int n;
    int64_t next_rid;
} R;

static void drop_blocks(void) {
    for (int i = 0; i < R.n; i++) free(R.b[i].data);
    free(R.b), free(R.path), free(R.tmpl);
    R.b = NULL, R.path = R.tmpl = NULL, R.n = 0;
}

void ensio_ioclient__restart_reset(void) {
    drop_blocks();
    R.next_rid = 0;
}

/* Absolute path, as Python's Path.absolute() (no symlink resolution). */
static char *absolute(const char *p) {
    char cwd[4096];
    if (p[0] == '/' || !getcwd(cwd, sizeof cwd)) return strdup(p);
    size_t n = strlen(cwd) + strlen(p) + 2;
    char *out = malloc(n);
    if (out) snprintf(out, n, "%s/%s", cwd, p);
    return out;
}

int ensio_ioclient_restart_begin(const char *path, const char *template_path) {
    const char *fn = "ensio_ioclient_restart_begin";
    if (!ensio_ioclient__embedded && ensio_ioclient__ready(fn)) return 1;
    if (!path || !*path || !template_path || !*template_path)
        return ensio_ioclient__fail("%s on rank %d: path and template must be given", fn,
                                    rank_of());
    if (R.path)
        return ensio_ioclient__fail("%s on rank %d: restart %s begun and not written (call "
                                    "ensio_ioclient_write_restart)", fn, rank_of(),
                                    R.path);
    R.path = absolute(path);
    R.tmpl = absolute(template_path);
    if (!R.path || !R.tmpl) {
        drop_blocks();
        return ensio_ioclient__fail("%s: out of memory", fn);
    }
    return 0;
}

static int restart_put(const char *fn, const char *variable, int ndim, const int64_t *start,
                       const int64_t *shape, const void *block, int dtype, size_t elsize) {
    int rank = rank_of();
    if (!ensio_ioclient__embedded && ensio_ioclient__ready(fn)) return 1;
    if (!R.path)
        return ensio_ioclient__fail("%s on rank %d: call ensio_ioclient_restart_begin first", fn,
                                    rank);
    if (!variable || !*variable || strlen(variable) > ENSIO_IOCLIENT_ID_MAX)
        return ensio_ioclient__fail("%s on rank %d: variable name missing or longer than %d "
                                    "bytes", fn, rank, ENSIO_IOCLIENT_ID_MAX);
    if (ndim < 1 || ndim > MAXDIM || !start || !shape)
        return ensio_ioclient__fail("%s: restart %s: %s on rank %d: ndim %d (1..%d) with start "
                                    "and shape", fn, R.path, variable, rank, ndim, MAXDIM);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (start[d] < 0 || shape[d] < 0)
            return ensio_ioclient__fail("%s: restart %s: %s on rank %d: negative start or "
                                        "shape in dimension %d", fn, R.path, variable, rank, d);
        n *= shape[d];
    }
    if (n > 0 && !block)
        return ensio_ioclient__fail("%s: restart %s: %s on rank %d: block is NULL", fn, R.path,
                                    variable, rank);
    for (int i = 0; i < R.n; i++)
        if (strcmp(R.b[i].name, variable) == 0)
            return ensio_ioclient__fail("%s: restart %s: %s put twice on rank %d", fn, R.path,
                                        variable, rank);
    rblock *grown = realloc(R.b, (size_t)(R.n + 1) * sizeof *R.b);
    if (!grown) return ensio_ioclient__fail("%s: out of memory", fn);
    R.b = grown;
    rblock *b = &R.b[R.n];
    memset(b, 0, sizeof *b);
    strcpy(b->name, variable);
    b->ndim = ndim, b->dtype = dtype, b->n = n;
    memcpy(b->start, start, (size_t)ndim * sizeof *start);
    memcpy(b->shape, shape, (size_t)ndim * sizeof *shape);
    b->data = malloc((size_t)(n ? n : 1) * elsize);
    if (!b->data) return ensio_ioclient__fail("%s: out of memory for %s", fn, variable);
    if (n) memcpy(b->data, block, (size_t)n * elsize);
    R.n++;
    return 0;
}

int ensio_ioclient_restart_put_double(const char *variable, int ndim, const int64_t *start,
                                      const int64_t *shape, const double *block) {
    return restart_put("ensio_ioclient_restart_put_double", variable, ndim, start, shape, block,
                       0, sizeof(double));
}

int ensio_ioclient_restart_put_float(const char *variable, int ndim, const int64_t *start,
                                     const int64_t *shape, const float *block) {
    return restart_put("ensio_ioclient_restart_put_float", variable, ndim, start, shape, block, 1,
                       sizeof(float));
}

int ensio_ioclient_restart_put_int(const char *variable, int ndim, const int64_t *start,
                                   const int64_t *shape, const int32_t *block) {
    return restart_put("ensio_ioclient_restart_put_int", variable, ndim, start, shape, block, 2,
                       sizeof(int32_t));
}

/* JSON string body of s (quotes and backslashes escaped, control characters as \u00XX). */
static size_t json_str(char *out, size_t cap, const char *s) {
    size_t k = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char tmp[8];
        if (c == '"' || c == '\\') snprintf(tmp, sizeof tmp, "\\%c", c);
        else if (c < 0x20) snprintf(tmp, sizeof tmp, "\\u%04x", c);
        else tmp[0] = (char)c, tmp[1] = 0;
        for (char *t = tmp; *t; t++) {
            if (out && k + 1 < cap) out[k] = *t;
            k++;
        }
    }
    if (out && cap) out[k < cap ? k : cap - 1] = 0;
    return k;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const rblock *)a)->name, ((const rblock *)b)->name);
}

/* The RestartMeta JSON (ensio.ioserver.restart.RestartMeta.to_json), variables sorted. */
static char *meta_json(int64_t rid) {
    size_t cap = 256 + 2 * (json_str(NULL, 0, R.path) + json_str(NULL, 0, R.tmpl));
    for (int i = 0; i < R.n; i++) cap += 2 * json_str(NULL, 0, R.b[i].name) + 8;
    char *j = malloc(cap);
    if (!j) return NULL;
    size_t k = (size_t)snprintf(j, cap, "{\"rid\": %lld, \"path\": \"", (long long)rid);
    k += json_str(j + k, cap - k, R.path);
    k += (size_t)snprintf(j + k, cap - k, "\", \"template\": \"");
    k += json_str(j + k, cap - k, R.tmpl);
    k += (size_t)snprintf(j + k, cap - k, "\", \"variables\": [");
    for (int i = 0; i < R.n; i++) {
        k += (size_t)snprintf(j + k, cap - k, "%s\"", i ? ", " : "");
        k += json_str(j + k, cap - k, R.b[i].name);
        k += (size_t)snprintf(j + k, cap - k, "\"");
    }
    snprintf(j + k, cap - k, "], \"fsync\": true}");
    return j;
}

/* One RESTART_PART (protocol.restart_part): starts, counts, block; F32 only for float
 * blocks whose indices are exact in float32, else everything as F64. */
static int send_part(int64_t rid, const rblock *b) {
    int f32 = b->dtype == 1;
    for (int d = 0; d < b->ndim; d++)
        if (b->start[d] >= F32_EXACT || b->shape[d] >= F32_EXACT) f32 = 0;
    int64_t count = 2 * b->ndim + b->n;
    size_t el = f32 ? sizeof(float) : sizeof(double);
    char *payload = malloc((size_t)count * el);
    if (!payload) return ensio_ioclient__fail("ensio_ioclient_write_restart: out of memory");
    for (int d = 0; d < b->ndim; d++) {
        if (f32) {
            ((float *)payload)[d] = (float)b->start[d];
            ((float *)payload)[b->ndim + d] = (float)b->shape[d];
        } else {
            ((double *)payload)[d] = (double)b->start[d];
            ((double *)payload)[b->ndim + d] = (double)b->shape[d];
        }
    }
    if (f32) {
        memcpy((float *)payload + 2 * b->ndim, b->data, (size_t)b->n * sizeof(float));
    } else {
        double *v = (double *)payload + 2 * b->ndim;
        for (int64_t i = 0; i < b->n; i++)
            v[i] = b->dtype == 0 ? ((const double *)b->data)[i]
                 : b->dtype == 1 ? (double)((const float *)b->data)[i]
                 : (double)((const int32_t *)b->data)[i];
    }
    int64_t a[7] = {rid, b->ndim, 0, 0, 0, 0, 0};
    int rc = ensio_ioclient__post_one(K_RESTART_PART, a, f32 ? W_F32 : W_F64, count, b->name,
                                      payload, count * (int64_t)el, rid);
    free(payload);
    return rc;
}

static int write_server(int64_t rid) {
    char *json = meta_json(rid);
    if (!json) return ensio_ioclient__fail("ensio_ioclient_write_restart: out of memory");
    int64_t a[7] = {rid, 0, 0, 0, 0, 0, 0};
    int64_t len = (int64_t)strlen(json);
    int rc = ensio_ioclient__post_one(K_RESTART_BEGIN, a, W_TEXT, len, NULL, json, len, rid);
    free(json);
    int64_t sent = 0;
    for (int i = 0; i < R.n && rc == 0; i++) {
        if (R.b[i].n == 0) continue;
        rc = send_part(rid, &R.b[i]);
        sent++;
    }
    a[1] = sent;
    if (rc == 0) rc = ensio_ioclient__post_one(K_RESTART_END, a, W_F64, 0, NULL, NULL, 0, rid);
    return rc;
}

static int write_embedded(int64_t rid) {
    const char *fn = "ensio_ioclient_write_restart";
    for (int i = 0; i < R.n; i++) {
        const rblock *b = &R.b[i];
        if (P.call(0, "restart_put", NULL, 0, pyerr, sizeof pyerr, "(siKKiK)", b->name, b->ndim,
                   ADDR(b->start), ADDR(b->shape), b->dtype, ADDR(b->data)))
            return py_failed(fn);
    }
    if (P.call(0, "write_restart", NULL, 0, pyerr, sizeof pyerr, "(ssL)", R.path, R.tmpl,
               (long long)rid))
        return py_failed(fn);
    return 0;
}

int ensio_ioclient_write_restart(void) {
    const char *fn = "ensio_ioclient_write_restart";
    if (!ensio_ioclient__embedded && ensio_ioclient__ready(fn)) return 1;
    if (!R.path)
        return ensio_ioclient__fail("%s on rank %d: call ensio_ioclient_restart_begin first", fn,
                                    rank_of());
    qsort(R.b, (size_t)R.n, sizeof *R.b, by_name);
    int64_t rid = R.next_rid++;
    int rc = ensio_ioclient__embedded ? write_embedded(rid) : write_server(rid);
    drop_blocks();
    return rc;
}

static int read_restart(const char *fn, const char *path, const char *variable, int ndim,
                        const int64_t *start, const int64_t *shape, void *block, int dtype) {
    int rank = rank_of();
    if (!ensio_ioclient__embedded && ensio_ioclient__ready(fn)) return 1;
    if (!path || !variable || ndim < 1 || ndim > MAXDIM || !start || !shape)
        return ensio_ioclient__fail("%s on rank %d: path, variable, ndim (1..%d), start and "
                                    "shape must be given", fn, rank, MAXDIM);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d] > 0 ? shape[d] : 0;
    if (n > 0 && !block)
        return ensio_ioclient__fail("%s: %s: %s on rank %d: block is NULL", fn, path, variable,
                                    rank);
    if (load_python(fn)) return 1;
    if (P.call(1, "read_block", NULL, 0, pyerr, sizeof pyerr, "(ssiKKKi)", path, variable, ndim,
               ADDR(start), ADDR(shape), ADDR(block), dtype))
        return py_failed(fn);
    return 0;
}

int ensio_ioclient_read_restart_double(const char *path, const char *variable, int ndim,
                                       const int64_t *start, const int64_t *shape,
                                       double *block) {
    return read_restart("ensio_ioclient_read_restart_double", path, variable, ndim, start, shape,
                        block, 0);
}

int ensio_ioclient_read_restart_float(const char *path, const char *variable, int ndim,
                                      const int64_t *start, const int64_t *shape, float *block) {
    return read_restart("ensio_ioclient_read_restart_float", path, variable, ndim, start, shape,
                        block, 1);
}

int ensio_ioclient_read_restart_int(const char *path, const char *variable, int ndim,
                                    const int64_t *start, const int64_t *shape, int32_t *block) {
    return read_restart("ensio_ioclient_read_restart_int", path, variable, ndim, start, shape,
                        block, 2);
}
