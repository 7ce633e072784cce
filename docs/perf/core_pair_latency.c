/*
 * core_pair_latency: how long one cache line takes to go from CPU 0 to CPU 1
 * and back, right now. Two threads, pinned one to each CPU, take turns
 * writing a counter the other polls; prints the mean round trip in ns.
 *
 * On the 2-vCPU development VM the answer depends on where the hypervisor
 * has put the two vCPUs at the moment: about 35-190 ns (one physical core or
 * one shared cache) or 290-570 ns (apart), changing between runs of a
 * fraction of a second. scripts/by_state.py runs it before and after each
 * benchmark launch to tell which state the launch ran in.
 *
 *   gcc -O2 -o core_pair_latency docs/perf/core_pair_latency.c -lpthread
 *   ./core_pair_latency [ROUND_TRIPS]       (default 200000)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Alignas(64) _Atomic uint64_t ping;
static _Alignas(64) _Atomic uint64_t pong;
static long rounds = 200000;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (pthread_setaffinity_np(pthread_self(), sizeof s, &s) != 0) {
        fprintf(stderr, "core_pair_latency: cannot pin a thread to CPU %d\n", cpu);
        exit(2);
    }
}

static void *echo(void *unused) {
    (void)unused;
    pin(1);
    for (uint64_t k = 1; k <= (uint64_t)rounds; k++) {
        while (atomic_load_explicit(&ping, memory_order_acquire) < k)
            __builtin_ia32_pause();
        atomic_store_explicit(&pong, k, memory_order_release);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1)
        rounds = atol(argv[1]);
    if (rounds < 1)
        rounds = 1;
    pthread_t t;
    pthread_create(&t, NULL, echo, NULL);
    pin(0);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (uint64_t k = 1; k <= (uint64_t)rounds; k++) {
        atomic_store_explicit(&ping, k, memory_order_release);
        while (atomic_load_explicit(&pong, memory_order_acquire) < k)
            __builtin_ia32_pause();
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, NULL);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / rounds);
    return 0;
}
