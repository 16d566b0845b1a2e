/*
 * avx2_internal.h: what the AVX2 kernel files (avx2*.c) share: the target attributes, the slab lane orders,
 * slab decoding, horizontal sums, and the parts of the kernel table each file fills. The scheme is
 * described in avx2.c. Everything here is static inline (or a declaration), so that each file compiles on
 * its own (CMake) and all of them together in one translation unit (bridge/gokv_unity.c).
 */
#ifndef GOKV_CPU_AVX2_INTERNAL_H
#define GOKV_CPU_AVX2_INTERNAL_H

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
/* 2-bit table: vpermps reads the low 3 bits of each index, a code shifted down to bits 0-1 and the next
 * code's low bit in bit 2, so the table repeats and decodes the code with no mask and no conversion. */
static const float avx2_lut2_codes[8] = {0, 1, 2, 3, 0, 1, 2, 3};

/* The way back to element order: element e (e < 8 in the first output, e - 8 in the second) sits at lane
 * back[e] of a or of b, b where the encoding's blend mask (avx2_unpermute) has bit e % 8: back[e] is
 * perm's inverse, modulo 8. */
static const int32_t avx2_back_q4[16] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
static const int32_t avx2_back_q2[16] = {0, 4, 0, 4, 1, 5, 1, 5, 2, 6, 2, 6, 3, 7, 3, 7};

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

/* The 16 2-bit codes of the 4 bytes at c, raw, in the 2-bit slab lane order: the bytes are broadcast by the
 * load itself (a memcpy'd word would go through a general register), each lane shifts its code down and
 * the table turns it into a float, one shuffle instead of a mask and a conversion on the FMA ports. */
AVX2_INLINE void avx2_q2_codes(const uint8_t *c, __m256 *a, __m256 *b) {
    const __m256i z = _mm256_broadcastd_epi32(_mm_loadu_si32(c));
    const __m256 lut = _mm256_loadu_ps(avx2_lut2_codes);
    *a = _mm256_permutevar8x32_ps(lut, _mm256_srlv_epi32(z, _mm256_loadu_si256((const __m256i *)avx2_q2_shift_a)));
    *b = _mm256_permutevar8x32_ps(lut, _mm256_srlv_epi32(z, _mm256_loadu_si256((const __m256i *)avx2_q2_shift_b)));
}

/* Slab k of a quantized row as its raw codes (no scale, no bias), in the encoding's lane order: the values
 * kernel folds the scale into the weights and adds the bias once per group (avx2_values.c). */
AVX2_INLINE void avx2_slab_codes(const uint8_t *row, int32_t k, const int enc, __m256 *a, __m256 *b) {
    if (enc == CPU_ENC_Q8) {
        *a = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + (size_t)k * 16))));
        *b = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + (size_t)k * 16 + 8))));
    } else if (enc == CPU_ENC_Q4) {
        const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + (size_t)k * 8)));
        *a = _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(15)));
        *b = _mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4));
    } else {
        avx2_q2_codes(row + (size_t)k * 4, a, b);
    }
}

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
    default: { /* the raw codes, then code·s + b */
        const __m256 s = _mm256_broadcast_ss(sp), bias = _mm256_broadcast_ss(bp);
        avx2_slab_codes(row, k, enc, a, b);
        *a = _mm256_fmadd_ps(*a, s, bias);
        *b = _mm256_fmadd_ps(*b, s, bias);
        return;
    }
    }
}

/* A slab's two vectors (a, b) in the encoding's lane order back in element order (lo: elements 0..7, hi:
 * 8..15): two permutes and a blend each, where storing the lanes one by one took 16 scalar stores and their
 * reloads (q4 values and KIVI keys 1.1x faster). */
AVX2_INLINE void avx2_unpermute(const int enc, __m256 a, __m256 b, __m256 *lo, __m256 *hi) {
    if (enc != CPU_ENC_Q4 && enc != CPU_ENC_Q2) {
        *lo = a, *hi = b;
        return;
    }
    const int32_t *back = enc == CPU_ENC_Q4 ? avx2_back_q4 : avx2_back_q2;
    const __m256i il = _mm256_loadu_si256((const __m256i *)back), ih = _mm256_loadu_si256((const __m256i *)(back + 8));
    if (enc == CPU_ENC_Q4) { /* odd elements from b */
        *lo = _mm256_blend_ps(_mm256_permutevar8x32_ps(a, il), _mm256_permutevar8x32_ps(b, il), 0xAA);
        *hi = _mm256_blend_ps(_mm256_permutevar8x32_ps(a, ih), _mm256_permutevar8x32_ps(b, ih), 0xAA);
    } else { /* elements 4j+2 and 4j+3 from b */
        *lo = _mm256_blend_ps(_mm256_permutevar8x32_ps(a, il), _mm256_permutevar8x32_ps(b, il), 0xCC);
        *hi = _mm256_blend_ps(_mm256_permutevar8x32_ps(a, ih), _mm256_permutevar8x32_ps(b, ih), 0xCC);
    }
}

/* r[t] = Σ_lanes v[t] for 8 vectors. */
AVX2_INLINE __m256 avx2_hsum8(const __m256 *v) {
    const __m256 h01 = _mm256_hadd_ps(v[0], v[1]), h23 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 h45 = _mm256_hadd_ps(v[4], v[5]), h67 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

static inline void avx2_store_partial(float *dst, const float *src, int32_t n) {
    for (int32_t i = 0; i < n; i++) dst[i] = src[i];
}

AVX2_INLINE float avx2_reduce(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* ---- what crosses files ---- */

/* q4 keys by the row kernel (avx2_scores.c), where the lanes kernel of avx2_q4.c cannot run. */
AVX2_FN void avx2_score_rows_q4_slabs(const cpu_rows *r, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                      size_t lds);
/* q8 keys by the row kernel (avx2_scores.c), for the AVX-VNNI kernel's calls it cannot take. */
AVX2_FN void avx2_score_rows_q8_fma(const cpu_rows *r, int32_t d, const float *q, size_t ldq, int32_t nq, float *s,
                                    size_t lds);

/* Each file's entries of the table (cpu_kernels_fill_avx2, avx2.c, calls them in this order). */
void avx2_fill_scores(cpu_kernels *k); /* avx2_scores.c: score_rows of f32, f16, q8, q2 */
void avx2_fill_values(cpu_kernels *k); /* avx2_values.c: accum_rows */
void avx2_fill_q4(cpu_kernels *k);     /* avx2_q4.c: score_rows of q4 (and q8, with query_prep, under AVX-VNNI) */
void avx2_fill_kivi(cpu_kernels *k);   /* avx2_kivi.c: score_chan, accum_chan */

#endif
#endif
