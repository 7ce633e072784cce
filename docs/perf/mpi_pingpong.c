/* Send/recv ping-pong between ranks 0 and 1 with Open MPI, timed as
 * examples/p2p_latency.rs times ringleader's: ITERS round trips after 200
 * of warm-up, a barrier before; rank 0 prints the mean round trip in us.
 * mpicc -O2 mpi_pingpong.c -o mpi_pingpong; mpirun -np 2 ./mpi_pingpong [ITERS] [BYTES] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    long iters = argc > 1 ? atol(argv[1]) : 20000, bytes = argc > 2 ? atol(argv[2]) : 8;
    char *a = calloc(bytes ? bytes : 1, 1), *b = calloc(bytes ? bytes : 1, 1);
    double t0 = 0;
    for (long i = -200; i < iters; i++) {
        if (i == 0) { MPI_Barrier(MPI_COMM_WORLD); t0 = MPI_Wtime(); }
        if (r == 0) {
            MPI_Send(a, (int)bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(b, (int)bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (r == 1) {
            MPI_Recv(b, (int)bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(a, (int)bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
    }
    if (r == 0) printf("{\"bytes\": %ld, \"round_trip_us\": {\"mean\": %.3f}}\n", bytes, (MPI_Wtime() - t0) * 1e6 / iters);
    free(a); free(b);
    MPI_Finalize();
    return 0;
}
