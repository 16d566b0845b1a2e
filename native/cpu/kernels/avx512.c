/*
 * avx512.c: the kernels of kernels.h in AVX-512 (F/BW/VL/DQ + FMA + F16C), chosen at run time
 * (cpu_backend.c); no file is compiled with -march, each function carries its target attribute.
 *
 * Rows are consumed in slabs of 32 elements (two zmm). A slab's codes are decoded to floats in whatever
 * lane order is cheapest for the encoding (4-bit: even elements, then odd ones; 2-bit: elements 4j, then
 * 4j+1, 4j+2, 4j+3) and the query is permuted the same way once per call, so codes are never shuffled per
 * token; accumulators of values are permuted back once per block. For scores, quantized slabs are
 * dequantized in registers as x̂ = code·s + b, the value scalar.c's dequant_row gives bit for bit (code·s
 * is exact in float), so q·k̂ = Σ q_c x̂_c needs no Σq bias term: one FMA per element per query, the
 * floor of docs/architecture.md §9.
 * 4- and 2-bit codes are dequantized through a 16-entry table per group (vpermps looks at the low 4 index
 * bits only, so the nibble needs no mask), 8-bit ones through an int->float conversion.
 *
 * Scores: per token, one accumulator per query over the slabs; 16 tokens' accumulators are summed
 * horizontally together by a transpose tree (15 adds for 16 tokens, not 16 full reductions). The tables
 * of 4 tokens are built before their slabs are walked. 4-bit keys are scored with 16 tokens in lanes
 * instead (avx512_score_q4_lanes: rows transposed as dwords, no tables, no horizontal sums), and where the
 * CPU has VNNI by vpdpbusd against the query cut into int8 pieces once per call (avx512_score_q4_vnni).
 * Values: slab-outer, token-inner, so the decoded slab of a token is shared by all the queries and the
 * accumulators (2 per query) stay in registers across the block. Quantized values fold the scale into the
 * weights instead (Σ_t p_t (s_t code_t + b_t) = Σ_t (p_t s_t) code_t + Σ_t p_t b_t, once per group and
 * block), so their codes decode through a constant table and the token loop is FMAs and shuffles only.
 * Queries are taken in chunks of 8, 4, 3, 2, 1 (each a compile-time specialization).
 */
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline)) AVX512_FN

enum { AVX512_SLAB = 32, AVX512_MAX_D = 1024, AVX512_MAX_NG = 32, AVX512_MAX_NQ = 8 };

/* Slab lane order: position j holds element perm[j]; inv[c] is the position of element c. */
static const int32_t avx512_perm_q4[32] = {0, 2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                           1, 3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
static const int32_t avx512_inv_q4[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                          8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
static const int32_t avx512_perm_q2[32] = {0, 4, 8,  12, 16, 20, 24, 28, 1, 5, 9,  13, 17, 21, 25, 29,
                                           2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31};
static const int32_t avx512_inv_q2[32] = {0, 8,  16, 24, 1, 9,  17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
                                          4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31};
static const int32_t avx512_iota[32] = {0, 1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                        16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
/* 2-bit table: entry e decodes the code in its low two bits (the next code sits in bits 2-3). */
static const float avx512_lut2_codes[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
static const float avx512_lut4_codes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const uint32_t avx512_q2_shift_a[16] = {0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2};
static const uint32_t avx512_q2_shift_b[16] = {4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6};

static inline const int32_t *avx512_perm(int32_t enc) {
    return enc == CPU_ENC_Q4 ? avx512_perm_q4 : enc == CPU_ENC_Q2 ? avx512_perm_q2 : avx512_iota;
}
static inline const int32_t *avx512_inv(int32_t enc) {
    return enc == CPU_ENC_Q4 ? avx512_inv_q4 : enc == CPU_ENC_Q2 ? avx512_inv_q2 : avx512_iota;
}

static inline __mmask16 avx512_mask(int32_t n) { return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u); }

/* fp16 -> float for n values (the scales and biases of a block are contiguous when sb_stride == groups). */
AVX512_INLINE void avx512_halves(const uint16_t *h, int32_t n, float *out) {
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
    if (i < n) {
        const __mmask16 m = avx512_mask(n - i);
        _mm512_mask_storeu_ps(out + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + i)));
    }
}

/* Scale and bias of the n rows of r as floats, token-major: sf[t * ng + j]. */
AVX512_INLINE void avx512_row_sb(const cpu_rows *r, int32_t ng, float *sf, float *bf) { cpu_row_sb(r, ng, sf, bf, avx512_halves); }

/* The 16-entry table of a 4- or 2-bit group: entry e holds code(e)·s + b (2-bit: code(e) = e & 3). */
AVX512_INLINE __m512 avx512_table(const int enc, float s, float b) {
    return _mm512_fmadd_ps(_mm512_loadu_ps(enc == CPU_ENC_Q4 ? avx512_lut4_codes : avx512_lut2_codes), _mm512_set1_ps(s),
                           _mm512_set1_ps(b));
}

/* Slab k of a 4- or 2-bit row decoded through table lut (vpermps looks at the low 4 index bits only, so
 * a nibble needs no mask). 2-bit: 8 bytes, each used twice (shifts 0/2 in a, 4/6 in b). */
AVX512_INLINE void avx512_slab_table(const uint8_t *row, int32_t k, const int enc, __m512 lut, __m512 *a, __m512 *b) {
    if (enc == CPU_ENC_Q4) {
        const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + (size_t)k * 16)));
        *a = _mm512_permutexvar_ps(x, lut);
        *b = _mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), lut);
    } else {
        const __m256i y = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + (size_t)k * 8)));
        const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(y), y, 1);
        *a = _mm512_permutexvar_ps(_mm512_srlv_epi32(z, _mm512_loadu_si512(avx512_q2_shift_a)), lut);
        *b = _mm512_permutexvar_ps(_mm512_srlv_epi32(z, _mm512_loadu_si512(avx512_q2_shift_b)), lut);
    }
}

/* Slab k of a quantized row as its raw codes (no scale, no bias), in the encoding's lane order: the values
 * kernel folds the scale into the weights and adds the bias once per group (see avx512_fold_weights). */
AVX512_INLINE void avx512_slab_codes(const uint8_t *row, int32_t k, const int enc, __m512 *a, __m512 *b) {
    if (enc == CPU_ENC_Q8) {
        *a = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + (size_t)k * 32))));
        *b = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + (size_t)k * 32 + 16))));
    } else {
        avx512_slab_table(row, k, enc, _mm512_loadu_ps(enc == CPU_ENC_Q4 ? avx512_lut4_codes : avx512_lut2_codes), a, b);
    }
}

/* Slab k of a row, decoded (and dequantized with scale *sp and bias *bp) into a (positions 0..15) and
 * b (16..31) in the encoding's lane order. Plain rows may end inside the slab (d % 32 != 0): masked. */
AVX512_INLINE void avx512_slab(const uint8_t *row, int32_t k, const int enc, int32_t d, const float *sp, const float *bp,
                               __m512 *a, __m512 *b) {
    switch (enc) {
    case CPU_ENC_F32: {
        const float *f = (const float *)row + (size_t)k * 32;
        if (k * 32 + 32 <= d) {
            *a = _mm512_loadu_ps(f), *b = _mm512_loadu_ps(f + 16);
        } else {
            const int32_t rem = d - k * 32;
            *a = _mm512_maskz_loadu_ps(avx512_mask(rem), f), *b = _mm512_maskz_loadu_ps(avx512_mask(rem - 16), f + 16);
        }
        return;
    }
    case CPU_ENC_F16: {
        const uint16_t *h = (const uint16_t *)row + (size_t)k * 32;
        if (k * 32 + 32 <= d) {
            *a = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
            *b = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 16)));
        } else {
            const int32_t rem = d - k * 32;
            *a = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(avx512_mask(rem), h));
            *b = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(avx512_mask(rem - 16), h + 16));
        }
        return;
    }
    case CPU_ENC_Q8: { /* the raw codes, then code·s + b */
        const __m512 s = _mm512_set1_ps(*sp), bias = _mm512_set1_ps(*bp);
        avx512_slab_codes(row, k, CPU_ENC_Q8, a, b);
        *a = _mm512_fmadd_ps(*a, s, bias);
        *b = _mm512_fmadd_ps(*b, s, bias);
        return;
    }
    default: /* Q4, Q2 */
        avx512_slab_table(row, k, enc, avx512_table(enc, *sp, *bp), a, b);
        return;
    }
}

/* Horizontal sums by a transpose tree: pairs inside 128-bit lanes, then across lanes. tree4 takes 4
 * vectors to one holding, in each 128-bit lane L, the 4 vectors' sums over lane L; tree_final takes 4 of
 * those (16 vectors) to r[t] = Σ_lanes v[t]. */
AVX512_INLINE __m512 avx512_tree4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    const __m512 x01 = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
    const __m512 x23 = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
    const __m512d x = _mm512_castps_pd(x01), y = _mm512_castps_pd(x23);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}

AVX512_INLINE __m512 avx512_tree_final(const __m512 *b) {
    const __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x44), _mm512_shuffle_f32x4(b[0], b[1], 0xEE));
    const __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x44), _mm512_shuffle_f32x4(b[2], b[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, 0x88), _mm512_shuffle_f32x4(c0, c1, 0xDD));
}

/* r[t] = Σ_lanes v[t] for 16 vectors (15 adds, not 16 full reductions). */
AVX512_INLINE __m512 avx512_hsum16(const __m512 *v) {
    __m512 b[4];
    #pragma GCC unroll 4
    for (int j = 0; j < 4; j++) b[j] = avx512_tree4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    return avx512_tree_final(b);
}

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
    cpu_prefetch_start(&pw, pf, (r->n + 15) / 16);
    for (int32_t t0 = 0; t0 < r->n; t0 += 16) {
        const int32_t tn = r->n - t0 < 16 ? r->n - t0 : 16;
        cpu_prefetch_step(&pw);
        int32_t tt = 0;
        if (NQ <= 4)
            for (; tt + 4 <= tn; tt += 4)
                avx512_score_tokens(r, d, qp, NQ, 4, enc, sf, bf, ng, gshift, t0 + tt, tt, raw, part);
        const int32_t in_part = tt / 4; /* groups of 4 already summed into part */
        if (NQ > 4)
            for (; tt + 2 <= tn; tt += 2)
                avx512_score_tokens(r, d, qp, NQ, 2, enc, sf, bf, ng, gshift, t0 + tt, tt, raw, part);
        for (; tt < tn; tt++) avx512_score_tokens(r, d, qp, NQ, 1, enc, sf, bf, ng, gshift, t0 + tt, tt, raw, part);
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

/* ---- accum_rows ---- */

/* Adds the permuted accumulators (a, b) of slab k to o[k*32 ..], restoring element order. */
AVX512_INLINE void avx512_add_slab(float *o, int32_t k, int32_t dv, __m512 a, __m512 b, const int enc) {
    __m512 lo = a, hi = b;
    if (enc == CPU_ENC_Q4 || enc == CPU_ENC_Q2) {
        lo = _mm512_permutex2var_ps(a, _mm512_loadu_si512(avx512_inv(enc)), b);
        hi = _mm512_permutex2var_ps(a, _mm512_loadu_si512(avx512_inv(enc) + 16), b);
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

/* Group j of tokens t0..t0+15 (lanes past mask m zero) from token-major x[t * ng + j]: shuffles for 1, 2
 * or 4 groups (d = 128 with g = 128, 64 or 32), a gather otherwise (slower on AMD: ~12 cycles each).
 * x is a CPU_BLOCK * AVX512_MAX_NG array, so the loads past the block's last token stay inside it. */
AVX512_INLINE __m512 avx512_group_column(const float *x, int32_t ng, int32_t t0, int32_t j, __mmask16 m) {
    const float *xt = x + (size_t)t0 * ng;
    const __m512i lane = _mm512_loadu_si512(avx512_iota);
    switch (ng) {
    case 1: return _mm512_maskz_loadu_ps(m, xt);
    case 2: {
        const __m512i idx = _mm512_add_epi32(_mm512_slli_epi32(lane, 1), _mm512_set1_epi32(j));
        return _mm512_maskz_permutex2var_ps(m, _mm512_loadu_ps(xt), idx, _mm512_loadu_ps(xt + 16));
    }
    case 4: { /* tokens 0-7 from the first 32 floats, 8-15 from the next 32 (lanes 8-15 of each unused) */
        const __m512i idx = _mm512_add_epi32(_mm512_slli_epi32(lane, 2), _mm512_set1_epi32(j));
        const __m512 lo = _mm512_permutex2var_ps(_mm512_loadu_ps(xt), idx, _mm512_loadu_ps(xt + 16));
        const __m512 hi = _mm512_permutex2var_ps(_mm512_loadu_ps(xt + 32), idx, _mm512_loadu_ps(xt + 48));
        return _mm512_maskz_mov_ps(m, _mm512_shuffle_f32x4(lo, hi, 0x44));
    }
    default:
        return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, _mm512_mullo_epi32(lane, _mm512_set1_epi32(ng)), xt + j, 4);
    }
}

/* vpermt2w indices that take groups j and j + 1 (j = 0 here; add j) of 16 tokens out of token-major fp16
 * with 4 or 2 groups a token: words 0-15 are group j of tokens 0-15, words 16-31 group j + 1. */
static const uint16_t avx512_half_idx4[32] = {0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60,
                                              1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61};
static const uint16_t avx512_half_idx2[32] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                              1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};

AVX512_INLINE __mmask32 avx512_mask32(int32_t n) { return n >= 32 ? ~(__mmask32)0 : n <= 0 ? 0 : (((__mmask32)1 << n) - 1); }

/* Token-major fp32 x[t * ng + j] of n tokens as columns out[j * CPU_BLOCK + t], lanes past n zero. */
AVX512_INLINE void avx512_float_columns(const float *x, int32_t n, int32_t ng, float *out) {
    for (int32_t t0 = 0; t0 < n; t0 += 16)
        for (int32_t j = 0; j < ng; j++)
            _mm512_store_ps(out + (size_t)j * CPU_BLOCK + t0, avx512_group_column(x, ng, t0, j, avx512_mask(n - t0)));
}

/* The same from the fp16 h (token-major, contiguous) for ng 1, 2 or 4 (d = 128 with g = 128, 64, 32): 16
 * tokens are ng x 16 halves, up to two zmm, and each vpermt2w takes two groups' 16 halves out of them. The
 * word indices are built once, and whole sets of 16 tokens load unmasked: shuffle-bound as it is (a
 * permute, an extract and two conversions per two groups), the masks and the index arithmetic in the loop
 * took a third of its time (bench: 29 -> 21 ns for a block's scales and biases at ng 4). */
AVX512_INLINE void avx512_half_columns(const uint16_t *h, int32_t n, int32_t ng, float *out) {
    const __m512i idx0 = _mm512_loadu_si512(ng == 4 ? avx512_half_idx4 : avx512_half_idx2);
    const __m512i idx2 = _mm512_add_epi16(idx0, _mm512_set1_epi16(2));
    for (int32_t t0 = 0; t0 < n; t0 += 16) {
        const int32_t halves = (n - t0 < 16 ? n - t0 : 16) * ng;
        const uint16_t *ht = h + (size_t)t0 * ng;
        if (ng == 1) {
            _mm512_store_ps(out + t0, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(avx512_mask(halves), ht)));
            continue;
        }
        __m512i w0, w1 = _mm512_setzero_si512();
        if (halves == 16 * ng) {
            w0 = _mm512_loadu_si512(ht);
            if (ng == 4) w1 = _mm512_loadu_si512(ht + 32);
        } else {
            w0 = _mm512_maskz_loadu_epi16(avx512_mask32(halves), ht);
            if (halves > 32) w1 = _mm512_maskz_loadu_epi16(avx512_mask32(halves - 32), ht + 32);
        }
        for (int32_t j = 0; j < ng; j += 2) {
            const __m512i pr = _mm512_permutex2var_epi16(w0, j ? idx2 : idx0, w1);
            _mm512_store_ps(out + (size_t)j * CPU_BLOCK + t0, _mm512_cvtph_ps(_mm512_castsi512_si256(pr)));
            _mm512_store_ps(out + (size_t)(j + 1) * CPU_BLOCK + t0, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(pr, 1)));
        }
    }
}

/* Scale and bias columns of the n rows, sc[j * CPU_BLOCK + t] = s_t,j (lanes past n zero), so that a lanes
 * kernel loads a group's 16 tokens at once instead of shuffling them out of token-major rows per use. */
AVX512_INLINE void avx512_sb_columns(const cpu_rows *r, int32_t ng, float *sc, float *bc) {
    if (r->sb_stride == (size_t)ng && (ng == 1 || ng == 2 || ng == 4)) {
        for (int32_t t0 = 0, t1; t0 < r->n; t0 = t1) { /* each run: its first token is a multiple of 16 */
            t1 = cpu_run_end(r, t0);
            avx512_half_columns(cpu_row_scale(r, t0), t1 - t0, ng, sc + t0);
            avx512_half_columns(cpu_row_bias(r, t0), t1 - t0, ng, bc + t0);
        }
        return;
    }
    float sf[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    float bf[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    avx512_row_sb(r, ng, sf, bf);
    avx512_float_columns(sf, r->n, ng, sc);
    avx512_float_columns(bf, r->n, ng, bc);
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

AVX512_INLINE void avx512_accum_core(const cpu_rows *r, int32_t dv, const float *p, size_t ldp, const int NQ,
                                     const int enc, const float *sc, const float *bc, float *o, size_t ldo,
                                     const cpu_prefetch *pf) {
    const int32_t nslab = (dv + 31) / 32, n = r->n, pieces = (n + 31) / 32; /* prefetch slices per slab */
    cpu_prefetch_walk pw;
    cpu_prefetch_start(&pw, pf, nslab * pieces);
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
            for (int i = 0; i < NQ; i++) acc_a[u][i] = acc_b[u][i] = _mm512_set1_ps(u == 0 ? bsum[i] : 0.0f);
        /* 32 tokens at a time (one run: CPU_RUN_ALIGN), each piece asking for its slice of the prefetch hint */
        for (int32_t t0 = 0, t = 0; t0 < n; t0 += 32) {
            if (enc == CPU_ENC_Q4) cpu_prefetch_step4(&pw); /* the VNNI q4 path's whole hint: see there */
            else cpu_prefetch_step(&pw);
            const int32_t t1 = n - t0 < 32 ? n : t0 + 32;
            const uint8_t *piece = cpu_row_codes(r, t0); /* row t at piece + (t - t0) * stride */
            if (NQ <= 4)
                for (; t + 2 <= t1; t += 2)
                    #pragma GCC unroll 8
                    for (int u = 0; u < 2; u++) {
                        __m512 a, b;
                        const uint8_t *row = piece + (size_t)(t + u - t0) * r->row_stride;
                        if (quant) avx512_slab_codes(row, k, enc, &a, &b);
                        else avx512_slab(row, k, enc, dv, NULL, NULL, &a, &b);
                        #pragma GCC unroll 8
                        for (int i = 0; i < NQ; i++) {
                            const __m512 wt = _mm512_set1_ps(w[(size_t)i * ldw + t + u]);
                            acc_a[u][i] = _mm512_fmadd_ps(a, wt, acc_a[u][i]);
                            acc_b[u][i] = _mm512_fmadd_ps(b, wt, acc_b[u][i]);
                        }
                    }
            for (; t < t1; t++) {
                __m512 a, b;
                const uint8_t *row = piece + (size_t)(t - t0) * r->row_stride;
                if (quant) avx512_slab_codes(row, k, enc, &a, &b);
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
        for (int i = 0; i < NQ; i++)
            avx512_add_slab(o + (size_t)i * ldo, k, dv, _mm512_add_ps(acc_a[0][i], acc_a[1][i]),
                            _mm512_add_ps(acc_b[0][i], acc_b[1][i]), enc);
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

/* ---- q4 keys with tokens in lanes: 16 tokens at a time, no horizontal sums, no per-token tables ----
 * q·k̂_t = Σ_g s_t,g (q_g · codes_t,g) + b_t,g Σq_g. The 16 rows are transposed as dwords (64 bytes of
 * each at a time), so dword column c (dims 8c..8c+7 of every row) decodes by shifts and vpermps into 8
 * dims of 16 tokens; each dim meets each query's element as a broadcast FMA, and the scales and biases
 * enter once per 32 dims and per group as columns of the block (avx512_group_column). bench_kernels, in
 * cache: 60% of FMA peak with per-token tables and the transpose-tree sums, 66% with the rows transposed
 * as bytes (a byte column: two dims), 68-71% as dwords (fewer decode ops). */

/* A 16x16 transpose of dwords: afterwards lane t of r[avx512_t16_reg[c]] is dword c of the old r[t]. */
static const int32_t avx512_t16_reg[16] = {0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15};
AVX512_INLINE void avx512_transpose_dwords(__m512i *r) {
    __m512i a[16];
    #pragma GCC unroll 8
    for (int p = 0; p < 8; p++)
        a[2 * p] = _mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]), a[2 * p + 1] = _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
    #pragma GCC unroll 4
    for (int q = 0; q < 4; q++)
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            r[4 * q + 2 * h] = _mm512_unpacklo_epi64(a[4 * q + h], a[4 * q + 2 + h]);
            r[4 * q + 2 * h + 1] = _mm512_unpackhi_epi64(a[4 * q + h], a[4 * q + 2 + h]);
        }
    #pragma GCC unroll 2
    for (int q = 0; q < 2; q++)
        #pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            a[8 * q + 2 * h] = _mm512_shuffle_i32x4(r[8 * q + h], r[8 * q + 4 + h], 0x88);
            a[8 * q + 2 * h + 1] = _mm512_shuffle_i32x4(r[8 * q + h], r[8 * q + 4 + h], 0xDD);
        }
    #pragma GCC unroll 8
    for (int h = 0; h < 8; h++) r[2 * h] = _mm512_shuffle_i32x4(a[h], a[8 + h], 0x88), r[2 * h + 1] = _mm512_shuffle_i32x4(a[h], a[8 + h], 0xDD);
}

/* Chunk c (64 bytes of each row, left of them still in the row) of the 16 rows from t0, tn of them real and
 * the rest zero, as dword columns: after it, cols[k][t] is dword k of the chunk of row t0+t. */
AVX512_INLINE void avx512_chunk_transpose(const cpu_rows *r, int32_t t0, int32_t tn, int32_t c, int32_t left,
                                          int32_t cols[16][16]) {
    const __mmask16 wm = avx512_mask(left / 4);
    __m512i x[16];
    const uint8_t *rows = cpu_row_codes(r, t0) + (size_t)c * 64; /* 16 rows of one run (CPU_RUN_ALIGN) */
    #pragma GCC unroll 16
    for (int u = 0; u < 16; u++) {
        const uint8_t *row = rows + (size_t)u * r->row_stride;
        x[u] = u >= tn ? _mm512_setzero_si512() : left >= 64 ? _mm512_loadu_si512(row) : _mm512_maskz_loadu_epi32(wm, row);
    }
    avx512_transpose_dwords(x);
    #pragma GCC unroll 16
    for (int k = 0; k < 16; k++) _mm512_store_si512(cols[k], x[avx512_t16_reg[k]]);
}

/* The dword columns of the 16 tokens from t0 (tn of them, of one run), ncol of them (all of the row's):
 * column k at the result + 16 k. Tiled rows whose t0 starts a tile are their own columns, read in place;
 * tiled rows that do not (a window's first page) are shifted out of two tiles by one permute a column;
 * plain rows are transposed. The last two write cols, whose lanes past tn are then zero or other tokens'
 * (lanes the kernels mask). */
AVX512_INLINE const int32_t *avx512_key_columns(const cpu_rows *r, int32_t t0, int32_t tn, int32_t ncol,
                                                int32_t (*cols)[16]) {
    if (r->tile < 0) {
        for (int32_t c = 0; c * 16 < ncol; c++)
            avx512_chunk_transpose(r, t0, tn, c, (ncol - 16 * c) * 4, cols + 16 * c);
        return cols[0];
    }
    const int32_t *in_place = cpu_tile_columns(r, t0, CPU_TILE);
    if (in_place) return in_place;
    int32_t lane;
    const int32_t *a = (const int32_t *)cpu_tile_at(r, t0, &lane);
    const int32_t *b = lane + tn > CPU_TILE ? a + CPU_TILE * (r->row_stride / 4u) : a; /* the next tile, when read */
    const __m512i idx =
        _mm512_add_epi32(_mm512_set1_epi32(lane), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    for (int32_t k = 0; k < ncol; k++)
        _mm512_store_si512(cols[k],
                           _mm512_permutex2var_epi32(_mm512_load_si512(a + 16 * k), idx, _mm512_load_si512(b + 16 * k)));
    return cols[0];
}

/* The start of the 16 tokens from t0 (of n) in a q4 lanes kernel: asks for the prefetch walk's next slice,
 * and seeds acc[i] = Σ_j b_t,j Σq_j (the biases). Returns how many of the 16 are real; *m masks them. */
AVX512_INLINE int32_t avx512_lanes_start(__m512 *acc, const int NQ, const float *bf, int32_t ng, int32_t t0, int32_t n,
                                         const float *qsum, cpu_prefetch_walk *pw, __mmask16 *m_out) {
    const int32_t tn = n - t0 < 16 ? n - t0 : 16;
    const __mmask16 m = *m_out = avx512_mask(tn);
    cpu_prefetch_step(pw);
    #pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) acc[i] = _mm512_setzero_ps();
    for (int32_t j = 0; j < ng; j++) {
        const __m512 bcol = avx512_group_column(bf, ng, t0, j, m);
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) acc[i] = _mm512_fmadd_ps(bcol, _mm512_set1_ps(qsum[(size_t)i * ng + j]), acc[i]);
    }
    return tn;
}

AVX512_INLINE void avx512_score_q4_lanes(const cpu_rows *r, int32_t d, const float *q, size_t ldq, const float *qsum,
                                         const int NQ, const float *sf, const float *bf, int32_t ng, float *s, size_t lds,
                                         const cpu_prefetch *pf) {
    const int32_t rb = d / 2, nchunk = (rb + 63) / 64, n = r->n; /* row bytes: a multiple of 16 (d % 32 == 0) */
    const int32_t gshift = __builtin_ctz((unsigned)r->group);
    const __m512 ctab = _mm512_loadu_ps(avx512_lut4_codes);
    int32_t cols_buf[AVX512_MAX_D / 8][16] __attribute__((aligned(64)));
    cpu_prefetch_walk pw;
    cpu_prefetch_start(&pw, pf, (n + 15) / 16);
    for (int32_t t0 = 0; t0 < n; t0 += 16) {
        __m512 acc[AVX512_MAX_NQ];
        __mmask16 m;
        const int32_t tn = avx512_lanes_start(acc, NQ, bf, ng, t0, n, qsum, &pw, &m);
        __m512 scol = _mm512_setzero_ps(); /* the scales of group scol_j: one column per group, not per 32 dims */
        int32_t scol_j = -1;
        const int32_t *cols0 = avx512_key_columns(r, t0, tn, rb / 4, cols_buf);
        for (int32_t c = 0; c < nchunk; c++) {
            const int32_t left = rb - c * 64, units = left >= 64 ? 4 : left / 16;
            const int32_t *cols = cols0 + (size_t)c * 256; /* the chunk's 16 columns */
            for (int U = 0; U < units; U++) {
                const int32_t dim0 = (c * 4 + U) * 32; /* these 4 dword columns: 32 dims */
                __m512 in[AVX512_MAX_NQ][4];
                #pragma GCC unroll 8
                for (int i = 0; i < NQ; i++) in[i][0] = in[i][1] = in[i][2] = in[i][3] = _mm512_setzero_ps();
                #pragma GCC unroll 4
                for (int cc = 0; cc < 4; cc++) {
                    const __m512i xw = _mm512_load_si512(cols + 16 * (4 * U + cc));
                    #pragma GCC unroll 8
                    for (int k = 0; k < 8; k++) {
                        const __m512i sh = k ? _mm512_srli_epi32(xw, 4 * k) : xw;
                        const __m512 v = _mm512_permutexvar_ps(sh, ctab); /* looks at the low 4 bits only */
                        #pragma GCC unroll 8
                        for (int i = 0; i < NQ; i++)
                            in[i][k & 3] = _mm512_fmadd_ps(v, _mm512_set1_ps(q[(size_t)i * ldq + dim0 + 8 * cc + k]), in[i][k & 3]);
                    }
                }
                if (dim0 >> gshift != scol_j) scol = avx512_group_column(sf, ng, t0, scol_j = dim0 >> gshift, m);
                #pragma GCC unroll 8
                for (int i = 0; i < NQ; i++)
                    acc[i] = _mm512_fmadd_ps(scol, _mm512_add_ps(_mm512_add_ps(in[i][0], in[i][1]), _mm512_add_ps(in[i][2], in[i][3])), acc[i]);
            }
        }
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) _mm512_mask_storeu_ps(s + (size_t)i * lds + t0, m, acc[i]);
    }
}

AVX512_FN static void avx512_score_rows_q4(const cpu_rows *r, int32_t d, const float *q, size_t ldq, const float *qsum,
                                           const void *prep, int32_t nq, float *s, size_t lds) {
    (void)prep; /* avx512_score_rows_q4_vnni reads it */
    if (!qsum) { /* the lanes kernel needs the query's group sums for the biases; the row kernel does not */
        avx512_score_rows_impl(r, d, q, ldq, nq, s, lds, CPU_ENC_Q4);
        return;
    }
    const int32_t ng = d / r->group;
    float sf[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    float bf[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    avx512_row_sb(r, ng, sf, bf);
#define AVX512_SCORE_Q4(N)                                                                                            \
    avx512_score_q4_lanes(r, d, q + (size_t)i0 * ldq, ldq, qsum + (size_t)i0 * ng, N, sf, bf, ng, s + (size_t)i0 * lds, lds, \
                          i0 ? NULL : r->pf)
    CPU_EACH_NQ4(AVX512_SCORE_Q4, nq, i0)
#undef AVX512_SCORE_Q4
}

/* ---- q4 keys through VNNI (vpdpbusd: 4 byte products summed into each dword, 64 per instruction) ----
 * vpdpbusd runs on the FMA pipes at the FMA rate here (bench_ports), so it pays only through its 4 products
 * per lane against the FMA's 1, and only if the query survives being cut to int8. One int8 piece, or two
 * (score error 3.2e-4), does not; three do: each key group j of a query is scaled to integers n = q/Q_j with
 * |n| <= 2^20, Q_j = max_j|q| / 2^20, and cut into balanced base-128 digits n = a·2^14 + b·2^7 + c (|a|, |b|,
 * |c| <= 64), an error of at most Q_j/2 per element, 2^-21 of the group's largest. Codes are the unsigned
 * operand (0-15). Tokens sit in lanes as in avx512_score_q4_lanes: a dword column holds dims 8c..8c+7 of 16
 * tokens, its low nibbles (dims 8c, +2, +4, +6) and high nibbles (the odd ones) are masked into two byte
 * columns, and each meets a broadcast dword of 4 query pieces. Per group and query the three piece sums
 * combine exactly in int32 ((A<<14) + (B<<7) + C: |A| <= 128·15·64, so < 2^31 for g <= 128), convert once
 * and meet the scale column: q·k̂_t = Σ_g Q_g s_t,g combined_g + Σ_g b_t,g Σq_g.
 * What sets the pace is loads, not dot products: this core (Zen 5) has two vector-load slots a cycle (a
 * zmm load takes both), and a broadcast operand takes one, so one broadcast per vpdpbusd held the kernel
 * to the load rate with everything else on top. Each broadcast dword now meets two 16-token blocks (two
 * queries at a time, so the accumulators fit), and the scale and bias columns are one load each.
 * bench_kernels (d 128, 128 tokens, 4 queries, g32, in cache): 665 ns with a broadcast per vpdpbusd, 534
 * with the two blocks; 89% of the FMA peak counted in fp32 flops, and 350 ns, the vpdpbusd rate, without
 * the transpose, the combine, the bias seeds and the scale columns (timing only). */
#define AVX512_VNNI_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512vnni")))
#define AVX512_VNNI_INLINE static inline __attribute__((always_inline)) AVX512_VNNI_FN

/* q4_prep's layout for one query: float Q_j per key group j at byte 4j (Q_0 = 0: not prepared, use the fp32
 * kernel), then from byte 128 six dwords per dword column c of the row (dims 8c..8c+7): for piece p (a, b, c),
 * dword 6c + 2p holds its int8s of the even dims 8c, +2, +4, +6 and dword 6c + 2p + 1 those of the odd ones.
 * A column's pieces are then one base and constant offsets in the kernel. Each group has its own
 * Q_j = max_j|q| / 2^20, so a large element costs precision in its group only. */
AVX512_VNNI_FN static void avx512_q4_prep(const float *q, size_t ldq, int32_t nq, int32_t d, int32_t group, void *prep) {
    static const uint8_t evens_odds[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
    const __m128i eo = _mm_loadu_si128((const __m128i *)evens_odds);
    const __m512i k64 = _mm512_set1_epi32(64), k127 = _mm512_set1_epi32(127);
    for (int32_t i = 0; i < nq; i++) {
        const float *qi = q + (size_t)i * ldq;
        uint8_t *out = (uint8_t *)prep + (size_t)i * CPU_Q4_PREP_STRIDE(d);
        float Q[AVX512_MAX_NG];
        int ok = d % 16 == 0 && group % 16 == 0 && d / group <= AVX512_MAX_NG;
        for (int32_t j = 0; ok && j < d / group; j++) {
            __m512 mx = _mm512_setzero_ps(), nan = _mm512_setzero_ps(); /* q·0 is NaN for a NaN or an inf */
            for (int32_t x = j * group; x < (j + 1) * group; x += 16) {
                const __m512 v = _mm512_loadu_ps(qi + x);
                mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
                nan = _mm512_add_ps(nan, _mm512_mul_ps(v, _mm512_setzero_ps()));
            }
            const float m = _mm512_reduce_max_ps(mx);
            ok = _mm512_reduce_add_ps(nan) == 0.0f && (m == 0.0f || m >= 0x1p-100f); /* finite, and scalable */
            Q[j] = m > 0.0f ? m * 0x1p-20f : 1.0f;
        }
        if (!ok) {
            memset(out, 0, sizeof(float));
            continue;
        }
        memcpy(out, Q, sizeof(float) * (size_t)(d / group));
        for (int32_t x = 0; x < d; x += 16) {
            const __m512 inv = _mm512_set1_ps(1.0f / Q[x / group]);
            const __m512i n = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(qi + x), inv)); /* |n| <= 2^20 */
            const __m512i c = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(n, k64), k127), k64);
            const __m512i n1 = _mm512_srai_epi32(_mm512_sub_epi32(n, c), 7);
            const __m512i b = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(n1, k64), k127), k64);
            const __m512i a = _mm512_srai_epi32(_mm512_sub_epi32(n1, b), 7);
            const __m512i piece[3] = {a, b, c};
            for (int p = 0; p < 3; p++) {
                uint8_t bytes[16]; /* dims x.. x+15 as evens, odds of column x/8, then of column x/8 + 1 */
                _mm_storeu_si128((__m128i *)bytes, _mm_shuffle_epi8(_mm512_cvtepi32_epi8(piece[p]), eo));
                for (int h = 0; h < 2; h++) memcpy(out + 128 + ((size_t)(x / 8 + h) * 6 + (size_t)p * 2) * 4, bytes + 8 * h, 8);
            }
        }
    }
}

/* QB queries (prep: theirs, at stride apart) over TB blocks of 16 tokens from t0, whose dword columns are
 * cols[b][col] (avx512_chunk_columns), CPG columns per group: each broadcast dword of pieces meets the TB
 * blocks (the load slots, above). The accumulators are reset per group, inside a fully unrolled column
 * loop: carried across a loop that is not unrolled, GCC 12 copies vpdpbusd accumulators back and forth
 * (two zmm moves per instruction). */
AVX512_VNNI_INLINE void avx512_vnni_tile(const int32_t *const *cols, int32_t ncol, const uint8_t *prep,
                                          size_t stride, const float *qsum, const int QB, const int TB, const int CPG,
                                          const float *sc, const float *bc, int32_t ng, int32_t t0, const int32_t *tn,
                                          float *s, size_t lds) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[2][2];
    #pragma GCC unroll 2
    for (int b = 0; b < TB; b++)
        #pragma GCC unroll 2
        for (int i = 0; i < QB; i++) acc[b][i] = _mm512_setzero_ps();
    for (int32_t j = 0; j < ng; j++) /* the biases: Σ_j b_t,j Σq_j */
        #pragma GCC unroll 2
        for (int b = 0; b < TB; b++) {
            const __m512 bcol = _mm512_load_ps(bc + (size_t)j * CPU_BLOCK + t0 + 16 * b);
            #pragma GCC unroll 2
            for (int i = 0; i < QB; i++) acc[b][i] = _mm512_fmadd_ps(bcol, _mm512_set1_ps(qsum[(size_t)i * ng + j]), acc[b][i]);
        }
    for (int32_t k0 = 0, j = 0; k0 < ncol; k0 += CPG, j++) {
        __m512i A[2][2][3];
        #pragma GCC unroll 2
        for (int b = 0; b < TB; b++)
            #pragma GCC unroll 2
            for (int i = 0; i < QB; i++) A[b][i][0] = A[b][i][1] = A[b][i][2] = _mm512_setzero_si512();
        #pragma GCC unroll 16
        for (int k = 0; k < CPG; k++) {
            __m512i lo[2], hi[2];
            #pragma GCC unroll 2
            for (int b = 0; b < TB; b++) {
                __m512i xw = _mm512_load_si512(cols[b] + 16 * (k0 + k));
                __asm__("" : "+v"(xw)); /* one load: GCC would fold it into both the and and the shift */
                lo[b] = _mm512_and_si512(xw, m4), hi[b] = _mm512_and_si512(_mm512_srli_epi32(xw, 4), m4);
            }
            #pragma GCC unroll 2
            for (int i = 0; i < QB; i++) {
                const int32_t *qp = (const int32_t *)(prep + (size_t)i * stride + 128) + (size_t)(k0 + k) * 6;
                #pragma GCC unroll 3
                for (int p = 0; p < 3; p++) {
                    const __m512i wl = _mm512_set1_epi32(qp[2 * p]), wh = _mm512_set1_epi32(qp[2 * p + 1]);
                    #pragma GCC unroll 2
                    for (int b = 0; b < TB; b++) {
                        A[b][i][p] = _mm512_dpbusd_epi32(A[b][i][p], lo[b], wl);
                        A[b][i][p] = _mm512_dpbusd_epi32(A[b][i][p], hi[b], wh);
                    }
                }
            }
        }
        #pragma GCC unroll 2
        for (int b = 0; b < TB; b++) {
            const __m512 scol = _mm512_load_ps(sc + (size_t)j * CPU_BLOCK + t0 + 16 * b);
            #pragma GCC unroll 2
            for (int i = 0; i < QB; i++) {
                const __m512i ab = _mm512_add_epi32(_mm512_slli_epi32(A[b][i][0], 14), _mm512_slli_epi32(A[b][i][1], 7));
                const __m512 sq = _mm512_mul_ps(scol, _mm512_set1_ps(((const float *)(prep + (size_t)i * stride))[j]));
                acc[b][i] = _mm512_fmadd_ps(sq, _mm512_cvtepi32_ps(_mm512_add_epi32(ab, A[b][i][2])), acc[b][i]);
            }
        }
    }
    #pragma GCC unroll 2
    for (int b = 0; b < TB; b++)
        #pragma GCC unroll 2
        for (int i = 0; i < QB; i++) _mm512_mask_storeu_ps(s + (size_t)i * lds + t0 + 16 * b, avx512_mask(tn[b]), acc[b][i]);
}

/* nq queries, CPG dword columns per group (g = 8·CPG <= 128): 32 tokens at a time, their rows transposed
 * once for all the queries, which then go two at a time. */
AVX512_VNNI_INLINE void avx512_score_q4_vnni(const cpu_rows *r, int32_t d, const void *prep_, const float *qsum,
                                             int32_t nq, const int CPG, const float *sc, const float *bc, int32_t ng,
                                             float *s, size_t lds) {
    const int32_t rb = d / 2, ncol = rb / 4, n = r->n;
    const size_t stride = CPU_Q4_PREP_STRIDE(d);
    const uint8_t *prep = prep_;
    int32_t cols_buf[2][AVX512_MAX_D / 8][16] __attribute__((aligned(64)));
    cpu_prefetch_walk pw;
    cpu_prefetch_start(&pw, r->pf, (n + 15) / 16);
    for (int32_t t0 = 0; t0 < n; t0 += 32) {
        int32_t tn[2] = {0, 0};
        const int32_t *cols[2] = {NULL, NULL};
        const int TB = n - t0 > 16 ? 2 : 1;
        for (int b = 0; b < TB; b++) {
            const int32_t tb = t0 + 16 * b;
            tn[b] = n - tb < 16 ? n - tb : 16;
            cpu_prefetch_step(&pw);
            cols[b] = avx512_key_columns(r, tb, tn[b], ncol, cols_buf[b]);
        }
        for (int32_t i0 = 0; i0 < nq; i0 += 2) {
            const uint8_t *pi = prep + (size_t)i0 * stride;
            const float *qi = qsum + (size_t)i0 * ng;
            float *si = s + (size_t)i0 * lds;
            if (nq - i0 >= 2 && TB == 2) avx512_vnni_tile(cols, ncol, pi, stride, qi, 2, 2, CPG, sc, bc, ng, t0, tn, si, lds);
            else if (nq - i0 >= 2) avx512_vnni_tile(cols, ncol, pi, stride, qi, 2, 1, CPG, sc, bc, ng, t0, tn, si, lds);
            else if (TB == 2) avx512_vnni_tile(cols, ncol, pi, stride, qi, 1, 2, CPG, sc, bc, ng, t0, tn, si, lds);
            else avx512_vnni_tile(cols, ncol, pi, stride, qi, 1, 1, CPG, sc, bc, ng, t0, tn, si, lds);
        }
    }
}

AVX512_VNNI_FN static void avx512_score_rows_q4_vnni(const cpu_rows *r, int32_t d, const float *q, size_t ldq,
                                                     const float *qsum, const void *prep, int32_t nq, float *s, size_t lds) {
    const int32_t g = r->group, ng = d / g;
    /* not prepared (or a query q4_prep left to fp32): the FMA kernels */
    if (!(qsum && (g == 32 || g == 64 || g == 128) && cpu_q4_prepared(prep, nq, d))) {
        avx512_score_rows_q4(r, d, q, ldq, qsum, NULL, nq, s, lds);
        return;
    }
    float sc[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    float bc[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    avx512_sb_columns(r, ng, sc, bc);
    switch (g) { /* the columns per group as a constant, so the group's loop unrolls */
    case 32: avx512_score_q4_vnni(r, d, prep, qsum, nq, 4, sc, bc, ng, s, lds); break;
    case 64: avx512_score_q4_vnni(r, d, prep, qsum, nq, 8, sc, bc, ng, s, lds); break;
    default: avx512_score_q4_vnni(r, d, prep, qsum, nq, 16, sc, bc, ng, s, lds); break;
    }
}

CPU_ROW_ENTRIES(avx512, AVX512_FN, f32, CPU_ENC_F32)
CPU_ROW_ENTRIES(avx512, AVX512_FN, f16, CPU_ENC_F16)
CPU_ROW_ENTRIES(avx512, AVX512_FN, q8, CPU_ENC_Q8)
CPU_ACCUM_ENTRY(avx512, AVX512_FN, q4, CPU_ENC_Q4) /* scores: avx512_score_rows_q4 above */
CPU_ROW_ENTRIES(avx512, AVX512_FN, q2, CPU_ENC_Q2)

/* ---- KIVI keys (per channel): tokens in lanes, 32 tokens per piece ---- */

/* Raw codes (no scale) of 32 tokens of one channel, in the 2-/4-bit slab lane order. */
AVX512_INLINE void avx512_chan_codes(const uint8_t *c, const int bits, __m512 *a, __m512 *b) {
    if (bits == 4) {
        const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)c));
        *a = _mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(15)));
        *b = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4));
    } else {
        const __m256i y = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)c));
        const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(y), y, 1), m3 = _mm512_set1_epi32(3);
        *a = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(z, _mm512_loadu_si512(avx512_q2_shift_a)), m3));
        *b = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(z, _mm512_loadu_si512(avx512_q2_shift_b)), m3));
    }
}

AVX512_INLINE void avx512_score_chan_core(const cpu_chan *ch, int32_t d, const float *q, size_t ldq, const int NQ,
                                          const int bits, float *s, size_t lds) {
    const size_t cbytes = (size_t)ch->g * bits / 8;
    float qs[AVX512_MAX_NQ * AVX512_MAX_D] __attribute__((aligned(64)));
    float sv[AVX512_MAX_D] __attribute__((aligned(64))), bv[AVX512_MAX_D] __attribute__((aligned(64)));
    float qb[AVX512_MAX_NQ];
    avx512_halves(ch->scale, d, sv);
    avx512_halves(ch->bias, d, bv);
    #pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) { /* q'_c = q_c s_c, and Σ_c q_c b_c */
        __m512 dot = _mm512_setzero_ps();
        for (int32_t c = 0; c < d; c += 16) {
            const __mmask16 m = avx512_mask(d - c);
            const __m512 qv = _mm512_maskz_loadu_ps(m, q + (size_t)i * ldq + c);
            _mm512_mask_storeu_ps(qs + (size_t)i * d + c, m, _mm512_mul_ps(qv, _mm512_maskz_loadu_ps(m, sv + c)));
            dot = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, bv + c), dot);
        }
        qb[i] = _mm512_reduce_add_ps(dot);
    }
    const __m512i ia = _mm512_loadu_si512(bits == 4 ? avx512_inv_q4 : avx512_inv_q2);
    const __m512i ib = _mm512_loadu_si512((bits == 4 ? avx512_inv_q4 : avx512_inv_q2) + 16);
    for (int32_t p0 = 0; p0 < ch->g; p0 += 32) {
        __m512 acc_a[AVX512_MAX_NQ], acc_b[AVX512_MAX_NQ];
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) acc_a[i] = acc_b[i] = _mm512_setzero_ps();
        const uint8_t *codes = ch->codes + (size_t)p0 * bits / 8;
        for (int32_t c = 0; c < d; c++) {
            __m512 a, b;
            avx512_chan_codes(codes + (size_t)c * cbytes, bits, &a, &b);
            #pragma GCC unroll 8
            for (int i = 0; i < NQ; i++) {
                const __m512 w = _mm512_set1_ps(qs[(size_t)i * d + c]);
                acc_a[i] = _mm512_fmadd_ps(a, w, acc_a[i]);
                acc_b[i] = _mm512_fmadd_ps(b, w, acc_b[i]);
            }
        }
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) {
            const __m512 bias = _mm512_set1_ps(qb[i]);
            float *si = s + (size_t)i * lds + p0;
            _mm512_storeu_ps(si, _mm512_add_ps(_mm512_permutex2var_ps(acc_a[i], ia, acc_b[i]), bias));
            _mm512_storeu_ps(si + 16, _mm512_add_ps(_mm512_permutex2var_ps(acc_a[i], ib, acc_b[i]), bias));
        }
    }
}

AVX512_INLINE void avx512_accum_chan_core(const cpu_chan *ch, int32_t dv, const float *p, size_t ldp, const int NQ,
                                          const int bits, float *o, size_t ldo) {
    const size_t cbytes = (size_t)ch->g * bits / 8;
    const int32_t npieces = ch->g / 32;
    /* p in the codes' token order, per piece; Σ_t p_t */
    float pp[AVX512_MAX_NQ][CPU_BLOCK] __attribute__((aligned(64)));
    float psum[AVX512_MAX_NQ];
    const __m512i pa = _mm512_loadu_si512(bits == 4 ? avx512_perm_q4 : avx512_perm_q2);
    const __m512i pb = _mm512_loadu_si512((bits == 4 ? avx512_perm_q4 : avx512_perm_q2) + 16);
    #pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) {
        __m512 sum = _mm512_setzero_ps();
        for (int32_t p0 = 0; p0 < ch->g; p0 += 32) {
            const __m512 lo = _mm512_loadu_ps(p + (size_t)i * ldp + p0), hi = _mm512_loadu_ps(p + (size_t)i * ldp + p0 + 16);
            _mm512_storeu_ps(pp[i] + p0, _mm512_permutex2var_ps(lo, pa, hi));
            _mm512_storeu_ps(pp[i] + p0 + 16, _mm512_permutex2var_ps(lo, pb, hi));
            sum = _mm512_add_ps(sum, _mm512_add_ps(lo, hi));
        }
        psum[i] = _mm512_reduce_add_ps(sum);
    }
    __m512 buf[AVX512_MAX_NQ][16];
    for (int32_t c0 = 0; c0 < dv; c0 += 16) {
        const int32_t cn = dv - c0 < 16 ? dv - c0 : 16;
        for (int32_t cc = 0; cc < 16; cc++) {
            if (cc >= cn) {
                #pragma GCC unroll 8
                for (int i = 0; i < NQ; i++) buf[i][cc] = _mm512_setzero_ps();
                continue;
            }
            __m512 acc[AVX512_MAX_NQ];
            #pragma GCC unroll 8
            for (int i = 0; i < NQ; i++) acc[i] = _mm512_setzero_ps();
            for (int32_t pi = 0; pi < npieces; pi++) {
                __m512 a, b;
                avx512_chan_codes(ch->codes + (size_t)(c0 + cc) * cbytes + (size_t)pi * 32 * bits / 8, bits, &a, &b);
                #pragma GCC unroll 8
                for (int i = 0; i < NQ; i++) {
                    acc[i] = _mm512_fmadd_ps(a, _mm512_loadu_ps(pp[i] + pi * 32), acc[i]);
                    acc[i] = _mm512_fmadd_ps(b, _mm512_loadu_ps(pp[i] + pi * 32 + 16), acc[i]);
                }
            }
            #pragma GCC unroll 8
            for (int i = 0; i < NQ; i++) buf[i][cc] = acc[i];
        }
        const __mmask16 m = avx512_mask(cn);
        const __m512 sv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, ch->scale + c0));
        const __m512 bv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, ch->bias + c0));
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) {
            float *oc = o + (size_t)i * ldo + c0;
            const __m512 add = _mm512_fmadd_ps(sv, avx512_hsum16(buf[i]), _mm512_mul_ps(bv, _mm512_set1_ps(psum[i])));
            _mm512_mask_storeu_ps(oc, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, oc), add));
        }
    }
}

AVX512_FN static void avx512_score_chan(const cpu_chan *ch, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                        size_t lds) {
    for (int32_t i0 = 0; i0 < nq;) {
        const int32_t left = nq - i0, nc = left >= 8 ? 8 : left >= 4 ? 4 : left;
        const float *qi = q + (size_t)i0 * ldq;
        float *si = s + (size_t)i0 * lds;
#define AVX512_SCORE_CHAN(N)                                                                                          \
    (ch->bits == 4 ? avx512_score_chan_core(ch, d, qi, ldq, N, 4, si, lds)                                           \
                   : avx512_score_chan_core(ch, d, qi, ldq, N, 2, si, lds))
        CPU_BY_NQ8(AVX512_SCORE_CHAN, nc)
#undef AVX512_SCORE_CHAN
        i0 += nc;
    }
}

AVX512_FN static void avx512_accum_chan(const cpu_chan *ch, int32_t dv, const float *p, size_t ldp, int32_t nq, float *o,
                                        size_t ldo) {
    for (int32_t i0 = 0; i0 < nq;) {
        const int32_t left = nq - i0, nc = left >= 8 ? 8 : left >= 4 ? 4 : left;
        const float *pi = p + (size_t)i0 * ldp;
        float *oi = o + (size_t)i0 * ldo;
#define AVX512_ACCUM_CHAN(N)                                                                                          \
    (ch->bits == 4 ? avx512_accum_chan_core(ch, dv, pi, ldp, N, 4, oi, ldo)                                          \
                   : avx512_accum_chan_core(ch, dv, pi, ldp, N, 2, oi, ldo))
        CPU_BY_NQ8(AVX512_ACCUM_CHAN, nc)
#undef AVX512_ACCUM_CHAN
        i0 += nc;
    }
}

/* ---- exp_sum: e^x = 2^n e^r, n = round(x log2 e), |r| <= ln2/2, degree-5 polynomial (CPU_EXP_C*), 1.5e-7 ---- */

AVX512_INLINE __m512 avx512_exp(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-110.0f)); /* -inf and anything below e^-104 give exactly 0 */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(CPU_EXP_C5), r, _mm512_set1_ps(CPU_EXP_C4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(CPU_EXP_C3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(CPU_EXP_C2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(CPU_EXP_C1));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
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
    k->score_rows[CPU_ENC_F32] = avx512_score_rows_f32;
    k->score_rows[CPU_ENC_F16] = avx512_score_rows_f16;
    k->score_rows[CPU_ENC_Q8] = avx512_score_rows_q8;
    k->score_rows[CPU_ENC_Q4] = avx512_score_rows_q4;
    k->score_rows[CPU_ENC_Q2] = avx512_score_rows_q2;
    k->accum_rows[CPU_ENC_F32] = avx512_accum_rows_f32;
    k->accum_rows[CPU_ENC_F16] = avx512_accum_rows_f16;
    k->accum_rows[CPU_ENC_Q8] = avx512_accum_rows_q8;
    k->accum_rows[CPU_ENC_Q4] = avx512_accum_rows_q4;
    k->accum_rows[CPU_ENC_Q2] = avx512_accum_rows_q2;
    k->score_chan = avx512_score_chan;
    k->accum_chan = avx512_accum_chan;
    k->max = avx512_max;
    k->exp_sum = avx512_exp_sum;
    k->dequant_row = avx512_dequant_row;
    k->spreads_prefetch = 1;
    if (__builtin_cpu_supports("avx512vnni")) {
        k->score_rows[CPU_ENC_Q4] = avx512_score_rows_q4_vnni;
        k->q4_prep = avx512_q4_prep;
        k->values_take_hint[CPU_ENC_Q4] = 1; /* paced by load slots: attend.c, prefetch_now */
    }
}
#endif
