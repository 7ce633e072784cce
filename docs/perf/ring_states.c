// Two processes exchange 512 KiB each way per "call", as a 2-rank 1 MiB
// all_gather over shared memory does, three ways in turn (0.1 s each):
//   ring  - copy into a shared 4-slot ring of 128 KiB slots, peer copies out
//           (what ringleader's shared-memory transport does below 1 MiB);
//   ntin  - the same ring, written with non-temporal (streaming) stores;
//   cma   - the peer reads the (unchanging) input with process_vm_readv
//           (what Open MPI's vader BTL does for large messages).
// Every 5 s it prints the mean time per call and, for the ring modes, the
// time spent copying in and copying out. See ring-states.md.
//
//   gcc -O2 -mavx2 docs/perf/ring_states.c -o /tmp/ring_states && /tmp/ring_states 120
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (128 * 1024)
#define CHUNKS 4
#define SLOTS 4
#define MODES 3

typedef struct {
    _Atomic unsigned long head, tail;
    char pad[112];
    char data[SLOTS][CHUNK];
} Ring;

static const char *names[MODES] = {"ring", "ntin", "cma"};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void copy_nt(char *d, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += 64) {
        __m256i a = _mm256_loadu_si256((const void *)(s + i)), b = _mm256_loadu_si256((const void *)(s + i + 32));
        _mm256_stream_si256((void *)(d + i), a);
        _mm256_stream_si256((void *)(d + i + 32), b);
    }
    _mm_sfence();
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 60;
    Ring *rings = mmap(0, 2 * sizeof(Ring) + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    _Atomic int *mode = (void *)((char *)rings + 2 * sizeof(Ring));
    _Atomic int *pids = mode + 16;
    int me = fork() == 0;
    pids[me] = getpid();
    Ring *out = &rings[me], *in = &rings[1 - me];
    char *src = aligned_alloc(4096, CHUNKS * CHUNK), *dst = aligned_alloc(4096, 2 * CHUNKS * CHUNK);
    memset(src, me + 1, CHUNKS * CHUNK);
    memset(dst, 0, 2 * CHUNKS * CHUNK);
    while (!pids[0] || !pids[1]) {
    }
    double t0 = now(), last = t0, total[MODES] = {0}, tin[MODES] = {0}, tout[MODES] = {0};
    long calls[MODES] = {0};
    for (;;) {
        if (me == 0) {
            double t = now() - t0;
            *mode = t > secs ? -1 : (int)((long)(t / 0.1) % MODES);
        }
        int m = *mode;
        if (m < 0)
            break;
        double t = now();
        memcpy(dst + me * CHUNKS * CHUNK, src, CHUNKS * CHUNK); // own part
        char *theirs = dst + (1 - me) * CHUNKS * CHUNK;
        if (m == 2) {
            for (int k = 0; k < CHUNKS; k++) {
                struct iovec l = {theirs + k * CHUNK, CHUNK}, r = {src + k * CHUNK, CHUNK};
                if (process_vm_readv(pids[1 - me], &l, 1, &r, 1, 0) != CHUNK) {
                    perror("process_vm_readv");
                    return 1;
                }
            }
        } else {
            for (int sent = 0, got = 0; sent < CHUNKS || got < CHUNKS;) {
                if (sent < CHUNKS && out->head - out->tail < SLOTS) {
                    double a = now();
                    char *slot = out->data[out->head % SLOTS];
                    if (m == 1)
                        copy_nt(slot, src + sent * CHUNK, CHUNK);
                    else
                        memcpy(slot, src + sent * CHUNK, CHUNK);
                    atomic_fetch_add(&out->head, 1);
                    sent++;
                    tin[m] += now() - a;
                }
                if (got < CHUNKS && in->tail < in->head) {
                    double a = now();
                    memcpy(theirs + got * CHUNK, in->data[in->tail % SLOTS], CHUNK);
                    atomic_fetch_add(&in->tail, 1);
                    got++;
                    tout[m] += now() - a;
                }
            }
        }
        total[m] += now() - t;
        calls[m]++;
        if (me == 0 && now() - last > 5) {
            printf("t=%4.0f s", now() - t0);
            for (int k = 0; k < MODES; k++) {
                double c = calls[k] ? calls[k] : 1;
                printf(" | %s %6.1f us", names[k], total[k] / c * 1e6);
                if (k < 2)
                    printf(" (in %5.1f out %5.1f)", tin[k] / c * 1e6, tout[k] / c * 1e6);
            }
            printf("\n");
            fflush(stdout);
            memset(total, 0, sizeof total);
            memset(tin, 0, sizeof tin);
            memset(tout, 0, sizeof tout);
            memset(calls, 0, sizeof calls);
            last = now();
        }
    }
    if (!me)
        wait(0);
    return 0;
}
