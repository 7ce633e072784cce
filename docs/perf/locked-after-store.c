/* The cost of locked instructions after a store into a cache line another core
 * polls (docs/perf/call-path-2026-12-04.md, section 3). Two threads pinned to
 * CPUs 0 and 1; prints ns per iteration for 0, 3, 6 and 9 locked adds.
 *   gcc -O2 -o /tmp/lk docs/perf/locked-after-store.c -lpthread && /tmp/lk
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <pthread.h>
#include <sched.h>
static inline double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
volatile uint64_t sink; uint64_t arr[4096];
_Alignas(64) volatile uint64_t shared_line[8];
volatile int stop;
void* poller(void*p){cpu_set_t s;CPU_ZERO(&s);CPU_SET(1,&s);sched_setaffinity(0,sizeof s,&s); uint64_t v=0; while(!stop){ v+=shared_line[0]; __builtin_ia32_pause(); } sink=v; return 0;}
__attribute__((noinline)) uint64_t work(uint64_t x, int locks, uint64_t *a, int i){
  shared_line[0] = i;   // the frame's store to a line the peer polls
  for(int j=0;j<100;j++){ x ^= arr[j]*3; arr[j+100] = x; }
  for(int k=0;k<locks;k++) { __atomic_fetch_add(&a[k*8], 1, __ATOMIC_SEQ_CST); for(int j=0;j<10;j++){ x ^= arr[j+300]*5; arr[j+400]=x; } }
  return x;
}
int main(){ cpu_set_t s;CPU_ZERO(&s);CPU_SET(0,&s);sched_setaffinity(0,sizeof s,&s); pthread_t t; pthread_create(&t,0,poller,0); static uint64_t a[128]; uint64_t x=1;
 for(int rep=0;rep<3;rep++) for(int locks=0;locks<=9;locks+=3){ double t0=now(); for(int i=0;i<500000;i++) x=work(x,locks,a,i); double d=now()-t0; printf("locks %2d: %.1f ns/iter\n",locks,d/500000*1e9);} stop=1; pthread_join(t,0); sink=x; }
