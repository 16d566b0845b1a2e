/*
 * avx512_internal.h: what the AVX-512 kernel files (avx512*.c) share: the target attributes, the slab lane
 * orders and their tables, slab decoding, horizontal sums, the block's scale and bias columns, and the
 * parts of the kernel table each file fills. The scheme is described in avx512.c. Everything here is
 * static inline (or a declaration), so that each file compiles on its own (CMake) and all of them together
 * in one translation unit (bridge/gokv_unity.c).
 */
#ifndef GOKV_CPU_AVX512_INTERNAL_H
#define GOKV_CPU_AVX512_INTERNAL_H

#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline)) AVX512_FN

enum { AVX512_SLAB = 32, AVX512_MAX_D = 1024, AVX512_MAX_NG = 32, AVX512_MAX_NQ = 8 };

/* Slab lane order: position j holds element perm[j]; inv[c] is the position of element c. 4-bit: the even
 * elements in a, the odd ones in b. 2-bit: the slab's 8 bytes are broadcast to every 64-bit lane by the load
 * itself, and each dword lane shifts its own code down (avx512_slab_table): lane j of a holds element
 * 16(j&1) + (j>>1), of b element 16(j&1) + 8 + (j>>1). */
static const int32_t avx512_perm_q4[32] = {0, 2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                           1, 3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
static const int32_t avx512_inv_q4[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                          8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
static const int32_t avx512_perm_q2[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                           8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
static const int32_t avx512_inv_q2[32] = {0, 2, 4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                          1, 3, 5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
static const int32_t avx512_iota[32] = {0, 1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                        16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
/* 2-bit table: entry e decodes the code in its low two bits (the next code sits in bits 2-3). */
static const float avx512_lut2_codes[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
static const float avx512_lut4_codes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
/* The shift of each dword lane's 2-bit code: a's, then b's (avx512_slab_table). */
static const uint32_t avx512_q2_shift[32] = {0,  0,  2,  2,  4,  4,  6,  6,  8,  8,  10, 10, 12, 12, 14, 14,
                                             16, 16, 18, 18, 20, 20, 22, 22, 24, 24, 26, 26, 28, 28, 30, 30};

/* 2-bit pairs (avx512_pair_codes): dword lane j, shifted down by avx512_q2_pair_shift[j], holds the pair of
 * codes 8(j&1) + (j>>1), elements 2·pair (lane j of a) and 2·pair + 1 (lane j of b). This order is its own
 * inverse: position p of a, b holds element avx512_inv_q2p[p], and element e sits at position inv[e]. */
static const int32_t avx512_inv_q2p[32] = {0, 16, 2, 18, 4,  20, 6,  22, 8,  24, 10, 26, 12, 28, 14, 30,
                                           1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
static const uint32_t avx512_q2_pair_shift[16] = {0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28};

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
 * a code needs no mask: the 2-bit table ignores the next code in bits 2-3). 2-bit: the broadcast load and a
 * variable shift per half, where widening the bytes first took two shuffles more on the permutes' port
 * (KIVI keys 1.25x, 2-bit values 1.14x faster on a cached block). 4-bit: the same broadcast form measured no
 * faster than widening (one shuffle either way), so the bytes are widened. */
AVX512_INLINE void avx512_slab_table(const uint8_t *row, int32_t k, const int enc, __m512 lut, __m512 *a, __m512 *b) {
    if (enc == CPU_ENC_Q4) {
        const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + (size_t)k * 16)));
        *a = _mm512_permutexvar_ps(x, lut);
        *b = _mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), lut);
    } else {
        const __m512i x = _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(row + (size_t)k * 8)));
        *a = _mm512_permutexvar_ps(_mm512_srlv_epi32(x, _mm512_loadu_si512(avx512_q2_shift)), lut);
        *b = _mm512_permutexvar_ps(_mm512_srlv_epi32(x, _mm512_loadu_si512(avx512_q2_shift + 16)), lut);
    }
}

/* Codes of a 4- or 2-bit slab (8 bytes at c for 2-bit, 16 for 4-bit) for kernels that accumulate Σ w·code over
 * tokens or channels: a holds the even elements' codes, b each pair's byte value (2-bit: lo + 4 hi; 4-bit: the
 * whole byte, lo + 16 hi) instead of the odd elements' codes; the caller recovers Σ w hi = (Σ w b - Σ w a) / K
 * (K = 4 or 16) once. One shift and two table permutes (2-bit), a widening, a permute and a conversion (4-bit),
 * where the odd codes took a shift and a permute more. Lane orders: avx512_inv_q2p, avx512_perm_q4; the 2-bit
 * pair's value comes from the 4-bit table (entry e is e). */
AVX512_INLINE void avx512_pair_codes(const uint8_t *c, const int bits, __m512 *a, __m512 *b) {
    if (bits == 4) {
        const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)c));
        *a = _mm512_permutexvar_ps(x, _mm512_loadu_ps(avx512_lut4_codes));
        *b = _mm512_cvtepi32_ps(x);
    } else {
        const __m512i x = _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)c));
        const __m512i y = _mm512_srlv_epi32(x, _mm512_loadu_si512(avx512_q2_pair_shift));
        *a = _mm512_permutexvar_ps(y, _mm512_loadu_ps(avx512_lut2_codes));
        *b = _mm512_permutexvar_ps(y, _mm512_loadu_ps(avx512_lut4_codes));
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

/* ---- what crosses files ---- */

/* q4 keys by the row kernel (avx512_scores.c), for the lanes kernel's callers without group sums. */
AVX512_FN void avx512_score_rows_q4_slabs(const cpu_rows *r, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                          size_t lds);
/* q8 keys by the row kernel (avx512_scores.c), for the VNNI kernel's calls it cannot take. */
AVX512_FN void avx512_score_rows_q8_fma(const cpu_rows *r, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                        size_t lds);

/* Each file's entries of the table (cpu_kernels_fill_avx512, avx512.c, calls them in this order). */
void avx512_fill_scores(cpu_kernels *k); /* avx512_scores.c: score_rows of f32, f16, q8, q2 */
void avx512_fill_values(cpu_kernels *k); /* avx512_values.c: accum_rows */
void avx512_fill_q4(cpu_kernels *k);     /* avx512_q4.c: score_rows of q4 (and q8, with query_prep, under VNNI) */
void avx512_fill_kivi(cpu_kernels *k);   /* avx512_kivi.c: score_chan, accum_chan */

#endif
#endif
