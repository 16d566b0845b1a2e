/*
 * check_simd.c: a quick standalone check of the SIMD kernel tables against the scalar one (kernels.h),
 * entry by entry on random data, then of whole gokv_attend calls (SIMD vs FORCE_SCALAR vs the AVX2 cap,
 * and vs a float64 reference over the dequantized K/V of gokv_pool_read). ctest runs it too (cpu.check_simd,
 * native/cpu/tests/CMakeLists.txt): it reaches table entries that no attention call reaches on a given CPU.
 * Build by hand:
 *   gcc -std=c11 -O2 -I bridge -I native/cpu native/cpu/bench/check_simd.c bridge/gokv_core.c \
 *       bridge/gokv_layout.c bridge/gokv_validate.c bridge/gokv_unity.c -lm -lpthread
 * Exit status 0 when everything agrees.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "gokv_half.h"

static uint64_t rng_state = 0x12345678abcdefull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f; }

static int failures = 0, checks = 0;
static void expect(int ok, const char *what) {
    checks++;
    if (!ok && failures++ < 20) fprintf(stderr, "FAIL: %s\n", what);
}

static const int32_t row_bits[CPU_ENC_COUNT] = {32, 16, 8, 4, 2};

/* Random rows of enc: n tokens of d elements (row stride padded by 64 bytes), scales/biases with stride ng+1. */
typedef struct rows_buf {
    uint8_t *codes;
    uint16_t *scale, *bias;
    cpu_rows r;
} rows_buf;

static rows_buf make_rows(int32_t enc, int32_t n, int32_t d, int32_t g, int contiguous_sb) {
    rows_buf b;
    const size_t row_bytes = (size_t)d * row_bits[enc] / 8 + 64;
    const int32_t ng = enc >= CPU_ENC_Q8 ? d / g : 0;
    const size_t sb_stride = contiguous_sb ? (size_t)ng : (size_t)ng + 3;
    b.codes = malloc(row_bytes * n);
    b.scale = malloc((sb_stride * n + 1) * 2);
    b.bias = malloc((sb_stride * n + 1) * 2);
    for (size_t i = 0; i < row_bytes * n; i++) b.codes[i] = (uint8_t)rnd();
    if (enc == CPU_ENC_F32)
        for (int32_t t = 0; t < n; t++)
            for (int32_t c = 0; c < d; c++) ((float *)(b.codes + t * row_bytes))[c] = frand(-2, 2);
    if (enc == CPU_ENC_F16)
        for (int32_t t = 0; t < n; t++)
            for (int32_t c = 0; c < d; c++) ((uint16_t *)(b.codes + t * row_bytes))[c] = gokv_float_to_half(frand(-2, 2));
    for (size_t i = 0; i < sb_stride * n + 1; i++) {
        b.scale[i] = gokv_float_to_half(frand(0.001f, 0.3f));
        b.bias[i] = gokv_float_to_half(frand(-1.5f, 0.5f));
    }
    if (enc >= CPU_ENC_Q8 && n > 1) b.scale[sb_stride] = 0; /* a constant group */
    b.r = (cpu_rows){b.codes, row_bytes, enc >= CPU_ENC_Q8 ? b.scale : NULL, enc >= CPU_ENC_Q8 ? b.bias : NULL,
                     sb_stride, n, enc, g, NULL, NULL, NULL, NULL, 0, -1};
    return b;
}
static void free_rows(rows_buf *b) { free(b->codes), free(b->scale), free(b->bias); }

static void check_rows(const cpu_kernels *S, const cpu_kernels *V, const char *lvl, int32_t enc, int32_t g, int32_t n,
                       int32_t nq, int32_t d, int contiguous) {
    char what[256];
    rows_buf b = make_rows(enc, n, d, g, contiguous);
    const size_t ldq = d + 5, lds = CPU_BLOCK + 3;
    const int32_t ng = enc >= CPU_ENC_Q8 ? d / g : 1;
    float *q = malloc(sizeof(float) * ldq * nq), *qsum = calloc((size_t)nq * ng, sizeof(float));
    float *s0 = malloc(sizeof(float) * lds * nq), *s1 = malloc(sizeof(float) * lds * nq);
    float *k = malloc(sizeof(float) * d);
    for (size_t i = 0; i < ldq * nq; i++) q[i] = frand(-1, 1);
    if (enc >= CPU_ENC_Q8)
        for (int32_t i = 0; i < nq; i++)
            for (int32_t c = 0; c < d; c++) qsum[i * ng + c / g] += q[i * ldq + c];
    /* q4 and q8 with a prepared query where the table prepares them (VNNI), and again without it (fp32) */
    const cpu_prep_fn prep_fn = V->query_prep[enc];
    const int prepared = prep_fn != NULL;
    void *prep = prepared ? aligned_alloc(64, (size_t)nq * CPU_PREP_STRIDE(d)) : NULL;
    if (prepared) prep_fn(q, ldq, nq, d, g, prep);
    S->score_rows[enc](&b.r, d, q, ldq, enc >= CPU_ENC_Q8 ? qsum : NULL, NULL, nq, s0, lds);
    V->score_rows[enc](&b.r, d, q, ldq, enc >= CPU_ENC_Q8 ? qsum : NULL, prep, nq, s1, lds);
    /* x86 q4 without the group sums falls back to the row kernels (the contract asks for them; defensive) */
    const int no_qsum = enc == CPU_ENC_Q4 && strcmp(lvl, "neon") != 0;
    float *s2 = malloc(sizeof(float) * lds * nq), *s3 = malloc(sizeof(float) * lds * nq);
    if (no_qsum) V->score_rows[enc](&b.r, d, q, ldq, NULL, NULL, nq, s2, lds);
    if (prepared) V->score_rows[enc](&b.r, d, q, ldq, qsum, NULL, nq, s3, lds);
    double worst = 0, worst2 = 0, worst3 = 0;
    for (int32_t t = 0; t < n; t++) {
        S->dequant_row(&b.r, t, d, k);
        float *k1 = malloc(sizeof(float) * d);
        V->dequant_row(&b.r, t, d, k1);
        snprintf(what, sizeof what, "%s dequant_row enc %d g %d d %d t %d", lvl, enc, g, d, t);
        expect(memcmp(k, k1, sizeof(float) * d) == 0, what);
        free(k1);
        for (int32_t i = 0; i < nq; i++) {
            double mag = 0;
            for (int32_t c = 0; c < d; c++) mag += fabs((double)q[i * ldq + c] * k[c]);
            const double err = fabs((double)s0[i * lds + t] - s1[i * lds + t]) / (mag + 1e-30);
            worst = err > worst ? err : worst;
            const double err2 = no_qsum ? fabs((double)s0[i * lds + t] - s2[i * lds + t]) / (mag + 1e-30) : 0.0;
            worst2 = err2 > worst2 ? err2 : worst2;
            const double err3 = prepared ? fabs((double)s0[i * lds + t] - s3[i * lds + t]) / (mag + 1e-30) : 0.0;
            worst3 = err3 > worst3 ? err3 : worst3;
        }
    }
    snprintf(what, sizeof what, "%s score_rows enc %d g %d n %d nq %d d %d sb %d: rel err %.3g", lvl, enc, g, n, nq, d,
             contiguous, worst);
    expect(worst <= 1e-5, what);
    if (no_qsum) {
        snprintf(what, sizeof what, "%s score_rows q4 without qsum g %d n %d nq %d d %d: rel err %.3g", lvl, g, n, nq, d, worst2);
        expect(worst2 <= 1e-5, what);
    }
    if (prepared) {
        snprintf(what, sizeof what, "%s score_rows enc %d unprepared g %d n %d nq %d d %d: rel err %.3g", lvl, enc, g, n, nq, d,
                 worst3);
        expect(worst3 <= 1e-5, what);
    }
    free(s2), free(s3), free(prep);

    /* accum: o += p v̂ */
    const size_t ldp = CPU_BLOCK + 1, ldo = d + 7;
    float *p = malloc(sizeof(float) * ldp * nq), *o0 = malloc(sizeof(float) * ldo * nq), *o1 = malloc(sizeof(float) * ldo * nq);
    for (size_t i = 0; i < ldp * nq; i++) p[i] = (rnd() % 5 == 0) ? 0.0f : frand(0, 1);
    for (size_t i = 0; i < ldo * nq; i++) o0[i] = o1[i] = frand(-1, 1);
    S->accum_rows[enc](&b.r, d, p, ldp, nq, o0, ldo);
    V->accum_rows[enc](&b.r, d, p, ldp, nq, o1, ldo);
    worst = 0;
    for (int32_t i = 0; i < nq; i++) {
        double mag = 1.0;
        for (int32_t t = 0; t < n; t++) {
            S->dequant_row(&b.r, t, d, k);
            for (int32_t c = 0; c < d; c++) mag += fabs(p[i * ldp + t] * k[c]) / d;
        }
        for (size_t c = 0; c < ldo; c++) {
            const double err = fabs((double)o0[i * ldo + c] - o1[i * ldo + c]) / mag;
            worst = err > worst ? err : worst;
        }
    }
    snprintf(what, sizeof what, "%s accum_rows enc %d g %d n %d nq %d d %d: rel err %.3g", lvl, enc, g, n, nq, d, worst);
    expect(worst <= 1e-5, what);
    free(q), free(qsum), free(s0), free(s1), free(k), free(p), free(o0), free(o1);
    free_rows(&b);
}

/* Rows in two runs (a block spanning two pages, kernels.h): the same n rows with rows [n1, n) moved to their own
 * memory must give bit for bit what one run gives, for the scalar table and the SIMD one, and the first run's
 * memory past n1 is overwritten before, so a kernel that reads a row from the wrong run shows. */
static void check_two_runs(const cpu_kernels *T, const char *lvl, int32_t enc, int32_t g, int32_t n, int32_t n1,
                           int32_t nq, int32_t d) {
    char what[256];
    rows_buf b = make_rows(enc, n, d, g, (n1 / 32 + nq) % 2);
    const size_t ldq = d + 1, lds = CPU_BLOCK, ldp = CPU_BLOCK, ldo = d;
    const int32_t ng = enc >= CPU_ENC_Q8 ? d / g : 1;
    float *q = malloc(sizeof(float) * ldq * nq), *qsum = calloc((size_t)nq * ng, sizeof(float));
    float *s[2], *o[2], *k[2], *p = malloc(sizeof(float) * ldp * nq);
    for (int x = 0; x < 2; x++) {
        s[x] = calloc(lds * nq, sizeof(float)), o[x] = malloc(sizeof(float) * ldo * nq);
        k[x] = malloc(sizeof(float) * (size_t)d * n);
    }
    for (size_t i = 0; i < ldq * nq; i++) q[i] = frand(-1, 1);
    for (size_t i = 0; i < ldp * nq; i++) p[i] = (rnd() % 5 == 0) ? 0.0f : frand(0, 1);
    if (enc >= CPU_ENC_Q8)
        for (int32_t i = 0; i < nq; i++)
            for (int32_t c = 0; c < d; c++) qsum[i * ng + c / g] += q[i * ldq + c];
    void *prep = T->query_prep[enc] ? aligned_alloc(64, (size_t)nq * CPU_PREP_STRIDE(d)) : NULL;
    if (prep) T->query_prep[enc](q, ldq, nq, d, g, prep);
    cpu_rows r = b.r;
    const size_t sb_stride = b.r.sb_stride, rest = (size_t)(n - n1);
    uint8_t *codes2 = malloc(rest * r.row_stride);
    uint16_t *scale2 = malloc(rest * sb_stride * 2 + 2), *bias2 = malloc(rest * sb_stride * 2 + 2);
    for (int x = 0; x < 2; x++) { /* x = 0: one run; 1: two */
        if (x == 1) {
            memcpy(codes2, b.codes + (size_t)n1 * r.row_stride, rest * r.row_stride);
            memset(b.codes + (size_t)n1 * r.row_stride, 0xA5, rest * r.row_stride);
            if (enc >= CPU_ENC_Q8) {
                memcpy(scale2, b.scale + (size_t)n1 * sb_stride, rest * sb_stride * 2);
                memcpy(bias2, b.bias + (size_t)n1 * sb_stride, rest * sb_stride * 2);
                for (size_t i = (size_t)n1 * sb_stride; i < (size_t)n * sb_stride; i++) b.scale[i] = b.bias[i] = 0x7C00; /* inf */
            }
            r.codes2 = codes2, r.scale2 = enc >= CPU_ENC_Q8 ? scale2 : NULL, r.bias2 = enc >= CPU_ENC_Q8 ? bias2 : NULL;
            r.n1 = n1;
        }
        T->score_rows[enc](&r, d, q, ldq, enc >= CPU_ENC_Q8 ? qsum : NULL, prep, nq, s[x], lds);
        for (size_t i = 0; i < ldo * nq; i++) o[x][i] = 0.25f;
        T->accum_rows[enc](&r, d, p, ldp, nq, o[x], ldo);
        for (int32_t t = 0; t < n; t++) T->dequant_row(&r, t, d, k[x] + (size_t)t * d);
    }
    snprintf(what, sizeof what, "%s two runs enc %d g %d n %d n1 %d nq %d d %d", lvl, enc, g, n, n1, nq, d);
    expect(memcmp(s[0], s[1], sizeof(float) * lds * nq) == 0 && memcmp(o[0], o[1], sizeof(float) * ldo * nq) == 0 &&
               memcmp(k[0], k[1], sizeof(float) * (size_t)d * n) == 0,
           what);
    for (int x = 0; x < 2; x++) free(s[x]), free(o[x]), free(k[x]);
    free(q), free(qsum), free(p), free(prep), free(codes2), free(scale2), free(bias2);
    free_rows(&b);
}

/* q4 keys as the pool tiles them (gokv_layout.h): the n rows of make_rows laid into tiles of CPU_TILE lanes from
 * lane `lane0`, in one run or in two (the second from n1, a multiple of CPU_RUN_ALIGN, starting its own tile).
 * Every table must read them as the scalar table reads the plain rows: scores (prepared, fp32, without qsum)
 * to 1e-5, dequant_row exactly. */
static void check_tiled(const cpu_kernels *S, const cpu_kernels *V, const char *lvl, int32_t g, int32_t n, int32_t n1,
                        int32_t lane0, int32_t nq, int32_t d) {
    char what[256];
    rows_buf b = make_rows(CPU_ENC_Q4, n, d, g, 1);
    const size_t rb = (size_t)d / 2, tile = (size_t)CPU_TILE * rb;
    const int32_t runs = n1 > 0 && n1 < n ? 2 : 1, na = runs == 2 ? n1 : n;
    const size_t tiles_a = (size_t)(lane0 + na + CPU_TILE - 1) / CPU_TILE;
    const size_t tiles_b = (size_t)(n - na + CPU_TILE - 1) / CPU_TILE;
    uint8_t *ta = aligned_alloc(64, tiles_a * tile), *tb = aligned_alloc(64, (tiles_b + 1) * tile);
    for (size_t i = 0; i < tiles_a * tile; i++) ta[i] = (uint8_t)rnd(); /* lanes of other tokens: anything */
    for (size_t i = 0; i < (tiles_b + 1) * tile; i++) tb[i] = (uint8_t)rnd();
    for (int32_t t = 0; t < n; t++) {
        const int32_t pos = t < na ? lane0 + t : t - na;
        uint8_t *base = (t < na ? ta : tb) + (size_t)(pos / CPU_TILE) * tile + (size_t)(pos % CPU_TILE) * 4;
        for (size_t j = 0; j < rb / 4; j++)
            memcpy(base + j * 4 * CPU_TILE, b.codes + (size_t)t * b.r.row_stride + 4 * j, 4);
    }
    cpu_rows tr = b.r;
    tr.codes = ta;
    tr.row_stride = rb;
    tr.tile = lane0;
    if (runs == 2) {
        tr.codes2 = tb;
        tr.scale2 = b.scale + (size_t)n1 * b.r.sb_stride;
        tr.bias2 = b.bias + (size_t)n1 * b.r.sb_stride;
        tr.n1 = n1;
    }
    const size_t ldq = d + 5, lds = CPU_BLOCK + 3;
    const int32_t ng = d / g;
    float *q = malloc(sizeof(float) * ldq * nq), *qsum = calloc((size_t)nq * ng, sizeof(float));
    float *s0 = malloc(sizeof(float) * lds * nq), *s1 = malloc(sizeof(float) * lds * nq);
    float *k0 = malloc(sizeof(float) * d), *k1 = malloc(sizeof(float) * d);
    for (size_t i = 0; i < ldq * nq; i++) q[i] = frand(-1, 1);
    for (int32_t i = 0; i < nq; i++)
        for (int32_t c = 0; c < d; c++) qsum[i * ng + c / g] += q[i * ldq + c];
    void *prep = V->query_prep[CPU_ENC_Q4] ? aligned_alloc(64, (size_t)nq * CPU_PREP_STRIDE(d)) : NULL;
    if (prep) V->query_prep[CPU_ENC_Q4](q, ldq, nq, d, g, prep);
    S->score_rows[CPU_ENC_Q4](&b.r, d, q, ldq, qsum, NULL, nq, s0, lds);
    for (int mode = 0; mode < 3; mode++) { /* prepared (where the table prepares), fp32, without the group sums */
        if (mode == 0 && !prep) continue;
        if (mode == 2 && (!strcmp(lvl, "neon") || !strcmp(lvl, "scalar"))) continue; /* x86 only, as check_rows */
        V->score_rows[CPU_ENC_Q4](&tr, d, q, ldq, mode == 2 ? NULL : qsum, mode == 0 ? prep : NULL, nq, s1, lds);
        double worst = 0;
        for (int32_t t = 0; t < n; t++)
            for (int32_t i = 0; i < nq; i++) {
                double mag = 0;
                S->dequant_row(&b.r, t, d, k0);
                for (int32_t c = 0; c < d; c++) mag += fabs((double)q[i * ldq + c] * k0[c]);
                const double err = fabs((double)s0[i * lds + t] - s1[i * lds + t]) / (mag + 1e-30);
                worst = err > worst ? err : worst;
            }
        snprintf(what, sizeof what, "%s tiled q4 score_rows mode %d g %d n %d n1 %d lane %d nq %d d %d: rel err %.3g",
                 lvl, mode, g, n, n1, lane0, nq, d, worst);
        expect(worst <= 1e-5, what);
    }
    for (int32_t t = 0; t < n; t++) {
        S->dequant_row(&b.r, t, d, k0);
        V->dequant_row(&tr, t, d, k1);
        snprintf(what, sizeof what, "%s tiled q4 dequant_row g %d n %d n1 %d lane %d d %d t %d", lvl, g, n, n1, lane0,
                 d, t);
        expect(memcmp(k0, k1, sizeof(float) * d) == 0, what);
    }
    free(q), free(qsum), free(s0), free(s1), free(k0), free(k1), free(prep), free(ta), free(tb);
    free_rows(&b);
}

static void check_chan(const cpu_kernels *S, const cpu_kernels *V, const char *lvl, int32_t bits, int32_t g, int32_t nq,
                       int32_t d, int32_t dv) {
    char what[256];
    const size_t cb = (size_t)g * bits / 8;
    uint8_t *codes = malloc(cb * d);
    uint16_t *sc = malloc(2 * d), *bi = malloc(2 * d);
    for (size_t i = 0; i < cb * d; i++) codes[i] = (uint8_t)rnd();
    for (int32_t c = 0; c < d; c++) sc[c] = gokv_float_to_half(frand(0.001f, 0.3f)), bi[c] = gokv_float_to_half(frand(-1, 1));
    cpu_chan ch = {codes, sc, bi, bits, g, NULL};
    const size_t ldq = d + 3, lds = CPU_BLOCK + 2, ldp = CPU_BLOCK + 5, ldo = dv + 1;
    float *q = calloc(ldq * nq, sizeof(float)), *s0 = malloc(sizeof(float) * lds * nq), *s1 = malloc(sizeof(float) * lds * nq);
    for (size_t i = 0; i < ldq * nq; i++) q[i] = frand(-1, 1);
    S->score_chan(&ch, d, q, ldq, nq, s0, lds);
    V->score_chan(&ch, d, q, ldq, nq, s1, lds);
    double worst = 0;
    for (int32_t i = 0; i < nq; i++)
        for (int32_t t = 0; t < g; t++) {
            double mag = 0;
            for (int32_t c = 0; c < d; c++) {
                const uint32_t code = bits == 2 ? (codes[c * cb + t / 4] >> (t % 4 * 2)) & 3 : (codes[c * cb + t / 2] >> (t % 2 * 4)) & 15;
                mag += fabs(q[i * ldq + c] * ((double)code * gokv_half_to_float(sc[c]) + gokv_half_to_float(bi[c])));
            }
            const double err = fabs((double)s0[i * lds + t] - s1[i * lds + t]) / (mag + 1e-30);
            worst = err > worst ? err : worst;
        }
    snprintf(what, sizeof what, "%s score_chan bits %d g %d nq %d d %d: rel err %.3g", lvl, bits, g, nq, d, worst);
    expect(worst <= 1e-5, what);
    float *p = malloc(sizeof(float) * ldp * nq), *o0 = malloc(sizeof(float) * ldo * nq), *o1 = malloc(sizeof(float) * ldo * nq);
    for (size_t i = 0; i < ldp * nq; i++) p[i] = frand(0, 1);
    for (size_t i = 0; i < ldo * nq; i++) o0[i] = o1[i] = frand(-1, 1);
    S->accum_chan(&ch, dv, p, ldp, nq, o0, ldo);
    V->accum_chan(&ch, dv, p, ldp, nq, o1, ldo);
    worst = 0;
    for (size_t i = 0; i < ldo * nq; i++) {
        const double err = fabs((double)o0[i] - o1[i]) / (1.0 + 0.5 * g);
        worst = err > worst ? err : worst;
    }
    snprintf(what, sizeof what, "%s accum_chan bits %d g %d nq %d dv %d: rel err %.3g", lvl, bits, g, nq, dv, worst);
    expect(worst <= 1e-5, what);
    free(codes), free(sc), free(bi), free(q), free(s0), free(s1), free(p), free(o0), free(o1);
}

/* query_prep's edges (q4, q8): a query with a 1000x element and a zero group (the error stays within the
 * pieces' bound, which is per group of the query: Q_j/2 per element), one with a NaN (scores NaN, as the fp32
 * kernels give), and one too small to scale (left to the fp32 kernels: fp32 rounding only). */
static void check_prep(const cpu_kernels *S, const cpu_kernels *V, const char *lvl, int32_t enc, int32_t g) {
    const cpu_prep_fn prep_fn = V->query_prep[enc];
    if (!prep_fn) return;
    char what[256];
    enum { NQ = 4, D = 128, T = 33 };
    rows_buf b = make_rows(enc, T, D, g, 1);
    const int32_t ng = D / g;
    float q[NQ * D], qsum[NQ * D / 32], s0[NQ * T], s1[NQ * T], k[D];
    void *prep = aligned_alloc(64, (size_t)NQ * CPU_PREP_STRIDE(D));
    for (int32_t i = 0; i < NQ * D; i++) q[i] = frand(-1, 1);
    q[0 * D + 5] = 1000.0f;                                     /* an outlier */
    for (int32_t c = g; c < 2 * g && ng > 1; c++) q[0 * D + c] = 0.0f; /* a zero group */
    q[2 * D + 70] = NAN;
    for (int32_t c = 0; c < D; c++) q[3 * D + c] *= 1e-33f;     /* below 2^-100 */
    for (int32_t i = 0; i < NQ; i++)
        for (int32_t j = 0; j < ng; j++) {
            qsum[i * ng + j] = 0.0f;
            for (int32_t c = j * g; c < (j + 1) * g; c++) qsum[i * ng + j] += q[i * D + c];
        }
    for (int32_t call = 0; call < 3; call++) { /* queries {0, 1}, {2}, {3} */
        const int32_t i0 = call == 0 ? 0 : call + 1, nq = call == 0 ? 2 : 1;
        prep_fn(q + i0 * D, D, nq, D, g, prep);
        S->score_rows[enc](&b.r, D, q + i0 * D, D, qsum + i0 * ng, NULL, nq, s0, T);
        V->score_rows[enc](&b.r, D, q + i0 * D, D, qsum + i0 * ng, prep, nq, s1, T);
        double worst = 0;
        int nan_ok = 1;
        for (int32_t i = 0; i < nq; i++)
            for (int32_t t = 0; t < T; t++) {
                S->dequant_row(&b.r, t, D, k);
                double mag = 0;
                for (int32_t c = 0; c < D; c++) mag += fabs((double)q[(i0 + i) * D + c] * k[c]);
                /* the pieces' bound: Q_j/2 per element, Q_j = max_j|q| / 2^20 (fp32 rounding on top) */
                double bound = 1e-6 * mag;
                for (int32_t c = 0; call == 0 && c < D; c++) {
                    float qmax = 0.0f;
                    for (int32_t x = c / g * g; x < (c / g + 1) * g; x++) qmax = fmaxf(qmax, fabsf(q[(i0 + i) * D + x]));
                    const uint8_t byte = b.r.codes[t * b.r.row_stride + (enc == CPU_ENC_Q8 ? c : c / 2)];
                    const int code = enc == CPU_ENC_Q8 ? byte : c & 1 ? byte >> 4 : byte & 15;
                    bound += qmax * 0x1p-21 * (code * gokv_half_to_float(b.r.scale[t * ng + c / g]));
                }
                if (call == 1) nan_ok &= isnan(s1[i * T + t]) && isnan(s0[i * T + t]);
                else {
                    const double err = fabs((double)s0[i * T + t] - s1[i * T + t]);
                    worst = err / bound > worst ? err / bound : worst;
                }
            }
        snprintf(what, sizeof what, "%s prep enc %d g %d call %d: error %.3g of its bound, NaNs %s", lvl, enc, g, call, worst,
                 nan_ok ? "as expected" : "wrong");
        expect(worst <= 1.0 && nan_ok, what);
        if (getenv("CHECK_VERBOSE")) printf("%s\n", what);
    }
    free(prep);
    free_rows(&b);
}

/* max: equal to the scalar one (NaN never wins, -inf rows stay -inf), for every length and position */
static void check_max(const cpu_kernels *S, const cpu_kernels *V, const char *lvl) {
    char what[256];
    for (int32_t n = 1; n <= CPU_BLOCK; n++)
        for (int32_t at = 0; at < n; at += 1 + n / 5) {
            float x[CPU_BLOCK];
            for (int32_t t = 0; t < n; t++) x[t] = rnd() % 3 == 0 ? -INFINITY : rnd() % 17 == 0 ? NAN : frand(-50, 0);
            x[at] = n % 4 == 0 ? -INFINITY : frand(1, 2); /* the winner, or a row with no finite maximum */
            if (n % 4 == 0)
                for (int32_t t = 0; t < n; t++) x[t] = -INFINITY;
            const float m0 = S->max(x, n), m1 = V->max(x, n);
            snprintf(what, sizeof what, "%s max n %d at %d: %g vs %g", lvl, n, at, m0, m1);
            expect(m0 == m1 || (isnan(m0) && isnan(m1)), what);
        }
}

static void check_exp(const cpu_kernels *S, const cpu_kernels *V, const char *lvl) {
    char what[256];
    for (int32_t n = 1; n <= CPU_BLOCK; n += 7) {
        float x0[CPU_BLOCK], x1[CPU_BLOCK];
        for (int32_t t = 0; t < n; t++) x0[t] = x1[t] = rnd() % 9 == 0 ? -INFINITY : frand(-90, 3);
        const float m = 3.0f;
        if (S->exp_acc && V->exp_acc) { /* acc += e^(x - m), x unchanged */
            float a0[CPU_BLOCK], a1[CPU_BLOCK], xin[CPU_BLOCK];
            for (int32_t t = 0; t < n; t++) a0[t] = a1[t] = frand(0.5f, 2.0f), xin[t] = x0[t];
            S->exp_acc(x0, n, m, a0);
            V->exp_acc(x1, n, m, a1);
            double worst_acc = 0;
            int same_x = 1;
            for (int32_t t = 0; t < n; t++) {
                worst_acc = fmax(worst_acc, fabs((double)a0[t] - a1[t]) / fabs(a0[t]));
                same_x = same_x && memcmp(&x1[t], &xin[t], sizeof(float)) == 0;
            }
            snprintf(what, sizeof what, "%s exp_acc n %d: max rel err %.3g, input %s", lvl, n, worst_acc,
                     same_x ? "unchanged" : "written");
            expect(worst_acc <= 3e-7 && same_x, what);
        }
        const float s0 = S->exp_sum(x0, n, m), s1 = V->exp_sum(x1, n, m);
        double worst = 0;
        for (int32_t t = 0; t < n; t++) {
            if (x0[t] == 0.0f) expect(x1[t] == 0.0f, "exp of -inf is 0");
            const double err = fabs((double)x0[t] - x1[t]) / (fabs(x0[t]) > 1e-37 ? fabs(x0[t]) : 1.0);
            worst = err > worst ? err : worst;
        }
        snprintf(what, sizeof what, "%s exp_sum n %d: max rel err %.3g (sum %.9g vs %.9g)", lvl, n, worst, s0, s1);
        expect(worst <= 3e-7 && fabs(s0 - s1) <= 1e-6 * fabs(s0), what);
    }
}

/* ---- whole attention calls ---- */

static gokv_device *dev;

/* keep > 0: per-kv-head validity masks (GOKV_ATTEND_MASK_PER_KV_HEAD), each aligned span of `span` tokens kept with
 * probability keep (kv head Hkv - 1 sees nothing when keep < 0.3), so that blocks are gathered (few tokens seen),
 * hidden and scored whole (many), or skipped, and ranges are cut where whole spans are hidden. */
static int attend_case_masked(int32_t format, int32_t g, int32_t Hq, int32_t Hkv, int32_t dk, int32_t dv, int32_t mla,
                              int32_t S, int32_t T, int32_t window, double keep, int32_t span) {
    char what[256];
    const int32_t P = 64, R = gokv_format_is_kivi(format) ? 64 : 0;
    const int32_t n_pages = (S + P - 1) / P;
    gokv_pool_desc pd = {sizeof pd, format, g, R, Hkv, dk, dv, mla, P, n_pages, gokv_format_is_kivi(format) ? 1 : 0, 0};
    gokv_pool *pool;
    if (gokv_pool_create(dev, &pd, &pool) != GOKV_OK) {
        fprintf(stderr, "pool: %s\n", gokv_last_error());
        return 1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * n_pages);
    for (int32_t i = 0; i < n_pages; i++) ids[i] = n_pages - 1 - i;
    float *k = malloc(sizeof(float) * S * Hkv * dk), *v = malloc(sizeof(float) * S * Hkv * dv);
    for (size_t i = 0; i < (size_t)S * Hkv * dk; i++) k[i] = frand(-1, 1) + (i % dk == 3 ? 4.0f : 0.0f);
    for (size_t i = 0; i < (size_t)S * Hkv * dv; i++) v[i] = frand(-1, 1);
    int32_t tok[2] = {0, S}, pind[2] = {0, n_pages}, start = 0, slot = 0;
    gokv_write_desc wd = {sizeof wd, 1, tok, pind, ids, &start, gokv_format_is_kivi(format) ? &slot : NULL, k, mla ? NULL : v};
    if (gokv_pool_write(pool, &wd) != GOKV_OK) {
        fprintf(stderr, "write: %s\n", gokv_last_error());
        return 1;
    }
    /* the dequantized K/V, for the float64 reference */
    gokv_read_desc rd = {sizeof rd, 1, tok, pind, ids, &S, &start, gokv_format_is_kivi(format) ? &slot : NULL, k, v};
    gokv_pool_read(pool, &rd);
    float *q = malloc(sizeof(float) * T * Hq * dk);
    for (size_t i = 0; i < (size_t)T * Hq * dk; i++) q[i] = frand(-1, 1);
    float *out[3];
    const uint32_t flags[3] = {0, GOKV_ATTEND_FORCE_SCALAR, 0};
    int32_t qind[2] = {0, T}, qpos = S - T, W = (S + 31) / 32, mind[2] = {0, W * Hkv};
    uint32_t *mask = keep > 0 ? calloc((size_t)W * Hkv, sizeof(uint32_t)) : NULL;
    for (int32_t h = 0; mask && h < Hkv; h++)
        for (int32_t t0 = 0; t0 < S; t0 += span) {
            const int kept = frand(0, 1) < keep && !(keep < 0.3 && h == Hkv - 1);
            for (int32_t t = t0; kept && t < t0 + span && t < S; t++) mask[(size_t)h * W + t / 32] |= 1u << (t % 32);
        }
    for (int c = 0; c < 3; c++) {
        out[c] = malloc(sizeof(float) * T * Hq * dv);
        gokv_cpu_set_simd_limit(c == 2 ? GOKV_CPU_AVX2 : 100);
        gokv_attend_desc ad = {sizeof ad, pool, 1, qind, pind, ids, &S, &qpos, gokv_format_is_kivi(format) ? &slot : NULL,
                               mask, mask ? mind : NULL, Hq, q, out[c], 1.0f / sqrtf((float)dk), NULL, 4, window, 0,
                               flags[c] | (mask ? GOKV_ATTEND_MASK_PER_KV_HEAD : 0u), NULL, 0, 0, 0, NULL, NULL};
        if (gokv_attend(dev, &ad) != GOKV_OK) {
            fprintf(stderr, "attend: %s\n", gokv_last_error());
            return 1;
        }
    }
    gokv_cpu_set_simd_limit(100);
    double worst[3] = {0, 0, 0};
    const int32_t G = Hq / Hkv;
    double *w = malloc(sizeof(double) * S);
    for (int32_t r = 0; r < T; r++)
        for (int32_t h = 0; h < Hq; h++) {
            const float *qh = q + ((size_t)r * Hq + h) * dk;
            const int32_t p = qpos + r, kvh = h / G;
            double m = -INFINITY, l = 0;
            for (int32_t t = 0; t < S; t++) {
                const int vis = t <= p && (window == 0 || t > p - window || t < 4) &&
                                (!mask || ((mask[(size_t)kvh * W + t / 32] >> (t % 32)) & 1u));
                w[t] = -INFINITY;
                if (!vis) continue;
                double acc = 0;
                for (int32_t c = 0; c < dk; c++) acc += (double)qh[c] * k[((size_t)t * Hkv + kvh) * dk + c];
                w[t] = acc / sqrt((double)dk);
                m = w[t] > m ? w[t] : m;
            }
            for (int32_t c = 0; c < dv; c++) {
                double acc = 0;
                l = 0;
                for (int32_t t = 0; t < S; t++) {
                    if (w[t] == -INFINITY) continue;
                    const double e = exp(w[t] - m);
                    l += e;
                    acc += e * (mla ? k[((size_t)t * Hkv + kvh) * dk + c] : v[((size_t)t * Hkv + kvh) * dv + c]);
                }
                const double ref = l > 0 ? acc / l : 0.0; /* a query that sees nothing outputs zeros */
                for (int x = 0; x < 3; x++) {
                    const double err = fabs(out[x][((size_t)r * Hq + h) * dv + c] - ref) / (fabs(ref) + 1e-2);
                    worst[x] = err > worst[x] ? err : worst[x];
                }
            }
        }
    snprintf(what, sizeof what,
             "attend %s g %d Hq %d Hkv %d dk %d dv %d mla %d S %d T %d W %d keep %.3g/%d: err simd %.2g scalar %.2g avx2 %.2g",
             gokv_format_name(format), g, Hq, Hkv, dk, dv, mla, S, T, window, keep, span, worst[0], worst[1], worst[2]);
    expect(worst[0] <= 1e-4 && worst[1] <= 1e-4 && worst[2] <= 1e-4, what);
    if (getenv("VERBOSE")) printf("%s\n", what);
    for (int c = 0; c < 3; c++) free(out[c]);
    free(w), free(q), free(k), free(v), free(ids), free(mask);
    gokv_pool_destroy(pool);
    return 0;
}

static int attend_case(int32_t format, int32_t g, int32_t Hq, int32_t Hkv, int32_t dk, int32_t dv, int32_t mla, int32_t S,
                       int32_t T, int32_t window) {
    return attend_case_masked(format, g, Hq, Hkv, dk, dv, mla, S, T, window, 0.0, 1);
}

int main(void) {
    const cpu_kernels *S = cpu_kernels_get(GOKV_CPU_SCALAR);
    const int32_t hw = gokv_cpu_simd_level();
    int scalar_runs_checked = 0; /* the scalar table's two-run check, with the first SIMD level's */
    int scalar_tiled_checked = 0; /* and its tiled check */
    for (int32_t level = 1; level <= 3; level++) {
        if (!(level <= hw && (hw != GOKV_CPU_NEON || level == GOKV_CPU_NEON))) continue;
        const cpu_kernels *V = cpu_kernels_get(level);
        const char *lvl = gokv_cpu_simd_name(level);
        const int32_t ns[] = {1, 7, 33, 128}, nqs[] = {1, 3, 4, 8, 17}, ds[] = {64, 128, 576}, gs[] = {32, 64, 128};
        for (int32_t enc = 0; enc < CPU_ENC_COUNT; enc++)
            for (int32_t gi = 0; gi < (enc >= CPU_ENC_Q8 ? 3 : 1); gi++)
                for (int32_t di = 0; di < 3; di++)
                    for (int32_t ni = 0; ni < 4; ni++)
                        for (int32_t qi = 0; qi < 5; qi++) {
                            const int32_t d = ds[di], g = enc >= CPU_ENC_Q8 ? gs[gi] : 0;
                            if (g && d % g) continue;
                            check_rows(S, V, lvl, enc, g, ns[ni], nqs[qi], d, (ni + qi) % 2);
                        }
        const int32_t split_ns[] = {33, 65, 100, 128};
        for (int32_t enc = 0; enc < CPU_ENC_COUNT; enc++)
            for (int32_t gi = 0; gi < (enc >= CPU_ENC_Q8 ? 3 : 1); gi++)
                for (int32_t ni = 0; ni < 4; ni++)
                    for (int32_t n1 = 32; n1 < split_ns[ni]; n1 += 32)
                        for (int32_t qi = 0; qi < 5; qi += 2) {
                            const int32_t g = enc >= CPU_ENC_Q8 ? gs[gi] : 0;
                            if (!scalar_runs_checked) check_two_runs(S, "scalar", enc, g, split_ns[ni], n1, nqs[qi], 128);
                            check_two_runs(V, lvl, enc, g, split_ns[ni], n1, nqs[qi], 128);
                        }
        scalar_runs_checked = 1;
        const int32_t odd_ds[] = {4, 20, 80, 100, 112};
        for (int32_t enc = 0; enc < 2; enc++)
            for (int32_t di = 0; di < 5; di++) check_rows(S, V, lvl, enc, 0, 33, 5, odd_ds[di], 1);
        for (int32_t bits = 2; bits <= 4; bits += 2)
            for (int32_t gi = 0; gi < 3; gi++)
                for (int32_t qi = 0; qi < 5; qi++) {
                    check_chan(S, V, lvl, bits, gs[gi], nqs[qi], 128, 128);
                    check_chan(S, V, lvl, bits, gs[gi], nqs[qi], 576, 512);
                    check_chan(S, V, lvl, bits, gs[gi], nqs[qi], 64, 36);
                }
        for (int32_t gi = 0; gi < 3; gi++) check_prep(S, V, lvl, CPU_ENC_Q4, gs[gi]), check_prep(S, V, lvl, CPU_ENC_Q8, gs[gi]);
        const int32_t tiled_ns[] = {1, 7, 16, 33, 100, 128}, lanes[] = {0, 3, 8, 15};
        for (int32_t gi = 0; gi < 3; gi++)
            for (int32_t di = 0; di < 3; di++)
                for (int32_t ni = 0; ni < 6; ni++)
                    for (int32_t li = 0; li < 4; li++) {
                        const int32_t d = ds[di], n = tiled_ns[ni];
                        if (d % gs[gi]) continue;
                        if (!scalar_tiled_checked)
                            check_tiled(S, S, "scalar", gs[gi], n, 0, lanes[li], nqs[(ni + li) % 5], d);
                        check_tiled(S, V, lvl, gs[gi], n, 0, lanes[li], nqs[(ni + li) % 5], d);
                        if (n > 32) check_tiled(S, V, lvl, gs[gi], n, 32 * ((n - 1) / 32), lanes[li], nqs[li], d);
                    }
        scalar_tiled_checked = 1;
        check_max(S, V, lvl);
        check_exp(S, V, lvl);
        printf("%s kernels: %d checks, %d failures so far\n", lvl, checks, failures);
    }
    gokv_device_desc dd = {sizeof dd, "cpu", -1, NULL, 2};
    if (gokv_device_open(&dd, &dev) != GOKV_OK) return 1;
    for (int32_t f = 0; f < GOKV_FORMAT_COUNT_; f++) {
        const int32_t g = gokv_format_quantized(f) ? 32 : 0;
        attend_case(f, g, 32, 8, 128, 128, 0, 1000, 1, 0);
        attend_case(f, g ? 64 : 0, 8, 2, 128, 128, 0, 777, 5, 0);
        attend_case(f, g, 12, 4, 64, 64, 0, 600, 3, 200);
        attend_case(f, g, 16, 1, 576, 512, 1, 300, 1, 0);
        const double keeps[] = {0.125, 0.5, 0.9};
        for (int k = 0; k < 3; k++) {
            attend_case_masked(f, g, 32, 8, 128, 128, 0, 3000, 1, 0, keeps[k], 1);
            attend_case_masked(f, g, 8, 2, 128, 128, 0, 1500, 5, 0, keeps[k], 1);
            attend_case_masked(f, g, 12, 4, 64, 64, 0, 1200, 3, 300, keeps[k], 1);
            attend_case_masked(f, g, 16, 1, 576, 512, 1, 700, 1, 0, keeps[k], 1);
            attend_case_masked(f, g, 32, 8, 128, 128, 0, 3000, 2, 0, keeps[k] / 2, 64);
            attend_case_masked(f, g, 8, 2, 128, 128, 0, 2000, 1, 0, keeps[k] / 2, 48);
        }
    }
    gokv_device_close(dev);
    printf("%d checks, %d failures\n", checks, failures);
    return failures != 0;
}
