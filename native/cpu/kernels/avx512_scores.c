/*
 * avx512_scores.c: score_rows of the AVX-512 table for f32, f16, q8 and q2 keys (and q4 where the lanes
 * kernel of avx512_q4.c cannot run): per token, one accumulator per query over the slabs, 16 tokens'
 * accumulators summed by a transpose tree. See avx512.c.
 */
#include "avx512_internal.h"

#if defined(__x86_64__)

/* Copies nq query rows into qp in the encoding's slab order, zero-padded to dpad, slab-major: slab k of
 * query i at qp[(k * nq + i) * 32 ..], so that a slab's queries sit at constant offsets from one pointer. */
AVX512_INLINE void avx512_permute_queries(const float *q, size_t ldq, int32_t nq, int32_t d, int32_t dpad, int32_t enc,
                                          float *qp) {
    const __m512i pa = _mm512_loadu_si512(avx512_perm(enc)), pb = _mm512_loadu_si512(avx512_perm(enc) + 16);
    for (int32_t i = 0; i < nq; i++)
        for (int32_t k = 0; k * 32 < dpad; k++) {
            const float *src = q + (size_t)i * ldq + (size_t)k * 32;
            const __m512 lo = _mm512_maskz_loadu_ps(avx512_mask(d - k * 32), src);
            const __m512 hi = _mm512_maskz_loadu_ps(avx512_mask(d - k * 32 - 16), src + 16);
            float *dst = qp + ((size_t)k * nq + i) * 32;
            _mm512_storeu_ps(dst, _mm512_permutex2var_ps(lo, pa, hi));
            _mm512_storeu_ps(dst + 16, _mm512_permutex2var_ps(lo, pb, hi));
        }
}

/* ---- score_rows ---- */

/* Scores TU consecutive tokens (from t, the tt-th of their 16) against NQ queries: each query slab is
 * loaded once for TU tokens. Leaves one accumulator per (query, token) in raw[i][tt + u]; with TU = 4
 * (tt a multiple of 4), their tree4 in part[i][tt / 4] instead, straight from the registers. */
AVX512_INLINE void avx512_score_tokens(const cpu_rows *r, int32_t d, const float *qp, const int NQ,
                                       const int TU, const int enc, const float *sf, const float *bf, int32_t ng,
                                       int32_t gshift, int32_t t, int32_t tt, __m512 (*raw)[16], __m512 (*part)[4]) {
    const int32_t nslab = (d + 31) / 32;
    __m512 acc[4][AVX512_MAX_NQ];
    #pragma GCC unroll 4
    for (int u = 0; u < TU; u++)
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) acc[u][i] = _mm512_setzero_ps();
    uint8_t tmp[4 * CPU_TILE_ROW_MAX]; /* tiled rows (q4 keys without q4's kernels' qsum): gathered here */
    const uint8_t *row0 = r->tile < 0 ? cpu_row_codes(r, t) : tmp; /* TU <= 4 rows of one run (CPU_RUN_ALIGN) */
    if (r->tile >= 0) cpu_rows_untile(r, t, TU, tmp);
    const float *sf0 = sf + (size_t)t * ng, *bf0 = bf + (size_t)t * ng;
    /* 4- and 2-bit: the tokens' group tables first. Built inside the slab loop, each table's FMA queues
     * behind the previous slab's on the FMA pipes and its vpermps wait on it (bench_kernels: 59% of the
     * FMA peak that way, 64% built ahead). */
    const int tabled = enc == CPU_ENC_Q4 || enc == CPU_ENC_Q2;
    __m512 tables[AVX512_MAX_NG * 4];
    if (tabled)
        for (int32_t j = 0; j < ng; j++)
            #pragma GCC unroll 4
            for (int u = 0; u < TU; u++) tables[j * TU + u] = avx512_table(enc, sf0[(size_t)u * ng + j], bf0[(size_t)u * ng + j]);
    for (int32_t k = 0; k < nslab; k++) {
        const int32_t j = k >> gshift;
        /* the slab's queries once, then one token at a time: its decoded slab meets every query */
        const float *qk = qp + (size_t)k * NQ * 32;
        __m512 qa[AVX512_MAX_NQ], qb[AVX512_MAX_NQ];
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) qa[i] = _mm512_loadu_ps(qk + i * 32), qb[i] = _mm512_loadu_ps(qk + i * 32 + 16);
        #pragma GCC unroll 4
        for (int u = 0; u < TU; u++) {
            __m512 a, b;
            const uint8_t *row = row0 + (size_t)u * r->row_stride;
            if (tabled) avx512_slab_table(row, k, enc, tables[j * TU + u], &a, &b);
            else avx512_slab(row, k, enc, d, sf0 + (size_t)u * ng + j, bf0 + (size_t)u * ng + j, &a, &b);
            #pragma GCC unroll 8
            for (int i = 0; i < NQ; i++) acc[u][i] = _mm512_fmadd_ps(b, qb[i], _mm512_fmadd_ps(a, qa[i], acc[u][i]));
        }
    }
    if (TU == 4) {
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) part[i][tt / 4] = avx512_tree4(acc[0][i], acc[1][i], acc[2][i], acc[3][i]);
        return;
    }
    #pragma GCC unroll 4
    for (int u = 0; u < TU; u++)
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) raw[i][tt + u] = acc[u][i];
}

AVX512_INLINE void avx512_score_core(const cpu_rows *r, int32_t d, const float *qp, const int NQ,
                                     const int enc, const float *sf, const float *bf, int32_t ng, float *s, size_t lds,
                                     const cpu_prefetch *pf) {
    const int32_t gshift = enc >= CPU_ENC_Q8 ? __builtin_ctz((unsigned)r->group / 32u) : 0;
    /* 4 tokens per query load (their sums start in registers), 2 when 8 queries need the registers */
    __m512 raw[AVX512_MAX_NQ][16], part[AVX512_MAX_NQ][4];
    cpu_prefetch_walk pw;
    cpu_prefetch_start(&pw, pf, (r->n + 3) / 4); /* a slice every 4 tokens (see avx512_accum_core) */
    for (int32_t t0 = 0; t0 < r->n; t0 += 16) {
        const int32_t tn = r->n - t0 < 16 ? r->n - t0 : 16;
        int32_t tt = 0;
        if (NQ <= 4)
            for (; tt + 4 <= tn; tt += 4) {
                cpu_prefetch_step(&pw);
                avx512_score_tokens(r, d, qp, NQ, 4, enc, sf, bf, ng, gshift, t0 + tt, tt, raw, part);
            }
        const int32_t in_part = tt / 4; /* groups of 4 already summed into part */
        if (NQ > 4)
            for (; tt + 2 <= tn; tt += 2) {
                if ((tt & 3) == 0) cpu_prefetch_step(&pw);
                avx512_score_tokens(r, d, qp, NQ, 2, enc, sf, bf, ng, gshift, t0 + tt, tt, raw, part);
            }
        for (; tt < tn; tt++) {
            if ((tt & 3) == 0) cpu_prefetch_step(&pw);
            avx512_score_tokens(r, d, qp, NQ, 1, enc, sf, bf, ng, gshift, t0 + tt, tt, raw, part);
        }
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) {
            for (int32_t z = tn; z < 16; z++) raw[i][z] = _mm512_setzero_ps();
            for (int32_t g = in_part; g < 4; g++)
                part[i][g] = avx512_tree4(raw[i][4 * g], raw[i][4 * g + 1], raw[i][4 * g + 2], raw[i][4 * g + 3]);
            _mm512_mask_storeu_ps(s + (size_t)i * lds + t0, avx512_mask(tn), avx512_tree_final(part[i]));
        }
    }
}

AVX512_INLINE void avx512_score_rows_impl(const cpu_rows *r, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                          size_t lds, const int enc) {
    const int32_t dpad = (d + 31) & ~31, ng = enc >= CPU_ENC_Q8 ? d / r->group : 0;
    float qp[AVX512_MAX_NQ * AVX512_MAX_D] __attribute__((aligned(64)));
    float sf[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    float bf[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    if (enc >= CPU_ENC_Q8) avx512_row_sb(r, ng, sf, bf);
    for (int32_t i0 = 0; i0 < nq;) {
        const int32_t left = nq - i0, nc = left >= 8 ? 8 : left >= 4 ? 4 : left;
        avx512_permute_queries(q + (size_t)i0 * ldq, ldq, nc, d, dpad, enc, qp);
        float *si = s + (size_t)i0 * lds;
#define AVX512_SCORE_ROWS(N) avx512_score_core(r, d, qp, N, enc, sf, bf, ng, si, lds, i0 ? NULL : r->pf)
        CPU_BY_NQ8(AVX512_SCORE_ROWS, nc)
#undef AVX512_SCORE_ROWS
        i0 += nc;
    }
}

CPU_SCORE_ENTRY(avx512, AVX512_FN, f32, CPU_ENC_F32)
CPU_SCORE_ENTRY(avx512, AVX512_FN, f16, CPU_ENC_F16)
CPU_SCORE_ENTRY(avx512, AVX512_FN, q8, CPU_ENC_Q8)
CPU_SCORE_ENTRY(avx512, AVX512_FN, q2, CPU_ENC_Q2)

AVX512_FN void avx512_score_rows_q8_fma(const cpu_rows *r, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                        size_t lds) {
    avx512_score_rows_impl(r, d, q, ldq, nq, s, lds, CPU_ENC_Q8);
}

AVX512_FN void avx512_score_rows_q4_slabs(const cpu_rows *r, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                          size_t lds) {
    avx512_score_rows_impl(r, d, q, ldq, nq, s, lds, CPU_ENC_Q4);
}

void avx512_fill_scores(cpu_kernels *k) {
    k->score_rows[CPU_ENC_F32] = avx512_score_rows_f32;
    k->score_rows[CPU_ENC_F16] = avx512_score_rows_f16;
    k->score_rows[CPU_ENC_Q8] = avx512_score_rows_q8;
    k->score_rows[CPU_ENC_Q2] = avx512_score_rows_q2;
}
#endif
