/* stencil_mpi.c -- the few MPI calls of the Fortran stencil model (stencil.f90).
 *
 * Why C: the Fortran model must build against the MPI the ensio client library uses,
 * and a pip MPICH has no Fortran bindings (no `use mpi`).  Communicators cross as
 * Fortran integers (MPI_Comm_f2c), as in ensio_ioclient.f90.
 */
#include <mpi.h>

/* Send n doubles to dest and receive n into recv from source (-1: MPI_PROC_NULL). */
int stencil_sendrecv(MPI_Fint comm, const double *send, int n, int dest, double *recv,
                     int source) {
    return MPI_Sendrecv(send, n, MPI_DOUBLE, dest < 0 ? MPI_PROC_NULL : dest, 7801, recv, n,
                        MPI_DOUBLE, source < 0 ? MPI_PROC_NULL : source, 7801,
                        MPI_Comm_f2c(comm), MPI_STATUS_IGNORE);
}

/* A communicator of the model's own (ensio_ioclient_finalize frees the one it gave). */
int stencil_dup(MPI_Fint comm, MPI_Fint *out) {
    MPI_Comm c;
    int rc = MPI_Comm_dup(MPI_Comm_f2c(comm), &c);
    *out = MPI_Comm_c2f(c);
    return rc;
}

int stencil_free(MPI_Fint comm) {
    MPI_Comm c = MPI_Comm_f2c(comm);
    return MPI_Comm_free(&c);
}

int stencil_barrier(MPI_Fint comm) { return MPI_Barrier(MPI_Comm_f2c(comm)); }

/* x <- the maximum of x over comm. */
int stencil_max(MPI_Fint comm, double *x) {
    return MPI_Allreduce(MPI_IN_PLACE, x, 1, MPI_DOUBLE, MPI_MAX, MPI_Comm_f2c(comm));
}

double stencil_wtime(void) { return MPI_Wtime(); }
