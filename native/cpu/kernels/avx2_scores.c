/*
 * avx2_scores.c: score_rows of the AVX2 table for f32, f16, q8 and q2 keys (and q4 where the lanes
 * kernel of avx2_q4.c cannot run): one FMA per element per query, the accumulators of 8 tokens reduced
 * together. See avx2.c.
 */
#include "avx2_internal.h"

#if defined(__x86_64__)

/* Copies nq query rows into qp[i * dpad ..] in the encoding's slab order, zero-padded to dpad. */
static inline void avx2_permute_queries(const float *q, size_t ldq, int32_t nq, int32_t d, int32_t dpad, int32_t enc,
                                        float *qp) {
    const int32_t *perm = avx2_perm(enc);
    for (int32_t i = 0; i < nq; i++)
        for (int32_t c = 0; c < dpad; c++) {
            const int32_t e = (c & ~15) + perm[c & 15];
            qp[(size_t)i * dpad + c] = e < d ? q[(size_t)i * ldq + e] : 0.0f;
        }
}

/* ---- score_rows ---- */

AVX2_INLINE void avx2_score_core(const cpu_rows *r, int32_t d, const float *qp, int32_t dpad, const int NQ, const int enc,
                                 const float *sf, const float *bf, int32_t ng, float *s, size_t lds, const cpu_prefetch *pf) {
    const int32_t nslab = (d + 15) / 16, gshift = enc >= CPU_ENC_Q8 ? __builtin_ctz((unsigned)r->group / 16u) : 0;
    __m256 buf[AVX2_MAX_NQ][8];
    cpu_prefetch_walk pw;
    cpu_prefetch_start(&pw, pf, (r->n + 7) / 8);
    for (int32_t t0 = 0; t0 < r->n; t0 += 8) {
        const int32_t tn = r->n - t0 < 8 ? r->n - t0 : 8;
        cpu_prefetch_step(&pw);
        for (int32_t tt = 0; tt < tn; tt++) {
            const int32_t t = t0 + tt;
            uint8_t tmp[CPU_TILE_ROW_MAX]; /* tiled rows (q4 keys without the lanes kernels' qsum): gathered */
            const uint8_t *row = cpu_row_load(r, t, tmp);
            __m256 acc_a[AVX2_MAX_NQ], acc_b[AVX2_MAX_NQ];
#pragma GCC unroll 4
            for (int i = 0; i < NQ; i++) acc_a[i] = acc_b[i] = _mm256_setzero_ps();
            for (int32_t k = 0; k < nslab; k++) {
                __m256 a, b;
                const int32_t j = k >> gshift;
                avx2_slab(row, k, enc, d, sf + (size_t)t * ng + j, bf + (size_t)t * ng + j, &a, &b);
                const float *qk = qp + (size_t)k * 16;
#pragma GCC unroll 4
                for (int i = 0; i < NQ; i++) {
                    acc_a[i] = _mm256_fmadd_ps(a, _mm256_loadu_ps(qk + (size_t)i * dpad), acc_a[i]);
                    acc_b[i] = _mm256_fmadd_ps(b, _mm256_loadu_ps(qk + (size_t)i * dpad + 8), acc_b[i]);
                }
            }
#pragma GCC unroll 4
            for (int i = 0; i < NQ; i++) buf[i][tt] = _mm256_add_ps(acc_a[i], acc_b[i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) {
            for (int32_t z = tn; z < 8; z++) buf[i][z] = _mm256_setzero_ps();
            const __m256 sum = avx2_hsum8(buf[i]);
            if (tn == 8) {
                _mm256_storeu_ps(s + (size_t)i * lds + t0, sum);
            } else {
                float tmp[8];
                _mm256_storeu_ps(tmp, sum);
                avx2_store_partial(s + (size_t)i * lds + t0, tmp, tn);
            }
        }
    }
}

AVX2_INLINE void avx2_score_rows_impl(const cpu_rows *r, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                      size_t lds, const int enc) {
    const int32_t dpad = (d + 15) & ~15, ng = enc >= CPU_ENC_Q8 ? d / r->group : 0;
    float qp[AVX2_MAX_NQ * AVX2_MAX_D] __attribute__((aligned(32)));
    float sf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    float bf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    if (enc >= CPU_ENC_Q8) avx2_row_sb(r, ng, sf, bf);
    for (int32_t i0 = 0; i0 < nq;) {
        const int32_t nc = nq - i0 >= 4 ? 4 : nq - i0;
        avx2_permute_queries(q + (size_t)i0 * ldq, ldq, nc, d, dpad, enc, qp);
        float *si = s + (size_t)i0 * lds;
#define AVX2_SCORE_ROWS(N) avx2_score_core(r, d, qp, dpad, N, enc, sf, bf, ng, si, lds, i0 ? NULL : r->pf)
        CPU_BY_NQ4(AVX2_SCORE_ROWS, nc)
#undef AVX2_SCORE_ROWS
        i0 += nc;
    }
}

CPU_SCORE_ENTRY(avx2, AVX2_FN, f32, CPU_ENC_F32)
CPU_SCORE_ENTRY(avx2, AVX2_FN, f16, CPU_ENC_F16)
CPU_SCORE_ENTRY(avx2, AVX2_FN, q8, CPU_ENC_Q8)
AVX2_FN void avx2_score_rows_q8_fma(const cpu_rows *r, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                    size_t lds) {
    avx2_score_rows_impl(r, d, q, ldq, nq, s, lds, CPU_ENC_Q8);
}
CPU_SCORE_ENTRY(avx2, AVX2_FN, q2, CPU_ENC_Q2)

AVX2_FN void avx2_score_rows_q4_slabs(const cpu_rows *r, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                      size_t lds) {
    avx2_score_rows_impl(r, d, q, ldq, nq, s, lds, CPU_ENC_Q4);
}

void avx2_fill_scores(cpu_kernels *k) {
    k->score_rows[CPU_ENC_F32] = avx2_score_rows_f32;
    k->score_rows[CPU_ENC_F16] = avx2_score_rows_f16;
    k->score_rows[CPU_ENC_Q8] = avx2_score_rows_q8;
    k->score_rows[CPU_ENC_Q2] = avx2_score_rows_q2;
}
#endif
