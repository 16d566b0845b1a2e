/*
 * avx512.c: the kernels of kernels.h in AVX-512 (F/BW/VL/DQ + FMA + F16C), chosen at run time
 * (cpu_backend.c); no file is compiled with -march, each function carries its target attribute.
 *
 * Rows are consumed in slabs of 32 elements (two zmm). A slab's codes are decoded to floats in whatever
 * lane order is cheapest for the encoding (4-bit: even elements, then odd ones; 2-bit: avx512_perm_q2)
 * and the query is permuted the same way once per call, so codes are never shuffled per token;
 * accumulators of values are permuted back once per block. For scores, quantized slabs are dequantized
 * in registers as x̂ = code·s + b, the value scalar.c's dequant_row gives bit for bit (code·s
 * is exact in float), so q·k̂ = Σ q_c x̂_c needs no Σq bias term: one FMA per element per query, the
 * floor of docs/architecture.md §9.
 * 4- and 2-bit codes are dequantized through a 16-entry table per group (vpermps looks at the low 4 index
 * bits only, so the nibble needs no mask), 8-bit ones through an int->float conversion.
 *
 * Scores: per token, one accumulator per query over the slabs; 16 tokens' accumulators are summed
 * horizontally together by a transpose tree (15 adds for 16 tokens, not 16 full reductions). The tables
 * of 4 tokens are built before their slabs are walked. 4-bit keys are scored with 16 tokens in lanes
 * instead (avx512_score_q4_lanes: rows transposed as dwords, no tables, no horizontal sums), and where the
 * CPU has VNNI by vpdpbusd against the query cut into int8 pieces once per call (avx512_score_q4_vnni);
 * with VNNI, 8-bit keys go through the same kernel (rows transposed as dwords: 4 byte codes a lane).
 * Values: slab-outer, token-inner, so the decoded slab of a token is shared by all the queries and the
 * accumulators (2 per query) stay in registers across the block. Quantized values fold the scale into the
 * weights instead (Σ_t p_t (s_t code_t + b_t) = Σ_t (p_t s_t) code_t + Σ_t p_t b_t, once per group and
 * block), so their codes decode through a constant table and the token loop is FMAs and shuffles only.
 * Queries are taken in chunks of 8, 4, 3, 2, 1 (each a compile-time specialization).
 *
 * Files: avx512_internal.h (what they share), avx512_scores.c (score_rows), avx512_values.c (accum_rows),
 * avx512_q4.c (q4 keys: tokens in lanes, VNNI), avx512_kivi.c (KIVI key groups) and this one (max,
 * exp_sum, dequant_row, and the table).
 */
#include "avx512_internal.h"

#if defined(__x86_64__)
/* ---- exp_sum: e^x = 2^n e^r, n = round(x log2 e), |r| <= ln2/2, degree-5 polynomial (CPU_EXP_C*), 1.5e-7.
 * Below x = -87 the result is 0, as it is for -inf (a hidden token's score): e^-87 is still a normal float, and
 * a result below the normal range would cost a microcode assist per vector on Intel cores (masked decodes
 * spent a fifth of their time in them when -inf went down to e^-110). ---- */

AVX512_INLINE __m512 avx512_exp(__m512 x) {
    const __mmask16 valid = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(CPU_EXP_C5), r, _mm512_set1_ps(CPU_EXP_C4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(CPU_EXP_C3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(CPU_EXP_C2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(CPU_EXP_C1));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(valid, y, n);
}

/* max_ps(x, m) gives m when x is NaN: a NaN never wins, as in scalar.c */
AVX512_FN static float avx512_max(const float *x, int32_t n) {
    __m512 m0 = _mm512_set1_ps(-__builtin_inff()), m1 = m0;
    int32_t t = 0;
    for (; t + 32 <= n; t += 32)
        m0 = _mm512_max_ps(_mm512_loadu_ps(x + t), m0), m1 = _mm512_max_ps(_mm512_loadu_ps(x + t + 16), m1);
    for (; t < n; t += 16) m0 = _mm512_mask_max_ps(m0, avx512_mask(n - t), _mm512_maskz_loadu_ps(avx512_mask(n - t), x + t), m0);
    return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

AVX512_FN static float avx512_exp_sum(float *x, int32_t n, float m) {
    const __m512 mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int32_t t = 0; t < n; t += 16) {
        const __mmask16 k = avx512_mask(n - t);
        const __m512 e = avx512_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + t), mv));
        _mm512_mask_storeu_ps(x + t, k, e);
        sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

AVX512_FN static void avx512_exp_acc(const float *x, int32_t n, float m, float *acc) {
    const __m512 mv = _mm512_set1_ps(m);
    for (int32_t t = 0; t < n; t += 16) {
        const __mmask16 k = avx512_mask(n - t);
        const __m512 e = avx512_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + t), mv));
        _mm512_mask_storeu_ps(acc + t, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, acc + t), e));
    }
}

AVX512_FN static void avx512_scale_acc(const float *x, int32_t n, float f, float *acc) {
    const __m512 fv = _mm512_set1_ps(f);
    for (int32_t t = 0; t < n; t += 16) {
        const __mmask16 k = avx512_mask(n - t);
        _mm512_mask_storeu_ps(acc + t, k, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, x + t), fv, _mm512_maskz_loadu_ps(k, acc + t)));
    }
}

AVX512_FN static void avx512_hide(float *x, int32_t n, const uint32_t *keep) {
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
    for (int32_t t = 0; t < n; t += 16)
        _mm512_mask_storeu_ps(x + t, (__mmask16)(~(keep[t >> 5] >> (t & 16)) & avx512_mask(n - t)), ninf);
}

/* ---- dequant_row ---- */

AVX512_FN static void avx512_dequant_row(const cpu_rows *r, int32_t t, int32_t d, float *out) {
    uint8_t tmp[CPU_TILE_ROW_MAX];
    const uint8_t *row = cpu_row_load(r, t, tmp);
    float sf[AVX512_MAX_NG], bf[AVX512_MAX_NG];
    const int quant = r->enc >= CPU_ENC_Q8;
    if (quant) {
        avx512_halves(cpu_row_scale(r, t), d / r->group, sf);
        avx512_halves(cpu_row_bias(r, t), d / r->group, bf);
    }
    for (int32_t k = 0; k * 32 < d; k++) {
        __m512 a, b;
        const int32_t j = quant ? k * 32 / r->group : 0;
        switch (r->enc) {
        case CPU_ENC_F32: avx512_slab(row, k, CPU_ENC_F32, d, sf + j, bf + j, &a, &b); break;
        case CPU_ENC_F16: avx512_slab(row, k, CPU_ENC_F16, d, sf + j, bf + j, &a, &b); break;
        case CPU_ENC_Q8: avx512_slab(row, k, CPU_ENC_Q8, d, sf + j, bf + j, &a, &b); break;
        case CPU_ENC_Q4: avx512_slab(row, k, CPU_ENC_Q4, d, sf + j, bf + j, &a, &b); break;
        default: avx512_slab(row, k, CPU_ENC_Q2, d, sf + j, bf + j, &a, &b); break;
        }
        __m512 lo = a, hi = b;
        if (r->enc == CPU_ENC_Q4 || r->enc == CPU_ENC_Q2) {
            lo = _mm512_permutex2var_ps(a, _mm512_loadu_si512(avx512_inv(r->enc)), b);
            hi = _mm512_permutex2var_ps(a, _mm512_loadu_si512(avx512_inv(r->enc) + 16), b);
        }
        _mm512_mask_storeu_ps(out + (size_t)k * 32, avx512_mask(d - k * 32), lo);
        _mm512_mask_storeu_ps(out + (size_t)k * 32 + 16, avx512_mask(d - k * 32 - 16), hi);
    }
}

void cpu_kernels_fill_avx512(cpu_kernels *k) {
    avx512_fill_scores(k);
    avx512_fill_values(k);
    avx512_fill_q4(k);
    avx512_fill_kivi(k);
    k->max = avx512_max;
    k->exp_sum = avx512_exp_sum;
    k->exp_acc = avx512_exp_acc;
    k->hide = avx512_hide;
    k->scale_acc = avx512_scale_acc;
    k->dequant_row = avx512_dequant_row;
    k->spreads_prefetch = 1;
}
#endif
