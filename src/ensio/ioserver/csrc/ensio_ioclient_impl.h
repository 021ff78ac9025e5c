/* ensio_ioclient_impl.h -- private interface between the files of libensio_ioclient.
 *
 * ensio_ioclient.c (server mode: handshake, field table, send buffer) owns the client
 * state; ensio_ioclient_modes.c (attached/sync through the embedded Python, restarts)
 * reaches it only through these functions.  Not installed.
 */
#ifndef ENSIO_IOCLIENT_IMPL_H
#define ENSIO_IOCLIENT_IMPL_H

#include "ensio_ioclient.h"

/* Record an error message (ensio_ioclient_errmsg) and return 1. */
int ensio_ioclient__fail(const char *fmt, ...);
/* 0 when the client is initialised and no server error arrived (else 1, message set). */
int ensio_ioclient__ready(const char *fn);
/* World rank of this process in the communicator given to init. */
int ensio_ioclient__rank(void);
/* Copy one message into the bounded send buffer, to server servers[index % nservers]. */
int ensio_ioclient__post_one(int64_t kind, const int64_t a[7], int64_t dtype, int64_t count,
                             const char *name, const void *payload, int64_t nbytes,
                             int64_t index);

/* Set by init when the job has no server ranks: every call goes to the embedded Python. */
extern int ensio_ioclient__embedded;
int ensio_ioclient__py_set_domain(const char *domain_id, int64_t ibegin, int64_t ni,
                                  int64_t jbegin, int64_t nj, const double *lon,
                                  const double *lat, const double *lon_bounds,
                                  const double *lat_bounds, const int *mask, const double *area);
int ensio_ioclient__py_simple(const char *method);             /* close_definition */
int ensio_ioclient__py_step(int64_t step);
int ensio_ioclient__py_send(const char *field_id, const void *data, int64_t count, int dtype);
int ensio_ioclient__py_is_active(const char *field_id, int64_t step);
int ensio_ioclient__py_finalize(ensio_ioclient_report *report);
int ensio_ioclient__py_abort(const char *reason);
/* For the Fortran module: set the error message (returns 1). */
int ensio_ioclient_fail_f(const char *text);
/* Forget restarts in progress and the restart counter (finalize). */
void ensio_ioclient__restart_reset(void);

#endif /* ENSIO_IOCLIENT_IMPL_H */
