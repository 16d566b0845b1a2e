/*
 * kernels.h: the inner kernels of the CPU module's fused attention (docs/architecture.md §5), as one table
 * per SIMD level. The scalar table (scalar.c) reads like the math; each SIMD file overrides the entries it
 * makes faster and is checked against the scalar one by the tests. Blocks never hold more than CPU_BLOCK
 * tokens, and their rows may lie in two runs (two pages: cpu_rows).
 *
 * Queries arrive pre-scaled by α, as nq vectors of d floats (row stride ldq). Scores go to s[i*lds + t].
 * Per-token groups:  q·k̂_t = Σ_g s_g (q_g · codes_g) + b_g Σ_{c∈g} q_c   (qsum[i*n_groups + g] = Σ_{c∈g} q_c)
 * Per-channel (KIVI keys, one group of g tokens): q·k̂_t = Σ_c (q_c s_c) code_{c,t} + Σ_c q_c b_c
 * Values: o_i += Σ_t p[i*ldp + t] v̂_t over the first dv dims, v̂ decoded in registers, never stored.
 */
#ifndef GOKV_CPU_KERNELS_H
#define GOKV_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { CPU_BLOCK = 128 };

/* How the elements of a per-token row are encoded. */
enum { CPU_ENC_F32 = 0, CPU_ENC_F16, CPU_ENC_Q8, CPU_ENC_Q4, CPU_ENC_Q2, CPU_ENC_COUNT };

/* A prefetch hint holds a block-head's keys and values: codes, scales and biases of up to two runs each. */
enum { CPU_PREFETCH_REGIONS = 12, CPU_RUN_ALIGN = 32 };

/* The SIMD exp_sum's polynomial: e^r ~ 1 + C1 r + ... + C5 r^5 for |r| <= ln2/2, minimax in relative error
 * with the constant held at 1, so that e^0 is exactly 1 (one visible token returns its value exactly): 9.1e-8,
 * 1.5e-7 evaluated in float by Horner's FMAs, against 1.2e-7 for the Cephes degree-7 form it replaced, for
 * three operations fewer a vector (exp_sum took 5% of a q4 decode). Fitted by Lawson's iteration in double. */
#define CPU_EXP_C1 0.9999997071886734f
#define CPU_EXP_C2 0.4999914952870967f
#define CPU_EXP_C3 0.1666763619597161f
#define CPU_EXP_C4 0.041897929569165084f
#define CPU_EXP_C5 0.008290314761851346f

/* Memory the caller reads after this call (the next block's rows: codes, scales and biases of up to two
 * runs), for a kernel to ask for a slice at a time while it computes. Queued all at once, a block's ~300
 * prefetches fill the core's miss buffers and stall the kernel's own loads behind them; spread over the
 * arithmetic, they hide DRAM. */
typedef struct cpu_prefetch {
    const uint8_t *p[CPU_PREFETCH_REGIONS];
    size_t n[CPU_PREFETCH_REGIONS]; /* bytes; 0 for an unused region */
} cpu_prefetch;

/* n consecutive tokens of one kv head, stored one row per token, in one run or two: a block may span two
 * pages, so that a kernel call covers up to CPU_BLOCK tokens whatever the page size (each call has fixed
 * work: the scale columns, the weight folds, the accumulators' start and end, the softmax of its scores).
 * With a second run (codes2 != NULL), tokens [n1, n) are its rows 0.. (same strides), and n1 is a multiple
 * of CPU_RUN_ALIGN, so that no 16- or 32-token piece of a kernel straddles the runs: kernels address rows
 * through cpu_row_codes / cpu_row_scale / cpu_row_bias at a piece's first token.
 * q4 keys may be tiled (gokv_layout.h: tiles of CPU_TILE tokens, dword-column-major; tile >= 0): codes then
 * points at the tile holding row 0, which sits in lane `tile` of it, and a second run starts at lane 0 of its
 * page's first tile. Tiled rows are never handed to accum_rows (values are plain rows), and kernels read them
 * through cpu_tile_columns (a piece's columns in place), cpu_row_load or cpu_rows_untile. */
typedef struct cpu_rows {
    const uint8_t *codes;   /* row t at codes + t * row_stride (bytes); tiled: see above */
    size_t row_stride;      /* bytes of one row (tiled: too, though rows are not laid end to end) */
    const uint16_t *scale;  /* fp16, row t's groups at scale + t * sb_stride (elements); NULL for f32/f16 */
    const uint16_t *bias;
    size_t sb_stride;
    int32_t n;              /* tokens, 1..CPU_BLOCK */
    int32_t enc;            /* CPU_ENC_* */
    int32_t group;          /* g for quantized encodings */
    const cpu_prefetch *pf; /* what to ask for while this runs (kernels with spreads_prefetch); NULL: nothing */
    /* the second run: NULL codes2 (the zero value) for one run */
    const uint8_t *codes2;
    const uint16_t *scale2, *bias2;
    int32_t n1;             /* tokens in the first run when codes2 is set: a multiple of CPU_RUN_ALIGN, < n */
    int32_t tile;           /* -1: plain rows; else tiled, row 0 in lane `tile` of the tile at codes */
} cpu_rows;

/* tokens per tile of tiled q4 keys (GOKV_KEY_TILE), and the most bytes of a tiled row (d <= 1024) */
enum { CPU_TILE = 16, CPU_TILE_ROW_MAX = 512 };

/* Row t's codes, scales and biases, and the first token of the run after t's (n when none): rows from t up
 * to it follow each other at the strides. */
static inline const uint8_t *cpu_row_codes(const cpu_rows *r, int32_t t) {
    return r->codes2 && t >= r->n1 ? r->codes2 + (size_t)(t - r->n1) * r->row_stride : r->codes + (size_t)t * r->row_stride;
}
static inline const uint16_t *cpu_row_scale(const cpu_rows *r, int32_t t) {
    return r->codes2 && t >= r->n1 ? r->scale2 + (size_t)(t - r->n1) * r->sb_stride : r->scale + (size_t)t * r->sb_stride;
}
static inline const uint16_t *cpu_row_bias(const cpu_rows *r, int32_t t) {
    return r->codes2 && t >= r->n1 ? r->bias2 + (size_t)(t - r->n1) * r->sb_stride : r->bias + (size_t)t * r->sb_stride;
}
static inline int32_t cpu_run_end(const cpu_rows *r, int32_t t) { return r->codes2 && t < r->n1 ? r->n1 : r->n; }

/* Tiled rows: the tile that holds row t (of either run), and t's lane in it. */
static inline const uint8_t *cpu_tile_at(const cpu_rows *r, int32_t t, int32_t *lane) {
    const int second = r->codes2 && t >= r->n1;
    const int32_t pos = second ? t - r->n1 : r->tile + t; /* lanes counted from the run's first tile */
    *lane = pos % CPU_TILE;
    return (second ? r->codes2 : r->codes) + (size_t)(pos / CPU_TILE) * CPU_TILE * r->row_stride;
}

/* Tiled rows: the dword columns of rows t .. t + w - 1 (w: 8 or 16, the piece of one run) in place, when they
 * start a w-aligned run of lanes of one tile: column j at the result + 16 * j (int32s). NULL when the rows
 * are plain or the piece is not aligned (the caller gathers them: cpu_rows_untile). */
static inline const int32_t *cpu_tile_columns(const cpu_rows *r, int32_t t, int32_t w) {
    if (r->tile < 0) return NULL;
    int32_t lane;
    const uint8_t *tile = cpu_tile_at(r, t, &lane);
    return lane % w ? NULL : (const int32_t *)tile + lane;
}

/* Copies rows t .. t + n - 1 of r (of one run; plain or tiled) to out as plain rows of r->row_stride bytes. */
static inline void cpu_rows_untile(const cpu_rows *r, int32_t t, int32_t n, uint8_t *out) {
    if (r->tile < 0) {
        memcpy(out, cpu_row_codes(r, t), (size_t)n * r->row_stride);
        return;
    }
    const size_t words = r->row_stride / 4u;
    for (int32_t u = 0; u < n; u++) {
        int32_t lane;
        const uint8_t *tile = cpu_tile_at(r, t + u, &lane) + (size_t)lane * 4u;
        uint8_t *row = out + (size_t)u * r->row_stride;
        for (size_t j = 0; j < words; j++) memcpy(row + 4u * j, tile + 4u * CPU_TILE * j, 4);
    }
}

/* Row t's codes as one plain row: in place for plain rows, else gathered into tmp (row_stride bytes). */
static inline const uint8_t *cpu_row_load(const cpu_rows *r, int32_t t, uint8_t *tmp) {
    if (r->tile < 0) return cpu_row_codes(r, t);
    cpu_rows_untile(r, t, 1, tmp);
    return tmp;
}

/* Scale and bias of r's rows as floats, token-major (sf[t * ng + j]), run by run, through the caller's fp16
 * conversion halves(h, n, out) (each SIMD file passes its own; inlined, so the call is direct). */
static inline __attribute__((always_inline)) void cpu_row_sb(const cpu_rows *r, int32_t ng, float *sf, float *bf,
                                                             void (*halves)(const uint16_t *, int32_t, float *)) {
    for (int32_t t0 = 0, t1; t0 < r->n; t0 = t1) {
        t1 = cpu_run_end(r, t0);
        const uint16_t *sc = cpu_row_scale(r, t0), *bi = cpu_row_bias(r, t0);
        if (r->sb_stride == (size_t)ng) { /* the run's scales (biases) are contiguous */
            halves(sc, (t1 - t0) * ng, sf + (size_t)t0 * ng);
            halves(bi, (t1 - t0) * ng, bf + (size_t)t0 * ng);
            continue;
        }
        for (int32_t t = t0; t < t1; t++) {
            halves(sc + (size_t)(t - t0) * r->sb_stride, ng, sf + (size_t)t * ng);
            halves(bi + (size_t)(t - t0) * r->sb_stride, ng, bf + (size_t)t * ng);
        }
    }
}

/* One KIVI key group: g tokens of d channels, channel c's codes at codes + c * (g * bits / 8). */
typedef struct cpu_chan {
    const uint8_t *codes;
    const uint16_t *scale; /* [d] fp16 */
    const uint16_t *bias;  /* [d] fp16 */
    int32_t bits;          /* 2 or 4 */
    int32_t g;             /* tokens in the group, <= CPU_BLOCK */
    const cpu_prefetch *pf; /* what score_chan asks for while it runs (tables with spreads_prefetch); NULL: nothing */
} cpu_chan;

/* Bytes per query of a query_prep's output (64-byte aligned): a 128-byte header, then 3 int8 pieces per dim. */
#define CPU_PREP_STRIDE(d) (((size_t)3 * (size_t)(d) + 128u + 63u) & ~(size_t)63u)

/* Whether query_prep prepared every one of the nq queries at prep (NULL: none): a query it left to the fp32
 * kernels has a first group scale of 0 in its header. */
static inline int cpu_prepared(const void *prep, int32_t nq, int32_t d) {
    int ready = prep != NULL;
    for (int32_t i = 0; ready && i < nq; i++) {
        float Q;
        memcpy(&Q, (const uint8_t *)prep + (size_t)i * CPU_PREP_STRIDE(d), sizeof Q);
        ready = Q > 0.0f;
    }
    return ready;
}

typedef void (*cpu_prep_fn)(const float *q, size_t ldq, int32_t nq, int32_t d, int32_t group, void *prep);

typedef struct cpu_kernels {
    /* s[i][t] = q_i · k̂_t for the n rows of r (d dims). qsum may be NULL for f32/f16. prep: query_prep[enc]'s
     * output for these nq queries, or NULL; a kernel that reads it computes the same scores without it. */
    void (*score_rows[CPU_ENC_COUNT])(const cpu_rows *r, int32_t d, const float *q, size_t ldq, const float *qsum,
                                      const void *prep, int32_t nq, float *s, size_t lds);
    /* Per encoding, optional (NULL: none): prepares nq queries once per call for score_rows[enc],
     * CPU_PREP_STRIDE(d) bytes each at prep + i * stride (q4 and q8 with AVX-512 VNNI or AVX-VNNI: each query
     * as int8 pieces, avx512_q4_prep's and avx512_q8_prep's layouts). */
    cpu_prep_fn query_prep[CPU_ENC_COUNT];
    /* o[i][0..dv) += Σ_t p[i][t] · v̂_t[0..dv) for the n rows of r. */
    void (*accum_rows[CPU_ENC_COUNT])(const cpu_rows *r, int32_t dv, const float *p, size_t ldp, int32_t nq,
                                      float *o, size_t ldo);
    /* KIVI keys: s[i][t] = q_i · k̂_t for the g tokens of the group (d channels). */
    void (*score_chan)(const cpu_chan *c, int32_t d, const float *q, size_t ldq, int32_t nq, float *s, size_t lds);
    /* KIVI keys read as values (MLA): o[i][0..dv) += Σ_t p[i][t] · k̂_t[0..dv). */
    void (*accum_chan)(const cpu_chan *c, int32_t dv, const float *p, size_t ldp, int32_t nq, float *o, size_t ldo);
    /* max of x[0..n) (-inf when every x is -inf; a NaN never wins) */
    float (*max)(const float *x, int32_t n);
    /* x[t] = e^(x[t] - m) for t < n (x may hold -inf: gives 0); returns Σ of the results. */
    float (*exp_sum)(float *x, int32_t n, float m);
    /* x[t] = -inf for t < n where bit t of keep (bit t % 32 of word t / 32) is clear: the tokens of a block a
     * query must not see, hidden before the softmax so that the scores kernels run unmasked. */
    void (*hide)(float *x, int32_t n, const uint32_t *keep);
    /* acc[t] += e^(x[t] - m) for t < n (x may hold -inf: adds 0); x is not written (the attention mass). */
    void (*exp_acc)(const float *x, int32_t n, float m, float *acc);
    /* acc[t] += f · x[t] for t < n (the attention mass from kept weights). */
    void (*scale_acc)(const float *x, int32_t n, float f, float *acc);
    /* Dequantizes one per-token row of d elements (reads, baseline). */
    void (*dequant_row)(const cpu_rows *r, int32_t t, int32_t d, float *out);
    /* 1: score_rows and accum_rows ask for r->pf a slice at a time; 0: they ignore it (the caller asks at once) */
    int32_t spreads_prefetch;
    /* With spreads_prefetch, per encoding: 1 when score_rows has no load slots to spare for prefetches (the
     * AVX-512 VNNI q4 kernel), so that the caller hands accum_rows the next block-head's keys and values
     * and score_rows nothing; 0: each kernel gets its own half. */
    int32_t values_take_hint[CPU_ENC_COUNT];
} cpu_kernels;

/* Asks for the cache line at p (a hint: never faults). Into L2, not L1 (prefetcht1): a line asked for into L1
 * holds one of the core's few L1 miss buffers until it arrives, so a block-head's hint of ~300 lines stalled the
 * kernel's own loads behind them; into L2 the walk from DRAM ran 1.13x faster for f16 at 128K, 1.05x for q4
 * (bench_decode, 2 threads, the 2-core Xeon), and the lines reach L1 early enough from there. */
static inline void cpu_prefetch_line(const void *p) {
#if defined(__x86_64__)
    __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)p)); /* asm: GCC deletes loops of bare builtins */
#elif defined(__aarch64__)
    __asm__ volatile("prfm pldl1keep, %0" : : "Q"(*(const char *)p));
#else
    __builtin_prefetch(p);
#endif
}

/* Asks for the n bytes at p, line by line. */
static inline void cpu_prefetch_bytes(const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)63u);
    const uint8_t *end = (const uint8_t *)p + n;
    for (; b < end; b += 64) cpu_prefetch_line(b);
}

/* A kernel's walk over a prefetch hint's lines, a slice at a time: cpu_prefetch_start cuts the lines of pf's
 * regions (64-byte aligned addresses, in region order) into `parts` slices of at most ceil(lines / parts),
 * and each cpu_prefetch_take hands the next slice to visit (cpu_prefetch_step asks for it). The walk's state
 * is a cursor, so a slice costs its lines and a compare or two: recomputing the slice bounds at every piece
 * (two divisions and six regions' line counts, ~24 times a block) cost as much as the prefetches saved at
 * 4K (bench_kernels, in cache with the hints: 1364 ns a block against 1212 without them). */
typedef struct cpu_prefetch_walk {
    const uint8_t *line[CPU_PREFETCH_REGIONS]; /* next line of each region */
    const uint8_t *end[CPU_PREFETCH_REGIONS];  /* past its last line */
    int32_t region;                            /* the region being walked */
    int32_t per;                               /* lines per slice; 0: nothing to ask for */
} cpu_prefetch_walk;

static inline void cpu_prefetch_start(cpu_prefetch_walk *w, const cpu_prefetch *pf, int32_t parts) {
    size_t total = 0;
    w->region = 0;
    w->per = 0;
    if (!pf || parts <= 0) return;
    for (int i = 0; i < CPU_PREFETCH_REGIONS; i++) {
        const uintptr_t a = (uintptr_t)pf->p[i] & ~(uintptr_t)63u;
        const uintptr_t e = pf->n[i] ? ((uintptr_t)pf->p[i] + pf->n[i] + 63u) & ~(uintptr_t)63u : a;
        w->line[i] = (const uint8_t *)a;
        w->end[i] = (const uint8_t *)e;
        total += (e - a) / 64u;
    }
    w->per = (int32_t)((total + (size_t)parts - 1) / (size_t)parts);
}

/* Hands the walk's next slice to visit, line by line. */
static inline __attribute__((always_inline)) void cpu_prefetch_take(cpu_prefetch_walk *w,
                                                                    void (*visit)(const void *line, void *arg),
                                                                    void *arg) {
    int32_t left = w->per;
    while (left > 0 && w->region < CPU_PREFETCH_REGIONS) {
        const uint8_t *l = w->line[w->region], *e = w->end[w->region];
        for (; left > 0 && l < e; l += 64, left--) visit(l, arg);
        w->line[w->region] = l;
        if (l >= e) w->region++;
    }
}

static inline void cpu_prefetch_line_visit(const void *line, void *arg) {
    (void)arg;
    cpu_prefetch_line(line);
}

/* Asks for the walk's next slice (nothing once every line was asked for, or without a hint). */
static inline void cpu_prefetch_step(cpu_prefetch_walk *w) { cpu_prefetch_take(w, cpu_prefetch_line_visit, NULL); }

/* Runs CALL(N) with N the compile-time constant equal to the query count nc (1-4, or 8 for CPU_BY_NQ8): the
 * SIMD kernels are specialized per count so that their accumulators stay in registers. */
#define CPU_BY_NQ4(CALL, nc)                                                                                       \
    switch (nc) {                                                                                                  \
    case 4: CALL(4); break;                                                                                        \
    case 3: CALL(3); break;                                                                                        \
    case 2: CALL(2); break;                                                                                        \
    default: CALL(1); break;                                                                                       \
    }
#define CPU_BY_NQ8(CALL, nc)                                                                                       \
    if ((nc) == 8) {                                                                                               \
        CALL(8);                                                                                                   \
    } else {                                                                                                       \
        CPU_BY_NQ4(CALL, nc)                                                                                       \
    }

/* The pair decode (avx512_pair_codes, the AVX2 q4 values): a kernel that sums Σ w·lo and Σ w·(lo + K hi) over
 * pairs of 4- or 2-bit codes recovers Σ w·hi as the difference over K, and a bias folded into both sums as
 * (1 + K)·bsum. K = 16 for 4-bit codes, 4 for 2-bit; 0 bits (no pairs): K = 0, so the bias is bsum once. */
static inline float cpu_pair_k(int bits) { return bits ? (float)(1 << bits) : 0.0f; }
static inline int cpu_pair_bits(int32_t enc) { return enc == CPU_ENC_Q4 ? 4 : enc == CPU_ENC_Q2 ? 2 : 0; }

/* Runs CALL(CPG) with CPG the compile-time count of dword columns in a key group of g = 32, 64 or 128 (g / 8 for
 * q4 codes, g / 4 for q8's bytes): the VNNI scores kernels unroll their group's loop on it. */
#define CPU_BY_GROUP_COLUMNS(CALL, g, q8)                                                                          \
    switch (g) {                                                                                                   \
    case 32: CALL((q8) ? 8 : 4); break;                                                                            \
    case 64: CALL((q8) ? 16 : 8); break;                                                                           \
    default: CALL((q8) ? 32 : 16); break;                                                                          \
    }

/* Runs CALL(N) over the nq queries in chunks of up to 4, with i0 the chunk's first query (in scope of CALL). */
#define CPU_EACH_NQ4(CALL, nq, i0)                                                                                 \
    for (int32_t i0 = 0, nc_ = 0; i0 < (nq); i0 += nc_) {                                                         \
        nc_ = (nq) - i0 >= 4 ? 4 : (nq) - i0;                                                                      \
        CPU_BY_NQ4(CALL, nc_)                                                                                      \
    }

/* A SIMD file's table entries for a row encoding: PFX_score_rows_NAME and PFX_accum_rows_NAME, thin wrappers
 * (with the file's target attribute FN, which may be empty) over its PFX_score_rows_impl and
 * PFX_accum_rows_impl with the encoding as a constant. CPU_ACCUM_ENTRY alone where the file scores the
 * encoding by its own kernel; CPU_SCORE_ENTRY and CPU_ACCUM_ENTRY apart where scores and values live in
 * different files. */
#define CPU_ACCUM_ENTRY(PFX, FN, name, enc)                                                                        \
    FN static void PFX##_accum_rows_##name(const cpu_rows *r, int32_t dv, const float *p, size_t ldp, int32_t nq,  \
                                           float *o, size_t ldo) {                                                  \
        PFX##_accum_rows_impl(r, dv, p, ldp, nq, o, ldo, enc);                                                     \
    }
#define CPU_SCORE_ENTRY(PFX, FN, name, enc)                                                                        \
    FN static void PFX##_score_rows_##name(const cpu_rows *r, int32_t d, const float *q, size_t ldq,               \
                                           const float *qsum, const void *prep, int32_t nq, float *s, size_t lds) { \
        (void)qsum, (void)prep; /* the bias is folded into the dequantized slab */                               \
        PFX##_score_rows_impl(r, d, q, ldq, nq, s, lds, enc);                                                      \
    }
#define CPU_ROW_ENTRIES(PFX, FN, name, enc)                                                                        \
    CPU_SCORE_ENTRY(PFX, FN, name, enc)                                                                            \
    CPU_ACCUM_ENTRY(PFX, FN, name, enc)

/* The table for a SIMD level (GOKV_CPU_*), filled on first use: scalar entries overridden by the level's. */
const cpu_kernels *cpu_kernels_get(int32_t level);

void cpu_kernels_fill_scalar(cpu_kernels *k);
/* Each SIMD file overrides what it implements; these exist only on their architectures. */
void cpu_kernels_fill_avx2(cpu_kernels *k);
void cpu_kernels_fill_avx512(cpu_kernels *k);
void cpu_kernels_fill_neon(cpu_kernels *k);

#ifdef __cplusplus
}
#endif
#endif
