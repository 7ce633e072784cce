/*
 * Test program for ffi/tests/c_abi.rs: the rl_*_device functions where no
 * CUDA driver is installed. Every call must come back at once with a named
 * invalid-argument error (never a crash, never a hang), and the communicator
 * must still run host collectives afterwards, on every rank. Prints
 * "NO-DRIVER <message>" on rank 0, or "HAVE-DRIVER" where a driver loads
 * (scripts/gpu_check.sh covers device buffers on such machines).
 */
#include <ringleader.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int check(int cond, const char *what) {
    if (!cond) fprintf(stderr, "CHECK FAILED: %s (last error: %s)\n", what, rl_last_error_message());
    return cond;
}

int main(void) {
    void *fake = (void *)(uintptr_t)0x7f0000001000ull; /* never dereferenced on the host */
    if (!check(rl_all_reduce_device(NULL, fake, 4, RL_DTYPE_F32, RL_REDUCE_OP_SUM, NULL) ==
                   RL_ERROR_CODE_INVALID_ARGUMENT,
               "NULL comm"))
        return 1;
    rl_comm *comm = NULL;
    if (rl_init_env(&comm) != RL_OK) {
        fprintf(stderr, "init: %s\n", rl_last_error_message());
        return 1;
    }
    int64_t rank = rl_comm_rank(comm);
    if (!check(rl_broadcast_device(comm, NULL, 4, RL_DTYPE_F32, 0, NULL) == RL_ERROR_CODE_INVALID_ARGUMENT,
               "NULL device buffer"))
        return 1;
    if (!check(strstr(rl_last_error_message(), "buf") != NULL, "message names buf")) return 1;
    if (!check(rl_all_reduce_device(comm, fake, 4, 42, RL_REDUCE_OP_SUM, NULL) == RL_ERROR_CODE_INVALID_ARGUMENT,
               "bad dtype"))
        return 1;

    if (rl_cuda_check() == RL_OK) {
        printf("HAVE-DRIVER\n");
    } else {
        char why[512];
        snprintf(why, sizeof why, "%s", rl_last_error_message());
        if (!check(strcmp(rl_last_error_kind(), "invalid-argument") == 0, "rl_cuda_check kind")) return 1;
        int rc = rl_all_reduce_device(comm, fake, 4, RL_DTYPE_F32, RL_REDUCE_OP_SUM, NULL);
        if (!check(rc == RL_ERROR_CODE_INVALID_ARGUMENT, "device all_reduce without a driver")) return 1;
        rc = rl_all_gather_device(comm, fake, 2, fake, 4, RL_DTYPE_F32, NULL);
        if (!check(rc == RL_ERROR_CODE_INVALID_ARGUMENT, "device all_gather without a driver")) return 1;
        if (rank == 0) printf("NO-DRIVER %s\n", why);
    }

    /* The failed device calls ran nothing: host collectives still agree. */
    float x = (float)(rank + 1);
    if (!check(rl_all_reduce(comm, &x, 1, RL_DTYPE_F32, RL_REDUCE_OP_SUM, NULL) == RL_OK, "host all_reduce after"))
        return 1;
    printf("rank %lld: host sum %g\n", (long long)rank, x);
    return rl_destroy(comm) == RL_OK ? 0 : 1;
}
