/*
 * avx512_values.c: accum_rows of the AVX-512 table (values of every row encoding): slab-outer,
 * token-inner, the scale of quantized values folded into the weights. See avx512.c.
 */
#include "avx512_internal.h"

#if defined(__x86_64__)

/* ---- accum_rows ---- */

/* Adds the permuted accumulators (a, b) of slab k to o[k*32 ..], restoring element order. */
AVX512_INLINE void avx512_add_slab(float *o, int32_t k, int32_t dv, __m512 a, __m512 b, const int enc) {
    __m512 lo = a, hi = b;
    if (enc == CPU_ENC_Q4 || enc == CPU_ENC_Q2) {
        const int32_t *inv = enc == CPU_ENC_Q2 ? avx512_inv_q2p : avx512_inv(enc); /* avx512_value_codes' orders */
        lo = _mm512_permutex2var_ps(a, _mm512_loadu_si512(inv), b);
        hi = _mm512_permutex2var_ps(a, _mm512_loadu_si512(inv + 16), b);
    }
    float *ok = o + (size_t)k * 32;
    if (k * 32 + 32 <= dv) {
        _mm512_storeu_ps(ok, _mm512_add_ps(_mm512_loadu_ps(ok), lo));
        _mm512_storeu_ps(ok + 16, _mm512_add_ps(_mm512_loadu_ps(ok + 16), hi));
    } else {
        const __mmask16 ma = avx512_mask(dv - k * 32), mb = avx512_mask(dv - k * 32 - 16);
        _mm512_mask_storeu_ps(ok, ma, _mm512_add_ps(_mm512_maskz_loadu_ps(ma, ok), lo));
        _mm512_mask_storeu_ps(ok + 16, mb, _mm512_add_ps(_mm512_maskz_loadu_ps(mb, ok + 16), hi));
    }
}

/* The weights of group j for NQ queries: w[i][t] = p[i][t] s_t,j, and bsum[i] = Σ_t p[i][t] b_t,j, so that
 * Σ_t p_t v̂_t = Σ_t w_t code_t + bsum over the group's elements. The scale leaves the token loop, whose
 * codes then decode through a constant table: a per-token table built on the FMA pipes costs the values
 * kernel about a fifth of its speed (bench_kernels: 95% of the FMA peak with constant tables, 72% without). */
AVX512_INLINE void avx512_fold_weights(const float *p, size_t ldp, const int NQ, int32_t n, const float *sc,
                                       const float *bc, int32_t j, float *w, float *bsum) {
    __m512 bacc[AVX512_MAX_NQ];
    #pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) bacc[i] = _mm512_setzero_ps();
    for (int32_t t0 = 0; t0 < n; t0 += 16) {
        const __mmask16 m = avx512_mask(n - t0);
        const __m512 sv = _mm512_load_ps(sc + (size_t)j * CPU_BLOCK + t0), bv = _mm512_load_ps(bc + (size_t)j * CPU_BLOCK + t0);
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) {
            const __m512 pv = _mm512_maskz_loadu_ps(m, p + (size_t)i * ldp + t0);
            _mm512_storeu_ps(w + (size_t)i * CPU_BLOCK + t0, _mm512_mul_ps(pv, sv));
            bacc[i] = _mm512_fmadd_ps(pv, bv, bacc[i]);
        }
    }
    #pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) bsum[i] = _mm512_reduce_add_ps(bacc[i]);
}

/* Slab k of a quantized value row for the values kernel: q4 and 2-bit slabs as avx512_pair_codes (b: each byte or
 * pair of codes whole; the kernel recovers the odd elements' sums once per slab), q8 as avx512_slab_codes. q4
 * values 1.065x, 2-bit ones 1.055x faster on a cached block (12 -> 11 operations per 32 codes and 4 queries). */
AVX512_INLINE void avx512_value_codes(const uint8_t *row, int32_t k, const int enc, __m512 *a, __m512 *b) {
    if (enc == CPU_ENC_Q4) avx512_pair_codes(row + (size_t)k * 16, 4, a, b);
    else if (enc == CPU_ENC_Q2) avx512_pair_codes(row + (size_t)k * 8, 2, a, b);
    else avx512_slab_codes(row, k, enc, a, b);
}

AVX512_INLINE void avx512_accum_core(const cpu_rows *r, int32_t dv, const float *p, size_t ldp, const int NQ,
                                     const int enc, const float *sc, const float *bc, float *o, size_t ldo,
                                     const cpu_prefetch *pf) {
    const int32_t nslab = (dv + 31) / 32, n = r->n, slices = (n + 7) / 8; /* prefetch slices per slab */
    cpu_prefetch_walk pw;
    cpu_prefetch_start(&pw, pf, nslab * slices);
    const int quant = enc >= CPU_ENC_Q8;
    const int32_t gshift = quant ? __builtin_ctz((unsigned)r->group / 32u) : 0;
    float wbuf[AVX512_MAX_NQ * CPU_BLOCK] __attribute__((aligned(64)));
    float bsum[AVX512_MAX_NQ] = {0};
    /* quantized rows: folded weights of the slab's group; plain ones: the probabilities themselves */
    const float *w = quant ? wbuf : p;
    const size_t ldw = quant ? CPU_BLOCK : ldp;
    /* two interleaved token streams when registers allow: each FMA chain then waits on every other token */
    enum { U = 2 };
    for (int32_t k = 0; k < nslab; k++) {
        const int32_t j = k >> gshift;
        if (quant && (k == 0 || j != (k - 1) >> gshift)) avx512_fold_weights(p, ldp, NQ, n, sc, bc, j, wbuf, bsum);
        __m512 acc_a[U][AVX512_MAX_NQ], acc_b[U][AVX512_MAX_NQ];
        #pragma GCC unroll 8
        for (int u = 0; u < U; u++)
            #pragma GCC unroll 8
            for (int i = 0; i < NQ; i++) { /* b sums w·pair for q4 and 2-bit: (1 + K)·bsum, so (b - a) / K keeps one */
                acc_a[u][i] = _mm512_set1_ps(u == 0 ? bsum[i] : 0.0f);
                acc_b[u][i] = _mm512_set1_ps(u == 0 ? (1.0f + cpu_pair_k(cpu_pair_bits(enc))) * bsum[i] : 0.0f);
            }
        /* 32 tokens at a time (one run: CPU_RUN_ALIGN), every 8 tokens asking for a slice of the prefetch hint:
         * a slice a piece (20 lines of the next block-head with q4's whole hint) ran out of the core's miss
         * buffers and stalled the kernel, a quarter of it spreads them (bench_kernels, q4 from DRAM: 1.08-1.10x) */
        for (int32_t t0 = 0, t = 0; t0 < n; t0 += 32) {
            const int32_t t1 = n - t0 < 32 ? n : t0 + 32;
            const uint8_t *piece = cpu_row_codes(r, t0); /* row t at piece + (t - t0) * stride */
            if (NQ <= 4)
                for (; t + 2 <= t1; t += 2) {
                    if ((t & 7) == 0) cpu_prefetch_step(&pw);
                    #pragma GCC unroll 8
                    for (int u = 0; u < 2; u++) {
                        __m512 a, b;
                        const uint8_t *row = piece + (size_t)(t + u - t0) * r->row_stride;
                        if (quant) avx512_value_codes(row, k, enc, &a, &b);
                        else avx512_slab(row, k, enc, dv, NULL, NULL, &a, &b);
                        #pragma GCC unroll 8
                        for (int i = 0; i < NQ; i++) {
                            const __m512 wt = _mm512_set1_ps(w[(size_t)i * ldw + t + u]);
                            acc_a[u][i] = _mm512_fmadd_ps(a, wt, acc_a[u][i]);
                            acc_b[u][i] = _mm512_fmadd_ps(b, wt, acc_b[u][i]);
                        }
                    }
                }
            for (; t < t1; t++) {
                if ((t & 7) == 0) cpu_prefetch_step(&pw);
                __m512 a, b;
                const uint8_t *row = piece + (size_t)(t - t0) * r->row_stride;
                if (quant) avx512_value_codes(row, k, enc, &a, &b);
                else avx512_slab(row, k, enc, dv, NULL, NULL, &a, &b);
                #pragma GCC unroll 8
                for (int i = 0; i < NQ; i++) {
                    const __m512 wt = _mm512_set1_ps(w[(size_t)i * ldw + t]);
                    acc_a[0][i] = _mm512_fmadd_ps(a, wt, acc_a[0][i]);
                    acc_b[0][i] = _mm512_fmadd_ps(b, wt, acc_b[0][i]);
                }
            }
        }
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) {
            const __m512 a = _mm512_add_ps(acc_a[0][i], acc_a[1][i]);
            __m512 b = _mm512_add_ps(acc_b[0][i], acc_b[1][i]);
            if (cpu_pair_bits(enc)) /* Σ w hi = (Σ w x - Σ w lo) / K */
                b = _mm512_mul_ps(_mm512_sub_ps(b, a), _mm512_set1_ps(1.0f / cpu_pair_k(cpu_pair_bits(enc))));
            avx512_add_slab(o + (size_t)i * ldo, k, dv, a, b, enc);
        }
    }
}

AVX512_INLINE void avx512_accum_rows_impl(const cpu_rows *r, int32_t dv, const float *p, size_t ldp, int32_t nq, float *o,
                                          size_t ldo, const int enc) {
    float sc[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    float bc[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    if (enc >= CPU_ENC_Q8) avx512_sb_columns(r, dv / r->group, sc, bc);
    for (int32_t i0 = 0; i0 < nq;) {
        const int32_t left = nq - i0, nc = left >= 8 ? 8 : left >= 4 ? 4 : left;
        const float *pi = p + (size_t)i0 * ldp;
        float *oi = o + (size_t)i0 * ldo;
#define AVX512_ACCUM_ROWS(N) avx512_accum_core(r, dv, pi, ldp, N, enc, sc, bc, oi, ldo, i0 ? NULL : r->pf)
        CPU_BY_NQ8(AVX512_ACCUM_ROWS, nc)
#undef AVX512_ACCUM_ROWS
        i0 += nc;
    }
}

CPU_ACCUM_ENTRY(avx512, AVX512_FN, f32, CPU_ENC_F32)
CPU_ACCUM_ENTRY(avx512, AVX512_FN, f16, CPU_ENC_F16)
CPU_ACCUM_ENTRY(avx512, AVX512_FN, q8, CPU_ENC_Q8)
CPU_ACCUM_ENTRY(avx512, AVX512_FN, q4, CPU_ENC_Q4)
CPU_ACCUM_ENTRY(avx512, AVX512_FN, q2, CPU_ENC_Q2)

void avx512_fill_values(cpu_kernels *k) {
    k->accum_rows[CPU_ENC_F32] = avx512_accum_rows_f32;
    k->accum_rows[CPU_ENC_F16] = avx512_accum_rows_f16;
    k->accum_rows[CPU_ENC_Q8] = avx512_accum_rows_q8;
    k->accum_rows[CPU_ENC_Q4] = avx512_accum_rows_q4;
    k->accum_rows[CPU_ENC_Q2] = avx512_accum_rows_q2;
}
#endif
