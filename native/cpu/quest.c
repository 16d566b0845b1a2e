/*
 * quest.c: Quest's page selection for the CPU backend (gokv_attend_desc.quest_pages). A pre-pass, parallel over
 * (sequence, kv head), scores every page-table entry of a decode row by its key bounds alone (fp16, beside the
 * pages: gokv_layout.h),
 *     B = max over the kv head's query heads h of Σ_c max(q_hc · min_c, q_hc · max_c),
 * chooses the K highest among the pages that are neither sink pages (holding t < n_sink_tokens) nor recent
 * pages (holding one of the last quest_recent tokens), ties to the older page, and turns the chosen, sink and
 * recent pages (and a KIVI ring's tokens) into the token ranges the attention walks for that kv head
 * (attend.c): every other token is never read. Released pages and pages with no key in them yet score
 * -INFINITY and do not compete. The validity masks cut ranges the same way (cpu_mask_plan, at the end): a
 * kv head's decode walks only the spans its mask does not hide whole.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "gokv_half.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Table entries of sequence s (page_indptr span). */
static int32_t quest_entries(const gokv_attend_desc *d, int32_t s) { return d->page_indptr[s + 1] - d->page_indptr[s]; }

size_t cpu_quest_bytes(const gokv_attend_desc *d, const gokv_layout *L) {
    const size_t H = (size_t)L->n_kv_heads;
    size_t ranges = 0, entries = 0;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        ranges += H * ((size_t)quest_entries(d, s) + 1u);
        entries += (size_t)quest_entries(d, s);
    }
    return ranges * sizeof(gokv_range) + (size_t)d->n_seqs * H * (sizeof(int64_t) + sizeof(int32_t)) +
           (size_t)d->n_seqs * sizeof(int64_t) + entries * H * sizeof(float) + 256u;
}

/* Σ_c max(q_c lo_c, q_c hi_c) for each of G queries (q: [G][d]), maximum over them. */
static float quest_bound_scalar(const float *q, int32_t G, int32_t dk, const uint16_t *lo, const uint16_t *hi) {
    float best = -INFINITY;
    for (int32_t g = 0; g < G; g++) {
        const float *qg = q + (size_t)g * dk;
        float acc = 0.0f;
        for (int32_t c = 0; c < dk; c++) {
            const float a = qg[c] * gokv_half_to_float(lo[c]), b = qg[c] * gokv_half_to_float(hi[c]);
            acc += a > b ? a : b;
        }
        best = acc > best ? acc : best;
    }
    return best;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) static float quest_bound_avx2(const float *q, int32_t G, int32_t dk,
                                                                       const uint16_t *lo, const uint16_t *hi) {
    float best = -INFINITY;
    if (dk % 8 != 0) return quest_bound_scalar(q, G, dk, lo, hi);
    __m256 acc[8];
    for (int32_t g0 = 0; g0 < G; g0 += 8) {
        const int32_t ng = G - g0 < 8 ? G - g0 : 8;
        for (int32_t g = 0; g < ng; g++) acc[g] = _mm256_setzero_ps();
        for (int32_t c = 0; c < dk; c += 8) {
            const __m256 l = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(lo + c)));
            const __m256 h = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hi + c)));
            for (int32_t g = 0; g < ng; g++) {
                const __m256 qv = _mm256_loadu_ps(q + (size_t)(g0 + g) * dk + c);
                /* max(q lo, q hi) = q · (q < 0 ? lo : hi): blendv takes lo where q's sign bit is set */
                acc[g] = _mm256_fmadd_ps(qv, _mm256_blendv_ps(h, l, qv), acc[g]);
            }
        }
        for (int32_t g = 0; g < ng; g++) {
            float t[8];
            _mm256_storeu_ps(t, acc[g]);
            const float v = ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
            best = v > best ? v : best;
        }
    }
    return best;
}
#endif

typedef struct quest_ctx {
    const gokv_attend_desc *d;
    const gokv_layout *L;
    const cpu_pool *pool;
    cpu_quest *qs;
    int simd;
    int64_t *entry0; /* per sequence: its first entry's index in the score scratch (per kv head, [H][entries]) */
} quest_ctx;

typedef struct quest_pick {
    float b;
    int32_t i;
} quest_pick;


static void quest_task(void *ctx_, int64_t index, int32_t worker) {
    (void)worker;
    const quest_ctx *c = ctx_;
    const gokv_attend_desc *d = c->d;
    const gokv_layout *L = c->L;
    cpu_quest *qs = c->qs;
    const int32_t H = L->n_kv_heads, s = (int32_t)(index / H), h = (int32_t)(index % H), P = L->page_size;
    const int32_t G = d->n_heads_q / H, dk = L->d_k, n = quest_entries(d, s), K = d->quest_pages;
    const int32_t kv_len = d->kv_len[s], rows = d->q_indptr[s + 1] - d->q_indptr[s];
    const int32_t n_quant = L->kivi ? gokv_kivi_quantized_len(kv_len, L->group, L->residual) : kv_len;
    const int32_t *ids = d->page_ids + d->page_indptr[s];
    float *B = qs->scores + c->entry0[s] * H + (int64_t)h * n;
    gokv_range *rg = qs->ranges + qs->off[index];
    qs->count[index] = 0;
    /* scores: only the bounds are read */
    const float *q = rows > 0 ? d->q + ((size_t)d->q_indptr[s] * d->n_heads_q + (size_t)h * G) * dk : NULL;
    for (int32_t i = 0; i < n; i++) {
        B[i] = -INFINITY;
        if (!q || ids[i] < 0 || (int64_t)i * P >= n_quant) continue;
        const uint16_t *lo = cpu_bounds(c->pool, L, ids[i]) + (size_t)h * 2 * dk, *hi = lo + dk;
        /* a page that holds no key (loaded with n_tokens 0: min +inf, max -inf) bounds nothing */
        if (gokv_half_to_float(lo[0]) > gokv_half_to_float(hi[0])) continue;
#if defined(__x86_64__)
        if (c->simd) {
            B[i] = quest_bound_avx2(q, G, dk, lo, hi);
            continue;
        }
#endif
        B[i] = quest_bound_scalar(q, G, dk, lo, hi);
    }
    if (d->quest_bounds)
        for (int32_t i = 0; i < n; i++) d->quest_bounds[((int64_t)d->page_indptr[s] + i) * H + h] = B[i];
    /* selection among the competing pages: present, not sink, not recent */
    const int32_t vis = rows > 0 ? (d->q_pos[s] + 1 < kv_len ? d->q_pos[s] + 1 : kv_len) : 0; /* tokens [0, vis) */
    const int64_t recent_from = (int64_t)vis - d->quest_recent;
    int32_t *sel = d->quest_selected ? d->quest_selected + ((int64_t)s * H + h) * K : NULL;
    /* mark: 1 read as sink or recent, 2 chosen */
    uint8_t mark_stack[4096];
    uint8_t *mark = n <= (int32_t)sizeof mark_stack ? mark_stack : calloc((size_t)n, 1);
    quest_pick pick_stack[1024];
    const int32_t n_pick = K < n ? K : n;
    quest_pick *pk = n_pick <= 1024 ? pick_stack : malloc((size_t)n_pick * sizeof *pk);
    if (!mark || !pk) { /* out of memory: read every page (the full attention) */
        if (mark != mark_stack) free(mark);
        if (pk != pick_stack) free(pk);
        if (sel)
            for (int32_t j = 0; j < K; j++) sel[j] = -1;
        if (vis > 0) rg[0] = (gokv_range){0, vis}, qs->count[index] = 1;
        return;
    }
    memset(mark, 0, (size_t)n);
    /* the K best so far in pk[0..n_sel), by bound descending then index ascending: entries come in index order,
     * so a later one displaces only a strictly lower bound (ties to the older page) */
    int32_t n_sel = 0;
    for (int32_t i = 0; i < n; i++) {
        const int64_t first = (int64_t)i * P, last = first + P; /* [first, last) */
        if (first >= vis) continue;
        if (first < d->n_sink_tokens || (last > recent_from && d->quest_recent > 0)) {
            mark[i] = 1;
            continue;
        }
        const float b = B[i];
        if (b == -INFINITY || K == 0 || (n_sel == K && !(b > pk[K - 1].b))) continue;
        int32_t j = n_sel < K ? n_sel++ : K - 1;
        for (; j > 0 && pk[j - 1].b < b; j--) pk[j] = pk[j - 1];
        pk[j] = (quest_pick){b, i};
    }
    for (int32_t j = 0; j < n_sel; j++) mark[pk[j].i] = 2;
    if (sel) {
        int32_t j = 0;
        for (int32_t i = 0; i < n; i++)
            if (mark[i] == 2) sel[j++] = i;
        for (; j < K; j++) sel[j] = -1;
    }
    /* the ranges: the marked pages, and the ring's tokens [n_quant, vis), merged when adjacent */
    int32_t nr = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t first = i * P;
        if (first >= vis) break;
        int32_t lo = first, hi = first + P < vis ? first + P : vis;
        if (!mark[i]) { /* unread page: only its ring tokens */
            lo = lo > n_quant ? lo : n_quant;
            if (lo >= hi) continue;
        }
        if (nr > 0 && rg[nr - 1].hi == lo) rg[nr - 1].hi = hi;
        else rg[nr++] = (gokv_range){lo, hi};
    }
    qs->count[index] = nr;
    if (mark != mark_stack) free(mark);
    if (pk != pick_stack) free(pk);
}

void cpu_quest_plan(cpu_threadpool *tp, const cpu_pool *pool, const gokv_layout *L, const gokv_attend_desc *d,
                    int simd, void *ws, cpu_quest *qs) {
    const int32_t H = L->n_kv_heads;
    uint8_t *base = ws;
    qs->off = (int64_t *)base, base += (size_t)d->n_seqs * H * sizeof(int64_t);
    qs->count = (int32_t *)base, base += (size_t)d->n_seqs * H * sizeof(int32_t);
    base = (uint8_t *)(((uintptr_t)base + 63u) & ~(uintptr_t)63u);
    qs->ranges = (gokv_range *)base;
    int64_t r = 0, e = 0;
    for (int32_t s = 0; s < d->n_seqs; s++)
        for (int32_t h = 0; h < H; h++) {
            qs->off[(int64_t)s * H + h] = r;
            r += quest_entries(d, s) + 1;
        }
    base += (size_t)r * sizeof(gokv_range);
    int64_t *entry0 = (int64_t *)base;
    base += (size_t)d->n_seqs * sizeof(int64_t);
    qs->scores = (float *)base;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        entry0[s] = e;
        e += quest_entries(d, s);
    }
    quest_ctx c = {d, L, pool, qs, simd, entry0};
    cpu_threadpool_run(tp, (int64_t)d->n_seqs * H, quest_task, &c);
}

/* Validity masks are read for ranges in aligned spans of MASK_SPAN tokens (a key tile); hidden spans of at least
 * MASK_MIN_GAP tokens end a range (mask_cut). */
enum { MASK_SPAN = 16, MASK_MIN_GAP = 64 };

/* ---- ranges cut from the validity masks: a decode tile walks, per kv head, only the spans of its ranges
 * (Quest's or the visible ones) that its mask does not hide whole, as Quest's items walk only their pages ---- */

/* Appends to out the pieces of [lo, hi) that mask does not hide, read in aligned spans of MASK_SPAN tokens: a run of
 * hidden spans of MASK_MIN_GAP tokens or more ends a piece (a shorter one is walked, its tokens hidden block by
 * block: a cut costs a block end). Returns the new count. */
static int32_t mask_cut(const uint32_t *mask, int32_t lo, int32_t hi, gokv_range *out, int32_t n) {
    int32_t open = -1, end = 0;
    for (int32_t t = lo; t < hi;) {
        const uint32_t word = mask[t >> 5];
        if (word == 0) { /* the rest of the word hidden */
            t = ((t >> 5) + 1) * 32 < hi ? ((t >> 5) + 1) * 32 : hi;
            continue;
        }
        int32_t e = word == ~0u ? ((t >> 5) + 1) * 32 : (t / MASK_SPAN + 1) * MASK_SPAN;
        e = e < hi ? e : hi;
        const uint32_t span = (word >> (t & 31)) & (e - t >= 32 ? ~0u : (1u << (e - t)) - 1u);
        if (span) {
            if (open < 0) {
                open = t;
            } else if (t - end >= MASK_MIN_GAP) {
                out[n++] = (gokv_range){open, end};
                open = t;
            }
            end = e;
        }
        t = e;
    }
    if (open >= 0) out[n++] = (gokv_range){open, end};
    return n;
}

/* Workspace of cpu_mask_plan for a call: per (sequence, kv head) an offset, a count and its ranges, at most the base
 * ranges (Quest's: a table's entries + 1; else 2) and one more per MASK_MIN_GAP tokens. */
size_t cpu_mask_plan_bytes(const gokv_attend_desc *d, const gokv_layout *L) {
    size_t ranges = 0;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const size_t base = d->quest_pages > 0 ? (size_t)(d->page_indptr[s + 1] - d->page_indptr[s]) + 1u : 2u;
        ranges += (size_t)L->n_kv_heads * (base + (size_t)d->kv_len[s] / MASK_MIN_GAP + 1u);
    }
    return (size_t)d->n_seqs * L->n_kv_heads * (sizeof(int64_t) + sizeof(int32_t)) + 64u + ranges * sizeof(gokv_range);
}

typedef struct mask_plan_ctx {
    const gokv_attend_desc *d;
    const gokv_layout *L;
    const cpu_quest *quest;
    cpu_quest *out;
} mask_plan_ctx;

/* Task (sequence s, kv head h) of cpu_mask_plan: s's decode tile's ranges for h, cut by h's mask. */
static void mask_plan_task(void *ctx_, int64_t index, int32_t worker) {
    (void)worker;
    const mask_plan_ctx *mc = ctx_;
    const gokv_attend_desc *d = mc->d;
    const cpu_quest *quest = mc->quest;
    const int32_t H = mc->L->n_kv_heads, s = (int32_t)(index / H), h = (int32_t)(index % H);
    const int32_t rows = d->q_indptr[s + 1] - d->q_indptr[s];
    cpu_quest *o = mc->out;
    gokv_range *out = o->ranges + o->off[index];
    gokv_range buf[2];
    const gokv_range *base = buf;
    int32_t nb;
    if (quest) {
        base = quest->ranges + quest->off[index];
        nb = quest->count[index];
    } else {
        nb = rows > 0 ? gokv_visible_ranges(d, d->kv_len[s], d->q_pos[s], d->q_pos[s] + rows - 1, buf) : 0;
    }
    if (rows > CPU_SPLIT_MAX_ROWS) { /* prefill tiles: their own visible ranges (Quest's, copied), masked block by block */
        o->count[index] = quest ? nb : -1;
        if (quest) memcpy(out, base, (size_t)nb * sizeof *out);
        return;
    }
    const uint32_t *mask = cpu_head_mask(d, s, h);
    int32_t n = 0;
    for (int32_t i = 0; i < nb; i++) n = mask_cut(mask, base[i].lo, base[i].hi, out, n);
    o->count[index] = n;
}

void cpu_mask_plan(cpu_threadpool *tp, const gokv_layout *L, const gokv_attend_desc *d, const cpu_quest *quest,
                   int per_head, void *ws, cpu_quest *o) {
    const int32_t H = L->n_kv_heads;
    const int shared = !per_head;
    uint8_t *base = ws;
    o->off = (int64_t *)base, base += (size_t)d->n_seqs * H * sizeof(int64_t);
    o->count = (int32_t *)base, base += (size_t)d->n_seqs * H * sizeof(int32_t);
    o->ranges = (gokv_range *)(((uintptr_t)base + 63u) & ~(uintptr_t)63u);
    o->scores = NULL;
    int64_t r = 0;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int64_t nb = d->quest_pages > 0 ? (int64_t)(d->page_indptr[s + 1] - d->page_indptr[s]) + 1 : 2;
        for (int32_t h = 0; h < H; h++) {
            o->off[(int64_t)s * H + h] = shared && h > 0 ? o->off[(int64_t)s * H] : r;
            if (!shared || h == 0) r += nb + d->kv_len[s] / MASK_MIN_GAP + 1;
        }
    }
    mask_plan_ctx mc = {d, L, quest, o};
    if (!shared) {
        cpu_threadpool_run(tp, (int64_t)d->n_seqs * H, mask_plan_task, &mc);
        return;
    }
    for (int32_t s = 0; s < d->n_seqs; s++) { /* one task per sequence; its other kv heads copy the count */
        mask_plan_task(&mc, (int64_t)s * H, 0);
        for (int32_t h = 1; h < H; h++) o->count[(int64_t)s * H + h] = o->count[(int64_t)s * H];
    }
}
