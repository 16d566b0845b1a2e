/*
 * avx2_kivi.c: score_chan and accum_chan of the AVX2 table: KIVI key groups (quantized per
 * channel), tokens in lanes, 16 tokens per piece. See avx2.c.
 */
#include "avx2_internal.h"

#if defined(__x86_64__)

/* ---- KIVI keys (per channel): tokens in lanes, 16 tokens per piece ---- */

/* Raw codes of 16 tokens of one channel, in the 2-/4-bit slab lane order (the bytes of one row's slab). */
AVX2_INLINE void avx2_chan_codes(const uint8_t *c, const int bits, __m256 *a, __m256 *b) {
    avx2_slab_codes(c, 0, bits == 4 ? CPU_ENC_Q4 : CPU_ENC_Q2, a, b);
}

AVX2_INLINE void avx2_score_chan_core(const cpu_chan *ch, int32_t d, const float *q, size_t ldq, const int NQ,
                                      const int bits, float *s, size_t lds, const cpu_prefetch *pf) {
    cpu_prefetch_walk pw; /* a slice every 32 channels (16 made kivi2 3% slower here) */
    cpu_prefetch_start(&pw, pf, (ch->g + 15) / 16 * ((d + 31) / 32));
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
    for (int32_t p0 = 0; p0 < ch->g; p0 += 16) {
        __m256 acc_a[AVX2_MAX_NQ], acc_b[AVX2_MAX_NQ];
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) acc_a[i] = acc_b[i] = _mm256_setzero_ps();
        const uint8_t *codes = ch->codes + (size_t)p0 * bits / 8;
        for (int32_t c = 0; c < d; c++) {
            if ((c & 31) == 0) cpu_prefetch_step(&pw);
            __m256 a, b;
            avx2_chan_codes(codes + (size_t)c * cbytes, bits, &a, &b);
#pragma GCC unroll 4
            for (int i = 0; i < NQ; i++) {
                const __m256 w = _mm256_broadcast_ss(qs + (size_t)i * d + c);
                acc_a[i] = _mm256_fmadd_ps(a, w, acc_a[i]);
                acc_b[i] = _mm256_fmadd_ps(b, w, acc_b[i]);
            }
        }
        /* unrolled: with i a variable, the accumulators lived on the stack, stored at every channel (KIVI keys
         * 1.30x faster without) */
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) {
            __m256 lo, hi;
            avx2_unpermute(bits == 4 ? CPU_ENC_Q4 : CPU_ENC_Q2, acc_a[i], acc_b[i], &lo, &hi);
            const __m256 qbi = _mm256_set1_ps(qb[i]);
            float *si = s + (size_t)i * lds + p0;
            _mm256_storeu_ps(si, _mm256_add_ps(lo, qbi));
            _mm256_storeu_ps(si + 8, _mm256_add_ps(hi, qbi));
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
    (ch->bits == 4 ? avx2_score_chan_core(ch, d, qi, ldq, N, 4, si, lds, i0 ? NULL : ch->pf)                         \
                   : avx2_score_chan_core(ch, d, qi, ldq, N, 2, si, lds, i0 ? NULL : ch->pf))
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

void avx2_fill_kivi(cpu_kernels *k) {
    k->score_chan = avx2_score_chan;
    k->accum_chan = avx2_accum_chan;
}
#endif
