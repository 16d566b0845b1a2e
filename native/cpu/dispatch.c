/*
 * dispatch.c: the attention kernels chosen by measurement. Where the CPU has AVX-512, the instruction set does
 * not say which kernels are fastest: Zen 4 runs each 512-bit operation as two halves on 256-bit units, Zen 5
 * and Intel's server cores run it whole, and the kernels differ in how much they shuffle. So the first call
 * times each attention kernel of the AVX-512 table against its AVX2 twin on one cached 128-token block of
 * the decode shape (4 queries of d 128, g 32) and keeps the faster where it is faster by a clear margin; the
 * softmax helpers, the dequantizer and the writers stay AVX-512 (the stored bytes never depend on this).
 * GOKV_CPU_DISPATCH=widest (or gokv_cpu_set_dispatch) keeps the AVX-512 table whole.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_internal.h"

/* The units swapped together: q4 scores with their query preparation and prefetch split (kernels.h). */
enum {
    UNIT_SCORES_F32,
    UNIT_SCORES_F16,
    UNIT_SCORES_Q8,
    UNIT_SCORES_Q4,
    UNIT_VALUES_F32,
    UNIT_VALUES_F16,
    UNIT_VALUES_Q8,
    UNIT_VALUES_Q4,
    UNIT_VALUES_Q2,
    UNIT_KIVI_KEYS,
    UNIT_KIVI_KEYS_AS_VALUES,
    UNIT_COUNT
};
static const char *const unit_names[UNIT_COUNT] = {"f32 scores", "f16 scores", "q8 scores",  "q4 scores",
                                                   "f32 values", "f16 values", "q8 values",  "q4 values",
                                                   "2-bit values", "kivi keys", "kivi keys as values"};

/* The narrow kernel must take at most this fraction of the wide one's time to be chosen: a shared machine
 * moves single timings by a few percent, and a kernel swapped on noise would cost as much as it saves. */
#define DISPATCH_MARGIN 0.92

static _Atomic int32_t g_mode = -1; /* GOKV_CPU_DISPATCH_*; -1: not read from the environment yet */

static int32_t dispatch_mode(void) {
    int32_t m = atomic_load(&g_mode);
    if (m < 0) {
        const char *e = getenv("GOKV_CPU_DISPATCH");
        m = e && strcmp(e, "widest") == 0 ? GOKV_CPU_DISPATCH_WIDEST : GOKV_CPU_DISPATCH_MEASURED;
        int32_t unset = -1;
        atomic_compare_exchange_strong(&g_mode, &unset, m);
        m = atomic_load(&g_mode);
    }
    return m;
}

int32_t gokv_cpu_set_dispatch(int32_t mode) {
    if (mode < GOKV_CPU_DISPATCH_MEASURED || mode > GOKV_CPU_DISPATCH_NARROW) mode = GOKV_CPU_DISPATCH_MEASURED;
    const int32_t old = dispatch_mode();
    atomic_store(&g_mode, mode);
    return old;
}

/* Copies unit u of src into dst. */
static void take_unit(cpu_kernels *dst, const cpu_kernels *src, int u) {
    switch (u) {
    case UNIT_SCORES_F32:
    case UNIT_SCORES_F16:
    case UNIT_SCORES_Q8:
    case UNIT_SCORES_Q4: { /* a scores kernel with its query preparation and how it takes hints */
        const int32_t enc = u - UNIT_SCORES_F32;
        dst->score_rows[enc] = src->score_rows[enc];
        dst->query_prep[enc] = src->query_prep[enc];
        dst->values_take_hint[enc] = src->values_take_hint[enc];
        break;
    }
    case UNIT_VALUES_F32: dst->accum_rows[CPU_ENC_F32] = src->accum_rows[CPU_ENC_F32]; break;
    case UNIT_VALUES_F16: dst->accum_rows[CPU_ENC_F16] = src->accum_rows[CPU_ENC_F16]; break;
    case UNIT_VALUES_Q8: dst->accum_rows[CPU_ENC_Q8] = src->accum_rows[CPU_ENC_Q8]; break;
    case UNIT_VALUES_Q4: dst->accum_rows[CPU_ENC_Q4] = src->accum_rows[CPU_ENC_Q4]; break;
    case UNIT_VALUES_Q2: dst->accum_rows[CPU_ENC_Q2] = src->accum_rows[CPU_ENC_Q2]; break;
    case UNIT_KIVI_KEYS: dst->score_chan = src->score_chan; break;
    default: dst->accum_chan = src->accum_chan; break;
    }
}

enum { DN = CPU_BLOCK, DD = 128, DQ = 4, DG = 32, DNG = DD / DG };

/* One cached block of every encoding, and the buffers a kernel call needs. */
typedef struct dispatch_data {
    uint8_t rows[DN * DD * 4];             /* the largest rows (f32); every encoding reads its prefix */
    uint16_t scale[DN * DNG], bias[DN * DNG];
    uint16_t chan_scale[DD], chan_bias[DD];
    float q[DQ * DD], qsum[DQ * DNG], p[DQ * DN], s[DQ * DN], o[DQ * DD];
    uint8_t prep[DQ * CPU_PREP_STRIDE(DD)];
} dispatch_data;

static double dispatch_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t dispatch_rand(uint32_t *x) {
    *x ^= *x << 13, *x ^= *x >> 17, *x ^= *x << 5;
    return *x;
}

/* Values that keep every product a normal float (a denormal costs Intel cores a microcode assist per vector):
 * the rows' first half holds f16 values in [0.5, 1), the second f32 ones; f32 rows read both halves (as floats
 * the f16 pairs are normal too), the others a prefix, whose bytes serve as any codes. */
static void dispatch_fill(dispatch_data *d) {
    uint32_t x = 2463534242u;
    uint16_t *h = (uint16_t *)d->rows;
    for (int i = 0; i < DN * DD; i++) h[i] = (uint16_t)(0x3800u | (dispatch_rand(&x) & 0x3ffu));
    float *f = (float *)d->rows;
    for (int i = DN * DD / 2; i < DN * DD; i++) f[i] = 0.5f + (float)(dispatch_rand(&x) & 0xffff) / 131072.0f;
    for (int i = 0; i < DN * DNG; i++) {
        d->scale[i] = (uint16_t)(0x2000u | (dispatch_rand(&x) & 0x3ffu));
        d->bias[i] = (uint16_t)(0xa000u | (dispatch_rand(&x) & 0x3ffu));
    }
    for (int i = 0; i < DD; i++) {
        d->chan_scale[i] = (uint16_t)(0x2000u | (dispatch_rand(&x) & 0x3ffu));
        d->chan_bias[i] = (uint16_t)(0xa000u | (dispatch_rand(&x) & 0x3ffu));
    }
    for (int i = 0; i < DQ * DD; i++) d->q[i] = (float)(dispatch_rand(&x) & 0xffff) / 65536.0f - 0.5f;
    for (int i = 0; i < DQ * DN; i++) d->p[i] = (float)(dispatch_rand(&x) & 0xffff) / 65536.0f;
    memset(d->qsum, 0, sizeof d->qsum);
    memset(d->o, 0, sizeof d->o);
}

/* The block's rows in encoding enc (q4 keys tiled, as the pool stores them; values plain). */
static cpu_rows dispatch_rows(const dispatch_data *d, int32_t enc, int tiled) {
    cpu_rows r;
    memset(&r, 0, sizeof r);
    static const size_t stride[CPU_ENC_COUNT] = {DD * 4, DD * 2, DD, DD / 2, DD / 4};
    r.codes = d->rows;
    r.row_stride = stride[enc];
    if (enc >= CPU_ENC_Q8) r.scale = d->scale, r.bias = d->bias, r.sb_stride = DNG;
    r.n = r.n1 = DN;
    r.enc = enc;
    r.group = enc >= CPU_ENC_Q8 ? DG : 0;
    r.tile = tiled ? 0 : -1;
    return r;
}

/* One run of unit u from table k: the unit's kernel over the whole block. */
static void dispatch_run(const cpu_kernels *k, int u, dispatch_data *d) {
    switch (u) {
    case UNIT_SCORES_F32:
    case UNIT_SCORES_F16:
    case UNIT_SCORES_Q8:
    case UNIT_SCORES_Q4: {
        const int32_t enc = u - UNIT_SCORES_F32;
        const cpu_rows r = dispatch_rows(d, enc, enc == CPU_ENC_Q4);
        k->score_rows[enc](&r, DD, d->q, DD, d->qsum, k->query_prep[enc] ? d->prep : NULL, DQ, d->s, DN);
        break;
    }
    case UNIT_KIVI_KEYS:
    case UNIT_KIVI_KEYS_AS_VALUES:
        for (int32_t g0 = 0; g0 < DN; g0 += DG) { /* KIVI 2-bit: a key group of DG tokens at a time */
            const cpu_chan ch = {d->rows + (size_t)g0 * DD / 4, d->chan_scale, d->chan_bias, 2, DG, NULL};
            if (u == UNIT_KIVI_KEYS) k->score_chan(&ch, DD, d->q, DD, DQ, d->s + g0, DN);
            else k->accum_chan(&ch, DD, d->p + g0, DN, DQ, d->o, DD);
        }
        break;
    default: {
        const int32_t enc = u - UNIT_VALUES_F32;
        const cpu_rows r = dispatch_rows(d, enc, 0);
        k->accum_rows[enc](&r, DD, d->p, DN, DQ, d->o, DD);
        break;
    }
    }
}

/* The best of several timed rounds of unit u from table k, in seconds per run. */
static double dispatch_time(const cpu_kernels *k, int u, dispatch_data *d) {
    const cpu_prep_fn prep = u >= UNIT_SCORES_F32 && u <= UNIT_SCORES_Q4 ? k->query_prep[u - UNIT_SCORES_F32] : NULL;
    if (prep) prep(d->q, DD, DQ, DD, DG, d->prep); /* once per call in attend.c */
    for (int w = 0; w < 4; w++) dispatch_run(k, u, d);
    double best = 0.0;
    for (int round = 0; round < 15; round++) {
        const double t0 = dispatch_now();
        for (int i = 0; i < 4; i++) dispatch_run(k, u, d);
        const double dt = (dispatch_now() - t0) / 4.0;
        if (round == 0 || dt < best) best = dt;
    }
    return best;
}

static cpu_kernels g_measured;
static char g_note[160];
static pthread_once_t g_measured_once = PTHREAD_ONCE_INIT;

static void build_measured(void) {
    const cpu_kernels *wide = cpu_kernels_get(GOKV_CPU_AVX512), *narrow = cpu_kernels_get(GOKV_CPU_AVX2);
    g_measured = *wide;
    snprintf(g_note, sizeof g_note, "every kernel avx512");
    dispatch_data *d = aligned_alloc(64, (sizeof(dispatch_data) + 63u) & ~(size_t)63u);
    if (!d) return; /* the AVX-512 table whole */
    dispatch_fill(d);
    for (int u = 0; u < UNIT_COUNT; u++) {
        /* alternate which table goes first: a machine that slows down mid-way favours neither */
        const double tn0 = u & 1 ? dispatch_time(narrow, u, d) : 0.0;
        const double tw = dispatch_time(wide, u, d);
        const double tn = u & 1 ? tn0 : dispatch_time(narrow, u, d);
        if (tn > 0.0 && tn <= DISPATCH_MARGIN * tw) {
            const size_t at = strlen(g_note);
            if (!strcmp(g_note, "every kernel avx512")) snprintf(g_note, sizeof g_note, "avx2 for %s", unit_names[u]);
            else snprintf(g_note + at, sizeof g_note - at, ", %s", unit_names[u]);
            take_unit(&g_measured, narrow, u);
        }
    }
    free(d);
}

/* The all-AVX2 mix (GOKV_CPU_DISPATCH_NARROW, a test hook): every unit of the AVX-512 table swapped. */
static cpu_kernels g_narrow;
static pthread_once_t g_narrow_once = PTHREAD_ONCE_INIT;
static void build_narrow(void) {
    g_narrow = *cpu_kernels_get(GOKV_CPU_AVX512);
    for (int u = 0; u < UNIT_COUNT; u++) take_unit(&g_narrow, cpu_kernels_get(GOKV_CPU_AVX2), u);
}

const cpu_kernels *cpu_kernels_dispatch(const cpu_kernels *wide) {
    switch (dispatch_mode()) {
    case GOKV_CPU_DISPATCH_WIDEST: return wide;
    case GOKV_CPU_DISPATCH_NARROW: pthread_once(&g_narrow_once, build_narrow); return &g_narrow;
    default: pthread_once(&g_measured_once, build_measured); return &g_measured;
    }
}

const char *gokv_cpu_dispatch_note(void) {
    switch (dispatch_mode()) {
    case GOKV_CPU_DISPATCH_WIDEST: return "every kernel avx512 (GOKV_CPU_DISPATCH=widest)";
    case GOKV_CPU_DISPATCH_NARROW: return "every kernel avx2 (test mix)";
    default: pthread_once(&g_measured_once, build_measured); return g_note;
    }
}
