/* The C twin of model_restart.F90 for tests/test_ioclient_restart.py (written for the
 * test): same arguments, decompositions and variables, through the C API, where starts
 * and shapes are in C order (the file's netCDF dimension order).
 *
 * Usage: model_restart_c CONFIG SPLIT INPUT TEMPLATE OUTPUT
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ensio_ioclient.h"

enum { NLON = 16, NLAT = 11, NLEV = 3 };

static void check(int rc, int rank) {
    if (rc == 0) return;
    fprintf(stderr, "model_restart_c rank %d: %s\n", rank, ensio_ioclient_errmsg());
    MPI_Abort(MPI_COMM_WORLD, 3);
}

int main(int argc, char **argv) {
    MPI_Comm comm;
    int rank, nproc;
    if (argc != 6) return 2;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    check(ensio_ioclient_init_config(MPI_COMM_WORLD, "restart", argv[1], &comm), rank);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &nproc);
    int64_t i0 = 0, ni = NLON, j0 = 0, nj = NLAT;
    if (strcmp(argv[2], "lat") == 0) {
        j0 = (int64_t)rank * NLAT / nproc;
        nj = (int64_t)(rank + 1) * NLAT / nproc - j0;
    } else {
        i0 = (int64_t)rank * NLON / nproc;
        ni = (int64_t)(rank + 1) * NLON / nproc - i0;
    }
    double *state = malloc((size_t)(NLEV * nj * ni) * sizeof *state);
    float *sst = malloc((size_t)(nj * ni) * sizeof *sst);
    int32_t *kind = malloc((size_t)(nj * ni) * sizeof *kind);
    int64_t s3[3] = {0, j0, i0}, n3[3] = {NLEV, nj, ni}, s2[2] = {j0, i0}, n2[2] = {nj, ni};
    check(ensio_ioclient_read_restart_double(argv[3], "state", 3, s3, n3, state), rank);
    check(ensio_ioclient_read_restart_float(argv[3], "sst", 2, s2, n2, sst), rank);
    check(ensio_ioclient_read_restart_int(argv[3], "kind", 2, s2, n2, kind), rank);
    check(ensio_ioclient_restart_begin(argv[5], argv[4]), rank);
    check(ensio_ioclient_restart_put_double("state", 3, s3, n3, state), rank);
    check(ensio_ioclient_restart_put_float("sst", 2, s2, n2, sst), rank);
    check(ensio_ioclient_restart_put_int("kind", 2, s2, n2, kind), rank);
    check(ensio_ioclient_write_restart(), rank);
    check(ensio_ioclient_finalize(NULL), rank);
    printf("DONE %d\n", rank);
    free(state), free(sst), free(kind);
    MPI_Finalize();
    return 0;
}
