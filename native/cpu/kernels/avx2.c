/*
 * avx2.c: the kernels of kernels.h in AVX2 + FMA + F16C, chosen at run time (cpu_backend.c); compiled
 * without -march, each function carries its target attribute. Same scheme as avx512.c, half as wide:
 *
 * rows are consumed in slabs of 16 elements (two ymm), decoded in the encoding's cheapest lane order
 * (4-bit: even elements then odd ones; 2-bit: elements 4j, 4j+1, 4j+2, 4j+3), with the query permuted the
 * same way once per call and value accumulators permuted back once per block. Quantized slabs are
 * dequantized in registers as code·s + b (exactly scalar.c's dequant_row: code·s is exact in float), so
 * the score is one FMA per element per query and needs no Σq bias term. Score accumulators of 8 tokens
 * are reduced together (hadd tree); value accumulators stay in registers across the block, slab by slab.
 * Plain rows whose length is not a multiple of 16 decode their last slab from a zero-padded copy.
 * Queries are taken in chunks of 4, 3, 2, 1 (16 ymm registers). Where the CPU has AVX-VNNI, q4 scores go
 * through vpdpbusd as in avx512.c (avx2_score_rows_q4_vnni, with this table's q4_prep).
 */
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline)) AVX2_FN

enum { AVX2_SLAB = 16, AVX2_MAX_D = 1024, AVX2_MAX_NG = 32, AVX2_MAX_NQ = 4 };

/* Slab lane order: position j holds element perm[j]. */
static const int32_t avx2_perm_q4[16] = {0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15};
static const int32_t avx2_perm_q2[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
static const int32_t avx2_iota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const uint32_t avx2_q2_shift_a[8] = {0, 8, 16, 24, 2, 10, 18, 26};
static const uint32_t avx2_q2_shift_b[8] = {4, 12, 20, 28, 6, 14, 22, 30};

static inline const int32_t *avx2_perm(int32_t enc) {
    return enc == CPU_ENC_Q4 ? avx2_perm_q4 : enc == CPU_ENC_Q2 ? avx2_perm_q2 : avx2_iota;
}

static const int32_t avx2_elem_bits[CPU_ENC_COUNT] = {32, 16, 8, 4, 2};

AVX2_INLINE void avx2_halves(const uint16_t *h, int32_t n, float *out) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) out[i] = _cvtsh_ss(h[i]);
}

/* Scale and bias of the n rows of r as floats, token-major: sf[t * ng + j]. */
AVX2_INLINE void avx2_row_sb(const cpu_rows *r, int32_t ng, float *sf, float *bf) { cpu_row_sb(r, ng, sf, bf, avx2_halves); }

/* Slab k (16 elements) of a row into a (positions 0..7) and b (8..15), dequantized with *sp, *bp. */
AVX2_INLINE void avx2_slab(const uint8_t *row, int32_t k, const int enc, int32_t d, const float *sp, const float *bp,
                           __m256 *a, __m256 *b) {
    uint8_t tail[64] __attribute__((aligned(32)));
    if (enc <= CPU_ENC_F16 && k * 16 + 16 > d) { /* the partial last slab of a plain row: zero-padded copy */
        const size_t eb = (size_t)avx2_elem_bits[enc] / 8;
        memset(tail, 0, sizeof tail);
        memcpy(tail, row + (size_t)k * 16 * eb, (size_t)(d - k * 16) * eb);
        row = tail;
        k = 0;
    }
    switch (enc) {
    case CPU_ENC_F32: {
        const float *f = (const float *)row + (size_t)k * 16;
        *a = _mm256_loadu_ps(f), *b = _mm256_loadu_ps(f + 8);
        return;
    }
    case CPU_ENC_F16: {
        const uint16_t *h = (const uint16_t *)row + (size_t)k * 16;
        *a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
        *b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 8)));
        return;
    }
    case CPU_ENC_Q8: {
        const __m256 s = _mm256_broadcast_ss(sp), bias = _mm256_broadcast_ss(bp);
        const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + (size_t)k * 16)));
        const __m256i y = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + (size_t)k * 16 + 8)));
        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x), s, bias);
        *b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(y), s, bias);
        return;
    }
    case CPU_ENC_Q4: {
        const __m256 s = _mm256_broadcast_ss(sp), bias = _mm256_broadcast_ss(bp);
        const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + (size_t)k * 8)));
        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(15))), s, bias);
        *b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4)), s, bias);
        return;
    }
    default: { /* Q2: 4 bytes, each used four times */
        const __m256 s = _mm256_broadcast_ss(sp), bias = _mm256_broadcast_ss(bp);
        uint32_t w;
        memcpy(&w, row + (size_t)k * 4, 4);
        const __m256i z = _mm256_set1_epi32((int)w), m3 = _mm256_set1_epi32(3);
        const __m256i sa = _mm256_loadu_si256((const __m256i *)avx2_q2_shift_a);
        const __m256i sb = _mm256_loadu_si256((const __m256i *)avx2_q2_shift_b);
        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(z, sa), m3)), s, bias);
        *b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(z, sb), m3)), s, bias);
        return;
    }
    }
}

/* r[t] = Σ_lanes v[t] for 8 vectors. */
AVX2_INLINE __m256 avx2_hsum8(const __m256 *v) {
    const __m256 h01 = _mm256_hadd_ps(v[0], v[1]), h23 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 h45 = _mm256_hadd_ps(v[4], v[5]), h67 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

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

static inline void avx2_store_partial(float *dst, const float *src, int32_t n) {
    for (int32_t i = 0; i < n; i++) dst[i] = src[i];
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

/* ---- q4 keys with tokens in lanes (see avx512.c): 8 tokens at a time, no horizontal sums, no dequantizing
 * FMAs. Used when the block's groups can be transposed by shuffles (ng = 1, 2 or 4: d = 128 at any g). ---- */

/* Group j of tokens t0..t0+7 from token-major x[t * ng + j] (x: CPU_BLOCK * AVX2_MAX_NG floats, so the
 * loads past the block stay inside it); lanes past tn are 0. */
AVX2_INLINE void avx2_group_columns(const float *x, int32_t ng, int32_t t0, int32_t tn, __m256 *col) {
    const float *xt = x + (size_t)t0 * ng;
    const __m256 live = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(tn), _mm256_loadu_si256((const __m256i *)avx2_iota)));
    if (ng == 1) {
        col[0] = _mm256_and_ps(_mm256_loadu_ps(xt), live);
    } else if (ng == 2) { /* pairs (t, g0 g1): even then odd elements, then the 64-bit pieces in order */
        const __m256 a = _mm256_loadu_ps(xt), b = _mm256_loadu_ps(xt + 8);
        for (int j = 0; j < 2; j++) {
            const __m256 e = j ? _mm256_shuffle_ps(a, b, 0xDD) : _mm256_shuffle_ps(a, b, 0x88);
            col[j] = _mm256_and_ps(_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8)), live);
        }
    } else { /* ng == 4: a 4x4 transpose per 128-bit lane gives tokens 0 2 4 6 1 3 5 7; one permute restores them */
        const __m256 a = _mm256_loadu_ps(xt), b = _mm256_loadu_ps(xt + 8), c = _mm256_loadu_ps(xt + 16),
                     d = _mm256_loadu_ps(xt + 24);
        const __m256 lo_ab = _mm256_unpacklo_ps(a, b), hi_ab = _mm256_unpackhi_ps(a, b);
        const __m256 lo_cd = _mm256_unpacklo_ps(c, d), hi_cd = _mm256_unpackhi_ps(c, d);
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        col[0] = _mm256_and_ps(_mm256_permutevar8x32_ps(_mm256_shuffle_ps(lo_ab, lo_cd, 0x44), order), live);
        col[1] = _mm256_and_ps(_mm256_permutevar8x32_ps(_mm256_shuffle_ps(lo_ab, lo_cd, 0xEE), order), live);
        col[2] = _mm256_and_ps(_mm256_permutevar8x32_ps(_mm256_shuffle_ps(hi_ab, hi_cd, 0x44), order), live);
        col[3] = _mm256_and_ps(_mm256_permutevar8x32_ps(_mm256_shuffle_ps(hi_ab, hi_cd, 0xEE), order), live);
    }
}

/* 8x8 transpose of dwords: afterwards lane t of r[c] is dword c of the old r[t]. */
AVX2_INLINE void avx2_transpose_dwords(__m256i *r) {
    __m256i t[8], u[8];
    for (int p = 0; p < 4; p++) t[2 * p] = _mm256_unpacklo_epi32(r[2 * p], r[2 * p + 1]), t[2 * p + 1] = _mm256_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
    for (int h = 0; h < 2; h++) /* tokens 4h..4h+3: u[4h + c] lane L = their dword 4L + c */
        for (int c = 0; c < 2; c++) {
            u[4 * h + 2 * c] = _mm256_unpacklo_epi64(t[4 * h + c], t[4 * h + 2 + c]);
            u[4 * h + 2 * c + 1] = _mm256_unpackhi_epi64(t[4 * h + c], t[4 * h + 2 + c]);
        }
    for (int c = 0; c < 4; c++) r[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20), r[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
}

/* The 8 rows from t0 (tn of them, one run) as plain rows at row_stride apart, for a kernel to transpose: in
 * place for plain rows, gathered into buf for tiled rows that do not start 8 lanes of a tile; NULL when
 * in_place (cpu_tile_columns) already has their columns. */
static inline const uint8_t *avx2_plain_rows(const cpu_rows *r, int32_t t0, int32_t tn, const int32_t *in_place,
                                             uint8_t *buf) {
    if (in_place) return NULL;
    if (r->tile < 0) return cpu_row_codes(r, t0);
    cpu_rows_untile(r, t0, tn, buf);
    return buf;
}

AVX2_INLINE void avx2_score_q4_lanes(const cpu_rows *r, int32_t d, const float *q, size_t ldq, const float *qsum,
                                     const int NQ, const float *sf, const float *bf, int32_t ng, float *s, size_t lds,
                                     const cpu_prefetch *pf) {
    const int32_t rb = d / 2, n = r->n, gshift = __builtin_ctz((unsigned)r->group);
    const __m256i m15 = _mm256_set1_epi32(15);
    int32_t cols_buf[8][8] __attribute__((aligned(32)));
    uint8_t rows_buf[8 * CPU_TILE_ROW_MAX];
    cpu_prefetch_walk pw;
    cpu_prefetch_start(&pw, pf, (n + 7) / 8);
    for (int32_t t0 = 0; t0 < n; t0 += 8) {
        const int32_t tn = n - t0 < 8 ? n - t0 : 8;
        cpu_prefetch_step(&pw);
        const int32_t *in_place = cpu_tile_columns(r, t0, 8); /* tiled rows: columns of 16 lanes, 8 of them ours */
        const uint8_t *rows0 = avx2_plain_rows(r, t0, tn, in_place, rows_buf);
        __m256 scol[4], bcol[4], acc[AVX2_MAX_NQ];
        avx2_group_columns(sf, ng, t0, tn, scol);
        avx2_group_columns(bf, ng, t0, tn, bcol);
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) { /* the biases: b_t,j Σq_j */
            acc[i] = _mm256_setzero_ps();
            for (int32_t j = 0; j < ng; j++) acc[i] = _mm256_fmadd_ps(bcol[j], _mm256_set1_ps(qsum[(size_t)i * ng + j]), acc[i]);
        }
        for (int32_t c0 = 0; c0 < rb; c0 += 32) { /* 32 bytes of each row: 8 dword columns, 64 dims */
            const int32_t half = rb - c0 < 32; /* the row's last 16 bytes */
            const int32_t *cols = in_place ? in_place + (size_t)16 * (c0 / 4) : cols_buf[0];
            const int32_t cs = in_place ? 16 : 8; /* column stride (int32s) */
            if (!in_place) {
                __m256i x[8];
                const uint8_t *rows = rows0 + c0;
                for (int u = 0; u < 8; u++) {
                    const uint8_t *src = rows + (size_t)u * r->row_stride;
                    x[u] = u >= tn ? _mm256_setzero_si256()
                           : half  ? _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)src), 0)
                                   : _mm256_loadu_si256((const __m256i *)src);
                }
                avx2_transpose_dwords(x);
                for (int c = 0; c < 8; c++) _mm256_store_si256((__m256i *)cols_buf[c], x[c]);
            }
            for (int32_t U = 0; U < (half ? 1 : 2); U++) { /* 4 columns: 32 dims, one scale */
                const int32_t dim0 = c0 * 2 + U * 32;
                __m256 in[AVX2_MAX_NQ][2];
#pragma GCC unroll 4
                for (int i = 0; i < NQ; i++) in[i][0] = in[i][1] = _mm256_setzero_ps();
                for (int cc = 0; cc < 4; cc++) {
                    const __m256i xw = _mm256_load_si256((const __m256i *)(cols + cs * (4 * U + cc)));
#pragma GCC unroll 8
                    for (int k = 0; k < 8; k++) {
                        const __m256i sh = k ? _mm256_srli_epi32(xw, 4 * k) : xw;
                        const __m256 v = _mm256_cvtepi32_ps(k == 7 ? sh : _mm256_and_si256(sh, m15));
#pragma GCC unroll 4
                        for (int i = 0; i < NQ; i++)
                            in[i][k & 1] = _mm256_fmadd_ps(v, _mm256_broadcast_ss(q + (size_t)i * ldq + dim0 + 8 * cc + k), in[i][k & 1]);
                    }
                }
                const __m256 sc = scol[dim0 >> gshift];
#pragma GCC unroll 4
                for (int i = 0; i < NQ; i++) acc[i] = _mm256_fmadd_ps(sc, _mm256_add_ps(in[i][0], in[i][1]), acc[i]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) {
            if (tn == 8) {
                _mm256_storeu_ps(s + (size_t)i * lds + t0, acc[i]);
            } else {
                float tmp[8];
                _mm256_storeu_ps(tmp, acc[i]);
                avx2_store_partial(s + (size_t)i * lds + t0, tmp, tn);
            }
        }
    }
}

AVX2_FN static void avx2_score_rows_q4(const cpu_rows *r, int32_t d, const float *q, size_t ldq, const float *qsum,
                                       const void *prep, int32_t nq, float *s, size_t lds) {
    (void)prep;
    const int32_t ng = d / r->group;
    if (!qsum || !(ng == 1 || ng == 2 || ng == 4)) { /* no group sums for the biases, or groups to gather */
        avx2_score_rows_impl(r, d, q, ldq, nq, s, lds, CPU_ENC_Q4);
        return;
    }
    float sf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    float bf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    avx2_row_sb(r, ng, sf, bf);
#define AVX2_SCORE_Q4(N)                                                                                              \
    avx2_score_q4_lanes(r, d, q + (size_t)i0 * ldq, ldq, qsum + (size_t)i0 * ng, N, sf, bf, ng, s + (size_t)i0 * lds, lds, \
                        i0 ? NULL : r->pf)
    CPU_EACH_NQ4(AVX2_SCORE_Q4, nq, i0)
#undef AVX2_SCORE_Q4
}

/* ---- q4 keys through AVX-VNNI (VEX vpdpbusd on ymm: Intel client cores from Alder Lake, AMD Zen 5) ----
 * The scheme of avx512.c's VNNI q4 scores, half as wide: each query cut once per call into three int8 pieces
 * per key group (q4_prep's layout, kernels.h), the 4-bit codes as the unsigned operand, tokens in lanes (8
 * rows transposed as dwords, so a dword column holds dims 8c..8c+7 of 8 tokens), and per group and query
 * the three piece sums combined exactly in int32, converted once and met with the scale column. With 16 ymm
 * registers a query is done at a time over 16 tokens (two blocks of 8, which share each broadcast piece);
 * a column's low and high nibbles are split once, when the columns are built, for all the queries. */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define AVX2_HAVE_VNNI 1 /* compilers that know AVX-VNNI (GCC 11, clang 12); older ones keep the FMA kernels */
#define AVX2_VNNI_FN __attribute__((target("avx2,fma,f16c,avxvnni")))
#define AVX2_VNNI_INLINE static inline __attribute__((always_inline)) AVX2_VNNI_FN

/* q4_prep: avx512_q4_prep's pieces and layout in plain C (once per call and query, off the hot path). */
static void avx2_q4_prep(const float *q, size_t ldq, int32_t nq, int32_t d, int32_t group, void *prep) {
    for (int32_t i = 0; i < nq; i++) {
        const float *qi = q + (size_t)i * ldq;
        uint8_t *out = (uint8_t *)prep + (size_t)i * CPU_Q4_PREP_STRIDE(d);
        float Q[AVX2_MAX_NG];
        int ok = d % 16 == 0 && group % 16 == 0 && d / group <= AVX2_MAX_NG;
        for (int32_t j = 0; ok && j < d / group; j++) {
            float m = 0.0f;
            for (int32_t x = j * group; ok && x < (j + 1) * group; x++) {
                ok = qi[x] - qi[x] == 0.0f; /* finite */
                m = fabsf(qi[x]) > m ? fabsf(qi[x]) : m;
            }
            ok = ok && (m == 0.0f || m >= 0x1p-100f); /* scalable */
            Q[j] = m > 0.0f ? m * 0x1p-20f : 1.0f;
        }
        if (!ok) {
            memset(out, 0, sizeof(float));
            continue;
        }
        memcpy(out, Q, sizeof(float) * (size_t)(d / group));
        for (int32_t x = 0; x < d; x++) {
            const int32_t n = (int32_t)lrintf(qi[x] * (1.0f / Q[x / group])); /* |n| <= 2^20 */
            const int32_t c = ((n + 64) & 127) - 64, n1 = (n - c) >> 7;
            const int32_t b = ((n1 + 64) & 127) - 64, a = (n1 - b) >> 7;
            const int32_t piece[3] = {a, b, c};
            for (int p = 0; p < 3; p++) /* dword 6·col + 2p: the even dims' int8s, + 1: the odd ones' */
                out[128 + ((size_t)(x / 8) * 6 + (size_t)p * 2 + (size_t)(x & 1)) * 4 + (size_t)(x % 8) / 2] =
                    (uint8_t)piece[p];
        }
    }
}

/* One query (pieces qp, group scales Q, group sums qs) over TB blocks of 8 tokens from t0: lo/hi[b][col]
 * are the blocks' nibble columns, sc/bc the scale and bias columns (sc[j * CPU_BLOCK + t]). */
AVX2_VNNI_INLINE void avx2_vnni_query(int32_t (*lo)[AVX2_MAX_D / 8][8], int32_t (*hi)[AVX2_MAX_D / 8][8], int32_t ncol,
                                      const int32_t *qp, const float *Q, const float *qs, const int TB, const int CPG,
                                      const float *sc, const float *bc, int32_t ng, int32_t t0, const int32_t *tn,
                                      float *s) {
    __m256 acc[2];
#pragma GCC unroll 2
    for (int b = 0; b < TB; b++) {
        acc[b] = _mm256_setzero_ps();
        for (int32_t j = 0; j < ng; j++) /* the biases: Σ_j b_t,j Σq_j */
            acc[b] = _mm256_fmadd_ps(_mm256_load_ps(bc + (size_t)j * CPU_BLOCK + t0 + 8 * b), _mm256_set1_ps(qs[j]),
                                     acc[b]);
    }
    for (int32_t k0 = 0, j = 0; k0 < ncol; k0 += CPG, j++) {
        __m256i A[2][3];
#pragma GCC unroll 2
        for (int b = 0; b < TB; b++) A[b][0] = A[b][1] = A[b][2] = _mm256_setzero_si256();
#pragma GCC unroll 16
        for (int k = 0; k < CPG; k++) {
            const int32_t *w = qp + (size_t)(k0 + k) * 6;
#pragma GCC unroll 3
            for (int p = 0; p < 3; p++) {
                const __m256i wl = _mm256_set1_epi32(w[2 * p]), wh = _mm256_set1_epi32(w[2 * p + 1]);
#pragma GCC unroll 2
                for (int b = 0; b < TB; b++) {
                    A[b][p] = _mm256_dpbusd_avx_epi32(A[b][p], _mm256_load_si256((const __m256i *)lo[b][k0 + k]), wl);
                    A[b][p] = _mm256_dpbusd_avx_epi32(A[b][p], _mm256_load_si256((const __m256i *)hi[b][k0 + k]), wh);
                }
            }
        }
#pragma GCC unroll 2
        for (int b = 0; b < TB; b++) {
            const __m256i ab = _mm256_add_epi32(_mm256_slli_epi32(A[b][0], 14), _mm256_slli_epi32(A[b][1], 7));
            const __m256 sq =
                _mm256_mul_ps(_mm256_load_ps(sc + (size_t)j * CPU_BLOCK + t0 + 8 * b), _mm256_set1_ps(Q[j]));
            acc[b] = _mm256_fmadd_ps(sq, _mm256_cvtepi32_ps(_mm256_add_epi32(ab, A[b][2])), acc[b]);
        }
    }
#pragma GCC unroll 2
    for (int b = 0; b < TB; b++) {
        if (tn[b] == 8) {
            _mm256_storeu_ps(s + t0 + 8 * b, acc[b]);
        } else {
            float tmp[8];
            _mm256_storeu_ps(tmp, acc[b]);
            avx2_store_partial(s + t0 + 8 * b, tmp, tn[b]);
        }
    }
}

/* nq prepared queries, CPG dword columns per group, rows of rb bytes (a multiple of 32: d % 64 == 0). */
AVX2_VNNI_INLINE void avx2_score_q4_vnni(const cpu_rows *r, int32_t d, const void *prep, const float *qsum, int32_t nq,
                                         const int CPG, const float *sc, const float *bc, int32_t ng, float *s,
                                         size_t lds) {
    const int32_t rb = d / 2, ncol = rb / 4, n = r->n;
    const size_t stride = CPU_Q4_PREP_STRIDE(d);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    int32_t lo[2][AVX2_MAX_D / 8][8] __attribute__((aligned(32)));
    int32_t hi[2][AVX2_MAX_D / 8][8] __attribute__((aligned(32)));
    uint8_t rows_buf[8 * CPU_TILE_ROW_MAX];
    cpu_prefetch_walk pw;
    cpu_prefetch_start(&pw, r->pf, (n + 7) / 8);
    for (int32_t t0 = 0; t0 < n; t0 += 16) {
        int32_t tn[2] = {0, 0};
        const int TB = n - t0 > 8 ? 2 : 1;
        for (int b = 0; b < TB; b++) { /* the 8 rows' nibble columns */
            const int32_t tb = t0 + 8 * b;
            tn[b] = n - tb < 8 ? n - tb : 8;
            cpu_prefetch_step(&pw);
            const int32_t *in_place = cpu_tile_columns(r, tb, 8); /* tiled: columns of 16 lanes, 8 of them ours */
            const uint8_t *rows = avx2_plain_rows(r, tb, tn[b], in_place, rows_buf);
            for (int32_t c0 = 0; c0 < rb; c0 += 32) {
                __m256i x[8];
                if (in_place) {
                    for (int c = 0; c < 8; c++)
                        x[c] = _mm256_loadu_si256((const __m256i *)(in_place + 16 * (c0 / 4 + c)));
                } else {
                    for (int u = 0; u < 8; u++)
                        x[u] = u < tn[b] ? _mm256_loadu_si256((const __m256i *)(rows + (size_t)u * r->row_stride + c0))
                                         : _mm256_setzero_si256();
                    avx2_transpose_dwords(x);
                }
                for (int c = 0; c < 8; c++) {
                    _mm256_store_si256((__m256i *)lo[b][c0 / 4 + c], _mm256_and_si256(x[c], m4));
                    _mm256_store_si256((__m256i *)hi[b][c0 / 4 + c], _mm256_and_si256(_mm256_srli_epi32(x[c], 4), m4));
                }
            }
        }
        for (int32_t i = 0; i < nq; i++) {
            const uint8_t *pi = (const uint8_t *)prep + (size_t)i * stride;
            const int32_t *qp = (const int32_t *)(pi + 128);
            const float *Q = (const float *)pi, *qs = qsum + (size_t)i * ng;
            if (TB == 2) avx2_vnni_query(lo, hi, ncol, qp, Q, qs, 2, CPG, sc, bc, ng, t0, tn, s + (size_t)i * lds);
            else avx2_vnni_query(lo, hi, ncol, qp, Q, qs, 1, CPG, sc, bc, ng, t0, tn, s + (size_t)i * lds);
        }
    }
}

AVX2_VNNI_FN static void avx2_score_rows_q4_vnni(const cpu_rows *r, int32_t d, const float *q, size_t ldq,
                                                 const float *qsum, const void *prep, int32_t nq, float *s, size_t lds) {
    const int32_t g = r->group, ng = d / g;
    const int ready = qsum && d % 64 == 0 && (g == 32 || g == 64 || g == 128) && (ng == 1 || ng == 2 || ng == 4) &&
                      cpu_q4_prepared(prep, nq, d);
    if (!ready) { /* not prepared (or a query q4_prep left to fp32), or a shape without the columns: fp32 */
        avx2_score_rows_q4(r, d, q, ldq, qsum, NULL, nq, s, lds);
        return;
    }
    float sf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    float bf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    float sc[CPU_BLOCK * 4] __attribute__((aligned(32))), bc[CPU_BLOCK * 4] __attribute__((aligned(32)));
    avx2_row_sb(r, ng, sf, bf);
    for (int32_t t0 = 0; t0 < r->n; t0 += 8) { /* token-major to columns, lanes past n zero */
        __m256 scol[4], bcol[4];
        const int32_t tn = r->n - t0 < 8 ? r->n - t0 : 8;
        avx2_group_columns(sf, ng, t0, tn, scol);
        avx2_group_columns(bf, ng, t0, tn, bcol);
        for (int32_t j = 0; j < ng; j++) {
            _mm256_store_ps(sc + (size_t)j * CPU_BLOCK + t0, scol[j]);
            _mm256_store_ps(bc + (size_t)j * CPU_BLOCK + t0, bcol[j]);
        }
    }
    switch (g) { /* the columns per group as a constant, so the group's loop unrolls */
    case 32: avx2_score_q4_vnni(r, d, prep, qsum, nq, 4, sc, bc, ng, s, lds); break;
    case 64: avx2_score_q4_vnni(r, d, prep, qsum, nq, 8, sc, bc, ng, s, lds); break;
    default: avx2_score_q4_vnni(r, d, prep, qsum, nq, 16, sc, bc, ng, s, lds); break;
    }
}

#endif /* AVX2_HAVE_VNNI */

CPU_ROW_ENTRIES(avx2, AVX2_FN, f32, CPU_ENC_F32)
CPU_ROW_ENTRIES(avx2, AVX2_FN, f16, CPU_ENC_F16)
CPU_ROW_ENTRIES(avx2, AVX2_FN, q8, CPU_ENC_Q8)
CPU_ACCUM_ENTRY(avx2, AVX2_FN, q4, CPU_ENC_Q4) /* scores: avx2_score_rows_q4 above */
CPU_ROW_ENTRIES(avx2, AVX2_FN, q2, CPU_ENC_Q2)

/* ---- KIVI keys (per channel): tokens in lanes, 16 tokens per piece ---- */

/* Raw codes of 16 tokens of one channel, in the 2-/4-bit slab lane order. */
AVX2_INLINE void avx2_chan_codes(const uint8_t *c, const int bits, __m256 *a, __m256 *b) {
    if (bits == 4) {
        const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)c));
        *a = _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(15)));
        *b = _mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4));
    } else {
        uint32_t w;
        memcpy(&w, c, 4);
        const __m256i z = _mm256_set1_epi32((int)w), m3 = _mm256_set1_epi32(3);
        *a = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(z, _mm256_loadu_si256((const __m256i *)avx2_q2_shift_a)), m3));
        *b = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(z, _mm256_loadu_si256((const __m256i *)avx2_q2_shift_b)), m3));
    }
}

AVX2_INLINE float avx2_reduce(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

AVX2_INLINE void avx2_score_chan_core(const cpu_chan *ch, int32_t d, const float *q, size_t ldq, const int NQ,
                                      const int bits, float *s, size_t lds) {
    const size_t cbytes = (size_t)ch->g * bits / 8;
    float qs[AVX2_MAX_NQ * AVX2_MAX_D] __attribute__((aligned(32)));
    float sv[AVX2_MAX_D], bv[AVX2_MAX_D], qb[AVX2_MAX_NQ];
    avx2_halves(ch->scale, d, sv);
    avx2_halves(ch->bias, d, bv);
    for (int i = 0; i < NQ; i++) { /* q'_c = q_c s_c, and Σ_c q_c b_c */
        __m256 dot = _mm256_setzero_ps();
        int32_t c = 0;
        for (; c + 8 <= d; c += 8) {
            const __m256 qv = _mm256_loadu_ps(q + (size_t)i * ldq + c);
            _mm256_storeu_ps(qs + (size_t)i * d + c, _mm256_mul_ps(qv, _mm256_loadu_ps(sv + c)));
            dot = _mm256_fmadd_ps(qv, _mm256_loadu_ps(bv + c), dot);
        }
        float tail = 0.0f;
        for (; c < d; c++) {
            qs[(size_t)i * d + c] = q[(size_t)i * ldq + c] * sv[c];
            tail += q[(size_t)i * ldq + c] * bv[c];
        }
        qb[i] = avx2_reduce(dot) + tail;
    }
    const int32_t *perm = bits == 4 ? avx2_perm_q4 : avx2_perm_q2;
    for (int32_t p0 = 0; p0 < ch->g; p0 += 16) {
        __m256 acc_a[AVX2_MAX_NQ], acc_b[AVX2_MAX_NQ];
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) acc_a[i] = acc_b[i] = _mm256_setzero_ps();
        const uint8_t *codes = ch->codes + (size_t)p0 * bits / 8;
        for (int32_t c = 0; c < d; c++) {
            __m256 a, b;
            avx2_chan_codes(codes + (size_t)c * cbytes, bits, &a, &b);
#pragma GCC unroll 4
            for (int i = 0; i < NQ; i++) {
                const __m256 w = _mm256_broadcast_ss(qs + (size_t)i * d + c);
                acc_a[i] = _mm256_fmadd_ps(a, w, acc_a[i]);
                acc_b[i] = _mm256_fmadd_ps(b, w, acc_b[i]);
            }
        }
        for (int i = 0; i < NQ; i++) {
            float tmp[16];
            _mm256_storeu_ps(tmp, acc_a[i]);
            _mm256_storeu_ps(tmp + 8, acc_b[i]);
            float *si = s + (size_t)i * lds + p0;
            for (int32_t j = 0; j < 16; j++) si[perm[j]] = tmp[j] + qb[i];
        }
    }
}

AVX2_INLINE void avx2_accum_chan_core(const cpu_chan *ch, int32_t dv, const float *p, size_t ldp, const int NQ,
                                      const int bits, float *o, size_t ldo) {
    const size_t cbytes = (size_t)ch->g * bits / 8;
    const int32_t npieces = ch->g / 16;
    const int32_t *perm = bits == 4 ? avx2_perm_q4 : avx2_perm_q2;
    float pp[AVX2_MAX_NQ][CPU_BLOCK] __attribute__((aligned(32)));
    float psum[AVX2_MAX_NQ];
    for (int i = 0; i < NQ; i++) {
        float sum = 0.0f;
        for (int32_t t = 0; t < ch->g; t++) {
            pp[i][(t & ~15) + (t & 15)] = p[(size_t)i * ldp + (t & ~15) + perm[t & 15]];
            sum += p[(size_t)i * ldp + t];
        }
        psum[i] = sum;
    }
    __m256 buf[AVX2_MAX_NQ][8];
    for (int32_t c0 = 0; c0 < dv; c0 += 8) {
        const int32_t cn = dv - c0 < 8 ? dv - c0 : 8;
        for (int32_t cc = 0; cc < 8; cc++) {
            __m256 acc[AVX2_MAX_NQ];
#pragma GCC unroll 4
            for (int i = 0; i < NQ; i++) acc[i] = _mm256_setzero_ps();
            if (cc < cn)
                for (int32_t pi = 0; pi < npieces; pi++) {
                    __m256 a, b;
                    avx2_chan_codes(ch->codes + (size_t)(c0 + cc) * cbytes + (size_t)pi * 16 * bits / 8, bits, &a, &b);
#pragma GCC unroll 4
                    for (int i = 0; i < NQ; i++) {
                        acc[i] = _mm256_fmadd_ps(a, _mm256_loadu_ps(pp[i] + pi * 16), acc[i]);
                        acc[i] = _mm256_fmadd_ps(b, _mm256_loadu_ps(pp[i] + pi * 16 + 8), acc[i]);
                    }
                }
#pragma GCC unroll 4
            for (int i = 0; i < NQ; i++) buf[i][cc] = acc[i];
        }
        float sv[8], bv[8];
        avx2_halves(ch->scale + c0, cn, sv);
        avx2_halves(ch->bias + c0, cn, bv);
        for (int i = 0; i < NQ; i++) {
            float sums[8];
            _mm256_storeu_ps(sums, avx2_hsum8(buf[i]));
            float *oc = o + (size_t)i * ldo + c0;
            for (int32_t cc = 0; cc < cn; cc++) oc[cc] += sv[cc] * sums[cc] + bv[cc] * psum[i];
        }
    }
}

AVX2_FN static void avx2_score_chan(const cpu_chan *ch, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                    size_t lds) {
    for (int32_t i0 = 0; i0 < nq;) {
        const int32_t nc = nq - i0 >= 4 ? 4 : nq - i0;
        const float *qi = q + (size_t)i0 * ldq;
        float *si = s + (size_t)i0 * lds;
#define AVX2_SCORE_CHAN(N)                                                                                            \
    (ch->bits == 4 ? avx2_score_chan_core(ch, d, qi, ldq, N, 4, si, lds) : avx2_score_chan_core(ch, d, qi, ldq, N, 2, si, lds))
        CPU_BY_NQ4(AVX2_SCORE_CHAN, nc)
#undef AVX2_SCORE_CHAN
        i0 += nc;
    }
}

AVX2_FN static void avx2_accum_chan(const cpu_chan *ch, int32_t dv, const float *p, size_t ldp, int32_t nq, float *o,
                                    size_t ldo) {
    for (int32_t i0 = 0; i0 < nq;) {
        const int32_t nc = nq - i0 >= 4 ? 4 : nq - i0;
        const float *pi = p + (size_t)i0 * ldp;
        float *oi = o + (size_t)i0 * ldo;
#define AVX2_ACCUM_CHAN(N)                                                                                            \
    (ch->bits == 4 ? avx2_accum_chan_core(ch, dv, pi, ldp, N, 4, oi, ldo) : avx2_accum_chan_core(ch, dv, pi, ldp, N, 2, oi, ldo))
        CPU_BY_NQ4(AVX2_ACCUM_CHAN, nc)
#undef AVX2_ACCUM_CHAN
        i0 += nc;
    }
}

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
    k->score_rows[CPU_ENC_F32] = avx2_score_rows_f32;
    k->score_rows[CPU_ENC_F16] = avx2_score_rows_f16;
    k->score_rows[CPU_ENC_Q8] = avx2_score_rows_q8;
    k->score_rows[CPU_ENC_Q4] = avx2_score_rows_q4;
    k->score_rows[CPU_ENC_Q2] = avx2_score_rows_q2;
    k->accum_rows[CPU_ENC_F32] = avx2_accum_rows_f32;
    k->accum_rows[CPU_ENC_F16] = avx2_accum_rows_f16;
    k->accum_rows[CPU_ENC_Q8] = avx2_accum_rows_q8;
    k->accum_rows[CPU_ENC_Q4] = avx2_accum_rows_q4;
    k->accum_rows[CPU_ENC_Q2] = avx2_accum_rows_q2;
    k->score_chan = avx2_score_chan;
    k->accum_chan = avx2_accum_chan;
    k->max = avx2_max;
    k->exp_sum = avx2_exp_sum;
    k->dequant_row = avx2_dequant_row;
    k->spreads_prefetch = 1;
#if defined(AVX2_HAVE_VNNI)
    if (__builtin_cpu_supports("avxvnni")) {
        k->score_rows[CPU_ENC_Q4] = avx2_score_rows_q4_vnni;
        k->q4_prep = avx2_q4_prep;
    }
#endif
}
#endif
