// Two pinned threads exchange stamps through a cache line each (as a
// 2-rank 8 B all_reduce does through fastbox cells), with and without a
// full fence between a thread's store and its load of a third line, in
// alternating blocks of one run (docs/perf/call-path-2026-12-04.md, 3).
// gcc -O2 -o /tmp/pp docs/perf/fence-pingpong.c -lpthread && /tmp/pp
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <stdlib.h>
// Each thread writes its cell, fences or not, reads a "sleepers" word in the
// peer's doorbell line, then polls the peer's cell.
struct line { _Alignas(64) _Atomic uint64_t v; char pad[56]; };
static struct line cell[2], bell[2];
static int N = 20000, BLOCKS = 200;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static void *run(void *a){ int me=(int)(intptr_t)a; cpu_set_t s; CPU_ZERO(&s); CPU_SET(me,&s); pthread_setaffinity_np(pthread_self(),sizeof s,&s);
 uint64_t k=0; double t[2]={0,0}; int cnt[2]={0,0};
 for(int b=0;b<BLOCKS;b++){ int f=b&1; double t0=now();
  for(int i=0;i<N;i++){ k++; atomic_store_explicit(&cell[me].v,k,memory_order_release);
   if(!f) atomic_thread_fence(memory_order_seq_cst); else atomic_signal_fence(memory_order_seq_cst);
   if(atomic_load_explicit(&bell[1-me].v,memory_order_relaxed)) abort();
   while(atomic_load_explicit(&cell[1-me].v,memory_order_acquire)<k) __builtin_ia32_pause(); }
  double d=(now()-t0)/N; t[f]+=d; cnt[f]++; }
 if(me==0) printf("fence %.1f ns/round trip, no fence %.1f ns\n", t[0]/cnt[0], t[1]/cnt[1]);
 return 0;}
int main(){pthread_t a,b; pthread_create(&a,0,run,(void*)0); pthread_create(&b,0,run,(void*)1); pthread_join(a,0); pthread_join(b,0);}
