/*
 * Test program for ffi/tests/c_abi.rs: the rank-conditional second
 * all_reduce of the seed, through the C ABI. Rank 0 prints the structured
 * last error as one line: "ERROR code=<c> kind=<k> op=<op> seq=<s> ranks=<r,..>",
 * then the message. Also checks argument validation before joining.
 */
#include <ringleader.h>
#include <stdio.h>
#include <string.h>

static int check(int cond, const char *what) {
    if (!cond) fprintf(stderr, "CHECK FAILED: %s (last error: %s)\n", what, rl_last_error_message());
    return cond;
}

int main(void) {
    /* Validation at the boundary, before anything runs. */
    float f = 1;
    if (!check(rl_all_reduce(NULL, &f, 1, RL_DTYPE_F32, RL_REDUCE_OP_SUM, NULL) == RL_ERROR_CODE_INVALID_ARGUMENT,
               "NULL comm"))
        return 1;
    if (!check(strstr(rl_last_error_message(), "comm") != NULL, "message names comm")) return 1;
    if (!check(rl_init_env(NULL) == RL_ERROR_CODE_INVALID_ARGUMENT, "NULL out")) return 1;
    if (!check(strcmp(rl_last_error_kind(), "invalid-argument") == 0, "kind name")) return 1;

    rl_comm *comm = NULL;
    int rc = rl_init_env(&comm);
    if (rc != RL_OK) {
        fprintf(stderr, "init: %s\n", rl_last_error_message());
        return 1;
    }
    int64_t rank = rl_comm_rank(comm);
    if (!check(rl_all_reduce(comm, NULL, 4, RL_DTYPE_F32, RL_REDUCE_OP_SUM, NULL) == RL_ERROR_CODE_INVALID_ARGUMENT,
               "NULL buffer"))
        return 1;
    if (!check(rl_all_reduce(comm, &f, 1, 42, RL_REDUCE_OP_SUM, NULL) == RL_ERROR_CODE_INVALID_ARGUMENT, "bad dtype"))
        return 1;
    if (!check(rl_all_reduce(comm, &f, 1, RL_DTYPE_F32, 9, NULL) == RL_ERROR_CODE_INVALID_ARGUMENT, "bad op"))
        return 1;
    float out[1];
    if (!check(rl_all_gather(comm, &f, 1, out, 1, RL_DTYPE_F32, NULL) == RL_ERROR_CODE_INVALID_ARGUMENT,
               "all_gather output too small"))
        return 1;

    float t = 1;
    if (!check(rl_set_call_site("skip.c:first in main") == RL_OK, "set the call site"))
        return 1;
    rc = rl_all_reduce(comm, &t, 1, RL_DTYPE_F32, RL_REDUCE_OP_SUM, NULL);
    if (rc != RL_OK) {
        fprintf(stderr, "first all_reduce: %s\n", rl_last_error_message());
        return 1;
    }
    printf("rank %lld: first all_reduce done\n", (long long)rank);
    fflush(stdout);
    if (rank == 0) { /* THE BUG: only rank 0 makes this call */
        rl_set_call_site("skip.c:second in main");
        rc = rl_all_reduce(comm, &t, 1, RL_DTYPE_F32, RL_REDUCE_OP_SUM, NULL);
        if (rc == RL_OK) {
            fprintf(stderr, "the second all_reduce succeeded on its own\n");
            return 1;
        }
        int64_t ranks[8];
        size_t n = rl_last_error_ranks(ranks, 8);
        printf("ERROR code=%d kind=%s op=%s seq=%lld ranks=", rc, rl_last_error_kind(), rl_op_name(rl_last_error_op()),
               (long long)rl_last_error_seq());
        for (size_t i = 0; i < n && i < 8; i++) printf("%s%lld", i ? "," : "", (long long)ranks[i]);
        printf("\n%s\n", rl_last_error_message());
    }
    printf("rank %lld: reached the end\n", (long long)rank);
    return rl_destroy(comm) == RL_OK ? 0 : 1;
}
