/*
 * neon.c: the arm64 kernels of kernels.h (NEON is baseline on AArch64, so no run-time check is needed).
 * Covers what the hot formats need: f32, f16 and 4-bit rows (score and accumulate) and exp_sum; the rest
 * (8- and 2-bit rows, KIVI channels, dequant_row) keep the scalar entries.
 *
 * Rows are consumed in slabs of 16 elements (four q registers). A 4-bit slab (8 bytes) is decoded as its
 * low nibbles (even elements) then its high nibbles (odd elements), and the query is permuted the same way
 * once per call, so codes are never shuffled per token; value accumulators are re-interleaved with zips
 * once per block. Quantized slabs are dequantized in registers as code·s + b (what scalar.c's dequant_row
 * gives: code·s is exact in float), one FMA per element per query. Scores reduce each (token, query) with
 * one across-vector add (vaddvq); values keep 4 accumulators per query in registers across the block.
 */
#include "kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <string.h>

enum { NEON_MAX_D = 1024, NEON_MAX_NG = 32, NEON_MAX_NQ = 4 };

/* position j of a 4-bit slab holds element neon_perm_q4[j] */
static const int32_t neon_perm_q4[16] = {0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15};

static inline float neon_half(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

static void neon_halves(const uint16_t *h, int32_t n, float *out) {
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + i))));
    for (; i < n; i++) out[i] = neon_half(h[i]);
}

static void neon_row_sb(const cpu_rows *r, int32_t ng, float *sf, float *bf) { cpu_row_sb(r, ng, sf, bf, neon_halves); }

/* Slab k (16 elements) of a row into v[0..3], dequantized with *sp, *bp for 4-bit rows. Plain rows whose
 * length ends inside the slab decode it from a zero-padded copy. */
static inline __attribute__((always_inline)) void neon_slab(const uint8_t *row, int32_t k, const int enc, int32_t d,
                                                            const float *sp, const float *bp, float32x4_t v[4]) {
    uint8_t tail[64] __attribute__((aligned(16)));
    if (enc != CPU_ENC_Q4 && k * 16 + 16 > d) {
        const size_t eb = enc == CPU_ENC_F32 ? 4 : 2;
        memset(tail, 0, sizeof tail);
        memcpy(tail, row + (size_t)k * 16 * eb, (size_t)(d - k * 16) * eb);
        row = tail;
        k = 0;
    }
    if (enc == CPU_ENC_F32) {
        const float *f = (const float *)row + (size_t)k * 16;
        v[0] = vld1q_f32(f), v[1] = vld1q_f32(f + 4), v[2] = vld1q_f32(f + 8), v[3] = vld1q_f32(f + 12);
    } else if (enc == CPU_ENC_F16) {
        const uint16_t *h = (const uint16_t *)row + (size_t)k * 16;
        const float16x8_t x = vreinterpretq_f16_u16(vld1q_u16(h)), y = vreinterpretq_f16_u16(vld1q_u16(h + 8));
        v[0] = vcvt_f32_f16(vget_low_f16(x)), v[1] = vcvt_high_f32_f16(x);
        v[2] = vcvt_f32_f16(vget_low_f16(y)), v[3] = vcvt_high_f32_f16(y);
    } else { /* Q4: 8 bytes, low nibbles = even elements, high nibbles = odd ones */
        const uint8x8_t bytes = vld1_u8(row + (size_t)k * 8);
        const uint16x8_t lo = vmovl_u8(vand_u8(bytes, vdup_n_u8(15))), hi = vmovl_u8(vshr_n_u8(bytes, 4));
        const float32x4_t s = vdupq_n_f32(*sp), b = vdupq_n_f32(*bp);
        v[0] = vfmaq_f32(b, vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), s);
        v[1] = vfmaq_f32(b, vcvtq_f32_u32(vmovl_high_u16(lo)), s);
        v[2] = vfmaq_f32(b, vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), s);
        v[3] = vfmaq_f32(b, vcvtq_f32_u32(vmovl_high_u16(hi)), s);
    }
}

/* ---- score_rows ---- */

static inline __attribute__((always_inline)) void neon_score_core(const cpu_rows *r, int32_t d, const float *qp,
                                                                  int32_t dpad, const int NQ, const int enc,
                                                                  const float *sf, const float *bf, int32_t ng, float *s,
                                                                  size_t lds) {
    const int32_t nslab = (d + 15) / 16, g = enc == CPU_ENC_Q4 ? r->group : 16;
    uint8_t tmp[CPU_TILE_ROW_MAX]; /* tiled rows (q4 keys): each gathered here, a dword per 64 bytes */
    for (int32_t t = 0; t < r->n; t++) {
        const uint8_t *row = cpu_row_load(r, t, tmp);
        float32x4_t acc[NEON_MAX_NQ][2];
        for (int i = 0; i < NQ; i++) acc[i][0] = acc[i][1] = vdupq_n_f32(0.0f);
        for (int32_t k = 0; k < nslab; k++) {
            float32x4_t v[4];
            const int32_t j = k * 16 / g;
            neon_slab(row, k, enc, d, sf + (size_t)t * ng + j, bf + (size_t)t * ng + j, v);
            const float *qk = qp + (size_t)k * 16;
            for (int i = 0; i < NQ; i++) {
                const float *qi = qk + (size_t)i * dpad;
                acc[i][0] = vfmaq_f32(acc[i][0], v[0], vld1q_f32(qi));
                acc[i][1] = vfmaq_f32(acc[i][1], v[1], vld1q_f32(qi + 4));
                acc[i][0] = vfmaq_f32(acc[i][0], v[2], vld1q_f32(qi + 8));
                acc[i][1] = vfmaq_f32(acc[i][1], v[3], vld1q_f32(qi + 12));
            }
        }
        for (int i = 0; i < NQ; i++) s[(size_t)i * lds + t] = vaddvq_f32(vaddq_f32(acc[i][0], acc[i][1]));
    }
}

static inline __attribute__((always_inline)) void neon_score_rows_impl(const cpu_rows *r, int32_t d, const float *q,
                                                                       size_t ldq, int32_t nq, float *s, size_t lds,
                                                                       const int enc) {
    const int32_t dpad = (d + 15) & ~15, ng = enc == CPU_ENC_Q4 ? d / r->group : 0;
    float qp[NEON_MAX_NQ * NEON_MAX_D] __attribute__((aligned(16)));
    float sf[CPU_BLOCK * NEON_MAX_NG], bf[CPU_BLOCK * NEON_MAX_NG];
    if (enc == CPU_ENC_Q4) neon_row_sb(r, ng, sf, bf);
    for (int32_t i0 = 0; i0 < nq;) {
        const int32_t nc = nq - i0 >= 4 ? 4 : nq - i0;
        for (int32_t i = 0; i < nc; i++) /* the query in slab order, zero-padded */
            for (int32_t c = 0; c < dpad; c++) {
                const int32_t e = enc == CPU_ENC_Q4 ? (c & ~15) + neon_perm_q4[c & 15] : c;
                qp[(size_t)i * dpad + c] = e < d ? q[(size_t)(i0 + i) * ldq + e] : 0.0f;
            }
        float *si = s + (size_t)i0 * lds;
#define NEON_SCORE_ROWS(N) neon_score_core(r, d, qp, dpad, N, enc, sf, bf, ng, si, lds)
        CPU_BY_NQ4(NEON_SCORE_ROWS, nc)
#undef NEON_SCORE_ROWS
        i0 += nc;
    }
}

/* ---- accum_rows ---- */

static inline __attribute__((always_inline)) void neon_accum_core(const cpu_rows *r, int32_t dv, const float *p,
                                                                  size_t ldp, const int NQ, const int enc,
                                                                  const float *sf, const float *bf, int32_t ng, float *o,
                                                                  size_t ldo) {
    const int32_t nslab = (dv + 15) / 16, g = enc == CPU_ENC_Q4 ? r->group : 16;
    for (int32_t k = 0; k < nslab; k++) {
        const int32_t j = k * 16 / g;
        float32x4_t acc[NEON_MAX_NQ][4];
        for (int i = 0; i < NQ; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = vdupq_n_f32(0.0f);
        for (int32_t t = 0; t < r->n; t++) {
            float32x4_t v[4];
            neon_slab(cpu_row_codes(r, t), k, enc, dv, sf + (size_t)t * ng + j, bf + (size_t)t * ng + j, v);
            for (int i = 0; i < NQ; i++) {
                const float w = p[(size_t)i * ldp + t];
                for (int x = 0; x < 4; x++) acc[i][x] = vfmaq_n_f32(acc[i][x], v[x], w);
            }
        }
        for (int i = 0; i < NQ; i++) {
            float32x4_t nat[4];
            if (enc == CPU_ENC_Q4) { /* even elements in acc 0-1, odd ones in 2-3: interleave back */
                nat[0] = vzip1q_f32(acc[i][0], acc[i][2]), nat[1] = vzip2q_f32(acc[i][0], acc[i][2]);
                nat[2] = vzip1q_f32(acc[i][1], acc[i][3]), nat[3] = vzip2q_f32(acc[i][1], acc[i][3]);
            } else {
                for (int x = 0; x < 4; x++) nat[x] = acc[i][x];
            }
            float *ok = o + (size_t)i * ldo + (size_t)k * 16;
            if (k * 16 + 16 <= dv) {
                for (int x = 0; x < 4; x++) vst1q_f32(ok + 4 * x, vaddq_f32(vld1q_f32(ok + 4 * x), nat[x]));
            } else {
                float tmp[16];
                for (int x = 0; x < 4; x++) vst1q_f32(tmp + 4 * x, nat[x]);
                for (int32_t c = 0; c < dv - k * 16; c++) ok[c] += tmp[c];
            }
        }
    }
}

static inline __attribute__((always_inline)) void neon_accum_rows_impl(const cpu_rows *r, int32_t dv, const float *p,
                                                                       size_t ldp, int32_t nq, float *o, size_t ldo,
                                                                       const int enc) {
    const int32_t ng = enc == CPU_ENC_Q4 ? dv / r->group : 0;
    float sf[CPU_BLOCK * NEON_MAX_NG], bf[CPU_BLOCK * NEON_MAX_NG];
    if (enc == CPU_ENC_Q4) neon_row_sb(r, ng, sf, bf);
    for (int32_t i0 = 0; i0 < nq;) {
        const int32_t nc = nq - i0 >= 4 ? 4 : nq - i0;
        const float *pi = p + (size_t)i0 * ldp;
        float *oi = o + (size_t)i0 * ldo;
#define NEON_ACCUM_ROWS(N) neon_accum_core(r, dv, pi, ldp, N, enc, sf, bf, ng, oi, ldo)
        CPU_BY_NQ4(NEON_ACCUM_ROWS, nc)
#undef NEON_ACCUM_ROWS
        i0 += nc;
    }
}

CPU_ROW_ENTRIES(neon, , f32, CPU_ENC_F32)
CPU_ROW_ENTRIES(neon, , f16, CPU_ENC_F16)
CPU_ROW_ENTRIES(neon, , q4, CPU_ENC_Q4)

/* ---- exp_sum: e^x = 2^n e^r, degree-5 polynomial (CPU_EXP_C*, 1.5e-7); 0 below -87.3 and for -inf ---- */

static inline float32x4_t neon_exp(float32x4_t x) {
    const uint32x4_t valid = vcgeq_f32(x, vdupq_n_f32(-87.3f));
    x = vmaxq_f32(x, vdupq_n_f32(-87.3f));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_n_f32(x, n, 0.693359375f);
    r = vfmsq_n_f32(r, n, -2.12194440e-4f);
    float32x4_t y = vfmaq_f32(vdupq_n_f32(CPU_EXP_C4), vdupq_n_f32(CPU_EXP_C5), r);
    y = vfmaq_f32(vdupq_n_f32(CPU_EXP_C3), y, r);
    y = vfmaq_f32(vdupq_n_f32(CPU_EXP_C2), y, r);
    y = vfmaq_f32(vdupq_n_f32(CPU_EXP_C1), y, r);
    y = vfmaq_f32(vdupq_n_f32(1.0f), y, r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    y = vmulq_f32(y, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(y), valid));
}

static float neon_exp_sum(float *x, int32_t n, float m) {
    float32x4_t sum = vdupq_n_f32(0.0f);
    int32_t t = 0;
    for (; t + 4 <= n; t += 4) {
        const float32x4_t e = neon_exp(vsubq_f32(vld1q_f32(x + t), vdupq_n_f32(m)));
        vst1q_f32(x + t, e);
        sum = vaddq_f32(sum, e);
    }
    float total = vaddvq_f32(sum);
    for (; t < n; t++) {
        x[t] = x[t] == -INFINITY ? 0.0f : expf(x[t] - m);
        total += x[t];
    }
    return total;
}

void cpu_kernels_fill_neon(cpu_kernels *k) {
    k->score_rows[CPU_ENC_F32] = neon_score_rows_f32;
    k->score_rows[CPU_ENC_F16] = neon_score_rows_f16;
    k->score_rows[CPU_ENC_Q4] = neon_score_rows_q4;
    k->accum_rows[CPU_ENC_F32] = neon_accum_rows_f32;
    k->accum_rows[CPU_ENC_F16] = neon_accum_rows_f16;
    k->accum_rows[CPU_ENC_Q4] = neon_accum_rows_q4;
    k->exp_sum = neon_exp_sum;
}
#endif
