/*
 * avx2_values.c: accum_rows of the AVX2 table (values of every row encoding): value accumulators in
 * registers across the block, slab by slab. See avx2.c.
 */
#include "avx2_internal.h"

#if defined(__x86_64__)

/* ---- accum_rows ---- */

/* Adds the permuted accumulators (a, b) of slab k to o[k*16 ..], restoring element order. */
AVX2_INLINE void avx2_add_slab(float *o, int32_t k, int32_t dv, __m256 a, __m256 b, const int enc) {
    float *ok = o + (size_t)k * 16;
    if ((enc == CPU_ENC_Q4 || enc == CPU_ENC_Q2) || k * 16 + 16 > dv) {
        float tmp[16];
        const int32_t *perm = avx2_perm(enc);
        const int32_t n = dv - k * 16 < 16 ? dv - k * 16 : 16;
        _mm256_storeu_ps(tmp, a);
        _mm256_storeu_ps(tmp + 8, b);
        for (int32_t j = 0; j < 16; j++)
            if (perm[j] < n) ok[perm[j]] += tmp[j];
        return;
    }
    _mm256_storeu_ps(ok, _mm256_add_ps(_mm256_loadu_ps(ok), a));
    _mm256_storeu_ps(ok + 8, _mm256_add_ps(_mm256_loadu_ps(ok + 8), b));
}

AVX2_INLINE void avx2_accum_core(const cpu_rows *r, int32_t dv, const float *p, size_t ldp, const int NQ, const int enc,
                                 const float *sf, const float *bf, int32_t ng, float *o, size_t ldo, const cpu_prefetch *pf) {
    const int32_t nslab = (dv + 15) / 16, n = r->n, pieces = (n + 31) / 32; /* prefetch slices per slab */
    const int32_t gshift = enc >= CPU_ENC_Q8 ? __builtin_ctz((unsigned)r->group / 16u) : 0;
    cpu_prefetch_walk pw;
    cpu_prefetch_start(&pw, pf, nslab * pieces);
    for (int32_t k = 0; k < nslab; k++) {
        const int32_t j = k >> gshift;
        __m256 acc_a[AVX2_MAX_NQ], acc_b[AVX2_MAX_NQ];
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) acc_a[i] = acc_b[i] = _mm256_setzero_ps();
        const uint8_t *piece = r->codes; /* rows of the 32 tokens from t & ~31 (never two runs: CPU_RUN_ALIGN) */
        for (int32_t t = 0; t < n; t++) {
            __m256 a, b;
            if ((t & 31) == 0) {
                cpu_prefetch_step(&pw);
                piece = cpu_row_codes(r, t);
            }
            avx2_slab(piece + (size_t)(t & 31) * r->row_stride, k, enc, dv, sf + (size_t)t * ng + j, bf + (size_t)t * ng + j,
                      &a, &b);
#pragma GCC unroll 4
            for (int i = 0; i < NQ; i++) {
                const __m256 w = _mm256_broadcast_ss(p + (size_t)i * ldp + t);
                acc_a[i] = _mm256_fmadd_ps(a, w, acc_a[i]);
                acc_b[i] = _mm256_fmadd_ps(b, w, acc_b[i]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) avx2_add_slab(o + (size_t)i * ldo, k, dv, acc_a[i], acc_b[i], enc);
    }
}

AVX2_INLINE void avx2_accum_rows_impl(const cpu_rows *r, int32_t dv, const float *p, size_t ldp, int32_t nq, float *o,
                                      size_t ldo, const int enc) {
    const int32_t ng = enc >= CPU_ENC_Q8 ? dv / r->group : 0;
    float sf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    float bf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    if (enc >= CPU_ENC_Q8) avx2_row_sb(r, ng, sf, bf);
    for (int32_t i0 = 0; i0 < nq;) {
        const int32_t nc = nq - i0 >= 4 ? 4 : nq - i0;
        const float *pi = p + (size_t)i0 * ldp;
        float *oi = o + (size_t)i0 * ldo;
#define AVX2_ACCUM_ROWS(N) avx2_accum_core(r, dv, pi, ldp, N, enc, sf, bf, ng, oi, ldo, i0 ? NULL : r->pf)
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
