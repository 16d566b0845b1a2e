/*
 * avx512_q4.c: score_rows of the AVX-512 table for q4 keys: 16 tokens in lanes (FMA), or through
 * VNNI against the query cut into int8 pieces (query_prep) where the CPU has it. See avx512.c.
 */
#include "avx512_internal.h"

#if defined(__x86_64__)

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
        avx512_score_rows_q4_slabs(r, d, q, ldq, nq, s, lds);
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

/* The q4 query_prep's layout for one query: float Q_j per key group j at byte 4j (Q_0 = 0: not prepared, use the fp32
 * kernel), then from byte 128 six dwords per dword column c of the row (dims 8c..8c+7): for piece p (a, b, c),
 * dword 6c + 2p holds its int8s of the even dims 8c, +2, +4, +6 and dword 6c + 2p + 1 those of the odd ones.
 * A column's pieces are then one base and constant offsets in the kernel. Each group has its own
 * Q_j = max_j|q| / 2^20, so a large element costs precision in its group only. */
/* The q8 one's (avx512_q8_prep) differs from it in the columns only: a q8 dword column c holds dims
 * 4c..4c+3 as bytes, so dword 3c + p holds piece p's int8s of those dims in order. */
AVX512_VNNI_INLINE void avx512_prep_pieces(const float *q, size_t ldq, int32_t nq, int32_t d, int32_t group, void *prep,
                                           const int Q8) {
    static const uint8_t evens_odds[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
    const __m128i eo = _mm_loadu_si128((const __m128i *)evens_odds);
    const __m512i k64 = _mm512_set1_epi32(64), k127 = _mm512_set1_epi32(127);
    for (int32_t i = 0; i < nq; i++) {
        const float *qi = q + (size_t)i * ldq;
        uint8_t *out = (uint8_t *)prep + (size_t)i * CPU_PREP_STRIDE(d);
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
                uint8_t bytes[16]; /* q4: dims x.. x+15 as evens, odds of column x/8, then of column x/8 + 1 */
                const __m128i b8 = _mm512_cvtepi32_epi8(piece[p]);
                _mm_storeu_si128((__m128i *)bytes, Q8 ? b8 : _mm_shuffle_epi8(b8, eo));
                if (Q8)
                    for (int h = 0; h < 4; h++) memcpy(out + 128 + ((size_t)(x / 4 + h) * 3 + (size_t)p) * 4, bytes + 4 * h, 4);
                else
                    for (int h = 0; h < 2; h++) memcpy(out + 128 + ((size_t)(x / 8 + h) * 6 + (size_t)p * 2) * 4, bytes + 8 * h, 8);
            }
        }
    }
}

AVX512_VNNI_FN static void avx512_q4_prep(const float *q, size_t ldq, int32_t nq, int32_t d, int32_t group, void *prep) {
    avx512_prep_pieces(q, ldq, nq, d, group, prep, 0);
}
AVX512_VNNI_FN static void avx512_q8_prep(const float *q, size_t ldq, int32_t nq, int32_t d, int32_t group, void *prep) {
    avx512_prep_pieces(q, ldq, nq, d, group, prep, 1);
}

/* QB queries (prep: theirs, at stride apart) over TB blocks of 16 tokens from t0, whose dword columns are
 * cols[b][col] (avx512_chunk_columns), CPG columns per group: each broadcast dword of pieces meets the TB
 * blocks (the load slots, above). The accumulators are reset per group, inside a fully unrolled column
 * loop: carried across a loop that is not unrolled, GCC 12 copies vpdpbusd accumulators back and forth
 * (two zmm moves per instruction). */
AVX512_VNNI_INLINE void avx512_vnni_tile(const int32_t *const *cols, int32_t ncol, const uint8_t *prep,
                                          size_t stride, const float *qsum, const int QB, const int TB, const int CPG,
                                          const float *sc, const float *bc, int32_t ng, int32_t t0, const int32_t *tn,
                                          float *s, size_t lds, const int Q8, cpu_prefetch_walk *pw) {
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
        cpu_prefetch_step(pw); /* a slice a group (see avx512_accum_core) */
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
                if (Q8) { /* a byte column already: 4 dims of 16 tokens */
                    lo[b] = hi[b] = xw;
                    continue;
                }
                __asm__("" : "+v"(xw)); /* one load: GCC would fold it into both the and and the shift */
                lo[b] = _mm512_and_si512(xw, m4), hi[b] = _mm512_and_si512(_mm512_srli_epi32(xw, 4), m4);
            }
            #pragma GCC unroll 2
            for (int i = 0; i < QB; i++) {
                const int32_t *qp = (const int32_t *)(prep + (size_t)i * stride + 128) + (size_t)(k0 + k) * (Q8 ? 3 : 6);
                #pragma GCC unroll 3
                for (int p = 0; p < 3; p++) {
                    const __m512i wl = _mm512_set1_epi32(qp[Q8 ? p : 2 * p]);
                    #pragma GCC unroll 2
                    for (int b = 0; b < TB; b++) {
                        A[b][i][p] = _mm512_dpbusd_epi32(A[b][i][p], lo[b], wl);
                        if (!Q8) A[b][i][p] = _mm512_dpbusd_epi32(A[b][i][p], hi[b], _mm512_set1_epi32(qp[2 * p + 1]));
                    }
                }
            }
        }
        #pragma GCC unroll 2
        for (int b = 0; b < TB; b++) {
            const __m512 scol = _mm512_load_ps(sc + (size_t)j * CPU_BLOCK + t0 + 16 * b);
            #pragma GCC unroll 2
            for (int i = 0; i < QB; i++) {
                const __m512 sq = _mm512_mul_ps(scol, _mm512_set1_ps(((const float *)(prep + (size_t)i * stride))[j]));
                __m512 sum;
                if (Q8) { /* |A| <= 128·255·64 < 2^24: exact as floats, but A << 14 would overflow int32 */
                    sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(A[b][i][0]), _mm512_set1_ps(16384.0f), _mm512_cvtepi32_ps(A[b][i][2]));
                    sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(A[b][i][1]), _mm512_set1_ps(128.0f), sum);
                } else {
                    const __m512i ab = _mm512_add_epi32(_mm512_slli_epi32(A[b][i][0], 14), _mm512_slli_epi32(A[b][i][1], 7));
                    sum = _mm512_cvtepi32_ps(_mm512_add_epi32(ab, A[b][i][2]));
                }
                acc[b][i] = _mm512_fmadd_ps(sq, sum, acc[b][i]);
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
                                             float *s, size_t lds, const int Q8) {
    const int32_t rb = Q8 ? d : d / 2, ncol = rb / 4, n = r->n;
    const size_t stride = CPU_PREP_STRIDE(d);
    const uint8_t *prep = prep_;
    int32_t cols_buf[2][AVX512_MAX_D / 4][16] __attribute__((aligned(64)));
    cpu_prefetch_walk pw;
    cpu_prefetch_start(&pw, r->pf, (n + 31) / 32 * ((nq + 1) / 2) * (ncol / CPG));
    for (int32_t t0 = 0; t0 < n; t0 += 32) {
        int32_t tn[2] = {0, 0};
        const int32_t *cols[2] = {NULL, NULL};
        const int TB = n - t0 > 16 ? 2 : 1;
        for (int b = 0; b < TB; b++) {
            const int32_t tb = t0 + 16 * b;
            tn[b] = n - tb < 16 ? n - tb : 16;
            cols[b] = avx512_key_columns(r, tb, tn[b], ncol, cols_buf[b]);
        }
        for (int32_t i0 = 0; i0 < nq; i0 += 2) {
            const uint8_t *pi = prep + (size_t)i0 * stride;
            const float *qi = qsum + (size_t)i0 * ng;
            float *si = s + (size_t)i0 * lds;
            if (nq - i0 >= 2 && TB == 2) avx512_vnni_tile(cols, ncol, pi, stride, qi, 2, 2, CPG, sc, bc, ng, t0, tn, si, lds, Q8, &pw);
            else if (nq - i0 >= 2) avx512_vnni_tile(cols, ncol, pi, stride, qi, 2, 1, CPG, sc, bc, ng, t0, tn, si, lds, Q8, &pw);
            else if (TB == 2) avx512_vnni_tile(cols, ncol, pi, stride, qi, 1, 2, CPG, sc, bc, ng, t0, tn, si, lds, Q8, &pw);
            else avx512_vnni_tile(cols, ncol, pi, stride, qi, 1, 1, CPG, sc, bc, ng, t0, tn, si, lds, Q8, &pw);
        }
    }
}

/* Whether the VNNI kernel takes these rows: prepared queries, their group sums, a group it unrolls, and (q8)
 * plain rows; else the caller's FMA kernel does. */
static inline int avx512_vnni_ready(const cpu_rows *r, int32_t d, const float *qsum, const void *prep, int32_t nq,
                                    const int Q8) {
    const int32_t g = r->group;
    return qsum && (!Q8 || r->tile < 0) && (g == 32 || g == 64 || g == 128) && cpu_prepared(prep, nq, d);
}

/* The block's scale and bias columns, then the kernel with its columns per group (g / 8 for q4, g / 4 for q8)
 * as a constant, so the group's loop unrolls. */
AVX512_VNNI_INLINE void avx512_score_vnni(const cpu_rows *r, int32_t d, const void *prep, const float *qsum, int32_t nq,
                                          float *s, size_t lds, const int Q8) {
    const int32_t g = r->group, ng = d / g;
    float sc[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    float bc[CPU_BLOCK * AVX512_MAX_NG] __attribute__((aligned(64)));
    avx512_sb_columns(r, ng, sc, bc);
#define AVX512_SCORE_VNNI(CPG) avx512_score_q4_vnni(r, d, prep, qsum, nq, CPG, sc, bc, ng, s, lds, Q8)
    CPU_BY_GROUP_COLUMNS(AVX512_SCORE_VNNI, g, Q8)
#undef AVX512_SCORE_VNNI
}

AVX512_VNNI_FN static void avx512_score_rows_q4_vnni(const cpu_rows *r, int32_t d, const float *q, size_t ldq,
                                                     const float *qsum, const void *prep, int32_t nq, float *s, size_t lds) {
    if (!avx512_vnni_ready(r, d, qsum, prep, nq, 0)) { /* e.g. a query query_prep left to fp32 */
        avx512_score_rows_q4(r, d, q, ldq, qsum, NULL, nq, s, lds);
        return;
    }
    avx512_score_vnni(r, d, prep, qsum, nq, s, lds, 0);
}

/* q8 keys through the same kernel: a dword column of plain rows (transposed as q4's are) is 4 dims of 16
 * tokens as bytes, the unsigned operand as it is, against avx512_q8_prep's pieces. Against the fp32 kernel, which
 * spends two converts and an FMA per 16 codes before the queries' FMAs, this is 4 products per lane and no
 * decode; the transpose costs a shuffle per 4 dims of 16 tokens. */
AVX512_VNNI_FN static void avx512_score_rows_q8_vnni(const cpu_rows *r, int32_t d, const float *q, size_t ldq,
                                                     const float *qsum, const void *prep, int32_t nq, float *s, size_t lds) {
    if (!avx512_vnni_ready(r, d, qsum, prep, nq, 1)) {
        avx512_score_rows_q8_fma(r, d, q, ldq, nq, s, lds);
        return;
    }
    avx512_score_vnni(r, d, prep, qsum, nq, s, lds, 1);
}

void avx512_fill_q4(cpu_kernels *k) {
    k->score_rows[CPU_ENC_Q4] = avx512_score_rows_q4;
    if (__builtin_cpu_supports("avx512vnni")) {
        k->score_rows[CPU_ENC_Q4] = avx512_score_rows_q4_vnni;
        k->query_prep[CPU_ENC_Q4] = avx512_q4_prep;
        /* On Zen 5 these scores were paced by load slots (two a cycle, a zmm load taking both), so the values
         * kernel asked for the whole next block-head (attend.c, prefetch_now). Intel's cores have slots to spare:
         * there each kernel asking for its own half decodes q4 at 128K 1.06-1.13x faster from DRAM (bench_decode,
         * builds alternated), the same in cache. */
        k->values_take_hint[CPU_ENC_Q4] = !__builtin_cpu_is("intel");
        k->score_rows[CPU_ENC_Q8] = avx512_score_rows_q8_vnni;
        k->query_prep[CPU_ENC_Q8] = avx512_q8_prep;
    }
}
#endif
