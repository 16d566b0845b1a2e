/*
 * avx2.c: the kernels of kernels.h in AVX2 + FMA + F16C, chosen at run time (cpu_backend.c); compiled
 * without -march, each function carries its target attribute. Same scheme as avx512.c, half as wide:
 *
 * rows are consumed in slabs of 16 elements (two ymm), decoded in the encoding's cheapest lane order
 * (4-bit: even elements then odd ones; 2-bit: elements 4j, 4j+1, 4j+2, 4j+3), with the query permuted the
 * same way once per call and value accumulators permuted back once per block. For scores, quantized slabs
 * are dequantized in registers as code·s + b (exactly scalar.c's dequant_row: code·s is exact in float),
 * so the score is one FMA per element per query and needs no Σq bias term. 2-bit codes decode through an
 * 8-entry table (avx2_q2_codes), 8- and 4-bit ones through an int->float conversion. Score accumulators
 * of 8 tokens are reduced together (hadd tree); value accumulators stay in registers across the block,
 * slab by slab, and quantized values fold the scale into the weights once per group and block
 * (Σ_t p_t (s_t code_t + b_t) = Σ_t (p_t s_t) code_t + Σ_t p_t b_t), so their token loop is the raw codes
 * and one FMA per query and 8 lanes.
 * Plain rows whose length is not a multiple of 16 decode their last slab from a zero-padded copy.
 * Queries are taken in chunks of 4, 3, 2, 1 (16 ymm registers). Where the CPU has AVX-VNNI, q4 scores go
 * through vpdpbusd as in avx512.c (avx2_score_rows_q4_vnni, with this table's query_prep).
 *
 * Files: avx2_internal.h (what they share), avx2_scores.c (score_rows), avx2_values.c (accum_rows),
 * avx2_q4.c (q4 keys: tokens in lanes, AVX-VNNI), avx2_kivi.c (KIVI key groups) and this one (max,
 * exp_sum, dequant_row, and the table).
 */
#include "avx2_internal.h"

#if defined(__x86_64__)
/* ---- exp_sum: e^x = 2^n e^r, n = round(x log2 e), |r| <= ln2/2, degree-5 polynomial (CPU_EXP_C*, 1.5e-7).
 * Below x = -87.3 (where 2^n leaves the normal range) the result is 0, as it is for -inf. ---- */

AVX2_INLINE __m256 avx2_exp(__m256 x) {
    const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(CPU_EXP_C5), r, _mm256_set1_ps(CPU_EXP_C4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(CPU_EXP_C3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(CPU_EXP_C2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(CPU_EXP_C1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), valid);
}

/* max_ps(x, m) gives m when x is NaN: a NaN never wins, as in scalar.c */
AVX2_FN static float avx2_max(const float *x, int32_t n) {
    __m256 m0 = _mm256_set1_ps(-__builtin_inff()), m1 = m0;
    int32_t t = 0;
    for (; t + 16 <= n; t += 16)
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + t), m0), m1 = _mm256_max_ps(_mm256_loadu_ps(x + t + 8), m1);
    m0 = _mm256_max_ps(m0, m1);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; t < n; t++) r = x[t] > r ? x[t] : r;
    return r;
}

AVX2_FN static float avx2_exp_sum(float *x, int32_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int32_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m256 e = avx2_exp(_mm256_sub_ps(_mm256_loadu_ps(x + t), mv));
        _mm256_storeu_ps(x + t, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (t < n) {
        float tmp[8];
        for (int32_t j = 0; j < 8; j++) tmp[j] = t + j < n ? x[t + j] : -__builtin_inff();
        const __m256 e = avx2_exp(_mm256_sub_ps(_mm256_loadu_ps(tmp), mv));
        _mm256_storeu_ps(tmp, e);
        for (int32_t j = 0; t + j < n; j++) x[t + j] = tmp[j];
        sum = _mm256_add_ps(sum, e);
    }
    return avx2_reduce(sum);
}

AVX2_FN static void avx2_exp_acc(const float *x, int32_t n, float m, float *acc) {
    const __m256 mv = _mm256_set1_ps(m);
    int32_t t = 0;
    for (; t + 8 <= n; t += 8)
        _mm256_storeu_ps(acc + t, _mm256_add_ps(_mm256_loadu_ps(acc + t), avx2_exp(_mm256_sub_ps(_mm256_loadu_ps(x + t), mv))));
    if (t < n) {
        float tmp[8];
        for (int32_t j = 0; j < 8; j++) tmp[j] = t + j < n ? x[t + j] : -__builtin_inff();
        _mm256_storeu_ps(tmp, avx2_exp(_mm256_sub_ps(_mm256_loadu_ps(tmp), mv)));
        for (int32_t j = 0; t + j < n; j++) acc[t + j] += tmp[j];
    }
}

/* ---- dequant_row ---- */

AVX2_FN static void avx2_dequant_row(const cpu_rows *r, int32_t t, int32_t d, float *out) {
    uint8_t tmp[CPU_TILE_ROW_MAX];
    const uint8_t *row = cpu_row_load(r, t, tmp);
    float sf[AVX2_MAX_NG], bf[AVX2_MAX_NG];
    const int quant = r->enc >= CPU_ENC_Q8;
    if (quant) {
        avx2_halves(cpu_row_scale(r, t), d / r->group, sf);
        avx2_halves(cpu_row_bias(r, t), d / r->group, bf);
    }
    const int32_t *perm = avx2_perm(r->enc);
    for (int32_t k = 0; k * 16 < d; k++) {
        __m256 a, b;
        const int32_t j = quant ? k * 16 / r->group : 0;
        switch (r->enc) {
        case CPU_ENC_F32: avx2_slab(row, k, CPU_ENC_F32, d, sf + j, bf + j, &a, &b); break;
        case CPU_ENC_F16: avx2_slab(row, k, CPU_ENC_F16, d, sf + j, bf + j, &a, &b); break;
        case CPU_ENC_Q8: avx2_slab(row, k, CPU_ENC_Q8, d, sf + j, bf + j, &a, &b); break;
        case CPU_ENC_Q4: avx2_slab(row, k, CPU_ENC_Q4, d, sf + j, bf + j, &a, &b); break;
        default: avx2_slab(row, k, CPU_ENC_Q2, d, sf + j, bf + j, &a, &b); break;
        }
        float tmp[16];
        _mm256_storeu_ps(tmp, a);
        _mm256_storeu_ps(tmp + 8, b);
        for (int32_t x = 0; x < 16; x++)
            if (k * 16 + perm[x] < d) out[k * 16 + perm[x]] = tmp[x];
    }
}

void cpu_kernels_fill_avx2(cpu_kernels *k) {
    avx2_fill_scores(k);
    avx2_fill_values(k);
    avx2_fill_q4(k);
    avx2_fill_kivi(k);
    k->max = avx2_max;
    k->exp_sum = avx2_exp_sum;
    k->exp_acc = avx2_exp_acc;
    k->dequant_row = avx2_dequant_row;
    k->spreads_prefetch = 1;
}
#endif
