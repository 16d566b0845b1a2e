/*
 * bench_quest.c: one decode step under Quest (gokv_attend_desc.quest_pages) against the full decode, standalone.
 *
 * Shape (Llama-3.1-8B-like): 32 query heads, 8 kv heads, d = 128, one sequence of S tokens, one query row at
 * S - 1, pages of 64 tokens in a pool with key_bounds. For each format and context it reports the median ms of
 * the full decode call and of the Quest call (scoring every page by its bounds, then attending the K chosen
 * pages and the recent ones, in the same timed call), and their ratio.
 *
 * Build by hand:
 *   gcc -std=c11 -O2 -I bridge -I native/cpu native/cpu/bench/bench_quest.c \
 *       bridge/gokv_core.c bridge/gokv_layout.c bridge/gokv_validate.c bridge/gokv_unity.c -lm -lpthread
 *
 * Usage: bench_quest [S ...] [-f q4,f16,...] [-k pages] [-r recent tokens] [-t threads] [-n reps]
 *        (defaults: 131072, q4, K 16, recent 64, 2 threads, 21 reps)
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gokv.h"

enum { QB_HQ = 32, QB_HKV = 8, QB_D = 128, QB_PAGE = 64, QB_G = 32, QB_R = 128 };

static double qb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int qb_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t qb_rng = 88172645463325252ull;
static float qb_rand(void) {
    qb_rng ^= qb_rng << 13, qb_rng ^= qb_rng >> 7, qb_rng ^= qb_rng << 17;
    return (float)((qb_rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static double qb_time(gokv_device *dev, gokv_attend_desc *ad, int reps) {
    double t[256];
    if (reps > 256) reps = 256;
    if (gokv_attend(dev, ad) != GOKV_OK) { /* warm-up */
        fprintf(stderr, "attend: %s\n", gokv_last_error());
        return -1;
    }
    for (int r = 0; r < reps; r++) {
        const double t0 = qb_now();
        gokv_attend(dev, ad);
        t[r] = qb_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, qb_cmp);
    return t[reps / 2] * 1e3;
}

int main(int argc, char **argv) {
    int32_t contexts[16], n_ctx = 0, threads = 2, reps = 21, K = 16, recent = 64;
    const char *formats = "q4";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-f") && i + 1 < argc) formats = argv[++i];
        else if (!strcmp(argv[i], "-k") && i + 1 < argc) K = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) recent = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (n_ctx < 16) contexts[n_ctx++] = atoi(argv[i]);
    }
    if (n_ctx == 0) contexts[n_ctx++] = 131072;
    gokv_device_desc dd = {sizeof dd, "cpu", -1, NULL, threads};
    gokv_device *dev;
    if (gokv_device_open(&dd, &dev) != GOKV_OK) return fprintf(stderr, "device: %s\n", gokv_last_error()), 1;
    gokv_device_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    gokv_device_info_get(dev, &info);
    printf("device: %s (%s), %d threads; Hq %d, Hkv %d, d %d, pages of %d, quest K %d, recent %d\n", info.name,
           info.features, info.n_threads, QB_HQ, QB_HKV, QB_D, QB_PAGE, K, recent);
    printf("%-8s %8s %10s %10s %8s\n", "format", "context", "full ms", "quest ms", "x");
    char fl[128];
    snprintf(fl, sizeof fl, "%s", formats);
    for (char *f = strtok(fl, ","); f; f = strtok(NULL, ",")) {
        int32_t format = -1;
        for (int32_t x = 0; x < GOKV_FORMAT_COUNT_; x++)
            if (!strcmp(gokv_format_name(x), f)) format = x;
        if (format < 0) return fprintf(stderr, "unknown format %s\n", f), 1;
        const int kivi = format == GOKV_FORMAT_KIVI2 || format == GOKV_FORMAT_KIVI4, quant = format >= GOKV_FORMAT_Q8;
        for (int c = 0; c < n_ctx; c++) {
            int32_t S = contexts[c], n_pages = (S + QB_PAGE - 1) / QB_PAGE;
            gokv_pool_desc pd = {sizeof pd, format, quant ? QB_G : 0, kivi ? QB_R : 0, QB_HKV, QB_D, QB_D, 0, QB_PAGE,
                                 n_pages, kivi ? 1 : 0, 1};
            gokv_pool *pool;
            if (gokv_pool_create(dev, &pd, &pool) != GOKV_OK) return fprintf(stderr, "pool: %s\n", gokv_last_error()), 1;
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_pages);
            for (int32_t i = 0; i < n_pages; i++) ids[i] = i;
            const int32_t chunk = 4096;
            float *k = malloc(sizeof(float) * (size_t)chunk * QB_HKV * QB_D), *v = malloc(sizeof(float) * (size_t)chunk * QB_HKV * QB_D);
            int32_t slot = 0, p_ind[2] = {0, n_pages}, q_ind[2] = {0, 1};
            for (int32_t t0 = 0; t0 < S; t0 += chunk) {
                const int32_t n = S - t0 < chunk ? S - t0 : chunk;
                for (size_t i = 0; i < (size_t)n * QB_HKV * QB_D; i++) k[i] = qb_rand(), v[i] = qb_rand();
                int32_t tok[2] = {0, n};
                gokv_write_desc wd = {sizeof wd, 1, tok, p_ind, ids, &t0, kivi ? &slot : NULL, k, v};
                if (gokv_pool_write(pool, &wd) != GOKV_OK) return fprintf(stderr, "write: %s\n", gokv_last_error()), 1;
            }
            float *q = malloc(sizeof(float) * QB_HQ * QB_D), *out = malloc(sizeof(float) * QB_HQ * QB_D);
            for (int i = 0; i < QB_HQ * QB_D; i++) q[i] = qb_rand();
            int32_t qpos = S - 1;
            gokv_attend_desc ad;
            memset(&ad, 0, sizeof ad);
            ad.struct_size = sizeof ad;
            ad.pool = pool;
            ad.n_seqs = 1;
            ad.q_indptr = q_ind;
            ad.page_indptr = p_ind;
            ad.page_ids = ids;
            ad.kv_len = &S;
            ad.q_pos = &qpos;
            ad.residual_slot = kivi ? &slot : NULL;
            ad.n_heads_q = QB_HQ;
            ad.q = q;
            ad.out = out;
            ad.scale = 1.0f / sqrtf((float)QB_D);
            const double full = qb_time(dev, &ad, reps);
            ad.quest_pages = K;
            ad.quest_recent = recent;
            const double quest = qb_time(dev, &ad, reps);
            printf("%-8s %8d %10.3f %10.3f %8.1f\n", f, S, full, quest, quest > 0 ? full / quest : 0.0);
            fflush(stdout);
            free(q), free(out), free(k), free(v), free(ids);
            gokv_pool_destroy(pool);
        }
    }
    gokv_device_close(dev);
    return 0;
}
