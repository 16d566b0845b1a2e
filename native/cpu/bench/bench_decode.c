/*
 * bench_decode.c: decode attention against the machine's floor (docs/architecture.md §9), standalone.
 *
 * Shape (Llama-3.1-8B-like): 32 query heads, 8 kv heads, d = 128, one sequence, one query row at
 * position S - 1, 2 threads, pages of 128 tokens. For each format and context S it reports the median
 * ms of a fused decode call, the bytes it must read (codes + scales/biases of every visible token, the
 * KIVI ring in fp16, queries and outputs), GB/s and GFLOP/s (flops = 2 Hq S (d_k + d_v)), the floor
 * max(bytes / read bandwidth, flops / peak) from roofline.c, the fraction of it reached, and the
 * dequantize-then-attend baseline and the scalar kernels for comparison.
 *
 * Build by hand (roofline.c is part of the library in CMake; cgo's unity file may or may not hold it):
 *   gcc -std=c11 -O2 -I bridge -I native/cpu native/cpu/bench/bench_decode.c native/cpu/roofline.c \
 *       bridge/gokv_core.c bridge/gokv_layout.c bridge/gokv_validate.c bridge/gokv_unity.c -lm -lpthread
 * With -mass, each case is also timed with the attention mass output (gokv_attend_desc.mass, every token of
 * every kv head), and the ratio to the call without it is printed (columns "mass ms" and "x mass").
 *
 * With -keep F[:SPAN], every call takes per-kv-head validity masks (GOKV_ATTEND_MASK_PER_KV_HEAD) as H2O and SnapKV
 * pass them: the 4 sinks, the newest 64 tokens, and a random F of the others per kv head, drawn token by token or, with
 * SPAN, in aligned spans of SPAN tokens (SPAN 128: whole pages); "ms" is then the masked call's.
 *
 * Usage: bench_decode [S ...] [-f f16,q4,kivi2,q8] [-t threads] [-n reps] [-noscalar] [-nobaseline] [-avx2] [-mass]
 *                     [-keep F[:SPAN]] [-bw GB/s] [-peak GFLOP/s] (skip the measurements); BENCH_CPU=1 also prints
 *                     CPU ms per call
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "gokv.h"
#include "gokv_backend.h"
#include "gokv_cpu.h"

enum { BENCH_HQ = 32, BENCH_HKV = 8, BENCH_D = 128, BENCH_PAGE = 128, BENCH_G = 32, BENCH_R = 128 };

static double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Process CPU seconds (all threads): under a loaded machine, wall time / CPU time shows the contention. */
static double bench_cpu(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec + 1e-6 * ru.ru_stime.tv_usec;
}

static int bench_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t bench_rng = 88172645463325252ull;
static float bench_rand(void) {
    bench_rng ^= bench_rng << 13, bench_rng ^= bench_rng >> 7, bench_rng ^= bench_rng << 17;
    return (float)((bench_rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

typedef struct bench_case {
    gokv_pool *pool;
    int32_t format, S, n_pages, *ids;
    int32_t q_ind[2], p_ind[2], qpos, slot;
    float *q, *out;
    uint32_t *mask; /* -keep: BENCH_HKV masks of ceil(S / 32) words; else NULL */
    int32_t m_ind[2];
} bench_case;

static double bench_keep = 0.0; /* -keep F: the fraction of tokens each kv head keeps (0: no masks) */
static int32_t bench_keep_span = 1;

/* The per-kv-head masks of -keep for c: sinks, the newest 64, and each span of the rest kept with probability F. */
static void bench_masks(bench_case *c) {
    const int32_t S = c->S, W = (S + 31) / 32;
    c->mask = calloc((size_t)W * BENCH_HKV, sizeof(uint32_t));
    c->m_ind[0] = 0, c->m_ind[1] = W * BENCH_HKV;
    for (int32_t h = 0; h < BENCH_HKV; h++) {
        uint32_t *m = c->mask + (size_t)h * W;
        for (int32_t t0 = 0; t0 < S; t0 += bench_keep_span) {
            const int keep = 0.5f * (bench_rand() + 1.0f) < bench_keep;
            for (int32_t t = t0; t < t0 + bench_keep_span && t < S; t++)
                if (keep || t < 4 || t >= S - 64) m[t / 32] |= 1u << (t % 32);
        }
    }
}

static int bench_setup(gokv_device *dev, bench_case *c, int32_t format, int32_t S) {
    const int kivi = format == GOKV_FORMAT_KIVI2 || format == GOKV_FORMAT_KIVI4;
    c->format = format;
    c->S = S;
    c->n_pages = (S + BENCH_PAGE - 1) / BENCH_PAGE;
    const int quant = format >= GOKV_FORMAT_Q8;
    gokv_pool_desc pd = {sizeof pd, format, quant ? BENCH_G : 0, kivi ? BENCH_R : 0, BENCH_HKV, BENCH_D, BENCH_D, 0, BENCH_PAGE,
                         c->n_pages, kivi ? 1 : 0, 0};
    if (gokv_pool_create(dev, &pd, &c->pool) != GOKV_OK) return fprintf(stderr, "pool: %s\n", gokv_last_error()), 1;
    c->ids = malloc(sizeof(int32_t) * c->n_pages);
    for (int32_t i = 0; i < c->n_pages; i++) c->ids[i] = i;
    c->p_ind[0] = 0, c->p_ind[1] = c->n_pages;
    c->q_ind[0] = 0, c->q_ind[1] = 1;
    c->qpos = S - 1;
    c->slot = 0;
    /* write in slices of 4096 tokens (the whole f32 input of 128K tokens would be 1 GiB) */
    const int32_t slice = 4096;
    const size_t row = (size_t)BENCH_HKV * BENCH_D;
    float *k = malloc(sizeof(float) * slice * row), *v = malloc(sizeof(float) * slice * row);
    for (int32_t t0 = 0; t0 < S; t0 += slice) {
        const int32_t n = S - t0 < slice ? S - t0 : slice;
        for (size_t i = 0; i < (size_t)n * row; i++) k[i] = bench_rand(), v[i] = bench_rand();
        int32_t tok[2] = {0, n};
        gokv_write_desc wd = {sizeof wd, 1, tok, c->p_ind, c->ids, &t0, kivi ? &c->slot : NULL, k, v};
        if (gokv_pool_write(c->pool, &wd) != GOKV_OK) return fprintf(stderr, "write: %s\n", gokv_last_error()), 1;
    }
    free(k), free(v);
    c->q = malloc(sizeof(float) * BENCH_HQ * BENCH_D);
    c->out = malloc(sizeof(float) * BENCH_HQ * BENCH_D);
    for (int32_t i = 0; i < BENCH_HQ * BENCH_D; i++) c->q[i] = bench_rand();
    c->mask = NULL;
    if (bench_keep > 0.0) bench_masks(c);
    return 0;
}

static void bench_teardown(bench_case *c) {
    gokv_pool_destroy(c->pool);
    free(c->ids), free(c->q), free(c->out), free(c->mask);
}

/* Median ms of reps calls with the given flags (after one warm-up call); with mass (BENCH_HKV * S floats),
 * the calls compute the attention mass too. */
static double bench_time_mass(gokv_device *dev, bench_case *c, uint32_t flags, int reps, float *mass) {
    const int kivi = c->format == GOKV_FORMAT_KIVI2 || c->format == GOKV_FORMAT_KIVI4;
    gokv_attend_desc ad = {sizeof ad, c->pool, 1, c->q_ind, c->p_ind, c->ids, &c->S, &c->qpos,
                           kivi ? &c->slot : NULL, c->mask, c->mask ? c->m_ind : NULL, BENCH_HQ, c->q, c->out,
                           1.0f / sqrtf((float)BENCH_D), NULL, 4, 0, 0, flags | (c->mask ? GOKV_ATTEND_MASK_PER_KV_HEAD : 0u),
                           mass, 0, 0, 0, NULL, NULL};
    double t[64];
    if (reps > 64) reps = 64;
    if (gokv_attend(dev, &ad) != GOKV_OK) {
        fprintf(stderr, "attend: %s\n", gokv_last_error());
        return NAN;
    }
    const double c0 = bench_cpu(), w0 = bench_now();
    for (int r = 0; r < reps; r++) {
        const double t0 = bench_now();
        gokv_attend(dev, &ad);
        t[r] = (bench_now() - t0) * 1e3;
    }
    if (getenv("BENCH_CPU"))
        fprintf(stderr, "  flags %u: cpu %.3f ms/call, wall %.3f ms/call\n", flags, (bench_cpu() - c0) * 1e3 / reps,
                (bench_now() - w0) * 1e3 / reps);
    qsort(t, (size_t)reps, sizeof *t, bench_cmp);
    return t[reps / 2];
}

static double bench_time(gokv_device *dev, bench_case *c, uint32_t flags, int reps) {
    return bench_time_mass(dev, c, flags, reps, NULL);
}

/* Bytes a decode call must read: every visible token's stored K and V (codes, scales, biases; KIVI's
 * ring rows in fp16), plus the queries and the outputs. */
static double bench_bytes(const bench_case *c) {
    const gokv_layout *L = gokv_pool_layout(c->pool);
    const double H = BENCH_HKV, S = c->S;
    double per_tok_k, per_tok_v;
    if (L->kivi) {
        per_tok_k = (double)L->k_row_bytes / L->group + (double)L->d_k * 4.0 / L->group; /* codes + s,b per token group */
        per_tok_v = (double)L->v_row_bytes + (double)L->v_groups * 4.0;
        const double nq = gokv_kivi_quantized_len(c->S, L->group, L->residual);
        return H * (nq * (per_tok_k + per_tok_v) + (S - nq) * (L->d_k + L->d_v) * 2.0) + 2.0 * BENCH_HQ * BENCH_D * 4.0;
    }
    per_tok_k = (double)L->k_row_bytes + (double)L->k_groups * 4.0;
    per_tok_v = (double)L->v_row_bytes + (double)L->v_groups * 4.0;
    return H * S * (per_tok_k + per_tok_v) + 2.0 * BENCH_HQ * BENCH_D * 4.0;
}

int main(int argc, char **argv) {
    int32_t sizes[16], n_sizes = 0, threads = 2, reps = 0, scalar = 1, baseline = 1, with_mass = 0;
    double gbps = 0.0, gflops = 0.0; /* measured unless given (-bw, -peak) */
    const char *formats = "f16,q8,q4,kivi2";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-f") && i + 1 < argc) formats = argv[++i];
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-bw") && i + 1 < argc) gbps = atof(argv[++i]);
        else if (!strcmp(argv[i], "-peak") && i + 1 < argc) gflops = atof(argv[++i]);
        else if (!strcmp(argv[i], "-noscalar")) scalar = 0;
        else if (!strcmp(argv[i], "-nobaseline")) baseline = 0;
        else if (!strcmp(argv[i], "-mass")) with_mass = 1;
        else if (!strcmp(argv[i], "-keep") && i + 1 < argc) {
            const char *arg = argv[++i], *colon = strchr(arg, ':');
            bench_keep = atof(arg);
            if (colon) bench_keep_span = atoi(colon + 1) > 0 ? atoi(colon + 1) : 1;
        }
        else if (!strcmp(argv[i], "-avx2")) gokv_cpu_set_simd_limit(GOKV_CPU_AVX2); /* the AVX2 kernels here */
        else if (n_sizes < 16) sizes[n_sizes++] = atoi(argv[i]);
    }
    if (n_sizes == 0) sizes[0] = 4096, sizes[1] = 32768, sizes[2] = 131072, n_sizes = 3;

    if (gbps <= 0.0) gbps = gokv_cpu_measure_read_gbps(threads, (uint64_t)1 << 30);
    if (gflops <= 0.0) gflops = gokv_cpu_measure_peak_gflops(threads);
    gokv_device *dev;
    gokv_device_desc dd = {sizeof dd, "cpu", -1, NULL, threads};
    if (gokv_device_open(&dd, &dev) != GOKV_OK) return fprintf(stderr, "device: %s\n", gokv_last_error()), 1;
    gokv_device_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    gokv_device_info_get(dev, &info);
    printf("cpu: %s, %s, %d threads; read %.1f GB/s, peak %.0f GFLOP/s (fp32 FMA)\n", info.name, info.features, threads,
           gbps, gflops);
    printf("Hq %d Hkv %d d %d, page %d, g %d, KIVI R %d; ms = median of the calls\n\n", BENCH_HQ, BENCH_HKV, BENCH_D,
           BENCH_PAGE, BENCH_G, BENCH_R);
    printf("%-6s %7s %9s %9s %8s %8s %8s %6s %9s %7s %9s %7s", "format", "S", "ms", "MB", "GB/s", "GFLOP/s", "floor",
           "frac", "baseline", "speedup", "scalar", "x");
    if (with_mass) printf(" %9s %7s", "mass ms", "x mass");
    printf("\n");

    static const struct { const char *name; int32_t format; } names[] = {
        {"f32", GOKV_FORMAT_F32}, {"f16", GOKV_FORMAT_F16}, {"q8", GOKV_FORMAT_Q8},
        {"q4", GOKV_FORMAT_Q4},   {"kivi2", GOKV_FORMAT_KIVI2}, {"kivi4", GOKV_FORMAT_KIVI4}};
    char list[256];
    snprintf(list, sizeof list, "%s", formats);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int32_t format = -1;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (!strcmp(tok, names[i].name)) format = names[i].format;
        if (format < 0) {
            fprintf(stderr, "unknown format %s\n", tok);
            continue;
        }
        for (int32_t si = 0; si < n_sizes; si++) {
            bench_case c;
            if (bench_setup(dev, &c, format, sizes[si])) return 1;
            const int r = reps > 0 ? reps : sizes[si] <= 8192 ? 41 : sizes[si] <= 40000 ? 21 : 11;
            const double ms = bench_time(dev, &c, 0, r);
            const double bytes = bench_bytes(&c);
            const double flops = 2.0 * BENCH_HQ * (double)sizes[si] * (2 * BENCH_D);
            const double floor_ms = fmax(bytes / (gbps * 1e9), flops / (gflops * 1e9)) * 1e3;
            const double base = baseline ? bench_time(dev, &c, GOKV_ATTEND_DEQUANT_BASELINE, r < 5 ? r : 5) : NAN;
            const double sc = scalar ? bench_time(dev, &c, GOKV_ATTEND_FORCE_SCALAR, sizes[si] > 40000 ? 3 : 5) : NAN;
            printf("%-6s %7d %9.3f %9.1f %8.1f %8.1f %8.3f %6.2f %9.2f %7.1f %9.2f %7.1f", tok, sizes[si], ms, bytes / 1e6,
                   bytes / (ms * 1e6), flops / (ms * 1e6), floor_ms, floor_ms / ms, base, base / ms, sc, sc / ms);
            if (with_mass) { /* the mass call and the plain one again, alternating, so load changes hit both */
                float *mass = malloc(sizeof(float) * BENCH_HKV * (size_t)sizes[si]);
                double mm = 0.0, m0 = 0.0;
                for (int k = 0; k < 3; k++) {
                    const double a = bench_time_mass(dev, &c, 0, r, mass), b = bench_time(dev, &c, 0, r);
                    mm = k == 0 || a < mm ? a : mm;
                    m0 = k == 0 || b < m0 ? b : m0;
                }
                printf(" %9.3f %7.3f", mm, mm / (m0 < ms ? m0 : ms));
                free(mass);
            }
            printf("\n");
            fflush(stdout);
            bench_teardown(&c);
        }
    }
    gokv_device_close(dev);
    return 0;
}
