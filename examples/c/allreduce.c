/*
 * all_reduce from C through libringleader.
 *
 * Build (from the repository root, after `cargo build --release -p ringleader-ffi`):
 *   cc examples/c/allreduce.c -I ffi/include -L target/release -lringleader \
 *      -Wl,-rpath,"$PWD/target/release" -o allreduce
 * Run two ranks:
 *   ringleader launch --nproc-per-node 2 -- ./allreduce
 * (or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself, as torchrun does).
 */
#include <ringleader.h>
#include <stdio.h>
#include <stdlib.h>

/* Prints the last error with its structured fields and exits. */
static void die(const char *what, int code) {
    int64_t ranks[16];
    size_t n = rl_last_error_ranks(ranks, 16);
    fprintf(stderr, "%s failed: code %d (%s)\n%s\n", what, code, rl_last_error_kind(), rl_last_error_message());
    fprintf(stderr, "  op %s, seq %lld, ranks:", rl_op_name(rl_last_error_op()), (long long)rl_last_error_seq());
    for (size_t i = 0; i < n && i < 16; i++) fprintf(stderr, " %lld", (long long)ranks[i]);
    fprintf(stderr, "\n");
    exit(2);
}

int main(void) {
    rl_comm *comm = NULL;
    int rc = rl_init_env(&comm);
    if (rc != RL_OK) die("rl_init_env", rc);
    int64_t rank = rl_comm_rank(comm), world = rl_comm_world_size(comm);

    /* Blocking: every rank contributes rank + 1; the sum is n(n+1)/2 everywhere. */
    float x[4];
    for (int i = 0; i < 4; i++) x[i] = (float)(rank + 1);
    rc = rl_all_reduce(comm, x, 4, RL_DTYPE_F32, RL_REDUCE_OP_SUM, NULL);
    if (rc != RL_OK) die("rl_all_reduce", rc);
    float want = (float)(world * (world + 1) / 2);
    for (int i = 0; i < 4; i++) {
        if (x[i] != want) {
            fprintf(stderr, "rank %lld: x[%d] = %g, want %g\n", (long long)rank, i, x[i], want);
            return 1;
        }
    }

    /* Queued: the max of the ranks, overlapped with nothing in particular. */
    int64_t m = rank;
    rl_work *work = NULL;
    rc = rl_all_reduce(comm, &m, 1, RL_DTYPE_I64, RL_REDUCE_OP_MAX, &work);
    if (rc != RL_OK) die("rl_all_reduce (queued)", rc);
    rc = rl_work_wait(work, 30.0);
    rl_work_free(work);
    if (rc != RL_OK) die("rl_work_wait", rc);
    if (m != world - 1) {
        fprintf(stderr, "rank %lld: max = %lld, want %lld\n", (long long)rank, (long long)m, (long long)(world - 1));
        return 1;
    }

    printf("rank %lld of %lld: sum %g, max %lld (ringleader %s)\n", (long long)rank, (long long)world, x[0],
           (long long)m, rl_version());
    rc = rl_destroy(comm);
    if (rc != RL_OK) die("rl_destroy", rc);
    return 0;
}
