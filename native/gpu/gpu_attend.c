/*
 * gpu_attend.c: the plan's fused attention (gpu_attend: the slot attend of every GPU module;
 * docs/architecture.md §5), decode and prefill, straight from the compressed pages: nothing dequantized is
 * ever written to device memory on this path.
 *
 * The host cuts the call into work items, as native/cpu/attend.c does, and the kernels run one workgroup
 * per item (the Vulkan module's shaders/attend_common.glsl has the in-item algorithm: token-parallel scores,
 * online softmax, channel-parallel value accumulation):
 *   - an item is one kv head of one sequence, a tile of query rows and a subset of the kv head's query
 *     heads: nq = rows x heads query vectors. When the whole group (G = Hq / Hkv heads) fits, an item
 *     takes all of it, so each K/V element is decoded once per group. The bound on nq comes from the
 *     shared memory budget (the queries live there: MLA's d_k = 576 takes fewer heads per item) and from
 *     the registers that hold the output accumulators; the kernels are specialized for the call's largest
 *     nq (NQ_MAX), so a decode step of a GQA 4:1 model runs items of 4 vectors.
 *   - the tokens a tile can see are at most two ranges, the sink tokens [0, n_sink) and the window
 *     (p0 - W, p1] (or [0, p1]), laid end to end. Decode rows and short prefills (<= 16 rows, as on the
 *     CPU) cut them into chunks of chunk_size tokens (split-K): every chunk writes a partial (m, l, o) per
 *     query vector to the scratch buffer and reduce.comp combines them
 *         M = max(max_c m_c, σ),  out = Σ_c e^(m_c - M) o_c / (Σ_c e^(m_c - M) l_c + e^(σ - M)).
 *     A tile of a single chunk (and every tile of a longer prefill: tiled flash attention, causal, one
 *     chunk per tile, parallel across tiles) finalizes in the attention pass.
 *
 * One call is one command buffer: [copy inputs ->] [quest_score -> quest_select ->] [baseline_dequant ->]
 * attend (or baseline_attend) [-> reduce] [-> mass]. The host writes the inputs (queries, sink logits, page
 * tables, masks, and the sequence, item, reduce, baseline-page, mass and Quest tables below) to the up buffer;
 * on a discrete GPU (caps.stage_inputs), where up is host memory, they are first copied into the
 * device-local scratch buffer, since every split-K chunk reads its queries and page table again
 * (shaders/attend_inputs.glsl). Scratch
 * holds, in order: the baseline's f32 pages, the split-K partials, the mass pass's softmax factors and scores,
 * Quest's bounds, the staged inputs. down receives out, then mass, then Quest's bounds and choices. Every
 * pass reads what the one before wrote, behind a barrier.
 *
 * Attention mass (desc.mass): the attention pass runs its MASS variant (GPU_SPEC_OP4 = 1; the plain
 * pipeline is untouched): for the counted rows (each sequence's last mass_rows rows, or all) it stores
 * every score s = α q·k of the tokens its ranges cover (NEG where a row does not see a token) into scratch,
 * [counted row][query head][kv_len] per sequence, and the softmax factors (a, b) of every row and head,
 * prob = e^(s - a) b, from the rows it finalizes; reduce_mass.comp stores them for split rows. Then
 * mass.comp sums the probabilities per sequence, kv head and token over the kv head's query heads and the
 * counted rows, and writes every element (zeros where no counted row sees a token, and for sequences with
 * no query rows). A call without query rows writes zeros on the host. The kept scores take counted rows x
 * n_heads_q x kv_len words of scratch per sequence, so they are kept only for sequences of at most
 * SPLIT_MAX_ROWS counted rows; for the others (longer prefills) mass_keys.comp computes the scores again
 * from the pool, with the attention pass's key decoding, and needs no scratch. Each runs behind a barrier
 * (they write different sequences' mass, but into the same buffer).
 *
 * Validity masks per kv head (GOKV_ATTEND_MASK_PER_KV_HEAD): the sequence table gives the words of one kv
 * head's mask, ceil(kv_len / 32), and an item reads its kv head's mask (0 for a shared mask). The attention
 * pass skips the blocks and whole chunks in which its kv head's mask has no bit set, so what a mask hides
 * costs next to nothing (attend_common.glsl).
 *
 * Specialization constants of attend / baseline_attend (GPU_SPEC_OP0..3): NQ_MAX query vectors per item,
 * CPI value channels per invocation and unit, NSG_MAX subgroups per workgroup at most (from the smallest
 * subgroup size the device may give the pipeline), INPUTS_STAGED; reduce and baseline_dequant use
 * INPUTS_STAGED (OP3) only.
 *
 * Quest (desc.quest_pages > 0; pools with key_bounds), all on the device in the same command buffer, so a
 * decode step never waits for the host: quest_score.comp scores every page-table entry per kv head from the
 * pages' key bounds into scratch; quest_select.comp (one workgroup per sequence and kv head) chooses the
 * pages as native/cpu/quest.c does and writes a validity mask per kv head (the chosen, sink and recent pages,
 * the KIVI ring, and'ed with the caller's mask) where the attention pass reads its masks: among the staged
 * inputs, so a Quest call always stages them, even on a device whose up buffer is device memory. The
 * attention then skips every masked block, which is what makes Quest cheaper than the full attention. The
 * bounds and the choices (quest_bounds, quest_selected) come back in down after the outputs.
 *
 * GOKV_ATTEND_DEQUANT_BASELINE (benchmarks): baseline_dequant first expands every page the call can see
 * into an f32 copy (the layout of an f32 pool of the same geometry, V stored apart even for MLA) at the
 * start of the scratch buffer, then baseline_attend runs the same attention specialized for that f32 pool.
 * GOKV_ATTEND_FORCE_SCALAR is a CPU-only switch and is ignored here.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"

enum {
    DEFAULT_CHUNK = 512,
    SPLIT_MAX_ROWS = 16, /* sequences with at most this many query rows are split into chunks */
    NQ_LIMIT = 64,       /* query vectors per item: scores held in registers */
    ACC_BUDGET = 64,     /* output accumulators per invocation (registers) */
    TS_LIMIT = 8,        /* token slices of the value pass, summed through shared memory at the end */
};
#define NONE GPU_NONE
#define MAX_GRID ((int64_t)GPU_MAX_GRID)

/* Records of the input tables, word for word as the kernels read them. */
enum { ITEM_WORDS = 12, SEQ_WORDS = 11, REDUCE_WORDS = 5, TPAGE_WORDS = 5, MASS_ITEM_WORDS = 3, QSEQ_WORDS = 9 };
enum { MASS_SPAN_BLOCKS = 4 }; /* tokens per mass item: this many workgroups' worth */

/* Push constants: the kernels' Push blocks, from the field lists of gpu_push.h. */
GPU_PUSH_STRUCT(attend_push, GOKV_PUSH_ATTEND);   /* attend, baseline_attend */
GPU_PUSH_STRUCT(reduce_push, GOKV_PUSH_REDUCE);   /* reduce */
GPU_PUSH_STRUCT(dequant_push, GOKV_PUSH_DEQUANT); /* baseline_dequant */
GPU_PUSH_STRUCT(mass_push, GOKV_PUSH_MASS);       /* mass */
GPU_PUSH_STRUCT(quest_score_push, GOKV_PUSH_QUEST_SCORE);   /* quest_score */
GPU_PUSH_STRUCT(quest_select_push, GOKV_PUSH_QUEST_SELECT); /* quest_select */

/* Visible token ranges: gokv_visible_ranges (gokv_backend.h), shared by every backend. */
typedef gokv_range seg;

/* The shape of a call's work, and where everything goes in the up and scratch buffers (in words). */
typedef struct plan {
    int32_t G, heads_per_item, rows_per_item, chunk, rows;
    uint32_t wg, nsg, nq_max, cpi;
    int64_t n_items, n_reduce, n_tpages, part_words;
    uint64_t q_w, sink_w, page_w, mask_w, seq_w, item_w, reduce_w, tpage_w, up_words;
    uint64_t f_page_w, f_v_w, f_head_w; /* baseline: the f32 page layout */
    /* mass: items, the table in up, softmax factors and scores in scratch, its place in down (words) */
    int mass;
    uint32_t mass_span;
    int64_t n_mass_items, n_key_items; /* mass.comp (kept scores), mass_keys.comp (scores computed again) */
    uint64_t mass_item_w, key_item_w, stats_w, score_w, score_words, mass_down_w, mass_words;
    /* Quest: the caller's masks, the page-table entries and Quest's sequence table in the inputs (mask_w
     * then holds the masks quest_select.comp writes), the bounds in scratch, the optional outputs in down */
    int quest;
    uint64_t umask_w, qentry_w, qseq_w, b_w, qbounds_down_w, qsel_down_w, down_words;
} plan;

/* The query rows of a sequence that count towards its mass: its last mass_rows rows (0: all). */
static int32_t mass_rows_of(const gokv_attend_desc *d, int32_t s) {
    const int32_t rows = d->q_indptr[s + 1] - d->q_indptr[s];
    return d->mass_rows > 0 && d->mass_rows < rows ? d->mass_rows : rows;
}

/* Whether the attention pass keeps a sequence's scores for mass.comp: up to SPLIT_MAX_ROWS counted rows
 * (decode, short prefills); for more, mass_keys.comp computes them again, which needs no scratch. */
static int mass_keeps_scores(const gokv_attend_desc *d, int32_t s) { return mass_rows_of(d, s) <= SPLIT_MAX_ROWS; }

/* Shared memory of attend_common.glsl for nq query vectors (keep in sync with its declarations). */
static uint64_t shared_bytes(const gokv_layout *L, uint32_t nq, uint32_t wg, uint32_t nsg) {
    const uint64_t dmax = (uint64_t)(L->d_k > L->d_v ? L->d_k : L->d_v);
    return 4u * ((uint64_t)nq * (dmax + wg + 2u * nsg + 3u) + 4u * wg);
}

/* Subgroups a workgroup may be cut into, at most: by the smallest subgroup size its pipelines may get. */
static uint32_t max_subgroups(const gpu_device *dev, uint32_t wg) {
    const uint32_t smallest = dev->caps.subgroup_min ? dev->caps.subgroup_min : 1u;
    return (wg + smallest - 1) / smallest;
}

/* Query vectors an item may hold: shared memory for their queries and softmax state, and registers for
 * their accumulators (at least ceil(d_v / wg) channels each). */
static gokv_status item_capacity(const gpu_device *dev, const gokv_layout *L, plan *p, uint32_t *cap) {
    const gpu_caps *caps = &dev->caps;
    uint64_t budget = caps->shared_budget ? caps->shared_budget : caps->max_shared_bytes;
    if (budget > caps->max_shared_bytes) budget = caps->max_shared_bytes;
    const uint32_t min_channels = ((uint32_t)L->d_v + p->wg - 1) / p->wg;
    uint32_t n = NQ_LIMIT;
    while (n > 1 && (shared_bytes(L, n, p->wg, p->nsg) > budget || n * min_channels > ACC_BUDGET)) n--;
    if (shared_bytes(L, n, p->wg, p->nsg) > caps->max_shared_bytes)
        return gokv_set_error(GOKV_ENOTSUP,
                              "gokv_attend: %s: d_k %d / d_v %d with workgroups of %u need %llu bytes of shared "
                              "memory, more than this device's %u",
                              dev->backend, L->d_k, L->d_v, p->wg, (unsigned long long)shared_bytes(L, 1, p->wg, p->nsg),
                              caps->max_shared_bytes);
    *cap = n;
    return GOKV_OK;
}

/* Value channels per unit of the value pass: the widest (fewer shared loads of p per FMA) whose
 * accumulators fit ACC_BUDGET and whose token slices stay few. */
static uint32_t pick_cpi(const gokv_layout *L, uint32_t nq, uint32_t wg) {
    for (uint32_t cpi = 16; cpi > 1; cpi /= 2) {
        if ((uint32_t)L->d_v % cpi) continue;
        const uint32_t nu = (uint32_t)L->d_v / cpi, upi = (nu + wg - 1) / wg, ts = nu >= wg ? 1 : wg / nu;
        if (nq * cpi * upi <= ACC_BUDGET && ts <= TS_LIMIT) return cpi;
    }
    return 1;
}

/* One tile: rows [r0, r0 + nr) of a sequence, its visible ranges and its split-K chunks. */
typedef struct tile {
    int32_t r0, nr, n_segs, vis_len, n_chunks;
    seg segs[2];
} tile;

static void tile_init(const gokv_attend_desc *d, const plan *p, int32_t s, int32_t r0, int32_t nr, int32_t rows_seq,
                      tile *t) {
    const int32_t p0 = d->q_pos[s] + r0;
    t->r0 = r0;
    t->nr = nr;
    t->n_segs = gokv_visible_ranges(d, d->kv_len[s], p0, p0 + nr - 1, t->segs);
    t->vis_len = 0;
    for (int32_t i = 0; i < t->n_segs; i++) t->vis_len += t->segs[i].hi - t->segs[i].lo;
    t->n_chunks = rows_seq <= SPLIT_MAX_ROWS && t->vis_len > p->chunk
                      ? (int32_t)(((int64_t)t->vis_len + p->chunk - 1) / p->chunk)
                      : 1;
}

/* Walks the call's tiles and items. Counts them (items, reduce entries, partial words, nq_max) when up is
 * NULL; otherwise writes the item and reduce tables at the plan's offsets. */
static void walk_items(const gokv_attend_desc *d, const gokv_layout *L, plan *p, uint32_t *up) {
    const uint32_t dv2 = (uint32_t)L->d_v + 2u;
    int64_t n_items = 0, n_reduce = 0, part = 0;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int32_t rows = d->q_indptr[s + 1] - d->q_indptr[s];
        for (int32_t r0 = 0; r0 < rows; r0 += p->rows_per_item) {
            tile t;
            tile_init(d, p, s, r0, rows - r0 < p->rows_per_item ? rows - r0 : p->rows_per_item, rows, &t);
            const int32_t per = t.n_chunks > 1 ? p->chunk : t.vis_len;
            const int32_t len0 = t.n_segs > 0 ? t.segs[0].hi - t.segs[0].lo : 0;
            for (int32_t kvh = 0; kvh < L->n_kv_heads; kvh++)
                for (int32_t h0 = 0; h0 < p->G; h0 += p->heads_per_item) {
                    const int32_t nh = p->G - h0 < p->heads_per_item ? p->G - h0 : p->heads_per_item;
                    const uint32_t nq = (uint32_t)(t.nr * nh);
                    const uint32_t qrow0 = (uint32_t)(d->q_indptr[s] + t.r0), head0 = (uint32_t)(kvh * p->G + h0);
                    if (!up && nq > p->nq_max) p->nq_max = nq;
                    for (int32_t ch = 0; ch < t.n_chunks; ch++) {
                        const int32_t v0 = ch * per, v1 = ch == t.n_chunks - 1 ? t.vis_len : v0 + per;
                        if (up) { /* the chunk [v0, v1) as ranges of the two segments */
                            uint32_t *it = up + p->item_w + (uint64_t)n_items * ITEM_WORDS;
                            uint32_t a0 = 0, a1 = 0, b0 = 0, b1 = 0;
                            if (v0 < len0) {
                                a0 = (uint32_t)(t.segs[0].lo + v0);
                                a1 = (uint32_t)(t.segs[0].lo + (v1 < len0 ? v1 : len0));
                            }
                            if (t.n_segs == 2 && v1 > len0) {
                                b0 = (uint32_t)(t.segs[1].lo + (v0 > len0 ? v0 - len0 : 0));
                                b1 = (uint32_t)(t.segs[1].lo + (v1 - len0));
                            }
                            const uint32_t rec[ITEM_WORDS] = {
                                (uint32_t)s, (uint32_t)kvh, qrow0, (uint32_t)t.nr, head0, (uint32_t)nh,
                                (uint32_t)(d->q_pos[s] + t.r0), a0, a1, b0, b1,
                                t.n_chunks > 1 ? (uint32_t)(part + (int64_t)ch * nq * dv2) : NONE};
                            memcpy(it, rec, sizeof rec);
                        }
                        n_items++;
                    }
                    if (t.n_chunks > 1) {
                        for (uint32_t i = 0; up && i < nq; i++) {
                            uint32_t *e = up + p->reduce_w + (uint64_t)(n_reduce + i) * REDUCE_WORDS;
                            const uint32_t head = head0 + i % (uint32_t)nh;
                            e[0] = (uint32_t)part + i * dv2;
                            e[1] = (uint32_t)t.n_chunks;
                            e[2] = nq * dv2;
                            e[3] = ((qrow0 + i / (uint32_t)nh) * (uint32_t)d->n_heads_q + head) * (uint32_t)L->d_v;
                            e[4] = head;
                        }
                        n_reduce += nq;
                        part += (int64_t)t.n_chunks * nq * dv2;
                    }
                }
        }
    }
    p->n_items = n_items;
    p->n_reduce = n_reduce;
    p->part_words = part;
}

/* Baseline: the page-table entries whose pages a sequence's rows can see get a temporary f32 page each.
 * Counts them when up is NULL; otherwise writes their entries and the page tables that point at them. */
static void walk_tpages(const gokv_attend_desc *d, const gokv_layout *L, plan *p, uint32_t *up) {
    const int32_t P = L->page_size;
    int64_t n = 0;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int32_t rows = d->q_indptr[s + 1] - d->q_indptr[s], kv_len = d->kv_len[s];
        const int32_t n_quant = L->kivi ? gokv_kivi_quantized_len(kv_len, L->group, L->residual) : kv_len;
        seg segs[2];
        const int32_t n_segs = rows > 0 ? gokv_visible_ranges(d, kv_len, d->q_pos[s], d->q_pos[s] + rows - 1, segs) : 0;
        for (int32_t j = d->page_indptr[s]; j < d->page_indptr[s + 1]; j++) {
            const int32_t start = (j - d->page_indptr[s]) * P, end = start + P < kv_len ? start + P : kv_len;
            int seen = 0;
            for (int32_t i = 0; i < n_segs; i++) seen |= segs[i].lo < end && start < segs[i].hi;
            const int use = seen && d->page_ids[j] >= 0;
            if (up) {
                up[p->page_w + (uint64_t)j] = use ? (uint32_t)n : NONE;
                if (use) {
                    uint32_t *e = up + p->tpage_w + (uint64_t)n * TPAGE_WORDS;
                    e[0] = (uint32_t)d->page_ids[j];
                    e[1] = (uint32_t)start;
                    e[2] = (uint32_t)(end - start);
                    e[3] = L->kivi ? (uint32_t)d->residual_slot[s] : 0u;
                    e[4] = (uint32_t)n_quant;
                }
            }
            n += use;
        }
    }
    p->n_tpages = n;
}

/* Mass items (sequence, kv head, first token) over every token of every sequence: mass.comp's (span tokens
 * each) for the sequences whose scores are kept (and those without rows), mass_keys.comp's (one workgroup
 * of tokens each) for the others. Counts them when up is NULL; otherwise writes the tables. Also counts the
 * mass words and the kept score words. */
static void walk_mass_items(const gokv_attend_desc *d, const gokv_layout *L, plan *p, uint32_t *up) {
    int64_t n = 0, nk = 0;
    uint64_t mass_words = 0, score_words = 0;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int32_t kv_len = d->kv_len[s];
        const int keep = mass_keeps_scores(d, s);
        const uint32_t span = keep ? p->mass_span : p->wg;
        int64_t *cnt = keep ? &n : &nk;
        for (int32_t kvh = 0; kvh < L->n_kv_heads; kvh++)
            for (int64_t t0 = 0; t0 < kv_len; t0 += span) {
                if (up) {
                    uint32_t *e = up + (keep ? p->mass_item_w : p->key_item_w) + (uint64_t)*cnt * MASS_ITEM_WORDS;
                    e[0] = (uint32_t)s;
                    e[1] = (uint32_t)kvh;
                    e[2] = (uint32_t)t0;
                }
                ++*cnt;
            }
        mass_words += (uint64_t)L->n_kv_heads * (uint64_t)kv_len;
        if (keep) score_words += (uint64_t)mass_rows_of(d, s) * (uint64_t)d->n_heads_q * (uint64_t)kv_len;
    }
    p->n_mass_items = n;
    p->n_key_items = nk;
    p->mass_words = mass_words;
    p->score_words = score_words;
}

/* Quest's inputs: per page-table entry the page quest_score.comp scores (NONE: -inf for released pages, pages
 * none of whose tokens are in pages yet, and sequences without a query row) and the word of its sequence's
 * queries; per sequence the record quest_select.comp reads (QSEQ_WORDS; the shader's header lists them). */
static void fill_quest(const gokv_attend_desc *d, const gokv_layout *L, const plan *p, uint32_t *up) {
    const uint32_t H = (uint32_t)L->n_kv_heads;
    uint64_t qmask = p->mask_w;
    uint32_t *e = up + p->qentry_w;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        const int32_t rows = d->q_indptr[s + 1] - d->q_indptr[s], kv_len = d->kv_len[s];
        const int32_t n_quant = L->kivi ? gokv_kivi_quantized_len(kv_len, L->group, L->residual) : kv_len;
        const int32_t vis = rows > 0 ? (d->q_pos[s] + 1 < kv_len ? d->q_pos[s] + 1 : kv_len) : 0;
        const int32_t n = d->page_indptr[s + 1] - d->page_indptr[s];
        const uint32_t W = (uint32_t)((kv_len + 31) / 32);
        const int32_t *ids = d->page_ids + d->page_indptr[s];
        const uint32_t q0 = (uint32_t)(p->q_w + (uint64_t)d->q_indptr[s] * (uint64_t)d->n_heads_q * (uint64_t)L->d_k);
        for (int32_t i = 0; i < n; i++, e += 2) {
            const int ok = rows > 0 && ids[i] >= 0 && (int64_t)i * L->page_size < n_quant;
            e[0] = ok ? (uint32_t)ids[i] : NONE;
            e[1] = q0;
        }
        uint32_t *q = up + p->qseq_w + (uint64_t)s * QSEQ_WORDS;
        q[0] = (uint32_t)d->page_indptr[s];
        q[1] = (uint32_t)n;
        q[2] = (uint32_t)kv_len;
        q[3] = (uint32_t)n_quant;
        q[4] = (uint32_t)vis;
        q[5] = rows == 0;
        q[6] = d->valid_mask ? (uint32_t)(p->umask_w + (uint64_t)d->valid_indptr[s]) : NONE;
        q[7] = d->valid_mask && (d->flags & GOKV_ATTEND_MASK_PER_KV_HEAD) ? W : 0u;
        q[8] = (uint32_t)qmask;
        qmask += H * (uint64_t)W;
    }
}

/* Fills the up buffer: queries, sinks, page tables, masks, sequences, then the item / reduce / page tables
 * (and Quest's). */
static void fill_up(const gokv_attend_desc *d, const gokv_layout *L, plan *p, uint32_t *up, int baseline) {
    memcpy(up + p->q_w, d->q, (size_t)p->rows * (size_t)d->n_heads_q * (size_t)L->d_k * sizeof(float));
    if (d->sink_logits) memcpy(up + p->sink_w, d->sink_logits, (size_t)d->n_heads_q * sizeof(float));
    if (baseline)
        walk_tpages(d, L, p, up);
    else
        memcpy(up + p->page_w, d->page_ids, (size_t)d->page_indptr[d->n_seqs] * sizeof(int32_t));
    if (d->valid_mask)
        memcpy(up + (p->quest ? p->umask_w : p->mask_w), d->valid_mask,
               (size_t)d->valid_indptr[d->n_seqs] * sizeof(uint32_t));
    uint64_t score = p->score_w, mass_out = p->mass_down_w, qmask = p->mask_w;
    for (int32_t s = 0; s < d->n_seqs; s++) {
        uint32_t *e = up + p->seq_w + (uint64_t)s * SEQ_WORDS;
        const int32_t kv_len = d->kv_len[s];
        e[0] = (uint32_t)kv_len;
        e[1] = (uint32_t)(L->kivi && !baseline ? gokv_kivi_quantized_len(kv_len, L->group, L->residual) : kv_len);
        e[2] = (uint32_t)(p->page_w + (uint64_t)d->page_indptr[s]);
        e[3] = p->quest ? (uint32_t)qmask : d->valid_mask ? (uint32_t)(p->mask_w + (uint64_t)d->valid_indptr[s]) : NONE;
        e[4] = L->kivi && !baseline && kv_len > 0 ? (uint32_t)d->residual_slot[s] : 0u;
        e[5] = p->quest || (d->valid_mask && (d->flags & GOKV_ATTEND_MASK_PER_KV_HEAD)) ? (uint32_t)((kv_len + 31) / 32)
                                                                                       : 0u;
        qmask += (uint64_t)L->n_kv_heads * (uint64_t)((kv_len + 31) / 32);
        const int32_t cr = p->mass ? mass_rows_of(d, s) : 0;
        const int32_t rows = d->q_indptr[s + 1] - d->q_indptr[s];
        e[6] = (uint32_t)(d->q_indptr[s + 1] - cr);
        e[7] = (uint32_t)cr;
        e[8] = (uint32_t)(d->q_pos[s] + rows - cr);
        const int keep = p->mass && mass_keeps_scores(d, s);
        e[9] = keep ? (uint32_t)score : NONE;
        e[10] = (uint32_t)mass_out;
        if (keep) score += (uint64_t)cr * (uint64_t)d->n_heads_q * (uint64_t)kv_len;
        mass_out += (uint64_t)L->n_kv_heads * (uint64_t)kv_len;
    }
    walk_items(d, L, p, up);
    if (p->mass) walk_mass_items(d, L, p, up);
    if (p->quest) fill_quest(d, L, p, up);
}

/* Reserves n words at *w; returns their offset. */
static uint64_t take(uint64_t *w, uint64_t n) {
    const uint64_t at = *w;
    *w += n;
    return at;
}

/* Everything a call needs before its command buffer is recorded. */
typedef struct attend_job {
    plan p;
    int baseline;
    int staged;                         /* inputs copied from up into scratch at in_base (discrete GPUs) */
    gpu_pipeline attend, reduce, dequant, mass, mass_keys; /* all but attend: NULL when not needed */
    gpu_pipeline quest_score, quest_select;
    uint64_t tpage_words, in_base, scratch_words, down_bytes;
} attend_job;

/* Plans the call (items, buffer layout) and gets its pipelines. */
static gokv_status attend_prepare(gpu_device *dev, const gpu_pool *pool, const gokv_layout *L,
                                  const gokv_attend_desc *d, attend_job *j) {
    const char *op = "gokv_attend";
    plan *p = &j->p;
    memset(j, 0, sizeof *j);
    j->baseline = (d->flags & GOKV_ATTEND_DEQUANT_BASELINE) != 0;
    p->mass = d->mass != NULL; /* never with the baseline (the core refuses it) */
    p->quest = d->quest_pages > 0; /* never with the baseline (the core refuses it) */
    /* Quest's masks are made on the device among the staged inputs, so a Quest call always stages them */
    j->staged = dev->caps.stage_inputs || p->quest;
    p->rows = d->q_indptr[d->n_seqs];
    p->G = d->n_heads_q / L->n_kv_heads;
    p->chunk = d->chunk_size > 0 ? d->chunk_size : dev->caps.chunk_size > 0 ? dev->caps.chunk_size : DEFAULT_CHUNK;
    p->wg = dev->caps.wg_size;
    p->nsg = max_subgroups(dev, p->wg);
    uint32_t cap = 1;
    gokv_status st = item_capacity(dev, L, p, &cap);
    if (st) return st;
    if ((uint32_t)p->G >= cap) { /* one row, the group's heads in near-equal subsets */
        const int32_t n_sub = (p->G + (int32_t)cap - 1) / (int32_t)cap;
        p->heads_per_item = (p->G + n_sub - 1) / n_sub;
        p->rows_per_item = 1;
    } else {
        p->heads_per_item = p->G;
        p->rows_per_item = (int32_t)cap / p->G;
    }
    walk_items(d, L, p, NULL);
    p->cpi = pick_cpi(L, p->nq_max, p->wg);
    if (p->mass) {
        p->mass_span = MASS_SPAN_BLOCKS * p->wg;
        walk_mass_items(d, L, p, NULL);
    }
    if (p->n_items > (int64_t)MAX_GRID * MAX_GRID || p->n_reduce > (int64_t)MAX_GRID * MAX_GRID ||
        p->n_mass_items > (int64_t)MAX_GRID * MAX_GRID || p->n_key_items > (int64_t)MAX_GRID * MAX_GRID)
        return gokv_set_error(GOKV_ENOMEM, "%s: %s: %lld work items are more than one call can dispatch; split the batch",
                              op, dev->backend, (long long)p->n_items);

    /* the f32 pool the baseline expands into */
    gokv_layout F;
    if (j->baseline) {
        gokv_pool_desc fd = {sizeof fd, GOKV_FORMAT_F32, 0, 0, L->n_kv_heads, L->d_k, L->d_v, 0, L->page_size, 1, 0, 0};
        gokv_layout_init(&F, &fd);
        p->f_page_w = F.page_bytes / 4u;
        p->f_v_w = F.v_codes / 4u;
        p->f_head_w = F.k_codes_head / 4u;
        walk_tpages(d, L, p, NULL);
    }

    /* up layout (words) */
    uint64_t w = 0;
    p->q_w = take(&w, (uint64_t)p->rows * (uint64_t)d->n_heads_q * (uint64_t)L->d_k);
    p->sink_w = d->sink_logits ? take(&w, (uint64_t)d->n_heads_q) : NONE;
    p->page_w = take(&w, (uint64_t)d->page_indptr[d->n_seqs]);
    const uint64_t n_entries = (uint64_t)d->page_indptr[d->n_seqs], H = (uint64_t)L->n_kv_heads;
    uint64_t quest_mask_words = 0;
    for (int32_t s = 0; p->quest && s < d->n_seqs; s++) quest_mask_words += H * (uint64_t)((d->kv_len[s] + 31) / 32);
    p->mask_w = take(&w, p->quest ? quest_mask_words : d->valid_mask ? (uint64_t)d->valid_indptr[d->n_seqs] : 0u);
    p->umask_w = p->quest && d->valid_mask ? take(&w, (uint64_t)d->valid_indptr[d->n_seqs]) : NONE;
    p->qentry_w = take(&w, p->quest ? 2u * n_entries : 0u);
    p->qseq_w = take(&w, p->quest ? (uint64_t)d->n_seqs * QSEQ_WORDS : 0u);
    p->seq_w = take(&w, (uint64_t)d->n_seqs * SEQ_WORDS);
    p->item_w = take(&w, (uint64_t)p->n_items * ITEM_WORDS);
    p->reduce_w = take(&w, (uint64_t)p->n_reduce * REDUCE_WORDS);
    p->tpage_w = take(&w, (uint64_t)p->n_tpages * TPAGE_WORDS);
    p->mass_item_w = take(&w, (uint64_t)p->n_mass_items * MASS_ITEM_WORDS);
    p->key_item_w = take(&w, (uint64_t)p->n_key_items * MASS_ITEM_WORDS);
    p->up_words = w;
    /* scratch layout (words): baseline f32 pages, split-K partials, mass factors and scores, staged inputs */
    j->tpage_words = (uint64_t)p->n_tpages * p->f_page_w;
    w = j->tpage_words + (uint64_t)p->part_words;
    p->stats_w = take(&w, p->mass ? 2u * (uint64_t)p->rows * (uint64_t)d->n_heads_q : 0u);
    p->score_w = take(&w, p->score_words);
    p->b_w = take(&w, p->quest ? n_entries * H : 0u);
    j->in_base = w;
    j->scratch_words = j->in_base + (j->staged ? p->up_words : 0u);
    /* down layout (words): out, then mass, then Quest's bounds and choices */
    p->mass_down_w = (uint64_t)p->rows * (uint64_t)d->n_heads_q * (uint64_t)L->d_v;
    w = p->mass_down_w + p->mass_words;
    p->qbounds_down_w = p->quest && d->quest_bounds ? take(&w, n_entries * H) : NONE;
    p->qsel_down_w = p->quest && d->quest_selected ? take(&w, (uint64_t)d->n_seqs * H * (uint64_t)d->quest_pages) : NONE;
    p->down_words = w;
    j->down_bytes = w * 4u;
    const uint64_t limit = dev->caps.max_binding_bytes;
    if (p->up_words * 4u > limit || j->scratch_words * 4u > limit || j->down_bytes > limit)
        return gokv_set_error(GOKV_ENOMEM,
                              "%s: %s: the call needs %llu bytes of inputs, %llu of scratch (%llu of them baseline "
                              "f32 pages, %llu attention mass scores) and %llu of outputs; this device's buffer "
                              "bindings hold %llu bytes at most: attend fewer rows or sequences per call (or count "
                              "fewer mass rows)",
                              op, dev->backend, (unsigned long long)(p->up_words * 4u), (unsigned long long)(j->scratch_words * 4u),
                              (unsigned long long)(j->tpage_words * 4u), (unsigned long long)(p->score_words * 4u),
                              (unsigned long long)j->down_bytes,
                              (unsigned long long)limit);

    /* pipelines */
    uint32_t spec[GPU_SPEC_COUNT];
    if (j->baseline)
        gpu_pool_spec(dev, &F, spec);
    else
        memcpy(spec, pool->spec, sizeof spec);
    spec[GPU_SPEC_OP0] = p->nq_max;
    spec[GPU_SPEC_OP1] = p->cpi;
    spec[GPU_SPEC_OP2] = p->nsg;
    spec[GPU_SPEC_OP3] = (uint32_t)j->staged;
    spec[GPU_SPEC_OP4] = (uint32_t)p->mass;
    st = gpu_get_pipeline(dev, j->baseline ? "baseline_attend" : "attend", spec, &j->attend);
    spec[GPU_SPEC_OP4] = 0;
    if (!st && p->n_key_items) st = gpu_get_pipeline(dev, "mass_keys", spec, &j->mass_keys);
    memcpy(spec, pool->spec, sizeof spec);
    spec[GPU_SPEC_OP3] = (uint32_t)j->staged;
    if (!st && p->n_reduce) st = gpu_get_pipeline(dev, p->mass ? "reduce_mass" : "reduce", spec, &j->reduce);
    if (!st && p->n_tpages) st = gpu_get_pipeline(dev, "baseline_dequant", spec, &j->dequant);
    if (!st && p->n_mass_items) st = gpu_get_pipeline(dev, "mass", spec, &j->mass);
    if (!st && p->quest) st = gpu_get_pipeline(dev, "quest_score", spec, &j->quest_score);
    spec[GPU_SPEC_OP2] = p->nsg;
    if (!st && p->quest) st = gpu_get_pipeline(dev, "quest_select", spec, &j->quest_select);
    return st;
}

/* Fills the call's up buffer and records its commands: [staging copy ->] [quest_score -> quest_select ->]
 * [baseline_dequant ->] attend [-> reduce] [-> mass]. */
static void attend_record(gpu_call *c, const gokv_layout *L, const gokv_attend_desc *d, attend_job *j) {
    plan *p = &j->p;
    const uint32_t in_base = (uint32_t)j->in_base;
    fill_up(d, L, p, (uint32_t *)c->up, j->baseline);
    if (j->staged) {
        gpu_copy(c, GPU_UP, 0, GPU_SCRATCH, j->in_base * 4u, p->up_words * 4u);
        gpu_barrier(c);
    }
    if (p->quest) { /* bounds, then the choice and the masks attend reads, behind a barrier each */
        const uint64_t n_scores = (uint64_t)d->page_indptr[d->n_seqs] * (uint64_t)L->n_kv_heads;
        const quest_score_push qp = {(uint32_t)n_scores, (uint32_t)p->qentry_w, (uint32_t)p->b_w,
                                     c->p->bounds_w, (uint32_t)(d->n_heads_q / L->n_kv_heads), in_base};
        gpu_dispatch_linear(c, j->quest_score, &qp, sizeof qp, n_scores, c->p->spec[GPU_SPEC_WG_SIZE]);
        gpu_barrier(c);
        const quest_select_push sp = {(uint32_t)d->n_seqs * (uint32_t)L->n_kv_heads, (uint32_t)p->qseq_w,
                                      (uint32_t)p->b_w, (uint32_t)p->qbounds_down_w, (uint32_t)p->qsel_down_w,
                                      (uint32_t)d->quest_pages, (uint32_t)d->n_sink_tokens,
                                      (uint32_t)d->quest_recent, in_base};
        gpu_dispatch_items(c, j->quest_select, &sp, sizeof sp, (int64_t)d->n_seqs * L->n_kv_heads);
        gpu_barrier(c);
    }
    if (j->dequant) {
        const dequant_push dp = {(uint32_t)p->n_tpages, (uint32_t)p->tpage_w, (uint32_t)p->f_page_w,
                                 (uint32_t)p->f_v_w, (uint32_t)p->f_head_w, in_base};
        gpu_dispatch_items(c, j->dequant, &dp, sizeof dp, p->n_tpages);
        gpu_barrier(c);
    }
    const attend_push ap = {(uint32_t)p->n_items, (uint32_t)p->item_w, (uint32_t)p->seq_w, (uint32_t)p->q_w,
                            (uint32_t)p->sink_w, (uint32_t)j->tpage_words, (uint32_t)d->n_heads_q, d->window,
                            d->n_sink_tokens, d->scale, in_base, (uint32_t)p->stats_w};
    gpu_dispatch_items(c, j->attend, &ap, sizeof ap, p->n_items);
    if (j->reduce) {
        gpu_barrier(c);
        const reduce_push rp = {(uint32_t)p->n_reduce, (uint32_t)p->reduce_w, (uint32_t)j->tpage_words,
                                (uint32_t)p->sink_w, in_base, (uint32_t)p->stats_w};
        gpu_dispatch_items(c, j->reduce, &rp, sizeof rp, p->n_reduce);
    }
    if (j->mass) { /* reads the scores and the factors of attend and reduce */
        gpu_barrier(c);
        const mass_push mp = {(uint32_t)p->n_mass_items, (uint32_t)p->mass_item_w, (uint32_t)p->seq_w,
                              (uint32_t)p->stats_w, (uint32_t)d->n_heads_q, d->window, d->n_sink_tokens,
                              p->mass_span, in_base};
        gpu_dispatch_items(c, j->mass, &mp, sizeof mp, p->n_mass_items);
    }
    if (j->mass_keys) { /* the same reads; other sequences' mass than mass.comp's, in the same buffer */
        gpu_barrier(c);
        attend_push kp = ap;
        kp.n_items = (uint32_t)p->n_key_items;
        kp.item_w = (uint32_t)p->key_item_w;
        gpu_dispatch_items(c, j->mass_keys, &kp, sizeof kp, p->n_key_items);
    }
}

gokv_status gpu_attend(gpu_device *dev, gpu_pool *pool, const gokv_attend_desc *d) {
    const gokv_layout *L = &pool->L;
    if (d->n_seqs == 0 || d->q_indptr[d->n_seqs] == 0) { /* no query rows: no token gets any mass */
        const uint64_t H = (uint64_t)L->n_kv_heads;
        if (d->mass) {
            uint64_t n = 0;
            for (int32_t s = 0; s < d->n_seqs; s++) n += H * (uint64_t)d->kv_len[s];
            memset(d->mass, 0, (size_t)n * sizeof(float));
        }
        if (d->quest_pages > 0 && d->quest_bounds) /* no page competes: every bound is -inf */
            for (uint64_t i = 0; i < (uint64_t)d->page_indptr[d->n_seqs] * H; i++) d->quest_bounds[i] = -INFINITY;
        if (d->quest_pages > 0 && d->quest_selected)
            for (uint64_t i = 0; i < (uint64_t)d->n_seqs * H * (uint64_t)d->quest_pages; i++) d->quest_selected[i] = -1;
        return GOKV_OK;
    }
    attend_job j;
    gokv_status st = attend_prepare(dev, pool, L, d, &j);
    if (st) return st;
    gpu_call c;
    st = gpu_call_begin(dev, pool, j.p.up_words * 4u, j.scratch_words * 4u, j.down_bytes, &c);
    if (st) return st;
    attend_record(&c, L, d, &j);
    st = gpu_call_submit(&c, "gokv_attend");
    if (!st) {
        const plan *p = &j.p;
        memcpy(d->out, c.down, (size_t)(p->mass_down_w * 4u));
        if (d->mass) memcpy(d->mass, c.down + p->mass_down_w * 4u, (size_t)(p->mass_words * 4u));
        if (p->qbounds_down_w != NONE)
            memcpy(d->quest_bounds, c.down + p->qbounds_down_w * 4u,
                   (size_t)d->page_indptr[d->n_seqs] * (size_t)L->n_kv_heads * sizeof(float));
        if (p->qsel_down_w != NONE)
            memcpy(d->quest_selected, c.down + p->qsel_down_w * 4u,
                   (size_t)d->n_seqs * (size_t)L->n_kv_heads * (size_t)d->quest_pages * sizeof(int32_t));
    }
    gpu_call_end(&c);
    return st;
}
