/* ensio_ioclient.h -- C client of the ensio asynchronous I/O server.
 *
 * A model written in C (or Fortran, through the module ensio_ioclient) sends its
 * fields to the Python server ranks of `ensio ioserver CONFIG`, started in the same
 * MPMD job (mpiexec -n P model : -n S ensio ioserver CONFIG).  The library speaks
 * the protocol of ensio.ioserver.protocol: the servers define what is written (the
 * YAML config); the model only declares its part of each domain and sends fields.
 *
 *   MPI_Init(&argc, &argv);
 *   MPI_Comm comm;                               // the model's own communicator
 *   ensio_ioclient_init(MPI_COMM_WORLD, "atm", &comm);
 *   ensio_ioclient_set_domain("atm", ibegin, ni, jbegin, nj, lon, lat, NULL, NULL, NULL, NULL);
 *   ensio_ioclient_close_definition();
 *   for (step = 1; step <= nsteps; step++) {
 *       ensio_ioclient_update_timestep(step);
 *       if (ensio_ioclient_is_active("tas", step) == 1)
 *           ensio_ioclient_send_double("tas", tas, ni * nj);
 *   }
 *   ensio_ioclient_report rep;
 *   ensio_ioclient_finalize(&rep);               // frees comm
 *   MPI_Finalize();
 *
 * Every function returns 0 on success and non-zero on error (is_active: 1/0, < 0 on
 * error); ensio_ioclient_errmsg() is the last error as one line naming the field or
 * domain and the rank.  Sends copy the data into a bounded buffer of outstanding
 * non-blocking sends (ENSIO_IOCLIENT_BUFFER_MB MiB per process, default 64) and return
 * at once; they block only while the buffer is full (a message larger than the whole
 * buffer waits until it is empty), and that time is reported by finalize.  A field no
 * file wants at the current step (is_active == 0) is validated but not sent.
 * Local errors (unknown id, wrong size, calls out of order) leave the client usable;
 * an error a server sent (tag 7704) makes every later call fail with it (the servers
 * then end the job themselves).  Errors no rank could go on after end the whole job
 * with one line and exit status 2 on every rank, without returning:
 *   - a failed setup, found on any rank: the servers' config (unknown key or field,
 *     bad frequency or expression, an attached/sync config given to ensio ioserver),
 *     a bad ENSIO_IOCLIENT_BUFFER_MB / ENSIO_IOSERVER_TIMEOUT, no server ranks at all
 *     (init prints "ensio ioserver: error: ..." on the first model rank, all ranks meet
 *     in a barrier, MPI_Finalize, exit(2));
 *   - a server that does not answer for ioserver.timeout_s seconds (default 300;
 *     ENSIO_IOSERVER_TIMEOUT overrides it) while a call waits for it: "ensio ioclient:
 *     error: model rank R: ioserver rank S did not answer for T s (...)" and MPI_Abort.
 * finalize is collective over the model ranks and frees model_comm; abort is not.
 *
 * Modes: ensio_ioclient_init is server mode (the MPMD job has `ensio ioserver` ranks,
 * whose config decides what is written).  ensio_ioclient_init_config(world, context,
 * "iodef.yaml", &comm) reads ioserver.mode from that config, as Python's
 * ensio.ioserver.start does: `server` continues as ensio_ioclient_init; `attached` and
 * `sync` (no server ranks: the model ranks post-process and write) run the Python client
 * inside the model process (libensio_ioclient_py.so, loaded on demand), so every call
 * below has the Python API's semantics and writes the same files.  In attached/sync,
 * set_domain is per rank but close_definition, update_timestep, send (for every active
 * field, an empty part included), write_restart and finalize are collective over the
 * model ranks, as in Python.
 *
 * Restarts (the Python Client.write_restart / read_restart): restart_begin(path,
 * template), restart_put_<type>(variable, ndim, start, shape, block) for each variable
 * of this rank (start: the block's global 0-based index per dimension, C order; any
 * decomposition), then write_restart(): every model rank calls it for each restart in
 * the same order.  The file is a copy of template with those variables replaced,
 * renamed into place when whole; server mode writes it on server rid % S (the call
 * returns once the blocks are in the send buffer), attached/sync on model rank 0
 * before returning.  read_restart_<type>(path, variable, ndim, start, shape, block)
 * reads this rank's box directly (not collective, any mode): a restart written by P
 * ranks is read back by Q ranks, bitwise.  A restart written in this run is on disk
 * once finalize returned (server mode) or at once (attached, sync).
 *
 * Arrays are C order: a field on a grid with a level axis is (nk, nj, ni), without
 * one (nj, ni); unstructured (nk, ni) / (ni).  Steps are 1-based.
 * Not thread safe: call from one thread per process.
 */
#ifndef ENSIO_IOCLIENT_H
#define ENSIO_IOCLIENT_H

#include <stdint.h>
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ENSIO_IOCLIENT_ID_MAX 31   /* longest field or domain id (bytes) */

typedef struct {
    double  blocked_seconds;          /* time sends waited for a full buffer */
    int64_t bytes_sent;               /* bytes sent to the servers (headers included) */
    double  server_busy_fraction;     /* from the first server's report */
    int64_t server_memory_hwm_bytes;
    int64_t bytes_written;
    int64_t files_written;
} ensio_ioclient_report;

int ensio_ioclient_init(MPI_Comm world, const char *context, MPI_Comm *model_comm);
int ensio_ioclient_set_domain(const char *domain_id, int64_t ibegin, int64_t ni,
                              int64_t jbegin, int64_t nj,
                              const double *lon, const double *lat,
                              const double *lon_bounds, const double *lat_bounds,
                              const int *mask, const double *area);
int ensio_ioclient_close_definition(void);
int ensio_ioclient_update_timestep(int64_t step);
int ensio_ioclient_send_double(const char *field_id, const double *data, int64_t count);
int ensio_ioclient_send_float(const char *field_id, const float *data, int64_t count);
int ensio_ioclient_is_active(const char *field_id, int64_t step);
int ensio_ioclient_finalize(ensio_ioclient_report *report);
/* The model failed: tell the servers (ABORT; they close their files valid and end the
 * job with an error naming this rank) and release the library.  Not collective. */
int ensio_ioclient_abort(const char *reason);
const char *ensio_ioclient_errmsg(void);

/* The mode from a config's ioserver.mode (see above); config NULL or "": as init. */
int ensio_ioclient_init_config(MPI_Comm world, const char *context, const char *config,
                               MPI_Comm *model_comm);
int ensio_ioclient_restart_begin(const char *path, const char *template_path);
int ensio_ioclient_restart_put_double(const char *variable, int ndim, const int64_t *start,
                                      const int64_t *shape, const double *block);
int ensio_ioclient_restart_put_float(const char *variable, int ndim, const int64_t *start,
                                     const int64_t *shape, const float *block);
int ensio_ioclient_restart_put_int(const char *variable, int ndim, const int64_t *start,
                                   const int64_t *shape, const int32_t *block);
int ensio_ioclient_write_restart(void);
int ensio_ioclient_read_restart_double(const char *path, const char *variable, int ndim,
                                       const int64_t *start, const int64_t *shape,
                                       double *block);
int ensio_ioclient_read_restart_float(const char *path, const char *variable, int ndim,
                                      const int64_t *start, const int64_t *shape, float *block);
int ensio_ioclient_read_restart_int(const char *path, const char *variable, int ndim,
                                    const int64_t *start, const int64_t *shape, int32_t *block);

/* For the Fortran module: Fortran integer communicators (MPI_Comm_f2c / c2f). */
int ensio_ioclient_init_f(MPI_Fint world, const char *context, MPI_Fint *model_comm);
int ensio_ioclient_init_config_f(MPI_Fint world, const char *context, const char *config,
                                 MPI_Fint *model_comm);
/* The Fortran module's policy for an error without ierr: the job ends, one line
 * (see ensio_ioclient.c).  Does not return. */
void ensio_ioclient_fatal_f(void);
/* For Fortran programs built without Fortran MPI bindings (e.g. a pip MPICH). */
int ensio_ioclient_mpi_init_f(void);
int ensio_ioclient_mpi_finalize_f(void);
MPI_Fint ensio_ioclient_comm_world_f(void);
int ensio_ioclient_comm_rank_f(MPI_Fint comm, int *rank);
int ensio_ioclient_comm_size_f(MPI_Fint comm, int *size);

#ifdef __cplusplus
}
#endif
#endif /* ENSIO_IOCLIENT_H */
