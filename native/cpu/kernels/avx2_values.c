/*
 * avx2_values.c: accum_rows of the AVX2 table (values of every row encoding): slab-outer, token-inner,
 * value accumulators in registers across the block, the scale of quantized values folded into the
 * weights. See avx2.c.
 */
#include "avx2_internal.h"

#if defined(__x86_64__)

/* ---- accum_rows ---- */

/* Adds the permuted accumulators (a, b) of slab k to o[k*16 ..], restoring element order. */
AVX2_INLINE void avx2_add_slab(float *o, int32_t k, int32_t dv, __m256 a, __m256 b, const int enc) {
    float *ok = o + (size_t)k * 16;
    __m256 lo, hi;
    avx2_unpermute(enc, a, b, &lo, &hi);
    if (k * 16 + 16 > dv) { /* a plain row's partial last slab (quantized rows hold whole groups) */
        float tmp[16];
        _mm256_storeu_ps(tmp, lo);
        _mm256_storeu_ps(tmp + 8, hi);
        for (int32_t e = 0; e < dv - k * 16; e++) ok[e] += tmp[e];
        return;
    }
    _mm256_storeu_ps(ok, _mm256_add_ps(_mm256_loadu_ps(ok), lo));
    _mm256_storeu_ps(ok + 8, _mm256_add_ps(_mm256_loadu_ps(ok + 8), hi));
}

/* Token-major x[t * ng + j] as columns out[j * CPU_BLOCK + t], for t below n rounded up to 8 (the caller
 * zeroes x up to there). Groups of 4 go through in-lane 4x4 transposes of rows t and t + 4 loaded into the
 * two halves, so the tokens come out in order with no cross-lane shuffle. */
AVX2_INLINE void avx2_float_columns(const float *x, int32_t n, int32_t ng, float *out) {
    const int32_t n8 = (n + 7) & ~7;
    if (ng % 4 == 0) {
        for (int32_t j = 0; j < ng; j += 4)
            for (int32_t t0 = 0; t0 < n8; t0 += 8) {
                const float *xt = x + (size_t)t0 * ng + j;
                __m256 v[4];
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++) v[u] = _mm256_loadu2_m128(xt + (size_t)(u + 4) * ng, xt + (size_t)u * ng);
                const __m256 l01 = _mm256_unpacklo_ps(v[0], v[1]), h01 = _mm256_unpackhi_ps(v[0], v[1]);
                const __m256 l23 = _mm256_unpacklo_ps(v[2], v[3]), h23 = _mm256_unpackhi_ps(v[2], v[3]);
                float *oj = out + (size_t)j * CPU_BLOCK + t0;
                _mm256_store_ps(oj, _mm256_shuffle_ps(l01, l23, 0x44));
                _mm256_store_ps(oj + CPU_BLOCK, _mm256_shuffle_ps(l01, l23, 0xEE));
                _mm256_store_ps(oj + 2 * CPU_BLOCK, _mm256_shuffle_ps(h01, h23, 0x44));
                _mm256_store_ps(oj + 3 * CPU_BLOCK, _mm256_shuffle_ps(h01, h23, 0xEE));
            }
    } else if (ng == 2) {
        for (int32_t t0 = 0; t0 < n8; t0 += 8) {
            const __m256 v0 = _mm256_loadu_ps(x + (size_t)t0 * 2), v1 = _mm256_loadu_ps(x + (size_t)t0 * 2 + 8);
            /* tokens 0 1 4 5 | 2 3 6 7 of each group: the middle quarters swap places */
            const __m256d e = _mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0x88));
            const __m256d o = _mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0xDD));
            _mm256_store_ps(out + t0, _mm256_castpd_ps(_mm256_permute4x64_pd(e, 0xD8)));
            _mm256_store_ps(out + CPU_BLOCK + t0, _mm256_castpd_ps(_mm256_permute4x64_pd(o, 0xD8)));
        }
    } else {
        for (int32_t t = 0; t < n8; t++)
            for (int32_t j = 0; j < ng; j++) out[(size_t)j * CPU_BLOCK + t] = x[(size_t)t * ng + j];
    }
}

/* The weights of one group for NQ queries, from its scale and bias columns sc, bc: w[i][t] = p[i][t] s_t and
 * bsum[i] = Σ_t p[i][t] b_t, so that Σ_t p_t v̂_t = Σ_t w_t code_t + bsum over the group's elements. Once
 * per group and block, the scale and bias leave the token loop (two FMAs per slab and token). */
AVX2_INLINE void avx2_fold_weights(const float *p, size_t ldp, const int NQ, int32_t n, const float *sc, const float *bc,
                                   float *w, float *bsum) {
    __m256 bacc[AVX2_MAX_NQ];
#pragma GCC unroll 4
    for (int i = 0; i < NQ; i++) bacc[i] = _mm256_setzero_ps();
    for (int32_t t0 = 0; t0 < n; t0 += 8) {
        const __m256 sv = _mm256_load_ps(sc + t0), bv = _mm256_load_ps(bc + t0);
        /* lanes past n load 0 (p may end there) */
        const __m256i iota = _mm256_loadu_si256((const __m256i *)avx2_iota);
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - t0), iota);
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) {
            const float *pi = p + (size_t)i * ldp + t0;
            const __m256 pv = t0 + 8 <= n ? _mm256_loadu_ps(pi) : _mm256_maskload_ps(pi, m);
            _mm256_store_ps(w + (size_t)i * CPU_BLOCK + t0, _mm256_mul_ps(pv, sv));
            bacc[i] = _mm256_fmadd_ps(pv, bv, bacc[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NQ; i++) bsum[i] = avx2_reduce(bacc[i]);
}

/* One token's slab into the accumulators of the NQ queries, w[i * ldw] its weights. A q4 slab's b holds the whole
 * bytes x = lo + 16 hi as floats (a shift fewer; the caller recovers Σ w hi = (Σ w x - Σ w lo) / 16, as
 * avx512_value_codes does). */
AVX2_INLINE void avx2_accum_token(const uint8_t *row, int32_t k, const int enc, int32_t dv, const float *w, size_t ldw,
                                  const int NQ, __m256 *acc_a, __m256 *acc_b) {
    __m256 a, b;
    if (enc == CPU_ENC_Q4) {
        const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + (size_t)k * 8)));
        a = _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(15)));
        b = _mm256_cvtepi32_ps(x);
    } else if (enc >= CPU_ENC_Q8) avx2_slab_codes(row, k, enc, &a, &b);
    else avx2_slab(row, k, enc, dv, NULL, NULL, &a, &b);
#pragma GCC unroll 4
    for (int i = 0; i < NQ; i++) {
        const __m256 wt = _mm256_broadcast_ss(w + (size_t)i * ldw);
        acc_a[i] = _mm256_fmadd_ps(a, wt, acc_a[i]);
        acc_b[i] = _mm256_fmadd_ps(b, wt, acc_b[i]);
    }
}

AVX2_INLINE void avx2_accum_core(const cpu_rows *r, int32_t dv, const float *p, size_t ldp, const int NQ, const int enc,
                                 const float *sc, const float *bc, float *o, size_t ldo, const cpu_prefetch *pf) {
    const int32_t nslab = (dv + 15) / 16, n = r->n, pieces = (n + 31) / 32; /* prefetch slices per slab */
    const int quant = enc >= CPU_ENC_Q8;
    const int32_t gshift = quant ? __builtin_ctz((unsigned)r->group / 16u) : 0;
    const size_t stride = r->row_stride;
    cpu_prefetch_walk pw;
    cpu_prefetch_start(&pw, pf, nslab * pieces);
    float wbuf[AVX2_MAX_NQ * CPU_BLOCK] __attribute__((aligned(32)));
    float bsum[AVX2_MAX_NQ] = {0};
    /* quantized rows: folded weights of the slab's group; plain ones: the probabilities themselves */
    const float *w = quant ? wbuf : p;
    const size_t ldw = quant ? CPU_BLOCK : ldp;
    /* two interleaved token streams where 16 ymm registers hold their accumulators: a query's FMA chain then
     * waits on every other token (one query: 1.25x; two: even; three or four would spill) */
    const int U = NQ <= 2 ? 2 : 1;
    for (int32_t k = 0; k < nslab; k++) {
        const int32_t j = k >> gshift;
        if (quant && (k == 0 || j != (k - 1) >> gshift))
            avx2_fold_weights(p, ldp, NQ, n, sc + (size_t)j * CPU_BLOCK, bc + (size_t)j * CPU_BLOCK, wbuf, bsum);
        __m256 acc_a[2][AVX2_MAX_NQ], acc_b[2][AVX2_MAX_NQ];
#pragma GCC unroll 2
        for (int u = 0; u < 2; u++)
#pragma GCC unroll 4
            for (int i = 0; i < NQ; i++) { /* q4: b sums w·x, (1 + K)·bsum, so (b - a) / K keeps one bsum (cpu_pair_k) */
                acc_a[u][i] = _mm256_set1_ps(u == 0 ? bsum[i] : 0.0f);
                acc_b[u][i] = _mm256_set1_ps(u == 0 ? (1.0f + cpu_pair_k(enc == CPU_ENC_Q4 ? 4 : 0)) * bsum[i] : 0.0f);
            }
        /* 32 tokens at a time (one run: CPU_RUN_ALIGN), each piece asking for its slice of the prefetch hint */
        for (int32_t t0 = 0, t = 0; t0 < n; t0 += 32) {
            cpu_prefetch_step(&pw);
            const int32_t t1 = n - t0 < 32 ? n : t0 + 32;
            /* row t's codes, stepped by the stride: an imul per token took a port the FMAs need (q8: 1.09x) */
            const uint8_t *row = cpu_row_codes(r, t0);
            if (U == 2)
                for (; t + 2 <= t1; t += 2, row += 2 * stride)
#pragma GCC unroll 2
                    for (int u = 0; u < 2; u++)
                        avx2_accum_token(row + (u ? stride : 0), k, enc, dv, w + t + u, ldw, NQ, acc_a[u], acc_b[u]);
            for (; t < t1; t++, row += stride) avx2_accum_token(row, k, enc, dv, w + t, ldw, NQ, acc_a[0], acc_b[0]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) {
            const __m256 a = U == 2 ? _mm256_add_ps(acc_a[0][i], acc_a[1][i]) : acc_a[0][i];
            __m256 b = U == 2 ? _mm256_add_ps(acc_b[0][i], acc_b[1][i]) : acc_b[0][i];
            if (enc == CPU_ENC_Q4) b = _mm256_mul_ps(_mm256_sub_ps(b, a), _mm256_set1_ps(1.0f / cpu_pair_k(4)));
            avx2_add_slab(o + (size_t)i * ldo, k, dv, a, b, enc);
        }
    }
}

AVX2_INLINE void avx2_accum_rows_impl(const cpu_rows *r, int32_t dv, const float *p, size_t ldp, int32_t nq, float *o,
                                      size_t ldo, const int enc) {
    const int32_t ng = enc >= CPU_ENC_Q8 ? dv / r->group : 0;
    float sf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    float bf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    float scol[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    float bcol[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    const float *sc = sf, *bc = bf; /* one group: the token-major scales are its column */
    if (enc >= CPU_ENC_Q8) {
        const size_t have = (size_t)r->n * ng, pad = (size_t)((r->n + 7) & ~7) * ng;
        avx2_row_sb(r, ng, sf, bf);
        memset(sf + have, 0, (pad - have) * sizeof(float)); /* the columns' lanes past n: 0, never NaN */
        memset(bf + have, 0, (pad - have) * sizeof(float));
        if (ng > 1) {
            avx2_float_columns(sf, r->n, ng, scol);
            avx2_float_columns(bf, r->n, ng, bcol);
            sc = scol, bc = bcol;
        }
    }
    for (int32_t i0 = 0; i0 < nq;) {
        const int32_t nc = nq - i0 >= 4 ? 4 : nq - i0;
        const float *pi = p + (size_t)i0 * ldp;
        float *oi = o + (size_t)i0 * ldo;
#define AVX2_ACCUM_ROWS(N) avx2_accum_core(r, dv, pi, ldp, N, enc, sc, bc, oi, ldo, i0 ? NULL : r->pf)
        CPU_BY_NQ4(AVX2_ACCUM_ROWS, nc)
#undef AVX2_ACCUM_ROWS
        i0 += nc;
    }
}

CPU_ACCUM_ENTRY(avx2, AVX2_FN, f32, CPU_ENC_F32)
CPU_ACCUM_ENTRY(avx2, AVX2_FN, f16, CPU_ENC_F16)
CPU_ACCUM_ENTRY(avx2, AVX2_FN, q8, CPU_ENC_Q8)
CPU_ACCUM_ENTRY(avx2, AVX2_FN, q4, CPU_ENC_Q4)
CPU_ACCUM_ENTRY(avx2, AVX2_FN, q2, CPU_ENC_Q2)

void avx2_fill_values(cpu_kernels *k) {
    k->accum_rows[CPU_ENC_F32] = avx2_accum_rows_f32;
    k->accum_rows[CPU_ENC_F16] = avx2_accum_rows_f16;
    k->accum_rows[CPU_ENC_Q8] = avx2_accum_rows_q8;
    k->accum_rows[CPU_ENC_Q4] = avx2_accum_rows_q4;
    k->accum_rows[CPU_ENC_Q2] = avx2_accum_rows_q2;
}
#endif
