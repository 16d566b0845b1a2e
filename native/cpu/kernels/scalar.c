/*
 * scalar.c: the plain scalar kernels of kernels.h, written to read like docs/architecture.md §5. Every SIMD
 * path is tested against these. Scores use the factored form (scale applied once per group), so no
 * dequantized K or V exists anywhere, not even a row.
 */
#include <math.h>
#include <string.h>

#include "gokv_half.h"
#include "kernels.h"

/* Code c of a packed row: 8, 4 (byte = q0 | q1<<4) or 2 bits (byte = q0 | q1<<2 | q2<<4 | q3<<6). */
static inline uint32_t code_at(const uint8_t *row, int32_t enc, int32_t c) {
    switch (enc) {
    case CPU_ENC_Q8: return row[c];
    case CPU_ENC_Q4: return (row[c >> 1] >> ((c & 1) * 4)) & 15u;
    default: return (row[c >> 2] >> ((c & 3) * 2)) & 3u;
    }
}

static inline float plain_at(const uint8_t *row, int32_t enc, int32_t c) {
    if (enc == CPU_ENC_F32) {
        float f;
        memcpy(&f, row + 4 * (size_t)c, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, row + 2 * (size_t)c, 2);
    return gokv_half_to_float(h);
}

static void score_rows_plain(const cpu_rows *r, int32_t d, const float *q, size_t ldq, const float *qsum,
                             const void *prep, int32_t nq, float *s, size_t lds) {
    (void)qsum, (void)prep;
    for (int32_t t = 0; t < r->n; t++) {
        const uint8_t *row = cpu_row_codes(r, t);
        for (int32_t i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * ldq;
            float acc = 0.0f;
            for (int32_t c = 0; c < d; c++) acc += qi[c] * plain_at(row, r->enc, c);
            s[(size_t)i * lds + t] = acc;
        }
    }
}

/* q·k̂ = Σ_g s_g (q_g · codes_g) + b_g Σ_{c∈g} q_c */
static void score_rows_quant(const cpu_rows *r, int32_t d, const float *q, size_t ldq, const float *qsum,
                             const void *prep, int32_t nq, float *s, size_t lds) {
    (void)prep;
    const int32_t g = r->group, ng = d / g;
    uint8_t tmp[CPU_TILE_ROW_MAX];
    for (int32_t t = 0; t < r->n; t++) {
        const uint8_t *row = cpu_row_load(r, t, tmp);
        const uint16_t *sc = cpu_row_scale(r, t), *bi = cpu_row_bias(r, t);
        for (int32_t i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * ldq;
            float acc = 0.0f;
            for (int32_t j = 0; j < ng; j++) {
                float dot = 0.0f;
                for (int32_t c = j * g; c < (j + 1) * g; c++) dot += qi[c] * (float)code_at(row, r->enc, c);
                acc += gokv_half_to_float(sc[j]) * dot + gokv_half_to_float(bi[j]) * qsum[(size_t)i * ng + j];
            }
            s[(size_t)i * lds + t] = acc;
        }
    }
}

static void accum_rows_plain(const cpu_rows *r, int32_t dv, const float *p, size_t ldp, int32_t nq, float *o,
                             size_t ldo) {
    for (int32_t t = 0; t < r->n; t++) {
        const uint8_t *row = cpu_row_codes(r, t);
        for (int32_t i = 0; i < nq; i++) {
            const float pt = p[(size_t)i * ldp + t];
            if (pt == 0.0f) continue;
            float *oi = o + (size_t)i * ldo;
            for (int32_t c = 0; c < dv; c++) oi[c] += pt * plain_at(row, r->enc, c);
        }
    }
}

/* o += p (codes·s + b), with p·s and p·b formed once per group */
static void accum_rows_quant(const cpu_rows *r, int32_t dv, const float *p, size_t ldp, int32_t nq, float *o,
                             size_t ldo) {
    const int32_t g = r->group;
    for (int32_t t = 0; t < r->n; t++) {
        const uint8_t *row = cpu_row_codes(r, t);
        const uint16_t *sc = cpu_row_scale(r, t), *bi = cpu_row_bias(r, t);
        for (int32_t i = 0; i < nq; i++) {
            const float pt = p[(size_t)i * ldp + t];
            if (pt == 0.0f) continue;
            float *oi = o + (size_t)i * ldo;
            for (int32_t c = 0; c < dv; c++) {
                const float ps = pt * gokv_half_to_float(sc[c / g]), pb = pt * gokv_half_to_float(bi[c / g]);
                oi[c] += ps * (float)code_at(row, r->enc, c) + pb;
            }
        }
    }
}

static inline uint32_t chan_code(const cpu_chan *ch, int32_t c, int32_t t) {
    const uint8_t *codes = ch->codes + (size_t)c * (size_t)(ch->g * ch->bits / 8);
    return ch->bits == 2 ? (codes[t >> 2] >> ((t & 3) * 2)) & 3u : (codes[t >> 1] >> ((t & 1) * 4)) & 15u;
}

/* q·k̂_t = Σ_c (q_c s_c) code_{c,t} + Σ_c q_c b_c */
static void score_chan_scalar(const cpu_chan *ch, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                              size_t lds) {
    for (int32_t i = 0; i < nq; i++) {
        const float *qi = q + (size_t)i * ldq;
        float *si = s + (size_t)i * lds;
        float qb = 0.0f;
        for (int32_t t = 0; t < ch->g; t++) si[t] = 0.0f;
        for (int32_t c = 0; c < d; c++) {
            const float qs = qi[c] * gokv_half_to_float(ch->scale[c]);
            qb += qi[c] * gokv_half_to_float(ch->bias[c]);
            for (int32_t t = 0; t < ch->g; t++) si[t] += qs * (float)chan_code(ch, c, t);
        }
        for (int32_t t = 0; t < ch->g; t++) si[t] += qb;
    }
}

/* o_c += s_c Σ_t p_t code_{c,t} + b_c Σ_t p_t */
static void accum_chan_scalar(const cpu_chan *ch, int32_t dv, const float *p, size_t ldp, int32_t nq, float *o,
                              size_t ldo) {
    for (int32_t i = 0; i < nq; i++) {
        const float *pi = p + (size_t)i * ldp;
        float *oi = o + (size_t)i * ldo;
        float psum = 0.0f;
        for (int32_t t = 0; t < ch->g; t++) psum += pi[t];
        if (psum == 0.0f) continue;
        for (int32_t c = 0; c < dv; c++) {
            float acc = 0.0f;
            for (int32_t t = 0; t < ch->g; t++) acc += pi[t] * (float)chan_code(ch, c, t);
            oi[c] += gokv_half_to_float(ch->scale[c]) * acc + gokv_half_to_float(ch->bias[c]) * psum;
        }
    }
}

/* eight independent running maxima, so the compare chain does not serialize the loop (a single one
 * costs a maxss latency per token and query, as much as a score kernel) */
static float max_scalar(const float *x, int32_t n) {
    float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int32_t t = 0;
    for (; t + 8 <= n; t += 8)
        for (int j = 0; j < 8; j++) m[j] = x[t + j] > m[j] ? x[t + j] : m[j];
    for (; t < n; t++) m[0] = x[t] > m[0] ? x[t] : m[0];
    for (int j = 1; j < 8; j++) m[0] = m[j] > m[0] ? m[j] : m[0];
    return m[0];
}

static float exp_sum_scalar(float *x, int32_t n, float m) {
    float sum = 0.0f;
    for (int32_t t = 0; t < n; t++) {
        x[t] = x[t] == -INFINITY ? 0.0f : expf(x[t] - m);
        sum += x[t];
    }
    return sum;
}

static void hide_scalar(float *x, int32_t n, const uint32_t *keep) {
    for (int32_t w = 0; w * 32 < n; w++) {
        const uint32_t k = keep[w];
        const int32_t e = n - w * 32 < 32 ? n - w * 32 : 32;
        for (int32_t t = 0; k != ~0u && t < e; t++)
            if (!((k >> t) & 1u)) x[w * 32 + t] = -INFINITY;
    }
}

static void scale_acc_scalar(const float *x, int32_t n, float f, float *acc) {
    for (int32_t t = 0; t < n; t++) acc[t] += f * x[t];
}

static void exp_acc_scalar(const float *x, int32_t n, float m, float *acc) {
    for (int32_t t = 0; t < n; t++) acc[t] += x[t] == -INFINITY ? 0.0f : expf(x[t] - m);
}

static void dequant_row_scalar(const cpu_rows *r, int32_t t, int32_t d, float *out) {
    uint8_t tmp[CPU_TILE_ROW_MAX];
    const uint8_t *row = cpu_row_load(r, t, tmp);
    if (r->enc == CPU_ENC_F32 || r->enc == CPU_ENC_F16) {
        for (int32_t c = 0; c < d; c++) out[c] = plain_at(row, r->enc, c);
        return;
    }
    const uint16_t *sc = cpu_row_scale(r, t), *bi = cpu_row_bias(r, t);
    for (int32_t c = 0; c < d; c++)
        out[c] = (float)code_at(row, r->enc, c) * gokv_half_to_float(sc[c / r->group]) + gokv_half_to_float(bi[c / r->group]);
}

void cpu_kernels_fill_scalar(cpu_kernels *k) {
    k->score_rows[CPU_ENC_F32] = k->score_rows[CPU_ENC_F16] = score_rows_plain;
    k->score_rows[CPU_ENC_Q8] = k->score_rows[CPU_ENC_Q4] = k->score_rows[CPU_ENC_Q2] = score_rows_quant;
    k->accum_rows[CPU_ENC_F32] = k->accum_rows[CPU_ENC_F16] = accum_rows_plain;
    k->accum_rows[CPU_ENC_Q8] = k->accum_rows[CPU_ENC_Q4] = k->accum_rows[CPU_ENC_Q2] = accum_rows_quant;
    k->score_chan = score_chan_scalar;
    k->accum_chan = accum_chan_scalar;
    k->max = max_scalar;
    k->exp_sum = exp_sum_scalar;
    k->exp_acc = exp_acc_scalar;
    k->hide = hide_scalar;
    k->scale_acc = scale_acc_scalar;
    k->dequant_row = dequant_row_scalar;
    k->spreads_prefetch = 0; /* the caller asks for the next block at once */
}
