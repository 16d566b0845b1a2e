/*
 * avx2_q4.c: score_rows of the AVX2 table for q4 keys: 8 tokens in lanes (FMA), or through
 * AVX-VNNI against the query cut into int8 pieces (query_prep) where the CPU and the compiler have it. See
 * avx2.c and avx512.c.
 */
#include "avx2_internal.h"

#if defined(__x86_64__)

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
        avx2_score_rows_q4_slabs(r, d, q, ldq, nq, s, lds);
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
 * per key group (avx512_q4_prep's layout), the 4-bit codes as the unsigned operand, tokens in lanes (8
 * rows transposed as dwords, so a dword column holds dims 8c..8c+7 of 8 tokens), and per group and query
 * the three piece sums combined exactly in int32, converted once and met with the scale column. With 16 ymm
 * registers a query is done at a time over 16 tokens (two blocks of 8, which share each broadcast piece);
 * a column's low and high nibbles are split once, when the columns are built, for all the queries. */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define AVX2_HAVE_VNNI 1 /* compilers that know AVX-VNNI (GCC 11, clang 12); older ones keep the FMA kernels */
#define AVX2_VNNI_FN __attribute__((target("avx2,fma,f16c,avxvnni")))
#define AVX2_VNNI_INLINE static inline __attribute__((always_inline)) AVX2_VNNI_FN

/* The q4 and q8 query_prep: avx512_q4_prep's and avx512_q8_prep's pieces and layouts in plain C (once per call and
 * query, off the hot path). */
static void avx2_prep_pieces(const float *q, size_t ldq, int32_t nq, int32_t d, int32_t group, void *prep, int q8) {
    for (int32_t i = 0; i < nq; i++) {
        const float *qi = q + (size_t)i * ldq;
        uint8_t *out = (uint8_t *)prep + (size_t)i * CPU_PREP_STRIDE(d);
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
            for (int p = 0; p < 3; p++) /* q4: dword 6·col + 2p: the even dims' int8s, + 1: the odd ones'; q8: 3·col + p */
                if (q8) out[128 + ((size_t)(x / 4) * 3 + (size_t)p) * 4 + (size_t)(x % 4)] = (uint8_t)piece[p];
                else out[128 + ((size_t)(x / 8) * 6 + (size_t)p * 2 + (size_t)(x & 1)) * 4 + (size_t)(x % 8) / 2] = (uint8_t)piece[p];
        }
    }
}

static void avx2_q4_prep(const float *q, size_t ldq, int32_t nq, int32_t d, int32_t group, void *prep) {
    avx2_prep_pieces(q, ldq, nq, d, group, prep, 0);
}
static void avx2_q8_prep(const float *q, size_t ldq, int32_t nq, int32_t d, int32_t group, void *prep) {
    avx2_prep_pieces(q, ldq, nq, d, group, prep, 1);
}

/* One query (pieces qp, group scales Q, group sums qs) over TB blocks of 8 tokens from t0: lo/hi[b][col]
 * are the blocks' nibble columns (Q8: lo their byte columns, hi unused), sc/bc the scale and bias columns
 * (sc[j * CPU_BLOCK + t]). */
AVX2_VNNI_INLINE void avx2_vnni_query(int32_t (*lo)[AVX2_MAX_D / 4][8], int32_t (*hi)[AVX2_MAX_D / 8][8], int32_t ncol,
                                      const int32_t *qp, const float *Q, const float *qs, const int TB, const int CPG,
                                      const float *sc, const float *bc, int32_t ng, int32_t t0, const int32_t *tn,
                                      float *s, const int Q8) {
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
            const int32_t *w = qp + (size_t)(k0 + k) * (Q8 ? 3 : 6);
#pragma GCC unroll 3
            for (int p = 0; p < 3; p++) {
                const __m256i wl = _mm256_set1_epi32(w[Q8 ? p : 2 * p]);
#pragma GCC unroll 2
                for (int b = 0; b < TB; b++) {
                    A[b][p] = _mm256_dpbusd_avx_epi32(A[b][p], _mm256_load_si256((const __m256i *)lo[b][k0 + k]), wl);
                    if (!Q8)
                        A[b][p] = _mm256_dpbusd_avx_epi32(A[b][p], _mm256_load_si256((const __m256i *)hi[b][k0 + k]),
                                                          _mm256_set1_epi32(w[2 * p + 1]));
                }
            }
        }
#pragma GCC unroll 2
        for (int b = 0; b < TB; b++) {
            const __m256 sq =
                _mm256_mul_ps(_mm256_load_ps(sc + (size_t)j * CPU_BLOCK + t0 + 8 * b), _mm256_set1_ps(Q[j]));
            __m256 sum;
            if (Q8) { /* |A| <= 128·255·64 < 2^24: exact as floats, but A << 14 would overflow int32 */
                sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A[b][0]), _mm256_set1_ps(16384.0f), _mm256_cvtepi32_ps(A[b][2]));
                sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A[b][1]), _mm256_set1_ps(128.0f), sum);
            } else {
                const __m256i ab = _mm256_add_epi32(_mm256_slli_epi32(A[b][0], 14), _mm256_slli_epi32(A[b][1], 7));
                sum = _mm256_cvtepi32_ps(_mm256_add_epi32(ab, A[b][2]));
            }
            acc[b] = _mm256_fmadd_ps(sq, sum, acc[b]);
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
                                         size_t lds, const int Q8) {
    const int32_t rb = Q8 ? d : d / 2, ncol = rb / 4, n = r->n;
    const size_t stride = CPU_PREP_STRIDE(d);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    int32_t lo[2][AVX2_MAX_D / 4][8] __attribute__((aligned(32)));
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
                    if (Q8) { /* byte columns as they are */
                        _mm256_store_si256((__m256i *)lo[b][c0 / 4 + c], x[c]);
                        continue;
                    }
                    _mm256_store_si256((__m256i *)lo[b][c0 / 4 + c], _mm256_and_si256(x[c], m4));
                    _mm256_store_si256((__m256i *)hi[b][c0 / 4 + c], _mm256_and_si256(_mm256_srli_epi32(x[c], 4), m4));
                }
            }
        }
        for (int32_t i = 0; i < nq; i++) {
            const uint8_t *pi = (const uint8_t *)prep + (size_t)i * stride;
            const int32_t *qp = (const int32_t *)(pi + 128);
            const float *Q = (const float *)pi, *qs = qsum + (size_t)i * ng;
            if (TB == 2) avx2_vnni_query(lo, hi, ncol, qp, Q, qs, 2, CPG, sc, bc, ng, t0, tn, s + (size_t)i * lds, Q8);
            else avx2_vnni_query(lo, hi, ncol, qp, Q, qs, 1, CPG, sc, bc, ng, t0, tn, s + (size_t)i * lds, Q8);
        }
    }
}

/* Whether the AVX-VNNI kernel takes these rows: prepared queries, their group sums, a shape with columns, and
 * (q8) plain rows; else the caller's FMA kernel does. */
static inline int avx2_vnni_ready(const cpu_rows *r, int32_t d, const float *qsum, const void *prep, int32_t nq,
                                  const int Q8) {
    const int32_t g = r->group, ng = d / g;
    return qsum && (!Q8 || r->tile < 0) && d % 64 == 0 && (g == 32 || g == 64 || g == 128) &&
           (ng == 1 || ng == 2 || ng == 4) && cpu_prepared(prep, nq, d);
}

/* The scale and bias columns of r's ng groups (sc[j * CPU_BLOCK + t], lanes past n zero), then the kernel
 * with its columns per group (g / 8 for q4, g / 4 for q8) as a constant, so the group's loop unrolls. */
AVX2_VNNI_INLINE void avx2_score_vnni(const cpu_rows *r, int32_t d, const void *prep, const float *qsum, int32_t nq,
                                      float *s, size_t lds, const int Q8) {
    const int32_t g = r->group, ng = d / g;
    float sf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    float bf[CPU_BLOCK * AVX2_MAX_NG] __attribute__((aligned(32)));
    float sc[CPU_BLOCK * 4] __attribute__((aligned(32))), bc[CPU_BLOCK * 4] __attribute__((aligned(32)));
    avx2_row_sb(r, ng, sf, bf);
    for (int32_t t0 = 0; t0 < r->n; t0 += 8) { /* token-major to columns */
        __m256 scol[4], bcol[4];
        const int32_t tn = r->n - t0 < 8 ? r->n - t0 : 8;
        avx2_group_columns(sf, ng, t0, tn, scol);
        avx2_group_columns(bf, ng, t0, tn, bcol);
        for (int32_t j = 0; j < ng; j++) {
            _mm256_store_ps(sc + (size_t)j * CPU_BLOCK + t0, scol[j]);
            _mm256_store_ps(bc + (size_t)j * CPU_BLOCK + t0, bcol[j]);
        }
    }
#define AVX2_SCORE_VNNI(CPG) avx2_score_q4_vnni(r, d, prep, qsum, nq, CPG, sc, bc, ng, s, lds, Q8)
    CPU_BY_GROUP_COLUMNS(AVX2_SCORE_VNNI, g, Q8)
#undef AVX2_SCORE_VNNI
}

AVX2_VNNI_FN static void avx2_score_rows_q4_vnni(const cpu_rows *r, int32_t d, const float *q, size_t ldq,
                                                 const float *qsum, const void *prep, int32_t nq, float *s, size_t lds) {
    if (!avx2_vnni_ready(r, d, qsum, prep, nq, 0)) { /* e.g. a query query_prep left to fp32 */
        avx2_score_rows_q4(r, d, q, ldq, qsum, NULL, nq, s, lds);
        return;
    }
    avx2_score_vnni(r, d, prep, qsum, nq, s, lds, 0);
}

/* q8 keys through the same kernel (avx512_score_rows_q8_vnni's scheme): a dword column of the transposed rows
 * is 4 dims of 8 tokens as bytes, the unsigned operand as it is. */
AVX2_VNNI_FN static void avx2_score_rows_q8_vnni(const cpu_rows *r, int32_t d, const float *q, size_t ldq,
                                                 const float *qsum, const void *prep, int32_t nq, float *s, size_t lds) {
    if (!avx2_vnni_ready(r, d, qsum, prep, nq, 1)) {
        avx2_score_rows_q8_fma(r, d, q, ldq, nq, s, lds);
        return;
    }
    avx2_score_vnni(r, d, prep, qsum, nq, s, lds, 1);
}

#endif /* AVX2_HAVE_VNNI */

void avx2_fill_q4(cpu_kernels *k) {
    k->score_rows[CPU_ENC_Q4] = avx2_score_rows_q4;
#if defined(AVX2_HAVE_VNNI)
    if (__builtin_cpu_supports("avxvnni")) {
        k->score_rows[CPU_ENC_Q4] = avx2_score_rows_q4_vnni;
        k->query_prep[CPU_ENC_Q4] = avx2_q4_prep;
        k->score_rows[CPU_ENC_Q8] = avx2_score_rows_q8_vnni;
        k->query_prep[CPU_ENC_Q8] = avx2_q8_prep;
    }
#endif
}
#endif
