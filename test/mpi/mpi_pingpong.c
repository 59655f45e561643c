/*
 * vrdma-mpi-pingpong: MPI ping-pong between ranks 0 and 1 (other ranks
 * idle), for scripts/bench-mpi.sh. For each size, a warm-up decides how
 * many round trips fit in the time budget; then it prints
 *
 *   SIZE  LATENCY_US  BANDWIDTH_MBPS
 *
 * where latency is half the mean round-trip time and bandwidth is SIZE
 * divided by that latency (10^6 bytes per second). Buffers are allocated
 * once and touched, so the registration cost is paid in the warm-up.
 *
 * Usage: vrdma-mpi-pingpong [--min BYTES] [--max BYTES] [--budget SECONDS]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    size_t min = 8, max = 4u << 20;
    double budget = 0.25;
    int rank, n;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--min")) min = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--max")) max = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--budget")) budget = atof(argv[i + 1]);
    }
    if (n < 2) {
        fprintf(stderr, "vrdma-mpi-pingpong: needs 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char *buf = malloc(max ? max : 1);
    memset(buf, rank, max ? max : 1);
    int peer = rank == 0 ? 1 : 0;
    if (rank == 0) printf("# size latency_us bandwidth_MBps\n");
    for (size_t size = min; size <= max; size *= 2) {
        int iters = 10;
        for (int pass = 0; pass < 2; ++pass) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (rank < 2) {
                for (int i = 0; i < iters; ++i) {
                    if (rank == 0) {
                        MPI_Send(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                        MPI_Recv(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    } else {
                        MPI_Recv(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                        MPI_Send(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                    }
                }
            }
            double dt = MPI_Wtime() - t0;
            if (pass == 0) {
                /* Warm-up done: size the measured pass to the budget. */
                double per = dt / iters;
                int want = per > 0 ? (int)(budget / per) : 100000;
                if (want < 20) want = 20;
                if (want > 100000) want = 100000;
                MPI_Bcast(&want, 1, MPI_INT, 0, MPI_COMM_WORLD);
                iters = want;
            } else if (rank == 0) {
                double lat = dt / iters / 2;
                printf("%zu %.2f %.1f\n", size, lat * 1e6, size / lat / 1e6);
                fflush(stdout);
            }
        }
        if (size == 0) break;
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
