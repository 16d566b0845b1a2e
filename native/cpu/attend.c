/*
 * attend.c: fused decode and prefill attention straight from the compressed pages (docs/architecture.md §5).
 *
 * Work is cut into items: (sequence, range of kv heads, tile of query rows, chunk of visible tokens). An
 * item handles every query head of its kv heads (G = Hq / Hkv) for its rows, so each K/V element is decoded
 * once per group. Decode items take a group of kv heads (all of them when that leaves items enough to keep the
 * workers busy, plan_cut) and walk them head-inner, block by block: with the page layout's head blocks
 * (gokv_layout.h) that reads a page's part for the group front to back, while software prefetch asks for
 * the next block-head ahead. The tokens a tile can see are at most two ranges: the sink tokens
 * [0, n_sink) and the window (p0 - W, p1] (or simply [0, p1] without a window); tokens outside them are never
 * read, which is what makes sliding-window layers cheap. Under Quest an item takes one kv head and its own
 * ranges instead: the pages quest.c chose for that head, the sink and recent pages, the KIVI ring
 * (item_segs). Validity masks cut a decode tile's ranges the same way (cpu_mask_plan, quest.c): a run of at least
 * 64 tokens that a kv head's mask hides whole (read in 16-token spans) is not walked, so an evicted
 * or compacted-with-holes sequence reads what it shows; per-kv-head masks (H2O, SnapKV) give one kv head per
 * item, as Quest does. Those ranges are laid end to end and, when kv heads
 * alone give too few items, cut into chunks of C tokens (split-K): each chunk keeps an online softmax state
 * (m, l, o) per query vector; a reduce pass combines chunks:
 *     M = max(max_c m_c, σ),   out = Σ_c e^(m_c - M) o_c / (Σ_c e^(m_c - M) l_c + e^(σ - M)).
 * A tile with a single chunk finalizes in place. Decode rows (and short prefills of <= 16 rows) are split;
 * longer prefills have parallelism enough in their tiles and use one chunk each.
 * Inside an item, tokens are walked in blocks of up to CPU_BLOCK tokens: per-token formats' blocks run to the
 * end of a page and on through the next one when it is present (page_block), KIVI blocks are whole key
 * groups the same way (kivi_block), and ring blocks stop at the ring's end; each block is scored by the
 * kernel table, masked per query position, exponentiated, and its values accumulated by the kernel table:
 * no dequantized K or V is ever stored. Masks do not slow the kernels down: they score the whole block and
 * the tokens a query may not see are set to -inf afterwards (block_visibility, the table's hide), a block
 * nobody sees is not read, and a per-token block of which at most 3/8 is seen (a randomly thinned mask) has
 * its seen key and value rows gathered (attend_sparse), so that scores, softmax and values run over them alone:
 * a hidden token costs a bit of a scan instead of its share of a block's arithmetic.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ITEMS_PER_WORKER: enough items for the pool to even out a slow worker, few enough that item starts (a
 * cold block, the queries' preparation) and the reduce stay small: 2 beat 8 at every context, and 1 leaves
 * a worker idle whenever the other is held up (docs/performance.md). */
enum {
    DEFAULT_CHUNK = 512,
    LONG_CHUNK = 4096,
    PREFILL_TILE_VECTORS = 64,
    SPLIT_MAX_ROWS = CPU_SPLIT_MAX_ROWS,
    ITEM_MAX_HEADS = 16,
    ITEMS_PER_WORKER = 2,
    MASS_UNIT = 2048, /* tokens of one kv head per unit of the mass pass */
    MASS_AHEAD = 2,   /* blocks the mass pass asks for ahead of the one it sums */
    MASS_EPOCHS = 16   /* the running maxima a kept query remembers before its kept weights are rescaled (epoch_add) */
};
/* A block is gathered (attend_sparse) when at most SPARSE_NUM / SPARSE_DEN of its tokens are seen, and its rows
 * are at most GATHER_ROW_MAX bytes. */
enum { SPARSE_NUM = 3, SPARSE_DEN = 8, GATHER_ROW_MAX = 1024 };
/* The most floats of kept scores a call holds (256 MiB): sequences past it have their scores computed again. */
#define MASS_STORE_MAX ((int64_t)1 << 26)

/* Visible token ranges: gokv_visible_ranges (gokv_backend.h), shared by every backend. */
typedef gokv_range seg;

typedef struct work_item {
    int32_t seq, kvh, nkvh, row0, nrows; /* kv heads [kvh, kvh + nkvh); rows relative to the sequence's first */
    int32_t v0, v1;                      /* chunk bounds in the concatenated visible ranges */
    int32_t chunk, n_chunks;             /* this chunk's index, and the tile's chunk count (> 1: partials + reduce) */
    int64_t part;                        /* float offset of the row tile's partials (chunk 0, kv head 0) */
} work_item;

/* A row tile of one kv head. Partials of a row tile: [chunk][kv head][query vector][2 + d_v] floats. */
typedef struct tile {
    int32_t seq, kvh, row0, nrows, n_chunks;
    int64_t part; /* first chunk's partials of this kv head */
} tile;

/* Attention mass (gokv_attend_desc.mass), per sequence: the counted rows are the last `counted` of its rows
 * (first_q = (rows - counted) * G is the first counted query vector of its row tile). A sequence whose rows
 * form one split tile (decode, short prefills) keeps its counted queries' raw scores while it is attended
 * (store >= 0, the float offset of [kv head][counted query][token] in the call's store, masked tokens -inf);
 * the others' scores are computed again by the mass pass (store < 0). A kept tile of one chunk (in_item: the
 * cut gives mass calls one kv head per item when that leaves the workers items enough) keeps weights instead,
 * and its items sum the mass themselves (mass_in_item): 1.11-1.13x the decode without the mass at 32K and 128K
 * where the pass over the kept scores from memory took 1.11-1.19x (bench_decode -mass, q4, 2 threads). */
typedef struct mass_seq {
    int32_t rows, counted, first_q;
    int64_t store;
    int64_t mass;  /* its first element in d->mass */
    int64_t tile0; /* split sequences: the index of their row tile's first tile (kv head 0); else -1 */
    int32_t in_item; /* 1: its tile is one chunk and keeps its scores, so each item sums its kv heads' mass as soon as
                      * it has their log-sum-exps (mass_in_item), while the scores are still in its cache; no units */
} mass_seq;

/* A work unit of the mass pass: tokens [t0, t1) of kv head h of sequence seq. */
typedef struct mass_unit {
    int32_t seq, h, t0, t1;
} mass_unit;

typedef struct attend_ctx {
    const gokv_attend_desc *d;
    const gokv_layout *L;
    const cpu_pool *pool;
    const cpu_kernels *k;
    const cpu_quest *quest; /* Quest's ranges per (sequence, kv head) (quest.c), NULL without quest_pages */
    const cpu_quest *hr;    /* the ranges item_segs hands out per (sequence, kv head): Quest's, or those cut from
                             * the validity masks (cpu_mask_plan; count -1: the visible ranges); NULL: visible ranges */
    int per_head;           /* the ranges differ per kv head (Quest, GOKV_ATTEND_MASK_PER_KV_HEAD): one per item */
    int32_t G, rows_per_tile, nq_max;
    int values_ask_all; /* the values kernel asks for the next block-head's keys too (values_take_hint) */
    work_item *items;
    tile *tiles;
    float *parts;       /* partial (m, l, o[d_v]) per query vector of split items */
    /* attention mass (d->mass; NULL otherwise): the final log-sum-exp of every query row and head, the counted
     * rows' raw scores of the sequences that keep them, and the per-sequence plan (mass_seq) */
    float *lse;         /* [rows][n_heads_q]; +inf where the query saw nothing */
    float *store;       /* kept scores: sequence s's at mseq[s].store, [kv head][counted query][token] */
    mass_seq *mseq;
    mass_unit *units;
    int64_t n_reduce;   /* the tiles of finish_task's loop (its reduce part), before the mass units */
    size_t mass_at;     /* a worker's mass unit sums (MASS_UNIT floats) in its scratch */
    uint8_t *scratch;   /* per-worker scratch: one part per kv head of an item, then the block's scores */
    size_t scratch_bytes, head_scratch_bytes, scores_at;
    size_t gather_at, gather_v; /* with masks: a worker's gathered keys at gather_at, its values gather_v on; else 0 */
} attend_ctx;

/* Per-worker scratch, carved from one block: a part per kv head of the item, except the block's scores and
 * weights s, which live only from a block-head's scores to its values and so are one buffer for all of a
 * worker's kv heads: one per head put 2 KB more of scratch (4 queries) in the L1 at every block-head, which
 * already holds that block-head's keys and values and the next one's prefetch. */
typedef struct scratch {
    float *q, *qsum, *m, *l, *o, *s;
    uint8_t *gather; /* the worker's gathered rows (attend_sparse), NULL without masks */
    uint8_t *prep; /* the kernel table's query_prep output for the format's encoding */
    int32_t *pos;
    /* a query whose weights are kept (mass_seq in_item): the weights of tokens [ep_t[e], ep_t[e + 1]) were taken at
     * the running maximum ep_m[e], ep_n of them, MASS_EPOCHS at most ([query][MASS_EPOCHS]) */
    int32_t *ep_t, *ep_n;
    float *ep_m;
} scratch;

static size_t align_up(size_t x) { return (x + 63u) & ~(size_t)63u; }

static size_t scratch_size(const gokv_layout *L, int32_t nq) {
    const int32_t ng = L->group ? L->d_k / L->group : 1;
    return align_up((size_t)nq * L->d_k * 4u) + align_up((size_t)nq * ng * 4u) + 2 * align_up((size_t)nq * 4u) +
           align_up((size_t)nq * L->d_v * 4u) + align_up((size_t)nq * 4u) + (size_t)nq * CPU_PREP_STRIDE(L->d_k) +
           2 * align_up((size_t)nq * MASS_EPOCHS * 4u) + align_up((size_t)nq * 4u);
}

static scratch carve(uint8_t *base, const gokv_layout *L, int32_t nq) {
    const int32_t ng = L->group ? L->d_k / L->group : 1;
    scratch s;
    s.q = (float *)base, base += align_up((size_t)nq * L->d_k * 4u);
    s.qsum = (float *)base, base += align_up((size_t)nq * ng * 4u);
    s.m = (float *)base, base += align_up((size_t)nq * 4u);
    s.l = (float *)base, base += align_up((size_t)nq * 4u);
    s.o = (float *)base, base += align_up((size_t)nq * L->d_v * 4u);
    s.s = NULL; /* the worker's, shared by the item's kv heads (run_item) */
    s.gather = NULL;
    s.prep = base, base += (size_t)nq * CPU_PREP_STRIDE(L->d_k);
    s.pos = (int32_t *)base, base += align_up((size_t)nq * 4u);
    s.ep_t = (int32_t *)base, base += align_up((size_t)nq * MASS_EPOCHS * 4u);
    s.ep_m = (float *)base, base += align_up((size_t)nq * MASS_EPOCHS * 4u);
    s.ep_n = (int32_t *)base;
    return s;
}

/* The token ranges kv head h of sequence seq reads for query rows at positions p0..p1: Quest's (quest.c) or
 * those cut from the masks (cpu_mask_plan), else the visible ranges (gokv_visible_ranges, into buf). */
static inline int32_t item_segs(const attend_ctx *c, int32_t seq, int32_t h, int32_t p0, int32_t p1, seg buf[2],
                                const seg **out) {
    if (c->hr) {
        const int64_t i = (int64_t)seq * c->L->n_kv_heads + h;
        if (c->hr->count[i] >= 0) {
            *out = c->hr->ranges + c->hr->off[i];
            return c->hr->count[i];
        }
    }
    *out = buf;
    return gokv_visible_ranges(c->d, c->d->kv_len[seq], p0, p1, buf);
}

/* Sets bits [x, y) of a block's bit set (0 <= x, y <= CPU_BLOCK; nothing when x >= y). */
static void bits_set(uint32_t *bits, int32_t x, int32_t y) {
    for (; x < y; x = (x | 31) + 1) {
        const int32_t e = y < (x | 31) + 1 ? y : (x | 31) + 1; /* within x's word */
        bits[x >> 5] |= (e - x == 32 ? ~0u : ((1u << (e - x)) - 1u)) << (x & 31);
    }
}

/* Which tokens base + t (t < n) of a kv head queries at positions p0..p1 may see, as bits t of bits (their union
 * over the positions): those in [lo, hi) (the item's range), at most p1, in the window of p0 or sinks, and set in
 * the mask (NULL: none) of kv_len tokens. Returns how many. */
static int32_t visible_bits(const gokv_attend_desc *d, const uint32_t *mask, int32_t kv_len, int32_t base, int32_t n,
                            int32_t lo, int32_t hi, int32_t p0, int32_t p1, uint32_t bits[CPU_BLOCK / 32]) {
    const int32_t a = lo > base ? lo : base;
    int32_t e = base + n < hi ? base + n : hi;
    e = (int64_t)p1 + 1 < e ? p1 + 1 : e;
    memset(bits, 0, CPU_BLOCK / 8);
    if (a >= e) return 0;
    if (d->window == 0) {
        bits_set(bits, a - base, e - base);
    } else { /* the sinks [0, n_sink), and (p0 - W, ...) */
        const int64_t wlo = (int64_t)p0 - d->window + 1;
        const int32_t sink_e = d->n_sink_tokens < e ? d->n_sink_tokens : e;
        bits_set(bits, a - base, sink_e - base);
        bits_set(bits, (int32_t)(wlo > a ? (wlo < e ? wlo : e) : a) - base, e - base);
    }
    int32_t count = 0;
    const int32_t words = (kv_len + 31) >> 5, sh = base & 31;
    for (int32_t j = 0; j * 32 < n; j++) {
        if (mask) {
            const int32_t w = (base >> 5) + j;
            uint64_t m = mask[w];
            if (sh && w + 1 < words) m |= (uint64_t)mask[w + 1] << 32;
            bits[j] &= (uint32_t)(m >> sh);
        }
        count += __builtin_popcount(bits[j]);
    }
    return count;
}

/* What the queries of an item see of one block of one kv head. */
typedef struct block_vis {
    int all;        /* every query sees every token: nothing to hide */
    int32_t nlive;  /* the tokens some query sees */
    uint32_t live[CPU_BLOCK / 32];
} block_vis;

/* The running maximum m of the online softmax moves only when a block's maximum passes it by more than
 * this: weights e^(s - m) then stay below e^8 (no overflow in l or o), and (l, o) are rescaled a few times
 * per item instead of at every new maximum (at 4K with 64-token pages the rescales took 5% of a decode).
 * Any m gives the same result: the reduce pass and the final division use the m the sums were taken at. */
#define RESCALE_SLACK 8.0f

static void epoch_add(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, int32_t nq, int32_t i, int32_t base,
                      float m);

/* Online softmax over one scored, masked block (its first token in range: base): rescales (m, l, o) and turns scores into
 * weights p, noting the queries' new maxima when their weights are kept (epoch_add). Returns 0 when no query sees
 * any token of the block (nothing to accumulate). */
static int softmax_block(const attend_ctx *c, const scratch *sc, int32_t nq, int32_t n, int32_t seq, int32_t h,
                         int32_t base) {
    const int kept = c->mseq && c->mseq[seq].in_item;
    int any = 0;
    for (int32_t i = 0; i < nq; i++) {
        float *si = sc->s + (size_t)i * CPU_BLOCK;
        const float bm = c->k->max(si, n);
        if (bm == -INFINITY) {
            memset(si, 0, (size_t)n * sizeof *si);
            continue;
        }
        any = 1;
        if (sc->m[i] == -INFINITY) { /* the first visible block: l and o are still 0, nothing to rescale */
            sc->m[i] = bm;
            if (kept) epoch_add(c, seq, h, sc, nq, i, base, bm);
        } else if (bm > sc->m[i] + RESCALE_SLACK) {
            const float corr = expf(sc->m[i] - bm);
            sc->l[i] *= corr;
            float *oi = sc->o + (size_t)i * c->L->d_v;
            for (int32_t v = 0; v < c->L->d_v; v++) oi[v] *= corr;
            sc->m[i] = bm;
            if (kept) epoch_add(c, seq, h, sc, nq, i, base, bm);
        }
        sc->l[i] += c->k->exp_sum(si, n, sc->m[i]);
    }
    return any;
}

/* One block of tokens [base, base + n), the same for every kv head of an item: where it lives. */
typedef struct block {
    int32_t base, n;
    int32_t lo, hi;       /* the tokens of the block that may be seen (others are masked) */
    int32_t next;         /* first token of the next block (for prefetching), >= hi of the range when none */
    const uint8_t *page;  /* NULL: ring rows */
    int32_t slot;         /* first slot in the page (KIVI: the key group's first slot), or ring row */
    const uint8_t *page2; /* per-token formats: the next page, holding tokens [base + n1, base + n); else NULL */
    int32_t n1;           /* tokens in the first page */
} block;

/* The first token of block b in its range (a KIVI block starts at its key group, which may begin before the range). */
static inline int32_t block_first(const block *b) { return b->base > b->lo ? b->base : b->lo; }

/* What the queries sc (nq of them, rows of G) see of block b of kv head h of sequence seq. */
static block_vis block_visibility(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, int32_t nq, const block *b) {
    const gokv_attend_desc *d = c->d;
    const int32_t p0 = sc->pos[0], p1 = sc->pos[nq - 1], last = b->base + b->n - 1;
    block_vis v;
    /* every token in range, causal and in every query's window, no mask: all seen */
    v.all = !d->valid_mask && b->base >= b->lo && last < b->hi && last <= p0 &&
            (d->window == 0 || (int64_t)b->base > (int64_t)p1 - d->window || last < d->n_sink_tokens);
    if (v.all) {
        v.nlive = b->n;
        memset(v.live, 0, sizeof v.live);
        bits_set(v.live, 0, b->n);
        return v;
    }
    v.nlive = visible_bits(d, cpu_head_mask(d, seq, h), d->kv_len[seq], b->base, b->n, b->lo, b->hi, p0, p1, v.live);
    v.all = p0 == p1 && v.nlive == b->n; /* one row: what it sees is the union */
    return v;
}

/* Sets s[i][t] = -inf where query i must not see token base + t of block b (v: block_visibility), row by row
 * (the G query vectors of a row share its position). The scores were computed for every token: the kernels
 * run unmasked, and hiding costs a masked store per 16 tokens and query. */
static void hide_block(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, int32_t nq, const block *b,
                       const block_vis *v) {
    if (v->all) return;
    const gokv_attend_desc *d = c->d;
    for (int32_t i0 = 0; i0 < nq; i0 += c->G) {
        uint32_t bits[CPU_BLOCK / 32];
        const uint32_t *keep = v->live;
        if (sc->pos[0] != sc->pos[nq - 1]) { /* rows at several positions: this row's own */
            visible_bits(d, cpu_head_mask(d, seq, h), d->kv_len[seq], b->base, b->n, b->lo, b->hi, sc->pos[i0], sc->pos[i0], bits);
            keep = bits;
        }
        for (int32_t i = i0; i < i0 + c->G && i < nq; i++) c->k->hide(sc->s + (size_t)i * CPU_BLOCK, b->n, keep);
    }
}

/* The block of a per-token format from token t (whose page is present) to at most hi: to the end of t's
 * page, and on through the next page when that end is a multiple of CPU_RUN_ALIGN tokens from t and the
 * next page is present, CPU_BLOCK tokens at most. With 64-token pages a kernel call then covers 128 tokens,
 * as with 128-token pages (bench_decode, q4, 2 threads: 64-token pages took 5-8% longer than 128-token ones
 * at 4K-128K before blocks spanned pages, about a third of that is recovered; README). */
static block page_block(const gokv_layout *L, const cpu_pool *pool, const int32_t *ids, int32_t t, int32_t lo, int32_t hi) {
    const int32_t P = L->page_size, slot = t % P, page_end = t - slot + P;
    int32_t n = hi - t;
    n = n < page_end - t ? n : page_end - t;
    n = n < CPU_BLOCK ? n : CPU_BLOCK;
    block b = {t, n, lo, hi, t + n, cpu_page(pool, L, ids[t / P]), slot, NULL, n};
    if (t + n == page_end && page_end < hi && n % CPU_RUN_ALIGN == 0 && n < CPU_BLOCK && ids[page_end / P] >= 0) {
        int32_t n2 = hi - page_end;
        n2 = n2 < P ? n2 : P;
        n2 = n2 < CPU_BLOCK - n ? n2 : CPU_BLOCK - n;
        b.page2 = cpu_page(pool, L, ids[page_end / P]);
        b.n += n2;
        b.next += n2;
    }
    return b;
}

/* The rows of kv head h's keys (value 0) or values (1) in block b (per-token formats). */
static cpu_rows block_rows(const gokv_layout *L, const block *b, int32_t h, int32_t value) {
    cpu_rows r = cpu_page_rows(L, b->page, h, value, b->slot, b->n1);
    if (b->page2) {
        const cpu_rows r2 = cpu_page_rows(L, b->page2, h, value, 0, b->n - b->n1);
        cpu_rows_join(&r, &r2);
    }
    return r;
}

/* Software prefetch. Each (block, kv head) asks for the next one in walk order (its ~20 KB of codes,
 * scales and biases at d = 128, q4): the hardware prefetchers follow a page's head blocks, but they restart
 * at every page and item. The SIMD kernels spread the request over their arithmetic (cpu_prefetch): asked
 * for at once, its ~300 lines stall the kernel's own loads (docs/performance.md: the walk from DRAM).
 * Each kernel asks for its own half (scores the keys, values the values), except where the kernel table
 * says so (values_take_hint: the VNNI q4 scores on AMD): those scores are paced by load slots there
 * (avx512_q4.c), which a prefetch takes too, while the values kernel has slots to spare, so it asks for all of
 * it, keys first. Not for f16 and q8: their scores are not load-bound and their blocks are larger, so the
 * values kernel asking for everything made them slower. KIVI blocks ask the same way (kivi_hint). */
static void prefetch_now(const cpu_prefetch *pf) {
    for (int i = 0; i < CPU_PREFETCH_REGIONS; i++)
        if (pf->n[i]) cpu_prefetch_bytes(pf->p[i], pf->n[i]);
}

/* The keys and values of kv head h in block b (per-token formats), and the same as prefetch hints. Each
 * block-head's are formed once: as the hint its predecessor in walk order asks for, then read. */
typedef struct head_rows {
    cpu_rows k, v;
    cpu_prefetch pk, pv; /* the hints for the scores kernel and for the values kernel (prefetch_now) */
    block_vis vis;       /* what the item's queries see of it */
} head_rows;

/* Whether block b, of which v is seen, is gathered (attend_sparse): sc has gather buffers (masks), and few are seen. */
static int gathered(const scratch *sc, const block *b, const block_vis *v) {
    return sc->gather && v->nlive * SPARSE_DEN <= b->n * SPARSE_NUM;
}

/* The rows of kv head h (queries sc of sequence seq) in block b. A block nobody sees asks for nothing; a gathered
 * one only for its keys, and its seen values are asked for now, a block-head ahead (a few lines apart: the walk's
 * hints would ask for all of them). */
static void block_head_rows(const attend_ctx *c, int32_t seq, const scratch *sc, int32_t nq, const block *b, int32_t h,
                            head_rows *r) {
    const gokv_layout *L = c->L;
    r->k = block_rows(L, b, h, 0);
    r->v = block_rows(L, b, h, 1);
    r->vis = block_visibility(c, seq, h, sc, nq, b);
    const cpu_rows *v = L->v_is_k_prefix ? NULL : &r->v; /* the keys already */
    if (r->vis.nlive == 0 || gathered(sc, b, &r->vis)) {
        const cpu_rows *k = r->vis.nlive ? &r->k : NULL;
        r->pk = cpu_rows_prefetch(c->values_ask_all ? NULL : k, NULL);
        r->pv = cpu_rows_prefetch(c->values_ask_all ? k : NULL, NULL);
        const cpu_rows *rv = L->v_is_k_prefix ? &r->k : &r->v;
        for (int32_t w = 0; w < CPU_BLOCK / 32; w++)
            for (uint32_t x = r->vis.live[w]; x; x &= x - 1) {
                const int32_t t = w * 32 + __builtin_ctz(x);
                cpu_prefetch_bytes(cpu_row_codes(rv, t), rv->row_stride);
                if (rv->scale) cpu_prefetch_line(cpu_row_scale(rv, t)), cpu_prefetch_line(cpu_row_bias(rv, t));
            }
    } else if (c->values_ask_all) {
        r->pk = cpu_rows_prefetch(NULL, NULL);
        r->pv = cpu_rows_prefetch(&r->k, v);
    } else {
        r->pk = cpu_rows_prefetch(&r->k, NULL);
        r->pv = cpu_rows_prefetch(v, NULL);
    }
}

/* The per-token block that starts at token t, for the hints; 0 when there is none (past the range, or a
 * released page). */
static int next_block(const gokv_layout *L, const cpu_pool *pool, const int32_t *ids, int32_t t, int32_t hi, block *nb) {
    if (t >= hi || ids[t / L->page_size] < 0) return 0;
    *nb = page_block(L, pool, ids, t, t, hi);
    return 1;
}

/* KIVI: regions 3..5 of pf ask for kv head h's key group at token t; none past the range, in the ring (small
 * and recently written) or in a released page. */
static void kivi_group_hint(const gokv_layout *L, const cpu_pool *pool, const int32_t *ids, int32_t h, int32_t t,
                            int32_t hi, int32_t n_quant, cpu_prefetch *pf) {
    pf->n[3] = pf->n[4] = pf->n[5] = 0;
    if (t >= hi || t >= n_quant) return;
    const int32_t P = L->page_size, id = ids[t / P];
    if (id < 0) return;
    const cpu_chan ch = cpu_page_chan(L, cpu_page(pool, L, id), h, t % P / L->group);
    pf->p[3] = ch.codes, pf->n[3] = L->k_row_bytes;
    pf->p[4] = (const uint8_t *)ch.scale, pf->n[4] = (size_t)L->d_k * 2u;
    pf->p[5] = (const uint8_t *)ch.bias, pf->n[5] = (size_t)L->d_k * 2u;
}

/* What a KIVI block asks for while it runs, of the next block-head in walk order (the next head's of the same
 * block, or the next block's first head's): its keys group by group while the keys kernel runs (kv head h's
 * key groups from token `from`, as far as the block's own groups go), its values while the values kernel runs.
 * Each kernel then asks for half the bytes it used to: the keys kernel asked for its own block's values too,
 * at the rate a core keeps misses in flight, and the values kernel for nothing (the walk from DRAM and the
 * kernels took turns). */
typedef struct kivi_hint {
    const int32_t *ids;
    int32_t h, from, hi, n_quant;
    cpu_prefetch values;
} kivi_hint;

/* The key group of kv head h at token t0 of KIVI block b (t0 a multiple of the group, in the first page or the
 * second). */
static cpu_chan kivi_block_group(const gokv_layout *L, const block *b, int32_t h, int32_t t0) {
    const int first = t0 < b->n1;
    return cpu_page_chan(L, first ? b->page : b->page2, h, (first ? b->slot + t0 : t0 - b->n1) / L->group);
}

/* The KIVI block from token t (page id present) to at most end (<= the quantized length): t's key group
 * and the whole groups after it, CPU_BLOCK tokens at most, over two pages at most (the second present,
 * joined as in page_block): a block of one group paid a softmax, a values call and their setup every 32
 * tokens at g = 32. What a block asks for ahead is still a group at a time, while each group is scored
 * (kivi_hint): asking for the whole block at once stalled the kernels' loads. */
static block kivi_block(const gokv_layout *L, const cpu_pool *pool, const int32_t *ids, int32_t t, int32_t end) {
    const int32_t P = L->page_size, g = L->group, slot = t % P, base = t - slot % g;
    block b = {base, g, t, 0, 0, cpu_page(pool, L, ids[t / P]), slot - slot % g, NULL, g};
    for (int32_t next = base + g; next < end && b.n + g <= CPU_BLOCK; next += g) {
        if (next % P == 0) { /* a new page: the second at most, present, after a whole run */
            if (b.page2 || ids[next / P] < 0 || b.n % CPU_RUN_ALIGN != 0) break;
            b.page2 = cpu_page(pool, L, ids[next / P]);
        }
        b.n += g;
        if (!b.page2) b.n1 = b.n;
    }
    b.hi = base + b.n < end ? base + b.n : end;
    b.next = b.hi;
    return b;
}

/* The values of the block-head ask points at (ask->h at token ask->from: block b's own tokens, or the KIVI block
 * after b), as ask->values; none when values are the keys (MLA), past the quantized tokens (the ring is small
 * and recently written) or in a released page. */
static void kivi_values_hint(const attend_ctx *c, const int32_t *ids, const block *b, kivi_hint *ask) {
    const gokv_layout *L = c->L;
    memset(&ask->values, 0, sizeof ask->values);
    if (L->v_is_k_prefix) return;
    const int32_t end = ask->n_quant < ask->hi ? ask->n_quant : ask->hi;
    block nb = *b;
    if (ask->from != b->base) {
        if (ask->from >= end || ids[ask->from / L->page_size] < 0) return;
        nb = kivi_block(L, c->pool, ids, ask->from, end);
    }
    const cpu_rows rv = block_rows(L, &nb, ask->h, 1);
    ask->values = cpu_rows_prefetch(&rv, NULL);
}

/* Attention mass: copies the scores of the counted queries of block b of kv head h (masked: -inf where a query
 * does not see the token) into the sequence's store, for its tokens in [lo, hi) (the others belong to another
 * chunk's item, or are not visible). */
static void keep_scores(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, int32_t nq, const block *b) {
    const mass_seq *ms = &c->mseq[seq];
    if (ms->store < 0) return;
    const int32_t a = b->base > b->lo ? b->base : b->lo, e = b->base + b->n < b->hi ? b->base + b->n : b->hi;
    if (a >= e) return;
    const int64_t kv = c->d->kv_len[seq], nqc = (int64_t)ms->counted * c->G;
    float *dst = c->store + ms->store + (int64_t)h * nqc * kv + a;
    for (int32_t i = ms->first_q; i < nq; i++)
        memcpy(dst + (i - ms->first_q) * kv, sc->s + (size_t)i * CPU_BLOCK + (a - b->base), (size_t)(e - a) * sizeof(float));
}

/* Whether sequence seq keeps the weights e^(s - m) of its counted queries after the softmax (mass_seq in_item: the
 * mass is then a multiply per token, m noted per epoch) rather than their scores before it. */
static inline int keeps_weights(const attend_ctx *c, int32_t seq) { return c->mseq && c->mseq[seq].in_item; }

/* keep_scores for a block whose scores are those of the tokens idx[0..n) only (attend_sparse; n = 0: none seen):
 * the others are -inf (weights: 0). */
static void keep_scores_of(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, int32_t nq, const block *b,
                           const uint8_t *idx, int32_t n) {
    const mass_seq *ms = &c->mseq[seq];
    if (ms->store < 0) return;
    const int32_t a = b->base > b->lo ? b->base : b->lo, e = b->base + b->n < b->hi ? b->base + b->n : b->hi;
    if (a >= e) return;
    const int64_t kv = c->d->kv_len[seq], nqc = (int64_t)ms->counted * c->G;
    float *dst = c->store + ms->store + (int64_t)h * nqc * kv + b->base;
    for (int32_t i = ms->first_q; i < nq; i++) {
        float *di = dst + (i - ms->first_q) * kv;
        const float hidden = keeps_weights(c, seq) ? 0.0f : -INFINITY;
        for (int32_t t = a - b->base; t < e - b->base; t++) di[t] = hidden;
        for (int32_t j = 0; j < n; j++) di[idx[j]] = sc->s[(size_t)i * CPU_BLOCK + j];
    }
}

/* Notes that query i's weights are taken at the running maximum m from token base on (softmax_block), when it is a
 * counted query of a sequence that keeps weights. With MASS_EPOCHS noted already, the kept weights so far are first
 * brought to the last of them, which then stands for them all: at most one pass over them per MASS_EPOCHS moves of m,
 * each of more than RESCALE_SLACK. */
static void epoch_add(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, int32_t nq, int32_t i, int32_t base,
                      float m) {
    (void)nq;
    const mass_seq *ms = &c->mseq[seq];
    if (i < ms->first_q || ms->store < 0) return;
    int32_t *t = sc->ep_t + (size_t)i * MASS_EPOCHS, n = sc->ep_n[i];
    float *em = sc->ep_m + (size_t)i * MASS_EPOCHS;
    if (n == MASS_EPOCHS) {
        const int64_t kv = c->d->kv_len[seq], nqc = (int64_t)ms->counted * c->G;
        float *w = c->store + ms->store + ((int64_t)h * nqc + (i - ms->first_q)) * kv;
        for (int32_t e = 0; e + 1 < n; e++) {
            const float f = expf(em[e] - em[n - 1]);
            for (int32_t x = t[e]; x < t[e + 1]; x++) w[x] *= f;
        }
        em[0] = em[n - 1];
        n = 1;
    }
    t[n] = base;
    em[n] = m;
    sc->ep_n[i] = n + 1;
}

/* Scores, masks and accumulates block b for kv head h into its scratch: a ring block or a KIVI block
 * (attend_rows takes the per-token formats). */
static void attend_block(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, int32_t nq, const block *b,
                         const uint8_t *ring, const kivi_hint *ask) {
    const gokv_layout *L = c->L;
    const cpu_kernels *k = c->k;
    const block_vis v = block_visibility(c, seq, h, sc, nq, b);
    if (v.nlive == 0) { /* nothing seen: not read */
        if (c->store) keep_scores_of(c, seq, h, sc, nq, b, NULL, 0);
        return;
    }
    if (!b->page) { /* KIVI residual ring: fp16 rows */
        cpu_rows rk = cpu_ring_rows(L, ring, h, 0, b->slot, b->n);
        k->score_rows[CPU_ENC_F16](&rk, L->d_k, sc->q, L->d_k, NULL, NULL, nq, sc->s, CPU_BLOCK);
        hide_block(c, seq, h, sc, nq, b, &v);
        if (c->store && !keeps_weights(c, seq)) keep_scores(c, seq, h, sc, nq, b);
        const int any = softmax_block(c, sc, nq, b->n, seq, h, block_first(b));
        if (c->store && keeps_weights(c, seq)) keep_scores(c, seq, h, sc, nq, b);
        if (any) {
            cpu_rows rv = cpu_ring_rows(L, ring, h, 1, b->slot, b->n);
            k->accum_rows[CPU_ENC_F16](&rv, L->d_v, sc->s, CPU_BLOCK, nq, sc->o, L->d_v);
        }
        return;
    }
    if (L->kivi) { /* whole key groups (kivi_block); tokens outside [lo, hi) are masked */
        const int32_t g = L->group;
        const cpu_rows rv = block_rows(L, b, h, 1);
        /* each group asks for the hint's group while it is scored (spread over the keys kernel: ~50 lines at once
         * stalled it on the core's miss buffers) */
        for (int32_t t0 = 0; t0 < b->n; t0 += g) {
            cpu_prefetch pf;
            memset(&pf, 0, sizeof pf);
            kivi_group_hint(L, c->pool, ask->ids, ask->h, ask->from + t0, ask->hi, ask->n_quant, &pf);
            cpu_chan ch = kivi_block_group(L, b, h, t0);
            if (k->spreads_prefetch) ch.pf = &pf;
            else prefetch_now(&pf);
            k->score_chan(&ch, L->d_k, sc->q, L->d_k, nq, sc->s + t0, CPU_BLOCK);
        }
        hide_block(c, seq, h, sc, nq, b, &v);
        if (c->store && !keeps_weights(c, seq)) keep_scores(c, seq, h, sc, nq, b);
        const int any = softmax_block(c, sc, nq, b->n, seq, h, block_first(b));
        if (c->store && keeps_weights(c, seq)) keep_scores(c, seq, h, sc, nq, b);
        if (!any) return;
        if (!L->v_is_k_prefix) {
            cpu_rows rvh = rv;
            if (k->spreads_prefetch) rvh.pf = &ask->values;
            else prefetch_now(&ask->values);
            k->accum_rows[cpu_row_enc(L->format)](&rvh, L->d_v, sc->s, CPU_BLOCK, nq, sc->o, L->d_v);
            return;
        }
        for (int32_t t0 = 0; t0 < b->n; t0 += g) {
            const cpu_chan ch = kivi_block_group(L, b, h, t0);
            k->accum_chan(&ch, L->d_v, sc->s + t0, CPU_BLOCK, nq, sc->o, L->d_v);
        }
        return;
    }
}

/* The rows of r at its tokens idx[0..n) (ascending), copied to buf as rows of one run: tiled keys as tiles from
 * lane 0, plain rows as plain rows, then their scales and biases. */
static cpu_rows gather_rows(const cpu_rows *r, const uint8_t *idx, int32_t n, uint8_t *buf) {
    cpu_rows g = *r;
    const size_t rs = r->row_stride, groups = r->scale ? r->sb_stride : 0, words = rs / 4u;
    const int tiled = r->tile >= 0;
    uint16_t *sc = (uint16_t *)(buf + align_up(tiled ? (size_t)(n + CPU_TILE - 1) / CPU_TILE * CPU_TILE * rs : (size_t)n * rs));
    uint16_t *bi = sc + (size_t)n * groups;
    for (int32_t j = 0; j < n; j++) {
        const int32_t t = idx[j];
        if (tiled) { /* dword k of row t at column k, lane `lane` of its tile; of row j at lane j % 16 of tile j / 16 */
            int32_t lane;
            const uint32_t *src = (const uint32_t *)cpu_tile_at(r, t, &lane) + lane;
            uint32_t *dst = (uint32_t *)buf + (size_t)(j / CPU_TILE) * CPU_TILE * words + j % CPU_TILE;
            for (size_t k = 0; k < words; k++) dst[k * CPU_TILE] = src[k * CPU_TILE];
        } else {
            memcpy(buf + (size_t)j * rs, cpu_row_codes(r, t), rs);
        }
        if (groups) {
            memcpy(sc + (size_t)j * groups, cpu_row_scale(r, t), groups * 2u);
            memcpy(bi + (size_t)j * groups, cpu_row_bias(r, t), groups * 2u);
        }
    }
    g.codes = buf;
    g.tile = tiled ? 0 : -1;
    g.scale = groups ? sc : NULL;
    g.bias = groups ? bi : NULL;
    g.n = g.n1 = n;
    g.codes2 = NULL;
    g.scale2 = g.bias2 = NULL;
    return g;
}

/* Bytes of gather_rows' output for CPU_BLOCK rows of row_bytes bytes and `groups` scales each (tiles of keys
 * hold CPU_BLOCK rows too). */
static size_t gather_bytes(uint64_t row_bytes, int32_t groups) {
    return align_up((size_t)CPU_BLOCK * row_bytes) + 2u * align_up((size_t)CPU_BLOCK * (size_t)groups * 2u);
}

/* Block b of a per-token format when few of its tokens are seen (v): their key and value rows are gathered
 * (gather_rows), so that scores, softmax and values run over them alone, as a block of v->nlive tokens. A
 * masked token then costs its share of a bit scan, not a score and a value row. */
static void attend_sparse(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, int32_t nq, const block *b,
                          const block_vis *v, const cpu_rows *rk, const cpu_rows *rv) {
    const gokv_layout *L = c->L;
    const cpu_kernels *k = c->k;
    const int32_t enc = cpu_row_enc(L->format);
    uint8_t idx[CPU_BLOCK];
    int32_t n = 0;
    for (int32_t w = 0; w < CPU_BLOCK / 32; w++)
        for (uint32_t x = v->live[w]; x; x &= x - 1) idx[n++] = (uint8_t)(w * 32 + __builtin_ctz(x));
    cpu_rows gk = gather_rows(rk, idx, n, sc->gather);
    k->score_rows[enc](&gk, L->d_k, sc->q, L->d_k, sc->qsum, k->query_prep[enc] ? sc->prep : NULL, nq, sc->s,
                       CPU_BLOCK);
    if (sc->pos[0] != sc->pos[nq - 1]) { /* rows at several positions: each row's own tokens among the gathered */
        const gokv_attend_desc *d = c->d;
        for (int32_t i0 = 0; i0 < nq; i0 += c->G) {
            uint32_t bits[CPU_BLOCK / 32], keep[CPU_BLOCK / 32] = {0};
            visible_bits(d, cpu_head_mask(d, seq, h), d->kv_len[seq], b->base, b->n, b->lo, b->hi, sc->pos[i0], sc->pos[i0], bits);
            for (int32_t j = 0; j < n; j++) keep[j >> 5] |= ((bits[idx[j] >> 5] >> (idx[j] & 31)) & 1u) << (j & 31);
            for (int32_t i = i0; i < i0 + c->G && i < nq; i++) k->hide(sc->s + (size_t)i * CPU_BLOCK, n, keep);
        }
    }
    if (c->store && !keeps_weights(c, seq)) keep_scores_of(c, seq, h, sc, nq, b, idx, n);
    const int any = softmax_block(c, sc, nq, n, seq, h, block_first(b));
    if (c->store && keeps_weights(c, seq)) keep_scores_of(c, seq, h, sc, nq, b, idx, n);
    if (!any) {
        if (rv->pf) prefetch_now(rv->pf);
        return;
    }
    const cpu_rows gv = gather_rows(rv, idx, n, sc->gather + c->gather_v);
    k->accum_rows[enc](&gv, L->d_v, sc->s, CPU_BLOCK, nq, sc->o, L->d_v);
}

/* The same for block b of a per-token format, whose rows for this kv head are r; next, when not NULL, holds
 * the hints of what comes next in walk order. */
static void attend_rows(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, int32_t nq, const block *b,
                        const head_rows *r, const head_rows *next) {
    const gokv_layout *L = c->L;
    const cpu_kernels *k = c->k;
    const int32_t enc = cpu_row_enc(L->format);
    cpu_rows rk = r->k, rv = r->v;
    if (next && !k->spreads_prefetch) { /* this table's kernels ignore hints: ask for it all now */
        prefetch_now(&next->pk);
        prefetch_now(&next->pv);
    } else if (next) {
        rk.pf = &next->pk, rv.pf = &next->pv;
    }
    const block_vis v = r->vis;
    if (v.nlive == 0) { /* nothing seen: not read */
        if (c->store) keep_scores_of(c, seq, h, sc, nq, b, NULL, 0);
        if (next && k->spreads_prefetch) prefetch_now(&next->pk), prefetch_now(&next->pv);
        return;
    }
    if (gathered(sc, b, &v)) {
        attend_sparse(c, seq, h, sc, nq, b, &v, &rk, &rv);
        return;
    }
    k->score_rows[enc](&rk, L->d_k, sc->q, L->d_k, sc->qsum, k->query_prep[enc] ? sc->prep : NULL, nq, sc->s,
                       CPU_BLOCK);
    hide_block(c, seq, h, sc, nq, b, &v);
    if (c->store && !keeps_weights(c, seq)) keep_scores(c, seq, h, sc, nq, b);
    const int any = softmax_block(c, sc, nq, b->n, seq, h, block_first(b));
    if (c->store && keeps_weights(c, seq)) keep_scores(c, seq, h, sc, nq, b);
    if (any)
        k->accum_rows[enc](&rv, L->d_v, sc->s, CPU_BLOCK, nq, sc->o, L->d_v);
    else if (rv.pf)
        prefetch_now(rv.pf);
}

/* Walks the tokens [lo, hi) of one sequence in blocks (page_block; a KIVI key group; ring rows up to the
 * ring's end), and each block for every kv head of the item (sc[i] is head it->kvh + i's scratch). */
static void attend_range(const attend_ctx *c, const work_item *it, const scratch *sc, int32_t nq, int32_t lo, int32_t hi) {
    const gokv_attend_desc *d = c->d;
    const gokv_layout *L = c->L;
    const int32_t seq = it->seq, P = L->page_size;
    const int32_t kv_len = d->kv_len[seq];
    const int32_t *ids = d->page_ids + d->page_indptr[seq];
    const int32_t n_quant = L->kivi ? gokv_kivi_quantized_len(kv_len, L->group, L->residual) : kv_len;
    const uint8_t *ring = L->kivi && kv_len > n_quant ? cpu_ring(c->pool, L, d->residual_slot[seq]) : NULL;
    head_rows rows[2], *cur = &rows[0], *nxt = &rows[1];
    int have_cur = 0; /* cur holds the rows of the block at t, head it->kvh (asked for by its predecessor) */
    int32_t t = lo;
    while (t < hi) {
        const int32_t id = ids[t / P], slot = t % P;
        const int32_t page_end = t - slot + P;
        if (id < 0) { /* released page: nothing visible, even tokens still in a KIVI ring */
            t = page_end;
            have_cur = 0;
            continue;
        }
        block b;
        if (t >= n_quant) { /* KIVI residual ring, never past the page (its release hides them) */
            const int32_t r = t % L->ring_rows;
            int32_t n = hi - t;
            n = n < L->ring_rows - r ? n : L->ring_rows - r;
            n = n < CPU_BLOCK ? n : CPU_BLOCK;
            n = n < page_end - t ? n : page_end - t;
            b = (block){t, n, lo, hi, t + n, NULL, r, NULL, n};
        } else if (L->kivi) {
            b = kivi_block(L, c->pool, ids, t, n_quant < hi ? n_quant : hi); /* ring tokens from the ring */
        } else {
            b = page_block(L, c->pool, ids, t, lo, hi);
            if (!have_cur) { /* the range's first block (or one after a released page): asked for now */
                block_head_rows(c, seq, sc, nq, &b, it->kvh, cur);
                prefetch_now(&cur->pk);
                prefetch_now(&cur->pv);
            }
        }
        for (int32_t i = 0; i < it->nkvh; i++) {
            const int last = i + 1 == it->nkvh;
            if (!b.page) {
                attend_block(c, seq, it->kvh + i, &sc[i], nq, &b, ring, NULL);
                continue;
            }
            if (L->kivi) { /* the next head's rows of this block, or the next block's first head's */
                kivi_hint ask = {ids, last ? it->kvh : it->kvh + i + 1, last ? b.next : b.base, hi, n_quant, {{0}, {0}}};
                kivi_values_hint(c, ids, &b, &ask);
                attend_block(c, seq, it->kvh + i, &sc[i], nq, &b, ring, &ask);
                continue;
            }
            /* what comes next in walk order: this block's next head, or the next block's first */
            block nb;
            have_cur = 0;
            if (!last) {
                block_head_rows(c, seq, sc, nq, &b, it->kvh + i + 1, nxt);
                have_cur = 1;
            } else if (next_block(L, c->pool, ids, b.next, hi, &nb)) {
                block_head_rows(c, seq, sc, nq, &nb, it->kvh, nxt);
                have_cur = 1;
            }
            attend_rows(c, seq, it->kvh + i, &sc[i], nq, &b, cur, have_cur ? nxt : NULL);
            head_rows *const tmp = cur;
            cur = nxt, nxt = tmp;
        }
        t = b.next;
    }
}

/* Final normalization with the learned sink: out = o e^(m-M) / (l e^(m-M) + e^(σ-M)), zeros if nothing seen. */
static void finalize(float *out, const float *o, float m, float l, int has_sink, float sigma, int32_t dv) {
    if (l == 0.0f) {
        memset(out, 0, (size_t)dv * sizeof *out);
        return;
    }
    const float M = has_sink && sigma > m ? sigma : m;
    const float w = expf(m - M);
    const float den = l * w + (has_sink ? expf(sigma - M) : 0.0f);
    const float f = w / den;
    for (int32_t v = 0; v < dv; v++) out[v] = o[v] * f;
}

/* dst = src · scale over n floats (restrict: the compiler may vectorize it). */
static void scale_row(float *restrict dst, const float *restrict src, int32_t n, float scale) {
    for (int32_t x = 0; x < n; x++) dst[x] = src[x] * scale;
}

/* Σ x over n floats in 8 interleaved partial sums: a single running sum is a chain of n dependent adds, and
 * an item start runs one per query, kv head and key group (4 x 4 chains of 32 adds, about 2000 cycles per
 * kv head at d = 128, g = 32). */
static float sum_row(const float *x, int32_t n) {
    float acc[8] = {0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int32_t k = 0; k < 8; k++) acc[k] += x[i + k];
    for (; i < n; i++) acc[i & 7] += x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* Loads the queries of rows [row0, row0 + nrows) of sequence seq for kv head kvh into s: scaled q, positions,
 * and for per-token quantized formats the groups' Σq (and query_prep's pieces). Query vector i = r * G + g. */
static void load_queries(const attend_ctx *c, scratch *s, int32_t seq, int32_t kvh, int32_t row0, int32_t nrows) {
    const gokv_attend_desc *d = c->d;
    const gokv_layout *L = c->L;
    const int32_t G = c->G, nq = nrows * G, dk = L->d_k;
    const int32_t qrow0 = d->q_indptr[seq] + row0;
    for (int32_t r = 0; r < nrows; r++)
        for (int32_t g = 0; g < G; g++) {
            const int32_t i = r * G + g;
            scale_row(s->q + (size_t)i * dk, d->q + ((size_t)(qrow0 + r) * d->n_heads_q + (size_t)kvh * G + g) * dk, dk,
                      d->scale);
            s->pos[i] = d->q_pos[seq] + row0 + r;
        }
    if (L->group && !L->kivi) { /* Σ q over each group, for the bias term of per-token formats */
        const int32_t ng = dk / L->group;
        for (int32_t i = 0; i < nq; i++)
            for (int32_t j = 0; j < ng; j++) s->qsum[(size_t)i * ng + j] = sum_row(s->q + (size_t)i * dk + j * L->group, L->group);
        const cpu_prep_fn prep = c->k->query_prep[cpu_row_enc(L->format)];
        if (prep) prep(s->q, dk, nq, dk, L->group, s->prep);
    }
}

/* The log-sum-exp of a query's final softmax, the learned sink in it: M + log(l e^(m - M) + e^(σ - M)); +inf
 * when the query saw nothing (l = 0: every probability is 0). */
static float final_lse(float m, float l, int has_sink, float sigma) {
    if (l == 0.0f) return INFINITY;
    const float M = has_sink && sigma > m ? sigma : m;
    return M + logf(l * expf(m - M) + (has_sink ? expf(sigma - M) : 0.0f));
}

static void mass_in_item(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, float *lse);

static void run_item(void *ctx_, int64_t index, int32_t worker) {
    const attend_ctx *c = ctx_;
    const work_item *it = &c->items[index];
    const gokv_attend_desc *d = c->d;
    const gokv_layout *L = c->L;
    const int32_t G = c->G, nq = it->nrows * G, dv = L->d_v;
    scratch sc[ITEM_MAX_HEADS];
    const int32_t qrow0 = d->q_indptr[it->seq] + it->row0;
    for (int32_t hh = 0; hh < it->nkvh; hh++) {
        scratch *s = &sc[hh];
        *s = carve(c->scratch + (size_t)worker * c->scratch_bytes + (size_t)hh * c->head_scratch_bytes, L, c->nq_max);
        s->s = (float *)(c->scratch + (size_t)worker * c->scratch_bytes + c->scores_at);
        s->gather = c->gather_at ? c->scratch + (size_t)worker * c->scratch_bytes + c->gather_at : NULL;
        load_queries(c, s, it->seq, it->kvh + hh, it->row0, it->nrows);
        for (int32_t i = 0; i < nq; i++) s->m[i] = -INFINITY, s->l[i] = 0.0f, s->ep_n[i] = 0;
        memset(s->o, 0, (size_t)nq * dv * sizeof *s->o);
    }
    /* walk this chunk of the concatenated visible ranges (Quest: the kv head's own, one kv head per item) */
    seg buf[2];
    const seg *segs;
    const int32_t p0 = d->q_pos[it->seq] + it->row0, p1 = p0 + it->nrows - 1;
    const int32_t n_segs = item_segs(c, it->seq, it->kvh, p0, p1, buf, &segs);
    int32_t v = 0;
    for (int32_t s = 0; s < n_segs; s++) {
        const int32_t len = segs[s].hi - segs[s].lo;
        const int32_t a = it->v0 > v ? it->v0 : v, b = it->v1 < v + len ? it->v1 : v + len;
        if (a < b) attend_range(c, it, sc, nq, segs[s].lo + (a - v), segs[s].lo + (b - v));
        v += len;
    }
    for (int32_t hh = 0; hh < it->nkvh; hh++) {
        const int32_t kvh = it->kvh + hh;
        const scratch *s = &sc[hh];
        if (it->n_chunks > 1) { /* partials for the reduce pass */
            float *part = c->parts + it->part + ((int64_t)it->chunk * L->n_kv_heads + kvh) * nq * (dv + 2);
            for (int32_t i = 0; i < nq; i++) {
                float *pi = part + (size_t)i * (dv + 2);
                pi[0] = s->m[i];
                pi[1] = s->l[i];
                memcpy(pi + 2, s->o + (size_t)i * dv, (size_t)dv * sizeof(float));
            }
            continue;
        }
        for (int32_t r = 0; r < it->nrows; r++)
            for (int32_t g = 0; g < G; g++) {
                const int32_t i = r * G + g, head = kvh * G + g;
                float *out = d->out + ((size_t)(qrow0 + r) * d->n_heads_q + head) * dv;
                finalize(out, s->o + (size_t)i * dv, s->m[i], s->l[i], d->sink_logits != NULL,
                         d->sink_logits ? d->sink_logits[head] : 0.0f, dv);
                if (c->lse)
                    c->lse[(size_t)(qrow0 + r) * d->n_heads_q + head] =
                        final_lse(s->m[i], s->l[i], d->sink_logits != NULL, d->sink_logits ? d->sink_logits[head] : 0.0f);
            }
        if (c->mseq && c->mseq[it->seq].in_item) mass_in_item(c, it->seq, kvh, s, sc[0].m); /* sc[0]'s sums are written */
    }
}

static void reduce_tile(void *ctx_, int64_t index, int32_t worker) {
    (void)worker;
    const attend_ctx *c = ctx_;
    const tile *tl = &c->tiles[index];
    if (tl->n_chunks <= 1) return;
    const gokv_attend_desc *d = c->d;
    const int32_t G = c->G, dv = c->L->d_v, nq = tl->nrows * G;
    const size_t stride = (size_t)c->L->n_kv_heads * nq * (dv + 2); /* floats per chunk */
    const int32_t qrow0 = d->q_indptr[tl->seq] + tl->row0;
    for (int32_t r = 0; r < tl->nrows; r++)
        for (int32_t g = 0; g < G; g++) {
            const int32_t i = r * G + g, head = tl->kvh * G + g;
            const int has_sink = d->sink_logits != NULL;
            const float sigma = has_sink ? d->sink_logits[head] : 0.0f;
            float *out = d->out + ((size_t)(qrow0 + r) * d->n_heads_q + head) * dv;
            float M = -INFINITY;
            for (int32_t ch = 0; ch < tl->n_chunks; ch++) {
                const float *pc = c->parts + tl->part + ch * stride + (size_t)i * (dv + 2);
                if (pc[1] > 0.0f && pc[0] > M) M = pc[0];
            }
            if (M == -INFINITY) { /* nothing visible in any chunk */
                memset(out, 0, (size_t)dv * sizeof *out);
                continue;
            }
            if (has_sink && sigma > M) M = sigma;
            for (int32_t v = 0; v < dv; v++) out[v] = 0.0f;
            float den = has_sink ? expf(sigma - M) : 0.0f;
            for (int32_t ch = 0; ch < tl->n_chunks; ch++) {
                const float *pc = c->parts + tl->part + ch * stride + (size_t)i * (dv + 2);
                if (pc[1] == 0.0f) continue;
                const float w = expf(pc[0] - M);
                den += w * pc[1];
                for (int32_t v = 0; v < dv; v++) out[v] += w * pc[2 + v];
            }
            const float inv = 1.0f / den;
            for (int32_t v = 0; v < dv; v++) out[v] *= inv;
        }
}

/* ---- attention mass (gokv_attend_desc.mass): after the attention and its reduce, when every query's final
 * log-sum-exp (lse) is known. A unit takes tokens [t0, t1) of one kv head of one sequence and writes each of
 * their mass elements once: Σ over the counted queries of e^(s - lse) (masked and unseen tokens 0). Sequences
 * whose items sum their own mass (mass_seq in_item) have no units. ---- */

/* Scores block b of kv head h (its masked scores in sc->s, as the attention walk computes them); 0 when no query
 * sees any of its tokens (then nothing is scored). */
static int score_block(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, int32_t nq, const block *b,
                       const uint8_t *ring) {
    const gokv_layout *L = c->L;
    const cpu_kernels *k = c->k;
    const block_vis v = block_visibility(c, seq, h, sc, nq, b);
    if (v.nlive == 0) return 0;
    if (!b->page) {
        cpu_rows rk = cpu_ring_rows(L, ring, h, 0, b->slot, b->n);
        k->score_rows[CPU_ENC_F16](&rk, L->d_k, sc->q, L->d_k, NULL, NULL, nq, sc->s, CPU_BLOCK);
    } else if (L->kivi) {
        for (int32_t t0 = 0; t0 < b->n; t0 += L->group) {
            const cpu_chan ch = kivi_block_group(L, b, h, t0);
            k->score_chan(&ch, L->d_k, sc->q, L->d_k, nq, sc->s + t0, CPU_BLOCK);
        }
    } else {
        const int32_t enc = cpu_row_enc(L->format);
        cpu_rows rk = block_rows(L, b, h, 0);
        rk.pf = NULL;
        k->score_rows[enc](&rk, L->d_k, sc->q, L->d_k, sc->qsum, k->query_prep[enc] ? sc->prep : NULL, nq,
                           sc->s, CPU_BLOCK);
    }
    hide_block(c, seq, h, sc, nq, b, &v);
    return 1;
}

/* The mass of tokens [lo, hi) of kv head h from queries sc (nq of them, lse[i] their log-sum-exps), computed
 * again from the pages: the walk of attend_range without its values, added to acc (token t at acc[t - t0]). */
static void mass_recompute(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, int32_t nq, const float *lse,
                           int32_t lo, int32_t hi, float *acc, int32_t t0) {
    const gokv_attend_desc *d = c->d;
    const gokv_layout *L = c->L;
    const int32_t P = L->page_size, kv_len = d->kv_len[seq];
    const int32_t *ids = d->page_ids + d->page_indptr[seq];
    const int32_t n_quant = L->kivi ? gokv_kivi_quantized_len(kv_len, L->group, L->residual) : kv_len;
    const uint8_t *ring = L->kivi && kv_len > n_quant ? cpu_ring(c->pool, L, d->residual_slot[seq]) : NULL;
    int32_t t = lo;
    while (t < hi) {
        const int32_t id = ids[t / P], slot = t % P, page_end = t - slot + P;
        if (id < 0) {
            t = page_end;
            continue;
        }
        block b;
        if (t >= n_quant) {
            const int32_t r = t % L->ring_rows;
            int32_t n = hi - t;
            n = n < L->ring_rows - r ? n : L->ring_rows - r;
            n = n < CPU_BLOCK ? n : CPU_BLOCK;
            n = n < page_end - t ? n : page_end - t;
            b = (block){t, n, lo, hi, t + n, NULL, r, NULL, n};
        } else if (L->kivi) {
            b = kivi_block(L, c->pool, ids, t, n_quant < hi ? n_quant : hi);
        } else {
            b = page_block(L, c->pool, ids, t, lo, hi);
        }
        if (!score_block(c, seq, h, sc, nq, &b, ring)) {
            t = b.next;
            continue;
        }
        const int32_t a = t, e = b.next; /* the block's tokens in the range (a KIVI block starts at its group) */
        for (int32_t i = 0; i < nq; i++) {
            if (lse[i] == INFINITY) continue;
            c->k->exp_acc(sc->s + (size_t)i * CPU_BLOCK + (a - b.base), e - a, lse[i], acc + (a - t0));
        }
        t = b.next;
    }
}

/* The final log-sum-exp of query vector i (row r = i / G of the sequence, head h * G + i % G) of a sequence: from
 * the partials of its split tile's chunks when it has several (the same combine as reduce_tile, so the mass
 * pass runs beside the reduce), else as the item wrote it. */
static float query_lse(const attend_ctx *c, const mass_seq *ms, int32_t seq, int32_t h, int32_t i) {
    const gokv_attend_desc *d = c->d;
    const int32_t G = c->G, head = h * G + i % G;
    const tile *tl = ms->tile0 >= 0 ? &c->tiles[ms->tile0 + h] : NULL;
    if (!tl || tl->n_chunks <= 1) return c->lse[(size_t)(d->q_indptr[seq] + i / G) * d->n_heads_q + head];
    const int32_t dv = c->L->d_v, nq = tl->nrows * G;
    const size_t stride = (size_t)c->L->n_kv_heads * nq * (dv + 2);
    const int has_sink = d->sink_logits != NULL;
    const float sigma = has_sink ? d->sink_logits[head] : 0.0f;
    const float *p0 = c->parts + tl->part + (size_t)i * (dv + 2);
    float M = -INFINITY;
    for (int32_t ch = 0; ch < tl->n_chunks; ch++)
        if (p0[ch * stride + 1] > 0.0f && p0[ch * stride] > M) M = p0[ch * stride];
    if (M == -INFINITY) return INFINITY;
    if (has_sink && sigma > M) M = sigma;
    float den = has_sink ? expf(sigma - M) : 0.0f;
    for (int32_t ch = 0; ch < tl->n_chunks; ch++)
        if (p0[ch * stride + 1] != 0.0f) den += expf(p0[ch * stride] - M) * p0[ch * stride + 1];
    return M + logf(den);
}

/* The mass of kv head h of sequence seq (mseq in_item), written by the item that attended it, right after its
 * final log-sum-exps: the kept scores of its ranges, a MASS_UNIT of tokens at a time over every counted query
 * (the sums stay in the cache), and zeros elsewhere. */
static void mass_in_item(const attend_ctx *c, int32_t seq, int32_t h, const scratch *sc, float *lse) {
    const gokv_attend_desc *d = c->d;
    const mass_seq *ms = &c->mseq[seq];
    const int32_t kv_len = d->kv_len[seq], P = c->L->page_size;
    const int32_t *ids = d->page_ids + d->page_indptr[seq];
    const int64_t nqc = (int64_t)ms->counted * c->G;
    float *mass = d->mass + ms->mass + (int64_t)h * kv_len;
    const float *kept = c->store + ms->store + (int64_t)h * nqc * kv_len;
    for (int32_t i = 0; i < nqc; i++) lse[i] = query_lse(c, ms, seq, h, ms->first_q + i);
    seg buf[2];
    const seg *segs;
    const int32_t n_segs = item_segs(c, seq, h, d->q_pos[seq], d->q_pos[seq] + ms->rows - 1, buf, &segs);
    int32_t done = 0; /* the tokens before it are written */
    for (int32_t sg = 0; sg <= n_segs; sg++) {
        const int32_t lo = sg < n_segs ? segs[sg].lo : kv_len, hi = sg < n_segs ? segs[sg].hi : kv_len;
        if (lo > done) memset(mass + done, 0, (size_t)(lo - done) * sizeof(float));
        for (int32_t t0 = lo, t1; t0 < hi; t0 = t1) { /* a page's part, MASS_UNIT tokens at most */
            const int32_t page_end = t0 - t0 % P + P;
            t1 = hi < page_end ? hi : page_end;
            t1 = t1 - t0 < MASS_UNIT ? t1 : t0 + MASS_UNIT;
            memset(mass + t0, 0, (size_t)(t1 - t0) * sizeof(float));
            if (ids[t0 / P] < 0) continue; /* released: never scored */
            for (int32_t i = 0; i < nqc; i++) { /* Σ over its epochs of w e^(m_e - lse) */
                const int32_t q = ms->first_q + i, n_ep = sc->ep_n[q];
                const int32_t *et = sc->ep_t + (size_t)q * MASS_EPOCHS;
                const float *em = sc->ep_m + (size_t)q * MASS_EPOCHS;
                if (lse[i] == INFINITY) continue;
                for (int32_t e = 0; e < n_ep; e++) {
                    const int32_t x = et[e] > t0 ? et[e] : t0, y = e + 1 < n_ep && et[e + 1] < t1 ? et[e + 1] : t1;
                    if (x < y) c->k->scale_acc(kept + i * kv_len + x, y - x, expf(em[e] - lse[i]), mass + x);
                }
            }
        }
        done = hi > done ? hi : done;
    }
}

/* dst[0..n) = src[0..n), with streaming stores where the target has them (x86-64): the mass is the caller's,
 * written once and not read here again, so it is not worth a read for ownership nor cache space. */
static void write_stream(float *dst, const float *src, int32_t n) {
#if defined(__x86_64__) && defined(__SSE2__)
    int32_t t = 0;
    for (; t < n && ((uintptr_t)(dst + t) & 15u); t++) dst[t] = src[t];
    for (; t + 4 <= n; t += 4) _mm_stream_ps(dst + t, _mm_loadu_ps(src + t));
    for (; t < n; t++) dst[t] = src[t];
    _mm_sfence(); /* before the loop's completion publishes them */
#else
    memcpy(dst, src, (size_t)n * sizeof *dst);
#endif
}

static void mass_sums(const attend_ctx *c, const mass_unit *u, const mass_seq *ms, int32_t worker, float *acc);

static void mass_unit_run(void *ctx_, int64_t index, int32_t worker) {
    const attend_ctx *c = ctx_;
    const mass_unit *u = &c->units[index];
    const gokv_attend_desc *d = c->d;
    const mass_seq *ms = &c->mseq[u->seq];
    const int32_t kv_len = d->kv_len[u->seq];
    float *mass = d->mass + ms->mass + (int64_t)u->h * kv_len + u->t0;
    float *acc = (float *)(c->scratch + (size_t)worker * c->scratch_bytes + c->mass_at); /* the unit's sums, then mass */
    memset(acc, 0, (size_t)(u->t1 - u->t0) * sizeof(float));
    mass_sums(c, u, ms, worker, acc);
    write_stream(mass, acc, u->t1 - u->t0);
}

/* The sums of unit u into acc (token t at acc[t - t0]). */
static void mass_sums(const attend_ctx *c, const mass_unit *u, const mass_seq *ms, int32_t worker, float *acc) {
    const gokv_attend_desc *d = c->d;
    const int32_t G = c->G, kv_len = d->kv_len[u->seq], P = c->L->page_size;
    const int32_t *ids = d->page_ids + d->page_indptr[u->seq];
    if (ms->counted == 0) return;
    const int32_t row_first = ms->rows - ms->counted;
    float *lse = carve(c->scratch + (size_t)worker * c->scratch_bytes, c->L, c->nq_max).m; /* the queries' lse */
    if (ms->store >= 0) { /* the scores kept by the walk, over the tokens it walked: read, not written back */
        const int64_t nqc = (int64_t)ms->counted * G;
        const float *kept = c->store + ms->store + (int64_t)u->h * nqc * kv_len;
        for (int32_t i = 0; i < nqc; i++) lse[i] = query_lse(c, ms, u->seq, u->h, ms->first_q + i);
        seg buf[2];
        const seg *segs;
        const int32_t n_segs = item_segs(c, u->seq, u->h, d->q_pos[u->seq], d->q_pos[u->seq] + ms->rows - 1, buf, &segs);
        for (int32_t sg = 0; sg < n_segs; sg++) {
            const int32_t lo = segs[sg].lo > u->t0 ? segs[sg].lo : u->t0, hi = segs[sg].hi < u->t1 ? segs[sg].hi : u->t1;
            for (int32_t t = lo; t < hi;) {
                const int32_t page_end = t - t % P + P, e = page_end < hi ? page_end : hi;
                for (int32_t t1 = t; ids[t / P] >= 0 && t1 < e; t1 += CPU_BLOCK) { /* a block at a time */
                    const int32_t n = e - t1 < CPU_BLOCK ? e - t1 : CPU_BLOCK;
                    for (int32_t i = 0; i < nqc; i++) {
                        const float l = lse[i];
                        if (l == INFINITY) continue;
                        /* each query's scores are a stream of their own; the hardware prefetchers stop at every
                         * 4 KB, so each block asks for the one MASS_AHEAD blocks on */
                        if (t1 + MASS_AHEAD * CPU_BLOCK < u->t1)
                            cpu_prefetch_bytes(kept + i * kv_len + t1 + MASS_AHEAD * CPU_BLOCK, CPU_BLOCK * sizeof(float));
                        c->k->exp_acc(kept + i * kv_len + t1, n, l, acc + (t1 - u->t0));
                    }
                }
                t = e;
            }
        }
        return;
    }
    /* scores computed again, the counted rows in groups of at most nq_max query vectors */
    scratch sc = carve(c->scratch + (size_t)worker * c->scratch_bytes, c->L, c->nq_max);
    sc.s = (float *)(c->scratch + (size_t)worker * c->scratch_bytes + c->scores_at);
    const int32_t group_rows = c->nq_max / G;
    for (int32_t r0 = row_first; r0 < ms->rows; r0 += group_rows) {
        const int32_t nr = ms->rows - r0 < group_rows ? ms->rows - r0 : group_rows, nq = nr * G;
        seg buf[2];
        const seg *segs;
        const int32_t p0 = d->q_pos[u->seq] + r0;
        const int32_t n_segs = item_segs(c, u->seq, u->h, p0, p0 + nr - 1, buf, &segs);
        int any = 0;
        for (int32_t sg = 0; sg < n_segs; sg++) any |= segs[sg].lo < u->t1 && segs[sg].hi > u->t0;
        if (!any) continue;
        load_queries(c, &sc, u->seq, u->h, r0, nr);
        for (int32_t i = 0; i < nq; i++) lse[i] = query_lse(c, ms, u->seq, u->h, r0 * G + i);
        for (int32_t sg = 0; sg < n_segs; sg++) {
            const int32_t lo = segs[sg].lo > u->t0 ? segs[sg].lo : u->t0, hi = segs[sg].hi < u->t1 ? segs[sg].hi : u->t1;
            if (lo < hi) mass_recompute(c, u->seq, u->h, &sc, nq, lse, lo, hi, acc, u->t0);
        }
    }
}

/* The loop after the items: tiles [0, n_reduce) reduce their chunks, then the mass units. */
static void finish_task(void *ctx_, int64_t index, int32_t worker) {
    const attend_ctx *c = ctx_;
    if (index < c->n_reduce) reduce_tile(ctx_, index, worker);
    else mass_unit_run(ctx_, index - c->n_reduce, worker);
}

/* Visible length of the tile of nrows query rows from row0 of sequence seq (Quest: its longest kv head's). */
static int32_t tile_len(const attend_ctx *c, int32_t seq, int32_t row0, int32_t nrows) {
    seg buf[2];
    const seg *segs;
    const int32_t p0 = c->d->q_pos[seq] + row0;
    int32_t best = 0;
    for (int32_t h = 0; h < (c->per_head ? c->L->n_kv_heads : 1); h++) {
        const int32_t n = item_segs(c, seq, h, p0, p0 + nrows - 1, buf, &segs);
        int32_t len = 0;
        for (int32_t s = 0; s < n; s++) len += segs[s].hi - segs[s].lo;
        best = len > best ? len : best;
    }
    return best;
}

/* How a call's work is cut into items (cpu_attend): the decode rows of a sequence form one row tile and longer
 * prefills tiles of rows_per_tile rows. A decode item is a chunk of a tile's visible tokens over hpi kv heads,
 * a prefill item a tile over one kv head. */
typedef struct cut {
    int32_t hpi;   /* kv heads per decode item */
    int32_t chunk; /* split-K chunk of decode tiles, in tokens */
} cut;

/* The chunks of a decode tile of len visible tokens: equal ones of the cut's chunk, the last shorter. */
static int32_t tile_chunks(int32_t len, int32_t chunk) {
    return len <= chunk ? 1 : (int32_t)(((int64_t)len + chunk - 1) / chunk);
}

/* The cut: at least ITEMS_PER_WORKER items per worker. Every chunk beyond a tile's first costs an item start
 * (the queries' preparation, a block fetched cold) and a partial to reduce, which a short context feels:
 * there the kv heads are split first (hpi halved from all of them, ITEM_MAX_HEADS at most, while there are
 * too few items), and tokens only when single heads are still too few (MQA), DEFAULT_CHUNK at least. A long
 * context (LONG_CHUNK tokens or more per item, cut by tokens alone) is cut by tokens over all the kv heads:
 * its item starts are far apart, and a worker then reads its pages whole (at 128K that wins slightly over
 * splitting heads; at 4K splitting heads wins by ~10%). A chunk size given by the call is kept, with heads
 * halved while its chunks are too few. */
static cut plan_cut(const attend_ctx *ctx, int32_t n_workers, int32_t rows_per_tile) {
    const gokv_attend_desc *d = ctx->d;
    const gokv_layout *L = ctx->L;
    if (ctx->per_head) { /* one kv head per item (each reads its own ranges), cut by tokens while they are too few */
        int64_t n_dec = 0, total = 0;
        for (int32_t s = 0; s < d->n_seqs; s++)
            if (d->q_indptr[s + 1] > d->q_indptr[s]) n_dec++, total += tile_len(ctx, s, 0, 1);
        const int64_t want = (int64_t)ITEMS_PER_WORKER * n_workers, items = n_dec * L->n_kv_heads;
        cut q = {1, d->chunk_size > 0 ? d->chunk_size : INT32_MAX};
        if (d->chunk_size <= 0 && items > 0 && items < want) {
            const int64_t per = (total * L->n_kv_heads / want + CPU_BLOCK - 1) / CPU_BLOCK * CPU_BLOCK;
            q.chunk = per <= DEFAULT_CHUNK ? DEFAULT_CHUNK : per >= INT32_MAX ? INT32_MAX : (int32_t)per;
        }
        return q;
    }
    int64_t n_pre = 0, n_dec = 0, total = 0, chunks = 0; /* prefill tiles, decode tiles, their tokens and chunks */
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int32_t rows = d->q_indptr[s + 1] - d->q_indptr[s];
        if (rows > SPLIT_MAX_ROWS) {
            n_pre += (rows + rows_per_tile - 1) / rows_per_tile;
        } else if (rows > 0) {
            const int32_t len = tile_len(ctx, s, 0, rows);
            n_dec++;
            total += len;
            if (d->chunk_size > 0) chunks += tile_chunks(len, d->chunk_size);
        }
    }
    const int64_t want = (int64_t)ITEMS_PER_WORKER * n_workers - n_pre * L->n_kv_heads;
    /* the mass, when single kv heads give items enough: one chunk per tile, so that each item sums its kv head's
     * mass from its scores while they are in its cache (mass_in_item), instead of a pass over them all from
     * memory after the reduce */
    if (d->mass && d->chunk_size <= 0 && n_dec > 0 && n_dec * L->n_kv_heads >= want) return (cut){1, INT32_MAX};
    const int32_t all = L->n_kv_heads < ITEM_MAX_HEADS ? L->n_kv_heads : ITEM_MAX_HEADS;
    cut c = {all, d->chunk_size > 0 ? d->chunk_size : INT32_MAX};
    if (d->chunk_size <= 0 && want > 0 && total / want >= LONG_CHUNK) { /* long: tokens over all the heads */
        const int64_t per = (total / want + CPU_BLOCK - 1) / CPU_BLOCK * CPU_BLOCK;
        c.chunk = per >= INT32_MAX ? INT32_MAX : (int32_t)per;
        return c;
    }
    if (d->chunk_size <= 0) chunks = n_dec;
    while (c.hpi > 1 && chunks * ((L->n_kv_heads + c.hpi - 1) / c.hpi) < want) c.hpi = (c.hpi + 1) / 2;
    const int64_t groups = (L->n_kv_heads + c.hpi - 1) / c.hpi;
    if (d->chunk_size > 0 || n_dec == 0 || n_dec * groups >= want) return c;
    const int64_t per = (total * groups / want + CPU_BLOCK - 1) / CPU_BLOCK * CPU_BLOCK; /* single heads: tokens too */
    c.chunk = per <= DEFAULT_CHUNK ? DEFAULT_CHUNK : per >= INT32_MAX ? INT32_MAX : (int32_t)per;
    return c;
}

/* The tiles and items of a call under cut k: counts them when c->items is NULL, else fills c->tiles and
 * c->items. */
typedef struct plan {
    int64_t n_tiles, n_items, n_part; /* tiles (one per kv head), items, floats of partials */
    int32_t max_rows;                 /* the most rows of a tile */
} plan;

static plan make_plan(const attend_ctx *c, cut k) {
    const gokv_attend_desc *d = c->d;
    const gokv_layout *L = c->L;
    plan pl = {0, 0, 0, 1};
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int32_t rows = d->q_indptr[s + 1] - d->q_indptr[s];
        const int split = rows <= SPLIT_MAX_ROWS;
        const int32_t rt = split ? rows : c->rows_per_tile, heads = split ? k.hpi : 1;
        for (int32_t r0 = 0; r0 < rows; r0 += rt) {
            const int32_t nr = rows - r0 < rt ? rows - r0 : rt;
            const int32_t len = tile_len(c, s, r0, nr), nc = split ? tile_chunks(len, k.chunk) : 1;
            const int64_t head_part = (int64_t)nr * c->G * (L->d_v + 2);
            for (int32_t h = 0; c->items && h < L->n_kv_heads; h++)
                c->tiles[pl.n_tiles + h] = (tile){s, h, r0, nr, nc, pl.n_part + h * head_part};
            if (c->items && c->mseq && split) c->mseq[s].tile0 = pl.n_tiles;
            for (int32_t ch = 0; ch < nc; ch++) {
                const int32_t v0 = nc == 1 ? 0 : ch * k.chunk, v1 = ch == nc - 1 ? len : v0 + k.chunk;
                for (int32_t h = 0; h < L->n_kv_heads; h += heads, pl.n_items++) {
                    const int32_t nh = L->n_kv_heads - h < heads ? L->n_kv_heads - h : heads;
                    if (c->items)
                        c->items[pl.n_items] = (work_item){s, h, nh, r0, nr, v0, v1, ch, nc, nc > 1 ? pl.n_part : -1};
                }
            }
            pl.n_tiles += L->n_kv_heads;
            if (nc > 1) pl.n_part += (int64_t)nc * L->n_kv_heads * head_part;
            pl.max_rows = nr > pl.max_rows ? nr : pl.max_rows;
        }
    }
    return pl;
}

/* The mass pass's plan (d->mass): which sequences keep their scores (split tiles, while the store stays under
 * MASS_STORE_MAX floats), the store's and the lse's floats, and the units; fills c->mseq and c->units when they
 * are set. */
typedef struct mass_plan {
    int64_t n_units, store_floats, lse_floats;
} mass_plan;

static mass_plan plan_mass(const attend_ctx *c, cut k) {
    const gokv_attend_desc *d = c->d;
    const int32_t H = c->L->n_kv_heads;
    mass_plan mp = {0, 0, (int64_t)d->q_indptr[d->n_seqs] * d->n_heads_q};
    int64_t off = 0;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int32_t rows = d->q_indptr[s + 1] - d->q_indptr[s], kv = d->kv_len[s];
        const int32_t counted = d->mass_rows == 0 || d->mass_rows > rows ? rows : d->mass_rows;
        const int64_t floats = (int64_t)H * counted * c->G * kv;
        const int keep = rows > 0 && rows <= SPLIT_MAX_ROWS && mp.store_floats + floats <= MASS_STORE_MAX;
        const int in_item = keep && tile_chunks(tile_len(c, s, 0, rows), k.chunk) == 1;
        if (c->mseq)
            c->mseq[s] = (mass_seq){rows, counted, (rows - counted) * c->G, keep ? mp.store_floats : -1, off, -1, in_item};
        if (keep) mp.store_floats += floats;
        off += (int64_t)H * kv;
        if (in_item) continue;
        for (int32_t h = 0; h < H; h++)
            for (int32_t t0 = 0; t0 < kv; t0 += MASS_UNIT, mp.n_units++)
                if (c->units) c->units[mp.n_units] = (mass_unit){s, h, t0, kv - t0 < MASS_UNIT ? kv : t0 + MASS_UNIT};
    }
    return mp;
}

gokv_status cpu_attend(void *dev_, void *pool, const gokv_layout *L, const gokv_attend_desc *d) {
    cpu_device *dev = dev_;
    if (d->flags & GOKV_ATTEND_DEQUANT_BASELINE) return cpu_attend_dequant_baseline(dev, pool, L, d);
    attend_ctx c = {0};
    c.d = d;
    c.L = L;
    c.pool = pool;
    c.k = cpu_kernels_for_call(d->flags);
    c.G = d->n_heads_q / L->n_kv_heads;
    c.values_ask_all = c.k->values_take_hint[cpu_row_enc(L->format)];
    c.rows_per_tile = PREFILL_TILE_VECTORS / c.G > 1 ? PREFILL_TILE_VECTORS / c.G : 1;
    const int32_t n_workers = cpu_threadpool_size(dev->tp);
    pthread_mutex_lock(&dev->mu);
    cpu_quest quest, masked;
    c.per_head = d->quest_pages > 0 || (d->valid_mask && (d->flags & GOKV_ATTEND_MASK_PER_KV_HEAD));
    if (d->quest_pages > 0 || d->valid_mask) { /* the ranges each kv head reads, first: Quest's pages, then the masks' */
        const size_t qb = d->quest_pages > 0 ? align_up(cpu_quest_bytes(d, L)) : 0;
        const size_t mb = d->valid_mask ? cpu_mask_plan_bytes(d, L) : 0;
        if (!cpu_buffer_reserve(&dev->quest_ws, &dev->quest_ws_bytes, qb + mb)) {
            pthread_mutex_unlock(&dev->mu);
            return gokv_set_error(GOKV_ENOMEM, "gokv_attend: cannot allocate %zu bytes of Quest and mask workspace", qb + mb);
        }
        if (d->quest_pages > 0) {
            cpu_quest_plan(dev->tp, pool, L, d, c.k != cpu_kernels_get(GOKV_CPU_SCALAR), dev->quest_ws, &quest);
            c.quest = c.hr = &quest;
        }
        if (d->valid_mask) {
            cpu_mask_plan(dev->tp, L, d, c.quest, c.per_head, (uint8_t *)dev->quest_ws + qb, &masked);
            c.hr = &masked;
        }
    }
    const cut k = plan_cut(&c, n_workers, c.rows_per_tile);
    const plan pl = make_plan(&c, k); /* counts */
    const mass_plan mp = d->mass ? plan_mass(&c, k) : (mass_plan){0, 0, 0};
    c.nq_max = pl.max_rows * c.G;
    c.head_scratch_bytes = scratch_size(L, c.nq_max);
    c.scores_at = c.head_scratch_bytes * (size_t)k.hpi;
    c.scratch_bytes = c.scores_at + align_up((size_t)c.nq_max * CPU_BLOCK * sizeof(float));
    const int32_t v_groups = L->v_is_k_prefix ? L->k_groups : L->v_groups;
    const uint64_t v_row = L->v_is_k_prefix ? L->k_row_bytes : L->v_row_bytes;
    if (d->valid_mask && !L->kivi && L->k_row_bytes <= GATHER_ROW_MAX && v_row <= GATHER_ROW_MAX) {
        c.gather_at = c.scratch_bytes;
        c.gather_v = gather_bytes(L->k_row_bytes, L->k_groups);
        c.scratch_bytes += c.gather_v + gather_bytes(v_row, v_groups);
    }
    c.mass_at = c.scratch_bytes;
    if (d->mass) c.scratch_bytes += align_up((size_t)MASS_UNIT * sizeof(float));
    const size_t mass_bytes = d->mass ? align_up((size_t)d->n_seqs * sizeof(mass_seq)) +
                                            align_up((size_t)mp.n_units * sizeof(mass_unit)) +
                                            align_up((size_t)mp.lse_floats * sizeof(float)) +
                                            align_up((size_t)mp.store_floats * sizeof(float))
                                      : 0;
    const size_t need = align_up((size_t)pl.n_tiles * sizeof(tile)) + align_up((size_t)pl.n_items * sizeof(work_item)) +
                        align_up((size_t)pl.n_part * sizeof(float)) + c.scratch_bytes * (size_t)n_workers + mass_bytes;

    if (!cpu_buffer_reserve(&dev->ws, &dev->ws_bytes, need)) {
        pthread_mutex_unlock(&dev->mu);
        return gokv_set_error(GOKV_ENOMEM, "gokv_attend: cannot allocate %zu bytes of workspace", need);
    }
    uint8_t *base = dev->ws;
    c.tiles = (tile *)base, base += align_up((size_t)pl.n_tiles * sizeof(tile));
    c.items = (work_item *)base, base += align_up((size_t)pl.n_items * sizeof(work_item));
    c.parts = (float *)base, base += align_up((size_t)pl.n_part * sizeof(float));
    c.scratch = base, base += c.scratch_bytes * (size_t)n_workers;
    if (d->mass) {
        c.mseq = (mass_seq *)base, base += align_up((size_t)d->n_seqs * sizeof(mass_seq));
        c.units = (mass_unit *)base, base += align_up((size_t)mp.n_units * sizeof(mass_unit));
        c.lse = (float *)base, base += align_up((size_t)mp.lse_floats * sizeof(float));
        c.store = mp.store_floats > 0 ? (float *)base : NULL;
        plan_mass(&c, k); /* fills */
    }

    make_plan(&c, k); /* fills */
    cpu_threadpool_run(dev->tp, pl.n_items, run_item, &c);
    /* the reduce and the mass pass in one loop: the mass units combine their split tiles' partials themselves */
    c.n_reduce = pl.n_part > 0 ? pl.n_tiles : 0;
    cpu_threadpool_run(dev->tp, c.n_reduce + mp.n_units, finish_task, &c);
    pthread_mutex_unlock(&dev->mu);
    return GOKV_OK;
}
