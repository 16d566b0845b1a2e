/*
 * bench_kernels.c: the q4 row kernels of the best SIMD table (kernels.h) on their own, d = 128, g = 32,
 * 4 queries (one kv head of GQA 4:1), 128-token blocks laid out like a page's head block.
 *   1. one block over and over (in L1/L2): ns per block for scores and for values, and the fraction of
 *      the FMA peak it is (peak given by -ghz, 2 zmm FMAs per cycle);
 *   2. a walk over -mb MB of blocks (from DRAM), scores then values per block as attend.c runs them, with
 *      the next block asked for four ways: not at all, at once (prefetch before the kernels), spread with
 *      each kernel asking for its own half (scores the keys, values the values), and spread with the
 *      values kernel asking for all of it, keys first (attend.c); a cpu_prefetch hint is asked for a slice
 *      at a time.
 * The kernel author's loop, not a test. Build by hand:
 *   gcc -std=c11 -O2 -I bridge -I native/cpu native/cpu/bench/bench_kernels.c bridge/gokv_core.c \
 *       bridge/gokv_layout.c bridge/gokv_validate.c bridge/gokv_unity.c -lm -lpthread
 * then run with -ghz <clock> -mb <walk size> [-avx2: the AVX2 kernels, peak counted in ymm FMAs]
 * [-novnni: q4 scores through the fp32 kernel where the table has the VNNI one] [-plain: keys as plain rows, not
 * the pool's tiles].
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cpu_internal.h"

#ifndef BENCH_G
#define BENCH_G 32 /* the group: -DBENCH_G=64 or 128 for the others */
#endif
enum { N = CPU_BLOCK, D = 128, G = BENCH_G, NQ = 4, NG = D / G };
enum { CODES = N * D / 2, SB = N * NG * 2, HALF = CODES + 2 * SB, BLOCK = 2 * HALF }; /* bytes */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Rows of block b's keys (value 0) or values (1). */
static int plain_keys; /* -plain: keys as plain rows (the layout before tiles), transposed at every read */
static cpu_rows rows(uint8_t *mem, long b, int value) {
    uint8_t *h = mem + (size_t)b * BLOCK + (size_t)value * HALF;
    return (cpu_rows){h, D / 2, (const uint16_t *)(h + CODES), (const uint16_t *)(h + CODES + SB), NG, N, CPU_ENC_Q4, G,
                      NULL, NULL, NULL, NULL, 0, value || plain_keys ? -1 : 0}; /* keys tiled as the pool's */
}

static float q[NQ * D], qsum[NQ * NG], s[NQ * N], o[NQ * D];
static uint8_t prep_buf[NQ * CPU_PREP_STRIDE(D)] __attribute__((aligned(64)));
static const void *prep; /* the table's q4 query_prep output, or NULL (-novnni, or a table without one) */

/* Scores, a cheap stand-in for the softmax, values: block b, with the hints given. */
static void run_block(const cpu_kernels *k, uint8_t *mem, long b, const cpu_prefetch *pk, const cpu_prefetch *pv) {
    cpu_rows rk = rows(mem, b, 0), rv = rows(mem, b, 1);
    rk.pf = pk, rv.pf = pv;
    k->score_rows[CPU_ENC_Q4](&rk, D, q, D, qsum, prep, NQ, s, N);
    for (int i = 0; i < NQ * N; i++) s[i] *= 1e-3f;
    k->accum_rows[CPU_ENC_Q4](&rv, D, s, N, NQ, o, D);
}

/* ns per block over the walk of n blocks; mode 0: no prefetch, 1: at once, 2: spread, each kernel its half,
 * 3: spread, all by the values kernel. Best of reps. */
static double walk(const cpu_kernels *k, uint8_t *mem, long n, int mode, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = now();
        for (long b = 0; b < n; b++) {
            const long nb = b + 1 < n ? b + 1 : b;
            const cpu_rows nk = rows(mem, nb, 0), nv = rows(mem, nb, 1);
            const cpu_prefetch pk = cpu_rows_prefetch(&nk, NULL), pv = cpu_rows_prefetch(&nv, NULL);
            const cpu_prefetch both = cpu_rows_prefetch(&nk, &nv);
            if (mode == 1) {
                for (int i = 0; i < CPU_PREFETCH_REGIONS; i++) cpu_prefetch_bytes(both.p[i], both.n[i]);
                run_block(k, mem, b, NULL, NULL);
            } else if (mode == 2) {
                run_block(k, mem, b, &pk, &pv);
            } else {
                run_block(k, mem, b, NULL, mode == 3 ? &both : NULL);
            }
        }
        const double dt = (now() - t0) / (double)n * 1e9;
        best = dt < best ? dt : best;
    }
    return best;
}

int main(int argc, char **argv) {
    double ghz = 4.1, mb = 160;
    int avx2 = 0, novnni = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-ghz") && i + 1 < argc) ghz = atof(argv[++i]);
        else if (!strcmp(argv[i], "-mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "-avx2")) avx2 = 1, gokv_cpu_set_simd_limit(GOKV_CPU_AVX2); /* the AVX2 kernels here */
        else if (!strcmp(argv[i], "-novnni")) novnni = 1; /* q4 scores through the fp32 kernel even with VNNI */
        else if (!strcmp(argv[i], "-plain")) plain_keys = 1;
    }
    const cpu_kernels *k = cpu_kernels_for_call(0);
    const long n = (long)(mb * 1e6 / BLOCK) > 4 ? (long)(mb * 1e6 / BLOCK) : 4;
    const size_t bytes = (size_t)n * BLOCK;
    uint8_t *mem = aligned_alloc(1 << 21, (bytes + (1u << 21) - 1) & ~(size_t)((1u << 21) - 1));
    if (!mem) return 1;
    madvise(mem, bytes, MADV_HUGEPAGE);
    srand(1);
    for (size_t i = 0; i < bytes; i++) mem[i] = (uint8_t)rand();
    for (long b = 0; b < n; b++) /* scales 1/16 and biases -1/2 (fp16), so every value is finite */
        for (int v = 0; v < 2; v++) {
            uint16_t *sb = (uint16_t *)(mem + (size_t)b * BLOCK + (size_t)v * HALF + CODES);
            for (int i = 0; i < N * NG; i++) sb[i] = 0x2c00, sb[N * NG + i] = 0xb800;
        }
    for (int i = 0; i < NQ * D; i++) q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int i = 0; i < NQ * NG; i++) /* the group sums of the query, as attend.c passes them */
        for (int c = 0; c < G; c++) qsum[i] += q[(i / NG) * D + (i % NG) * G + c];
    if (k->query_prep[CPU_ENC_Q4] && !novnni) k->query_prep[CPU_ENC_Q4](q, D, NQ, D, G, prep_buf), prep = prep_buf;

    /* 1. one block, in cache */
    const long iters = 200000;
    double best_s = 1e30, best_v = 1e30;
    const cpu_rows rk = rows(mem, 0, 0), rv = rows(mem, 0, 1);
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (long it = 0; it < iters; it++) k->score_rows[CPU_ENC_Q4](&rk, D, q, D, qsum, prep, NQ, s, N);
        double dt = (now() - t0) / (double)iters * 1e9;
        best_s = dt < best_s ? dt : best_s;
        t0 = now();
        for (long it = 0; it < iters; it++) k->accum_rows[CPU_ENC_Q4](&rv, D, s, N, NQ, o, D);
        dt = (now() - t0) / (double)iters * 1e9;
        best_v = dt < best_v ? dt : best_v;
    }
    const double ideal = (double)N * D * NQ / (avx2 ? 8.0 : 16.0) / 2.0 / ghz; /* 2 FMAs per cycle, ymm or zmm */
    printf("q4 kernels (scores %s), d %d, g %d, %d queries, %d-token block; FMA peak at %.2f GHz: %.0f ns per kernel\n",
           prep ? "VNNI" : "fp32", D, G, NQ, N, ghz, ideal);
    printf("in cache: scores %.0f ns (%.0f%% of peak), values %.0f ns (%.0f%%)\n", best_s, 100 * ideal / best_s, best_v,
           100 * ideal / best_v);

    /* 2. the walk */
    printf("walk over %.0f MB (%ld blocks of %d bytes), ns per block (scores + values):\n", bytes / 1e6, n, BLOCK);
    const char *names[4] = {"no prefetch", "next block at once", "spread, each kernel its half",
                            "spread, all by values (attend.c)"};
    const double in_cache = walk(k, mem, 4, 0, 2000);
    printf("  %-34s %8.0f\n", "4 blocks, in cache", in_cache);
    for (int mode = 0; mode < 4; mode++) {
        const double t = walk(k, mem, n, mode, 3);
        printf("  %-34s %8.0f  (%.2fx in cache)\n", names[mode], t, t / in_cache);
    }
    free(mem);
    return 0;
}
