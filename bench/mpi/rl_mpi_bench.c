/*
 * rl_mpi_bench: Open MPI (or any MPI) collectives measured the way
 * `ringleader perf` measures ringleader's, so that the two compare like with
 * like, native code against native code (scripts/bench_compare.py --native).
 *
 * Build:  mpicc -O2 -o rl_mpi_bench bench/mpi/rl_mpi_bench.c -lm
 * Run:    mpirun -np 2 ./rl_mpi_bench --op all_reduce --sizes 8,1M,64M --json out.jsonl
 *
 * The method, as crates/ringleader-cli/src/perf/bench.rs has it, per size:
 *  1. allocate the buffers and write zeros into them (an untouched buffer
 *     reads as the kernel's shared zero page, which costs no memory
 *     bandwidth); ask for transparent huge pages from 4 MiB up, as
 *     ringleader perf (and numpy) do;
 *  2. warm-up calls (at least one when the iteration count is adaptive: it
 *     estimates one call; the ranks agree on the count through an
 *     Allreduce(MAX) of that estimate: about 0.3 s per size, 5 to 1000);
 *  3. a barrier, then `iters` timed calls; this rank's mean per call,
 *     combined over the ranks as -a says (default 3: the slowest rank's);
 *  4. unless -c 0: fill the buffers with a known pattern, one more call, count
 *     the wrong elements, and sum the counts over the ranks.
 * The timed calls run on zeros, as ringleader perf's do (repeated in-place
 * sums would otherwise grow without bound); the checked call uses fresh
 * inputs.
 *
 * Only the form each collective has in ringleader's API is measured (it is
 * what `ringleader perf --json` reports as time_us, its "native" group):
 *   all_reduce      MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM)
 *   broadcast       MPI_Bcast(buf, n, MPI_FLOAT, root)
 *   all_gather      MPI_Allgather(in, n/P, ..., out, n/P, ...)        out of place
 *   reduce_scatter  MPI_Reduce_scatter_block(in, out, n/P, MPI_FLOAT, MPI_SUM)
 *   barrier         MPI_Barrier (one row, size 0)
 *
 * Sizes follow nccl-tests and ringleader perf (perf/sizes.rs): a size is the
 * larger buffer in bytes, rounded down to whole float32 elements, and for
 * all_gather and reduce_scatter to a multiple of P elements: all_gather's
 * size is its output (P x count), reduce_scatter's its input (P x count);
 * count is per rank (all_gather's input, reduce_scatter's output). algbw =
 * size / time; busbw = algbw x 2(P-1)/P for all_reduce, x (P-1)/P for
 * all_gather and reduce_scatter, x 1 for broadcast.
 *
 * Output: a table on rank 0's stdout (header lines start with '#'); with
 * --json FILE, one JSON line per size appended to FILE, with the field names
 * of `ringleader perf --json` (op, nproc, bytes, count, dtype, type, redop,
 * root, native, time_us, algbw_GBps, busbw_GBps, wrong, check, out_of_place,
 * in_place, lib, lib_version, iters, warmup, agg_iters, blocking, average).
 * Exit status: 0, 1 when a result was wrong, 2 on a usage error.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define TARGET_SECS 0.3
#define MIN_ITERS 5
#define MAX_ITERS 1000
#define MAX_SIZES 256
#define ELEM ((uint64_t)sizeof(float))
#define POISON (-1.0f)

enum op { ALL_REDUCE, ALL_GATHER, BROADCAST, REDUCE_SCATTER, BARRIER };
static const char *const OP_NAMES[] = {"all_reduce", "all_gather", "broadcast", "reduce_scatter", "barrier"};
static const char *const AVERAGE_NAMES[] = {"rank0", "mean", "min", "max"};

struct opts {
    enum op op;
    uint64_t sizes[MAX_SIZES];
    int nsizes;
    long iters; /* 0: adaptive */
    long warmup;
    int check;
    int average;
    int root;
    const char *json;
    const char *lib;
};

static int rank, world;

static void usage_exit(const char *why) {
    if (rank == 0) {
        if (why)
            fprintf(stderr, "rl_mpi_bench: %s\n", why);
        fprintf(stderr,
                "usage: mpirun -np P rl_mpi_bench [--op OP] [--sizes LIST | -b MIN -e MAX -f F]\n"
                "         [-n ITERS] [-w WARMUP] [-c 0|N] [-a 0-3] [-r ROOT] [--json FILE] [--lib NAME]\n"
                "  --op      all_reduce, all_gather, broadcast, reduce_scatter or barrier [all_reduce]\n"
                "  --sizes   comma-separated sizes in bytes, K/M/G = powers of 1024 (8,1M,64M)\n"
                "  -b -e -f  smallest, largest size and step factor instead [8, 64M, 2]\n"
                "  -n        timed calls per size [adaptive: about 0.3 s, 5 to 1000]\n"
                "  -w        warm-up calls per size [3]\n"
                "  -c        checked calls per size, on fresh inputs; 0: none [1]\n"
                "  -a        ranks' times combined: 0 rank 0's, 1 mean, 2 fastest, 3 slowest [3]\n"
                "  -r        root of broadcast [0]\n"
                "  --json    append one JSON line per size to FILE (ringleader perf's fields)\n"
                "  --lib     the lib field of the JSON lines [openmpi-c]\n");
    }
    MPI_Finalize();
    exit(2);
}

/* 8, 64K, 1M, 1G (powers of 1024; a trailing B or iB is accepted). */
static int parse_size(const char *s, uint64_t *out) {
    char buf[64];
    size_t len = strlen(s);
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len + 1);
    if (len >= 2 && strcmp(buf + len - 2, "iB") == 0)
        buf[len -= 2] = 0;
    else if (len >= 1 && (buf[len - 1] == 'B' || buf[len - 1] == 'b'))
        buf[--len] = 0;
    int shift = 0;
    if (len > 0) {
        switch (toupper((unsigned char)buf[len - 1])) {
        case 'K': shift = 10; break;
        case 'M': shift = 20; break;
        case 'G': shift = 30; break;
        case 'T': shift = 40; break;
        }
        if (shift)
            buf[--len] = 0;
    }
    if (len == 0)
        return -1;
    for (size_t i = 0; i < len; i++)
        if (!isdigit((unsigned char)buf[i]))
            return -1;
    unsigned long long v = strtoull(buf, NULL, 10);
    if (v > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static long parse_long(const char *flag, const char *s, long lo, long hi) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < lo || v > hi) {
        char why[128];
        snprintf(why, sizeof why, "%s: %s is not a number from %ld to %ld", flag, s, lo, hi);
        usage_exit(why);
    }
    return v;
}

static void parse_args(int argc, char **argv, struct opts *o) {
    uint64_t lo = 8, hi = 64ull << 20, factor = 2;
    int have_list = 0, have_sweep = 0;
    memset(o, 0, sizeof *o);
    o->op = ALL_REDUCE;
    o->warmup = 3;
    o->check = 1;
    o->average = 3;
    o->lib = "openmpi-c";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
            usage_exit(NULL);
        if (i + 1 >= argc) {
            char why[128];
            snprintf(why, sizeof why, "%s: unknown, or missing its value", a);
            usage_exit(why);
        }
        const char *v = argv[++i];
        if (strcmp(a, "--op") == 0) {
            int found = 0;
            for (int k = 0; k < 5; k++)
                if (strcmp(v, OP_NAMES[k]) == 0)
                    o->op = (enum op)k, found = 1;
            if (!found)
                usage_exit("--op: all_reduce, all_gather, broadcast, reduce_scatter or barrier");
        } else if (strcmp(a, "--sizes") == 0) {
            char *copy = strdup(v), *save = NULL;
            for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o->nsizes == MAX_SIZES)
                    usage_exit("--sizes: too many sizes");
                if (parse_size(t, &o->sizes[o->nsizes]) != 0)
                    usage_exit("--sizes: a size is 8, 4096, 64K, 64M or 1G");
                o->nsizes++;
            }
            free(copy);
            have_list = 1;
        } else if (strcmp(a, "-b") == 0 || strcmp(a, "--minbytes") == 0) {
            if (parse_size(v, &lo) != 0)
                usage_exit("-b: not a size");
            have_sweep = 1;
        } else if (strcmp(a, "-e") == 0 || strcmp(a, "--maxbytes") == 0) {
            if (parse_size(v, &hi) != 0)
                usage_exit("-e: not a size");
            have_sweep = 1;
        } else if (strcmp(a, "-f") == 0 || strcmp(a, "--stepfactor") == 0) {
            factor = (uint64_t)parse_long(a, v, 1, 1 << 20);
            have_sweep = 1;
        } else if (strcmp(a, "-n") == 0 || strcmp(a, "--iters") == 0) {
            o->iters = parse_long(a, v, 1, 1L << 40);
        } else if (strcmp(a, "-w") == 0 || strcmp(a, "--warmup") == 0) {
            o->warmup = parse_long(a, v, 0, 1L << 40);
        } else if (strcmp(a, "-c") == 0 || strcmp(a, "--check") == 0) {
            o->check = (int)parse_long(a, v, 0, 1000);
        } else if (strcmp(a, "-a") == 0 || strcmp(a, "--average") == 0) {
            o->average = (int)parse_long(a, v, 0, 3);
        } else if (strcmp(a, "-r") == 0 || strcmp(a, "--root") == 0) {
            o->root = (int)parse_long(a, v, 0, world - 1);
        } else if (strcmp(a, "--json") == 0) {
            o->json = v;
        } else if (strcmp(a, "--lib") == 0) {
            o->lib = v;
        } else {
            char why[128];
            snprintf(why, sizeof why, "%s: unknown option", a);
            usage_exit(why);
        }
    }
    if (have_list && have_sweep)
        usage_exit("--sizes replaces -b/-e/-f; give one or the other");
    if (!have_list) {
        for (uint64_t s = lo; s <= hi && o->nsizes < MAX_SIZES;) {
            o->sizes[o->nsizes++] = s;
            if (factor < 2 || s == 0 || s > UINT64_MAX / factor)
                break;
            s *= factor;
        }
    }
    qsort(o->sizes, (size_t)o->nsizes, sizeof o->sizes[0], cmp_u64);
    int k = 0; /* each size once */
    for (int i = 0; i < o->nsizes; i++)
        if (k == 0 || o->sizes[k - 1] != o->sizes[i])
            o->sizes[k++] = o->sizes[i];
    o->nsizes = k;
    if (o->op == BARRIER) { /* no payload: one row, size 0 */
        o->sizes[0] = 0;
        o->nsizes = 1;
    }
}

/* As perf/sizes.rs: Shape::of. */
struct shape {
    uint64_t in_len, out_len; /* elements of the input and output buffers */
    uint64_t count;           /* the count column, per rank */
    uint64_t bytes;           /* the size column */
};

static int shape_of(enum op op, uint64_t bytes, int n, struct shape *s) {
    uint64_t elems = bytes / ELEM, per = elems / (uint64_t)n;
    memset(s, 0, sizeof *s);
    switch (op) {
    case ALL_REDUCE:
    case BROADCAST:
        s->in_len = elems, s->out_len = 0, s->count = elems, s->bytes = elems * ELEM;
        return elems > 0;
    case ALL_GATHER:
        s->in_len = per, s->out_len = per * n, s->count = per, s->bytes = per * n * ELEM;
        return per > 0;
    case REDUCE_SCATTER:
        s->in_len = per * n, s->out_len = per, s->count = per, s->bytes = per * n * ELEM;
        return per > 0;
    case BARRIER:
        return 1;
    }
    return 0;
}

static double bus_factor(enum op op, int n) {
    switch (op) {
    case ALL_REDUCE: return 2.0 * (n - 1) / n;
    case ALL_GATHER:
    case REDUCE_SCATTER: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static long adaptive_iters(double per_call) {
    if (!isfinite(per_call) || per_call <= 0.0)
        return MAX_ITERS;
    double n = ceil(TARGET_SECS / per_call);
    if (n >= MAX_ITERS)
        return MAX_ITERS;
    return n < MIN_ITERS ? MIN_ITERS : (long)n;
}

/* `v` of every rank combined as -a says; the same on every rank. */
static double across_ranks(double v, int how) {
    double out = v;
    switch (how) {
    case 0: MPI_Bcast(&out, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD); break;
    case 1:
        MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        out /= world;
        break;
    case 2: MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD); break;
    default: MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); break;
    }
    return out;
}

/* Written zeros, on transparent huge pages from 4 MiB up (perf/bench.rs: zeroed). */
static float *zeroed(uint64_t len) {
    size_t bytes = (size_t)(len ? len : 1) * sizeof(float);
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes) != 0) {
        fprintf(stderr, "rl_mpi_bench: rank %d: cannot allocate %zu bytes\n", rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    if (bytes >= (4u << 20))
        madvise(p, bytes / 4096 * 4096, MADV_HUGEPAGE);
    memset(p, 0, bytes);
    return p;
}

/* Rank r's input element i: small integers, so float sums are exact. */
static float pattern(int r, uint64_t i) { return (float)((r + 1) * 8 + (int)(i % 13)); }

static void call(const struct opts *o, const struct shape *s, float *in, float *out) {
    switch (o->op) {
    case ALL_REDUCE: MPI_Allreduce(MPI_IN_PLACE, in, (int)s->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case BROADCAST: MPI_Bcast(in, (int)s->count, MPI_FLOAT, o->root, MPI_COMM_WORLD); break;
    case ALL_GATHER:
        MPI_Allgather(in, (int)s->count, MPI_FLOAT, out, (int)s->count, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case REDUCE_SCATTER:
        MPI_Reduce_scatter_block(in, out, (int)s->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case BARRIER: MPI_Barrier(MPI_COMM_WORLD); break;
    }
}

/* One checked call on fresh inputs; the wrong elements over every rank. */
static uint64_t checked_call(const struct opts *o, const struct shape *s, float *in, float *out) {
    uint64_t wrong = 0, total = 0;
    for (uint64_t i = 0; i < s->in_len; i++)
        in[i] = o->op == BROADCAST && rank != o->root ? POISON : pattern(rank, i);
    for (uint64_t i = 0; i < s->out_len; i++)
        out[i] = POISON;
    call(o, s, in, out);
    switch (o->op) {
    case ALL_REDUCE:
        for (uint64_t i = 0; i < s->count; i++) {
            float want = 0;
            for (int r = 0; r < world; r++)
                want += pattern(r, i);
            wrong += in[i] != want;
        }
        break;
    case BROADCAST:
        for (uint64_t i = 0; i < s->count; i++)
            wrong += in[i] != pattern(o->root, i);
        break;
    case ALL_GATHER:
        for (int r = 0; r < world; r++)
            for (uint64_t i = 0; i < s->count; i++)
                wrong += out[(uint64_t)r * s->count + i] != pattern(r, i);
        break;
    case REDUCE_SCATTER:
        for (uint64_t i = 0; i < s->count; i++) {
            float want = 0;
            for (int r = 0; r < world; r++)
                want += pattern(r, (uint64_t)rank * s->count + i);
            wrong += out[i] != want;
        }
        break;
    case BARRIER: break;
    }
    MPI_Allreduce(&wrong, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    return total;
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    struct opts o;
    parse_args(argc, argv, &o);
    if (o.nsizes == 0)
        usage_exit("no size to measure");

    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int vlen = 0;
    MPI_Get_library_version(version, &vlen);
    version[strcspn(version, "\n,")] = 0; /* "Open MPI v4.1.4" */

    int in_place = o.op == ALL_REDUCE || o.op == BROADCAST || o.op == BARRIER;
    int reduces = o.op == ALL_REDUCE || o.op == REDUCE_SCATTER;
    int rooted = o.op == BROADCAST;
    FILE *json = NULL;
    if (rank == 0) {
        if (o.json && !(json = fopen(o.json, "a"))) {
            perror(o.json);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        printf("# rl_mpi_bench: %s over %d ranks, %s\n", OP_NAMES[o.op], world, version);
        if (o.iters)
            printf("# warmup iters: %ld iters: %ld validation: %d\n", o.warmup, o.iters, o.check);
        else
            printf("# warmup iters: %ld iters: adaptive (about %.1f s, %d to %d) validation: %d\n", o.warmup,
                   TARGET_SECS, MIN_ITERS, MAX_ITERS, o.check);
        printf("# time: per call, %s over the ranks (-a %d); %s\n",
               (const char *[]){"rank 0's", "the mean", "the fastest rank's", "the slowest rank's"}[o.average],
               o.average, in_place ? "in place" : "out of place");
        printf("#%11s %13s %9s %9s %9s %7s %6s\n", "size (B)", "count", "time (us)", "algbw", "busbw", "#wrong",
               "iters");
        fflush(stdout);
    }

    uint64_t wrong_all = 0;
    for (int k = 0; k < o.nsizes; k++) {
        struct shape s;
        if (!shape_of(o.op, o.sizes[k], world, &s)) {
            if (rank == 0)
                printf("# %llu bytes: no element per rank for %s over %d ranks; skipped\n",
                       (unsigned long long)o.sizes[k], OP_NAMES[o.op], world);
            continue;
        }
        float *in = zeroed(s.in_len), *out = zeroed(s.out_len);

        long warm = o.iters ? o.warmup : (o.warmup > 1 ? o.warmup : 1);
        double t = now();
        for (long i = 0; i < warm; i++)
            call(&o, &s, in, out);
        long iters = o.iters;
        if (!iters)
            iters = adaptive_iters(across_ranks((now() - t) / (double)warm, 3));

        MPI_Barrier(MPI_COMM_WORLD);
        t = now();
        for (long i = 0; i < iters; i++)
            call(&o, &s, in, out);
        double mine = (now() - t) / (double)iters;
        double time_s = across_ranks(mine, o.average);

        int checked = o.check > 0 && o.op != BARRIER;
        uint64_t wrong = 0;
        for (int c = 0; checked && c < o.check; c++)
            wrong += checked_call(&o, &s, in, out);
        wrong_all += wrong;
        free(in);
        free(out);

        if (rank != 0)
            continue;
        double algbw = time_s > 0 ? (double)s.bytes / time_s / 1e9 : 0.0;
        double busbw = algbw * bus_factor(o.op, world);
        const char *check = !checked ? "unchecked" : wrong ? "FAIL" : "ok";
        char nwrong[32];
        snprintf(nwrong, sizeof nwrong, checked ? "%llu" : "N/A", (unsigned long long)wrong);
        printf(" %11llu %13llu %9.2f %9.3f %9.3f %7s %6ld\n", (unsigned long long)s.bytes,
               (unsigned long long)s.count, time_s * 1e6, algbw, busbw, nwrong, iters);
        fflush(stdout);
        if (!json)
            continue;
        char wrong_s[32], group[256], root_s[16];
        snprintf(wrong_s, sizeof wrong_s, checked ? "%llu" : "null", (unsigned long long)wrong);
        snprintf(root_s, sizeof root_s, rooted ? "%d" : "null", o.root);
        snprintf(group, sizeof group,
                 "{\"time\":%.6f,\"alg_bw\":%.9g,\"bus_bw\":%.9g,\"nwrong\":%s,\"iters\":%ld,\"emulated\":false}",
                 time_s * 1e6, algbw, busbw, wrong_s, iters);
        fprintf(json,
                "{\"op\":\"%s\",\"nproc\":%d,\"bytes\":%llu,\"count\":%llu,\"dtype\":\"f32\",\"type\":\"float\","
                "\"redop\":%s,\"root\":%s,\"native\":\"%s\",\"time_us\":%.6f,\"algbw_GBps\":%.9g,"
                "\"busbw_GBps\":%.9g,\"wrong\":%s,\"check\":\"%s\",\"out_of_place\":%s,\"in_place\":%s,\"lib\":",
                OP_NAMES[o.op], world, (unsigned long long)s.bytes, (unsigned long long)s.count,
                reduces ? "\"sum\"" : "null", root_s, in_place ? "in_place" : "out_of_place", time_s * 1e6, algbw,
                busbw, wrong_s, check, in_place ? "null" : group, in_place ? group : "null");
        json_string(json, o.lib);
        fputs(",\"lib_version\":", json);
        json_string(json, version);
        fprintf(json, ",\"iters\":%ld,\"warmup\":%ld,\"agg_iters\":1,\"blocking\":true,\"average\":\"%s\"}\n",
                iters, o.warmup, AVERAGE_NAMES[o.average]);
        fflush(json);
    }
    if (rank == 0) {
        printf("# Out of bounds values : %llu %s\n", (unsigned long long)wrong_all, wrong_all ? "FAILED" : "OK");
        if (json)
            fclose(json);
    }
    MPI_Finalize();
    return wrong_all ? 1 : 0;
}
