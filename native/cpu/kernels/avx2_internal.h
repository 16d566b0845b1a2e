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

/* Each file's entries of the table (cpu_kernels_fill_avx2, avx2.c, calls them in this order). */
void avx2_fill_scores(cpu_kernels *k); /* avx2_scores.c: score_rows of f32, f16, q8, q2 */
void avx2_fill_values(cpu_kernels *k); /* avx2_values.c: accum_rows */
void avx2_fill_q4(cpu_kernels *k);     /* avx2_q4.c: score_rows of q4 (+ q4_prep with AVX-VNNI) */
void avx2_fill_kivi(cpu_kernels *k);   /* avx2_kivi.c: score_chan, accum_chan */

#endif
#endif
