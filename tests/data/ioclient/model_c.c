/* Test model for tests/test_ioserver_cclient.py: sends fields computed from a formula
 * the stub server checks independently.
 *   model_c normal        the whole run
 *   model_c errors        also calls with an unknown field id and a wrong size (prints ERR lines)
 *   model_c server_error  stops at the first failing call (a server error, tag 7704)
 *   model_c abort         model rank 0 calls ensio_ioclient_abort at step 2
 * Grid: rectilinear "atm" 8 x 6, axis "lev" 3, unstructured "cells" 10 cells (3 vertices),
 * curvilinear "ocn" 4 x 3, split over the model ranks along j (atm) and i (cells, ocn).
 * Steps 1..4.
 * value(field, s, k, j, i) = off + s*1000 + k*100 + j*10 + i + 0.25, off: tas 0, ta 0.5;
 * cu = s*1000 + i + 0.75, sst = s*1000 + j*10 + i + 0.125.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ensio_ioclient.h"

#define NI 8
#define NJ 6
#define NK 3
#define NC 10
#define OI 4
#define OJ 3
#define NSTEPS 4

static double val(double off, int s, int k, int j, int i) {
    return off + s * 1000.0 + k * 100.0 + j * 10.0 + i + 0.25;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "normal";
    MPI_Comm comm;
    int rank, size, wrank, rc;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    if (ensio_ioclient_init(MPI_COMM_WORLD, "test", &comm)) {
        fprintf(stderr, "init: %s\n", ensio_ioclient_errmsg());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int jb = rank * NJ / size, nj = (rank + 1) * NJ / size - jb;
    int ib = rank * NC / size, nc = (rank + 1) * NC / size - ib;
    double lon[NI], lat[NJ], lonb[NI * 2], latb[NJ * 2], area[NI * NJ];
    int mask[NI * NJ];
    for (int i = 0; i < NI; i++) {
        lon[i] = i * 45.0;
        lonb[2 * i] = lon[i] - 22.5, lonb[2 * i + 1] = lon[i] + 22.5;
    }
    for (int j = 0; j < nj; j++) {
        lat[j] = -75.0 + (jb + j) * 30.0;
        latb[2 * j] = lat[j] - 15.0, latb[2 * j + 1] = lat[j] + 15.0;
        for (int i = 0; i < NI; i++) {
            mask[j * NI + i] = (i + jb + j) % 5 != 0;
            area[j * NI + i] = 1.0 + i + 10.0 * (jb + j);
        }
    }
    double clon[NC], clat[NC], clonb[NC * 3], clatb[NC * 3];
    for (int c = 0; c < nc; c++) {
        int g = ib + c;
        clon[c] = g * 36.0, clat[c] = 0.5 * g - 2.0;
        for (int v = 0; v < 3; v++) {
            clonb[3 * c + v] = clon[c] + (v - 1);
            clatb[3 * c + v] = clat[c] + (v == 1 ? 1.0 : -1.0);
        }
    }
    int ob = rank * OI / size, no = (rank + 1) * OI / size - ob;
    double olon[OI * OJ], olat[OI * OJ], olonb[OI * OJ * 4], olatb[OI * OJ * 4], oarea[OI * OJ];
    for (int j = 0; j < OJ; j++)
        for (int c = 0; c < no; c++) {
            int p = j * no + c, g = ob + c;
            olon[p] = 10.0 * g + j, olat[p] = 20.0 * j - g, oarea[p] = 100.0 + g + j;
            for (int v = 0; v < 4; v++) {
                olonb[4 * p + v] = olon[p] + (v == 1 || v == 2 ? 0.5 : -0.5);
                olatb[4 * p + v] = olat[p] + (v >= 2 ? 0.5 : -0.5);
            }
        }
    rc = ensio_ioclient_set_domain("ocn", ob, no, 0, OJ, olon, olat, olonb, olatb, NULL, oarea);
    rc |= ensio_ioclient_set_domain("atm", 0, NI, jb, nj, lon, lat, lonb, latb, mask, area);
    rc |= ensio_ioclient_set_domain("cells", ib, nc, 0, 1, clon, clat, clonb, clatb, NULL, NULL);
    rc |= ensio_ioclient_close_definition();
    if (rc) {
        fprintf(stderr, "definition: %s\n", ensio_ioclient_errmsg());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (strcmp(mode, "errors") == 0 && ensio_ioclient_is_active("tas", 0) < 0)
        printf("ERR nostep: %s\n", ensio_ioclient_errmsg());
    double *tas = malloc(sizeof(double) * NI * nj);
    float *ta = malloc(sizeof(float) * NK * NI * nj);
    double *cu = malloc(sizeof(double) * (nc ? nc : 1));
    double sst[OI * OJ];
    for (int s = 1; s <= NSTEPS; s++) {
        if ((rc = ensio_ioclient_update_timestep(s))) break;
        if (strcmp(mode, "abort") == 0 && rank == 0 && s == 2) {
            rc = ensio_ioclient_abort("model blew up at step 2");
            printf("ABORTED rank %d rc %d\n", wrank, rc);
            free(tas), free(ta), free(cu);
            MPI_Finalize();
            return 0;
        }
        for (int j = 0; j < nj; j++)
            for (int i = 0; i < NI; i++) {
                tas[j * NI + i] = val(0.0, s, 0, jb + j, i);
                for (int k = 0; k < NK; k++)
                    ta[(k * nj + j) * NI + i] = (float)val(0.5, s, k, jb + j, i);
            }
        for (int c = 0; c < nc; c++) cu[c] = s * 1000.0 + ib + c + 0.75;
        for (int j = 0; j < OJ; j++)
            for (int c = 0; c < no; c++) sst[j * no + c] = s * 1000.0 + j * 10.0 + ob + c + 0.125;
        if (strcmp(mode, "errors") == 0 && s == 1) {
            if (ensio_ioclient_send_double("nosuch", tas, NI * nj) != 0)
                printf("ERR unknown: %s\n", ensio_ioclient_errmsg());
            if (ensio_ioclient_send_double("tas", tas, NI * nj - 1) != 0)
                printf("ERR size: %s\n", ensio_ioclient_errmsg());
            if (ensio_ioclient_is_active("nosuch", s) < 0)
                printf("ERR active: %s\n", ensio_ioclient_errmsg());
            if (ensio_ioclient_set_domain("atm", 0, NI, jb, nj, NULL, NULL, NULL, NULL, NULL, NULL))
                printf("ERR closed: %s\n", ensio_ioclient_errmsg());
        }
        if ((rc = ensio_ioclient_send_double("tas", tas, NI * nj))) break;
        if ((rc = ensio_ioclient_send_double("sst", sst, OJ * no))) break;
        /* every step: the library skips the steps no file wants (period 2) */
        if ((rc = ensio_ioclient_send_float("ta", ta, NK * NI * nj))) break;
        int act = ensio_ioclient_is_active("cu", s);
        if (act < 0 || (act == 1 && (rc = ensio_ioclient_send_double("cu", cu, nc)))) {
            rc = 1;
            break;
        }
        if (ensio_ioclient_is_active("pr", s) != 0) {
            printf("ERR pr is active at step %d\n", s);
            rc = 1;
            break;
        }
    }
    if (rc) printf("STOPPED rank %d: %s\n", wrank, ensio_ioclient_errmsg());
    ensio_ioclient_report rep;
    rc = ensio_ioclient_finalize(&rep);
    if (rc) printf("FINALIZE rank %d: %s\n", wrank, ensio_ioclient_errmsg());
    printf("REPORT %d %lld %.6f %lld %lld %lld %.9f\n", wrank, (long long)rep.bytes_sent,
           rep.server_busy_fraction, (long long)rep.server_memory_hwm_bytes,
           (long long)rep.bytes_written, (long long)rep.files_written, rep.blocked_seconds);
    free(tas), free(ta), free(cu);
    MPI_Finalize();
    return 0;
}
