/*
 * avx512_kivi.c: score_chan and accum_chan of the AVX-512 table: KIVI key groups (quantized per
 * channel), tokens in lanes, 32 tokens per piece. See avx512.c.
 */
#include "avx512_internal.h"

#if defined(__x86_64__)

/* ---- KIVI keys (per channel): tokens in lanes, 32 tokens per piece ---- */

/* Raw codes (no scale) of 32 tokens of one channel, in the 4- or 2-bit slab lane order (avx512_perm_q4/q2). */
AVX512_INLINE void avx512_chan_codes(const uint8_t *c, const int bits, __m512 *a, __m512 *b) {
    if (bits == 4) avx512_slab_table(c, 0, CPU_ENC_Q4, _mm512_loadu_ps(avx512_lut4_codes), a, b);
    else avx512_slab_table(c, 0, CPU_ENC_Q2, _mm512_loadu_ps(avx512_lut2_codes), a, b);
}

AVX512_INLINE void avx512_score_chan_core(const cpu_chan *ch, int32_t d, const float *q, size_t ldq, const int NQ,
                                          const int bits, float *s, size_t lds, const cpu_prefetch *pf) {
    cpu_prefetch_walk pw; /* a slice every 16 channels (see avx512_accum_core) */
    cpu_prefetch_start(&pw, pf, (ch->g + 31) / 32 * ((d + 15) / 16));
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
    const __m512i ia = _mm512_loadu_si512(bits == 4 ? avx512_inv_q4 : avx512_inv_q2p);
    const __m512i ib = _mm512_loadu_si512((bits == 4 ? avx512_inv_q4 : avx512_inv_q2p) + 16);
    const __m512 unit = _mm512_set1_ps(1.0f / cpu_pair_k(bits));
    for (int32_t p0 = 0; p0 < ch->g; p0 += 32) {
        __m512 acc_a[AVX512_MAX_NQ], acc_b[AVX512_MAX_NQ];
        #pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) acc_a[i] = acc_b[i] = _mm512_setzero_ps();
        const uint8_t *codes = ch->codes + (size_t)p0 * bits / 8;
        for (int32_t c = 0; c < d; c++) {
            if ((c & 15) == 0) cpu_prefetch_step(&pw);
            __m512 a, b; /* b: the pairs whole (avx512_pair_codes) */
            avx512_pair_codes(codes + (size_t)c * cbytes, bits, &a, &b);
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
            const __m512 hi = _mm512_mul_ps(_mm512_sub_ps(acc_b[i], acc_a[i]), unit); /* Σ q' hi = (Σ q' pair - Σ q' lo) / K */
            float *si = s + (size_t)i * lds + p0;
            _mm512_storeu_ps(si, _mm512_add_ps(_mm512_permutex2var_ps(acc_a[i], ia, hi), bias));
            _mm512_storeu_ps(si + 16, _mm512_add_ps(_mm512_permutex2var_ps(acc_a[i], ib, hi), bias));
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
    (ch->bits == 4 ? avx512_score_chan_core(ch, d, qi, ldq, N, 4, si, lds, i0 ? NULL : ch->pf)                       \
                   : avx512_score_chan_core(ch, d, qi, ldq, N, 2, si, lds, i0 ? NULL : ch->pf))
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

void avx512_fill_kivi(cpu_kernels *k) {
    k->score_chan = avx512_score_chan;
    k->accum_chan = avx512_accum_chan;
}
#endif
