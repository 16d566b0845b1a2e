// attend.h: fused decode / prefill attention straight from the compressed pages (docs/architecture.md §5), the
// body of attend.metal (reads the pool), baseline_attend.metal (reads the f32 copy that baseline_dequant.metal
// wrote at the start of scratch) and, for its key decoding, mass_keys.metal. A port of
// native/vulkan/shaders/attend_common.glsl: the same work items, inputs, phases, threadgroup arrays and results;
// the host's plan (native/gpu/gpu_attend.c) cannot tell the two apart.
//
// One threadgroup runs one work item of the plan: one kv head of one sequence, nq = nrows x nheads query
// vectors (query rows [qrow0, qrow0 + nrows), heads [head0, head0 + nheads) of the kv head's group), and the
// visible tokens [a0, a1) then [b0, b1) (a chunk of the sink range + window range). It walks those tokens in
// blocks of WG_SIZE, with the online softmax state (m, l) of every query vector in threadgroup memory and the
// output accumulators in registers:
//   A  token-parallel: thread k takes token k of the block, works out which query vectors see it (causal,
//      window / sink tokens, released page, validity mask), decodes its key once and scores it against every
//      query vector (queries, pre-scaled by α, in threadgroup memory); simd_max + threadgroup memory give each
//      vector's block maximum.
//   B  one thread per vector: m_new = max(m, block max), corr = e^(m - m_new), l *= corr; then token-parallel
//      again: p = e^(s - m_new) into threadgroup memory, simd_sum for the sum (folded into l at the next block).
//   C  channel-parallel: each thread owns CPI consecutive value channels (a "unit") of UPI units and a token
//      slice (with fewer units than threads, TS slices of the block run side by side); it rescales its
//      accumulators by corr and adds p · v for every query vector, decoding each value element once.
// At the end the slices are summed through threadgroup memory and the item either finalizes into `down`
// (out = o / (l + e^(σ - m)), zeros when nothing was visible) or writes its partial (m, l, o[D_V]) to scratch
// for reduce.metal. Nothing dequantized is ever stored. MASS (spec OP4), validity masks (per sequence or per kv
// head, with block and item skipping), Quest's masks (among the staged inputs), KIVI rings, MLA
// (v_is_k_prefix), learned sinks, sink tokens and windows: all as attend_common.glsl describes them.
//
// Templates and spec words. Only what sizes a register array is a template parameter: NQ >= the plan's NQ_MAX
// (spec OP0, rounded up to a power of two) for the scores, CPI (spec OP1) for a value unit, UPI >= the units
// per thread (ceil(D_V / CPI / WG_SIZE), rounded up to a power of two) for the accumulators
// [UPI][NQ][CPI]. Everything else, the format included, is a runtime word of the spec, read once into
// kv_pool / attend_engine; a branch on it is uniform across the grid. Loops over the register arrays run to the
// template bound and stop at the runtime one, so a real compiler unrolls them and keeps the arrays in
// registers, and threadgroup memory is laid out for the spec's NQ_MAX, not the template's (tg_words in
// native/gpu/gpu_variants.c, which must agree with attend_layout below).
//
// q4 keys: the pre-divided query of Open-TQ-Metal. A packed word holds 8 codes, code e at bits 4e; for each
// 16-bit half h, (h & 0x000F, h & 0x00F0, h & 0x0F00, h & 0xF000) are the codes times 16^e, so a query stored
// pre-divided, q_pre[c] = α q[c] / 16^(c % 4) (exact: powers of two), gives Σ q_pre (h & mask) = Σ α q · code
// with no shift per code, and each group adds s · Σ q·code + b · Σ_{c∈g} α q_c (the per-group sums of the
// query, computed once per item into qsum), the identity of docs/architecture.md §5. Against the Vulkan
// shader's per-element q·(code·s + b) this only regroups the rounding of the score (a few ulp of the group's
// terms; the conformance suite's 1e-4 of the output's scale is orders of magnitude wider), and it saves the
// shift and the dequantizing multiply-add per element; q8 keys, values, KIVI and the ring keep the plain
// per-element decode (their codes do not sit on nibble boundaries, or there is no shared scale to factor).
//
// Simdgroups: reductions go through simd_max / simd_sum inside each simdgroup and threadgroup memory across
// n_sg simdgroups (NSG_MAX = spec OP2 entries reserved); the width is never assumed.
#ifndef GOKV_MTL_ATTEND_H
#define GOKV_MTL_ATTEND_H

#include "mtl_kernel.h"
#include "common.h"

struct attend_push {
    GOKV_PUSH_ATTEND(PUSH_FIELD)
};

constant constexpr uint NONE = 0xffffffffu;
constant constexpr float NEG = -3.0e38f;                  // score of an invisible token, m of a vector that saw nothing
constant constexpr int NO_TOKEN = -1, RING_TOKEN = -2;    // tok_page of a token nobody sees / of a KIVI ring token
constant constexpr uint ITEM_WORDS = 12u, SEQ_WORDS = 11u; // item and sequence tables (gpu_attend.c)
constant constexpr uint MASS_ITEM_WORDS = 3u;             // mass and mass_keys items

// fp16 -> f32 for the finite halves pools hold (values, scales and biases are validated finite on write):
// equal to common.h's half_to_float there, in fewer operations.
static inline float half_finite(uint h) {
    uint a = h & 0x7fffu;
    float f = a < 0x400u ? float(a) * 5.9604644775390625e-8f : as_type<float>((a << 13) + 0x38000000u);
    return (h & 0x8000u) != 0u ? -f : f;
}

// Whether a query at position p sees token t (given t is stored, valid and its page not released).
static inline bool sees(int window, int n_sink_tokens, uint p, uint t) {
    return t <= p && (window == 0 || p - t < uint(window) || t < uint(n_sink_tokens));
}

// One work item of the plan (ITEM_WORDS words in the item table, SEQ_WORDS per sequence), and what follows.
struct attend_item {
    uint kvh, qrow0, nrows, head0, nheads, pos0; // kv head, query rows and heads, position of row qrow0
    uint a0, a1, b0, b1;                         // visible tokens [a0, a1) then [b0, b1)
    uint part;                                   // its split-K partial's offset, or NONE: finalize
    uint n_quant, page_w, mask_w, rs;            // the sequence: tokens in pages, page table, mask, ring slot
    uint nq, len_a, n_vis;                       // query vectors, tokens of [a0, a1), visible tokens
    uint kv_len, mass_row0, score_w;             // MASS: the sequence's length, first counted row, scores
};

// Threadgroup memory of attend (words), for the spec's NQ_MAX (not the template's): what
// native/gpu/gpu_variants.c reserves. Offsets in the order the arrays are carved.
struct attend_layout {
    uint qo, pw, red_m, red_l, st_m, st_l, st_c, tok_page, tok_slot, live_sg, qsum, words;
};
static inline attend_layout attend_layout_of(uint nq_max, uint wg, uint nsg, uint d_k, uint d_v, uint q4_groups) {
    attend_layout a;
    const uint dmax = d_k > d_v ? d_k : d_v;
    a.qo = 0u;                               // queries (scaled), then the item's output o[i][c]
    a.pw = a.qo + nq_max * dmax;             // softmax weights p[i][k] of the block
    a.red_m = a.pw + nq_max * wg;            // per simdgroup block maxima
    a.red_l = a.red_m + nq_max * nsg;        // per simdgroup block sums of p
    a.st_m = a.red_l + nq_max * nsg;         // running max, running sum, rescale factor
    a.st_l = a.st_m + nq_max;
    a.st_c = a.st_l + nq_max;
    a.tok_page = a.st_c + nq_max;            // by block parity: page of token k, RING_TOKEN or NO_TOKEN
    a.tok_slot = a.tok_page + 2u * wg;       // slot in the page (ring tokens: the position)
    a.live_sg = a.tok_slot + 2u * wg;        // per simdgroup: whether its share of the item's mask words has a bit
    a.qsum = a.live_sg + nsg;                // q4 keys: Σ of each query vector's channels per group
    a.words = a.qsum + nq_max * q4_groups;
    return a;
}

template <uint NQ, uint CPI, uint UPI> struct attend_engine {
    kv_pool kv;         // pages: the pool, or (baseline_attend) the f32 copy in scratch
    attend_push pc;
    device uint *in;    // the inputs (attend_inputs.glsl)
    device uint *scratch;
    device uint *down;
    uint WG, NSG, NQ_MAX, D_K, D_V, GQ, NU, TS, MASS;
    uint q4_groups;     // q4 keys (pre-divided query): groups per key row; 0 otherwise
    threadgroup float *qo, *pw, *red_m, *red_l, *st_m, *st_l, *st_c, *qsum;
    threadgroup int *tok_page;
    threadgroup uint *tok_slot, *live_sg;
    float score[NQ];             // scores of this thread's token
    float acc[UPI * NQ * CPI];   // output accumulators: [unit][vector][channel]
    float xv[CPI];               // one decoded value unit

    float kv_half(uint i) const { return half_finite((kv.pages[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu); }
    float ring_half_finite(uint i) const { return half_finite((kv.rings[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu); }
    bool sees_pos(uint p, uint t) const { return sees(pc.window, pc.n_sink_tokens, p, t); }

    // ---- phase A: keys ----

    void dot1(uint c, float x) {
        for (uint i = 0u; i < NQ; i++) {
            if (i >= NQ_MAX) break;
            score[i] += qo[i * D_K + c] * x;
        }
    }

    // q4: the four codes of the 16-bit half h, channels c .. c + 3, against the pre-divided query.
    void nibbles(thread float *g, uint c, uint h) {
        const float f0 = float(h & 0x000Fu), f1 = float(h & 0x00F0u), f2 = float(h & 0x0F00u), f3 = float(h & 0xF000u);
        for (uint i = 0u; i < NQ; i++) {
            if (i >= NQ_MAX) break;
            const threadgroup float *q = qo + i * D_K + c;
            g[i] += q[0] * f0 + q[1] * f1 + q[2] * f2 + q[3] * f3;
        }
    }

    // Per-token key row whose word 0 is kv.pages[w0] (key_word; its words are K_WORD_STEP apart); sh0 / bh0:
    // half index of its group-0 scale / bias.
    void score_key_row(uint w0, uint sh0, uint bh0) {
        const uint step = kv.K_WORD_STEP;
        if (kv.FORMAT == FMT_F32) {
            for (uint c = 0u; c < D_K; c++) dot1(c, as_type<float>(kv.pages[w0 + c]));
        } else if (kv.FORMAT == FMT_F16) {
            for (uint c2 = 0u; c2 < D_K / 2u; c2++) {
                const uint u = kv.pages[w0 + c2];
                dot1(2u * c2, half_finite(u & 0xffffu));
                dot1(2u * c2 + 1u, half_finite(u >> 16));
            }
        } else if (q4_groups != 0u) { // q4, pre-divided query: s · Σ q·code + b · Σ q per group
            const uint wpg = GQ / 8u; // words per group
            for (uint j = 0u; j < q4_groups; j++) {
                const float sc = kv_half(sh0 + j), bi = kv_half(bh0 + j);
                float g[NQ];
                for (uint i = 0u; i < NQ; i++) g[i] = 0.0f;
                for (uint k = 0u; k < wpg; k++) {
                    const uint u = kv.pages[w0 + (j * wpg + k) * step];
                    const uint c = j * GQ + 8u * k;
                    nibbles(g, c, u & 0xffffu);
                    nibbles(g, c + 4u, u >> 16);
                }
                for (uint i = 0u; i < NQ; i++) {
                    if (i >= NQ_MAX) break;
                    score[i] += sc * g[i] + bi * qsum[i * q4_groups + j];
                }
            }
        } else { // q8: x = code·s + b per element (the Vulkan shader's decode, also right for any BITS)
            const uint bits = kv.BITS, mask = kv.CODE_MASK, epw = 32u / bits, wpg = GQ / epw;
            for (uint j = 0u; j < D_K / GQ; j++) {
                const float sc = kv_half(sh0 + j), bi = kv_half(bh0 + j);
                for (uint k = 0u; k < wpg; k++) {
                    const uint u = kv.pages[w0 + (j * wpg + k) * step];
                    for (uint e = 0u; e < epw; e++)
                        dot1(j * GQ + k * epw + e, float((u >> (e * bits)) & mask) * sc + bi);
                }
            }
        }
    }

    // KIVI key of the token at (page, slot): per channel codes packed along the g tokens of its group.
    void score_kivi_key(uint page, uint head, uint slot) {
        const uint bits = kv.BITS, wpc = GQ * bits / 32u; // words of one channel in a token group
        const uint jg = slot / GQ, tg = slot % GQ;
        const uint w0 =
            page * kv.PAGE_WORDS + kv.K_CODES_W + head * kv.K_CODES_HEAD_W + jg * kv.K_ROW_W + (tg * bits) / 32u;
        const uint sh = (tg * bits) % 32u;
        const uint hs = page * kv.PAGE_WORDS * 2u + head * kv.K_SB_HEAD_H + jg * D_K;
        for (uint c = 0u; c < D_K; c++) {
            const uint code = (kv.pages[w0 + c * wpc] >> sh) & kv.CODE_MASK;
            dot1(c, float(code) * kv_half(hs + kv.K_SCALE_H + c) + kv_half(hs + kv.K_BIAS_H + c));
        }
    }

    // KIVI residual ring key (fp16 row) of position t.
    void score_ring_key(uint rs, uint t, uint head) {
        const uint h0 = ring_k_half(kv, rs, t, head, 0u);
        for (uint c = 0u; c < D_K; c++) dot1(c, ring_half_finite(h0 + c));
    }

    // Scores token t of the sequence (page id, or the ring) into score[] (from 0).
    void score_token(int id, uint t, uint n_quant, uint rs, uint kvh) {
        for (uint i = 0u; i < NQ; i++) score[i] = 0.0f;
        if (kv.KIVI != 0u && t >= n_quant) {
            score_ring_key(rs, t, kvh);
        } else if (kv.KIVI != 0u) {
            score_kivi_key(uint(id), kvh, t % kv.PAGE_SIZE);
        } else {
            const uint sl = t % kv.PAGE_SIZE;
            score_key_row(key_word(kv, uint(id), kvh, sl, 0u), row_scale_half(kv, uint(id), kvh, sl, 0u, false),
                          row_bias_half(kv, uint(id), kvh, sl, 0u, false));
        }
    }

    // ---- phase C: values ----

    // Decodes value channels [c0, c0 + CPI) of a token into xv.
    void load_value_unit(int pg, uint slot, uint head, uint rs, uint c0) {
        if (kv.KIVI != 0u && pg == RING_TOKEN) {
            const uint h = ring_v_half(kv, rs, slot, head, c0);
            for (uint ch = 0u; ch < CPI; ch++) xv[ch] = ring_half_finite(h + ch);
            return;
        }
        const uint page = uint(pg);
        if (kv.KIVI != 0u && kv.V_IS_K_PREFIX != 0u) { // MLA over KIVI: values are the per-channel keys' prefix
            for (uint ch = 0u; ch < CPI; ch++) xv[ch] = kivi_key_elem(kv, page, head, slot, c0 + ch);
            return;
        }
        const bool is_v = kv.V_IS_K_PREFIX == 0u;
        const uint w0 = row_word(kv, page, head, slot, is_v);
        if (kv.FORMAT == FMT_F32) {
            for (uint ch = 0u; ch < CPI; ch++) xv[ch] = as_type<float>(kv.pages[w0 + c0 + ch]);
        } else if (kv.FORMAT == FMT_F16) {
            for (uint ch = 0u; ch < CPI; ch++) xv[ch] = kv_half(2u * w0 + c0 + ch);
        } else {
            const uint bits = kv.BITS, mask = kv.CODE_MASK, epw = 32u / bits;
            const uint j = c0 / GQ;
            const float sc = kv_half(row_scale_half(kv, page, head, slot, j, is_v));
            const float bi = kv_half(row_bias_half(kv, page, head, slot, j, is_v));
            if (CPI >= epw) {
                for (uint wi = 0u; wi < CPI / epw; wi++) {
                    const uint word = kv.pages[w0 + c0 / epw + wi];
                    for (uint e = 0u; e < epw; e++) xv[wi * epw + e] = float((word >> (e * bits)) & mask) * sc + bi;
                }
            } else {
                const uint word = kv.pages[w0 + c0 / epw] >> ((c0 % epw) * bits);
                for (uint e = 0u; e < CPI; e++) xv[e] = float((word >> (e * bits)) & mask) * sc + bi;
            }
        }
    }

    // ---- the work item ----

    attend_item load_item(uint item) const {
        attend_item it;
        const uint iw = pc.item_w + item * ITEM_WORDS;
        const uint seq = in[iw];
        it.kvh = in[iw + 1u];
        it.qrow0 = in[iw + 2u];
        it.nrows = in[iw + 3u];
        it.head0 = in[iw + 4u];
        it.nheads = in[iw + 5u];
        it.pos0 = in[iw + 6u];
        it.a0 = in[iw + 7u];
        it.a1 = in[iw + 8u];
        it.b0 = in[iw + 9u];
        it.b1 = in[iw + 10u];
        it.part = in[iw + 11u];
        const uint sw = pc.seq_w + seq * SEQ_WORDS;
        it.n_quant = in[sw + 1u];
        it.page_w = in[sw + 2u];
        it.mask_w = in[sw + 3u];
        if (it.mask_w != NONE) it.mask_w += it.kvh * in[sw + 5u]; // this kv head's mask
        it.rs = in[sw + 4u];
        it.kv_len = 0u;
        it.mass_row0 = 0u;
        it.score_w = NONE;
        if (MASS != 0u) {
            it.kv_len = in[sw];
            it.mass_row0 = in[sw + 6u];
            it.score_w = in[sw + 9u];
        }
        it.nq = it.nrows * it.nheads;
        it.len_a = it.a1 - it.a0;
        it.n_vis = it.len_a + (it.b1 - it.b0);
        return it;
    }

    // Query vectors first .. first + NQ_MAX - 1 of a run of n_valid (vector v: row row0 + v / nheads, head
    // head0 + v % nheads), scaled by α, into qo (past n_valid: zero); q4 keys: pre-divided, and their per-group
    // sums into qsum. Thread lid of WG; the caller puts a barrier before their use.
    void load_queries(uint lid, uint first, uint n_valid, uint row0, uint head0, uint nheads) {
        for (uint x = lid; x < NQ_MAX * D_K; x += WG) {
            const uint i = x / D_K, c = x % D_K, v = first + i;
            float q = 0.0f;
            if (v < n_valid)
                q = as_type<float>(in[pc.q_w + ((row0 + v / nheads) * pc.n_heads_q + head0 + v % nheads) * D_K + c]) *
                    pc.scale;
            if (q4_groups != 0u) // 1 / 16^(c % 4)
                q *= (c & 3u) == 0u ? 1.0f : (c & 3u) == 1u ? 0.0625f : (c & 3u) == 2u ? 0.00390625f : 0.000244140625f;
            qo[x] = q;
        }
        for (uint x = lid; x < NQ_MAX * q4_groups; x += WG) {
            const uint i = x / q4_groups, j = x % q4_groups, v = first + i;
            float s = 0.0f;
            if (v < n_valid) {
                const uint w = pc.q_w + ((row0 + v / nheads) * pc.n_heads_q + head0 + v % nheads) * D_K + j * GQ;
                for (uint c = 0u; c < GQ; c++) s += as_type<float>(in[w + c]) * pc.scale;
            }
            qsum[x] = s;
        }
    }

    // Queries, the softmax state, the accumulators.
    void init_item(thread const attend_item &it, uint lid) {
        load_queries(lid, 0u, it.nq, it.qrow0, it.head0, it.nheads);
        for (uint i = lid; i < NQ_MAX; i += WG) {
            st_m[i] = NEG;
            st_l[i] = 0.0f;
        }
        for (uint x = 0u; x < UPI * NQ * CPI; x++) acc[x] = 0.0f;
    }

    // ---- masks: whether tokens [lo, hi) have a set bit in the mask at mask_w, looking at the words first,
    // first + step, ... of the range (every thread: 0, 1; one share each: lid, WG) ----
    bool mask_any(uint mask_w, uint lo, uint hi, uint first, uint step) const {
        if (lo >= hi) return false;
        const uint w0 = lo >> 5, w1 = (hi - 1u) >> 5;
        for (uint w = w0 + first; w <= w1; w += step) {
            uint bits = in[mask_w + w];
            if (w == w0) bits &= ~0u << (lo & 31u);
            if (w == w1 && (hi & 31u) != 0u) bits &= ~(~0u << (hi & 31u));
            if (bits != 0u) return true;
        }
        return false;
    }

    // The tokens of visible-range indices [v0, v1) of the item: [a0, a1) then [b0, b1) laid end to end.
    bool item_any(thread const attend_item &it, uint v0, uint v1, uint first, uint step) const {
        bool found = false;
        if (v0 < it.len_a) found = mask_any(it.mask_w, it.a0 + v0, it.a0 + min(v1, it.len_a), first, step);
        if (v1 > it.len_a)
            found = found ||
                    mask_any(it.mask_w, it.b0 + (max(v0, it.len_a) - it.len_a), it.b0 + (v1 - it.len_a), first, step);
        return found;
    }

    // MASS: where row `row` stores its score of token t for head `head`.
    uint score_word(thread const attend_item &it, uint row, uint head, uint t) const {
        return it.score_w + ((row - it.mass_row0) * pc.n_heads_q + head) * it.kv_len + t;
    }

    // MASS: a skipped block's tokens still get their NEG scores (mass.metal reads every token of the ranges).
    void mass_skip(thread const attend_item &it, uint blk, uint lid) {
        const uint v = blk * WG + lid;
        if (v >= it.n_vis || it.score_w == NONE) return;
        const uint t = v < it.len_a ? it.a0 + v : it.b0 + (v - it.len_a);
        for (uint i = 0u; i < NQ; i++) {
            if (i >= NQ_MAX) break;
            const uint row = it.qrow0 + i / it.nheads;
            if (i < it.nq && row >= it.mass_row0)
                scratch[score_word(it, row, it.head0 + i % it.nheads, t)] = as_type<uint>(NEG);
        }
    }

    // ---- A: visibility and scores of token lid of block blk; its page and slot into tok_* (buffer tb), the
    // simdgroup maxima into red_m ----
    void phase_a(thread const attend_item &it, uint blk, uint lid, uint tb, bool elect, uint sg) {
        for (uint i = 0u; i < NQ; i++) score[i] = NEG;
        int pg = NO_TOKEN;
        uint slot = 0u;
        const uint v = blk * WG + lid;
        if (v < it.n_vis) {
            const uint t = v < it.len_a ? it.a0 + v : it.b0 + (v - it.len_a);
            const int id = int(in[it.page_w + t / kv.PAGE_SIZE]);
            bool ok = id >= 0;
            if (ok && it.mask_w != NONE) ok = ((in[it.mask_w + (t >> 5)] >> (t & 31u)) & 1u) != 0u;
            // some row sees t iff the first row at or after t does (the window only moves away from t)
            const uint p_first = max(t, it.pos0);
            const bool any_vis = ok && p_first < it.pos0 + it.nrows && sees_pos(p_first, t);
            if (any_vis) {
                const bool ring = kv.KIVI != 0u && t >= it.n_quant;
                score_token(id, t, it.n_quant, it.rs, it.kvh);
                for (uint i = 0u; i < NQ; i++)
                    if (i >= it.nq || !sees_pos(it.pos0 + i / it.nheads, t)) score[i] = NEG;
                pg = ring ? RING_TOKEN : id;
                slot = ring ? t : t % kv.PAGE_SIZE;
            }
            if (MASS != 0u && it.score_w != NONE) // every token of the ranges, NEG where the row does not see it
                for (uint i = 0u; i < NQ; i++) {
                    if (i >= NQ_MAX) break;
                    const uint row = it.qrow0 + i / it.nheads;
                    if (i < it.nq && row >= it.mass_row0)
                        scratch[score_word(it, row, it.head0 + i % it.nheads, t)] = as_type<uint>(score[i]);
                }
        }
        tok_page[tb + lid] = pg;
        tok_slot[tb + lid] = slot;
        for (uint i = 0u; i < NQ; i++) {
            if (i >= NQ_MAX) break;
            const float mx = simd_max(score[i]);
            if (elect) red_m[i * NSG + sg] = mx;
        }
    }

    // ---- B, first half: new running maxima; fold the previous walked block's sum into l (done: blocks walked) ----
    void phase_b_max(uint done, uint lid, uint n_sg) {
        for (uint i = lid; i < NQ_MAX; i += WG) {
            float mb = NEG, l = st_l[i];
            for (uint g = 0u; g < n_sg; g++) {
                mb = max(mb, red_m[i * NSG + g]);
                if (done > 0u) l += red_l[i * NSG + g];
            }
            const float mo = st_m[i], mn = max(mo, mb);
            const float corr = mo == NEG ? 0.0f : exp(mo - mn);
            st_m[i] = mn;
            st_l[i] = l * corr;
            st_c[i] = corr;
        }
    }

    // ---- B, second half: p = e^(s - m_new) of token lid into pw, the simdgroup sums into red_l ----
    void phase_b_weights(uint lid, bool elect, uint sg) {
        for (uint i = 0u; i < NQ; i++) {
            if (i >= NQ_MAX) break;
            const float p = score[i] == NEG ? 0.0f : exp(score[i] - st_m[i]);
            pw[i * WG + lid] = p;
            const float sum = simd_sum(p);
            if (elect) red_l[i * NSG + sg] = sum;
        }
    }

    // ---- C: rescale and accumulate p · v over this thread's units (from unit0) and token slice ----
    void phase_c(uint kvh, uint rs, uint tb, uint slice, uint unit0) {
        for (uint u = 0u; u < UPI; u++)
            for (uint i = 0u; i < NQ; i++) {
                if (i >= NQ_MAX) break;
                const float corr = st_c[i];
                for (uint ch = 0u; ch < CPI; ch++) acc[(u * NQ + i) * CPI + ch] *= corr;
            }
        for (uint k = slice; k < WG; k += TS) {
            const int tp = tok_page[tb + k];
            if (tp == NO_TOKEN) continue;
            const uint ts = tok_slot[tb + k];
            for (uint u = 0u; u < UPI; u++) {
                const uint unit = unit0 + u * WG;
                if (unit >= NU) break;
                load_value_unit(tp, ts, kvh, rs, unit * CPI);
                for (uint i = 0u; i < NQ; i++) {
                    if (i >= NQ_MAX) break;
                    const float p = pw[i * WG + k];
                    for (uint ch = 0u; ch < CPI; ch++) acc[(u * NQ + i) * CPI + ch] += p * xv[ch];
                }
            }
        }
    }

    // ---- the end: the last walked block's sum; the slices summed into qo (now free) as o[i][c] ----
    void sum_slices(uint done, uint lid, uint slice, uint unit0, bool c_active, uint n_sg) {
        if (done > 0u)
            for (uint i = lid; i < NQ_MAX; i += WG)
                for (uint g = 0u; g < n_sg; g++) st_l[i] += red_l[i * NSG + g];
        for (uint s2 = 0u; s2 < TS; s2++) {
            if (c_active && slice == s2)
                for (uint u = 0u; u < UPI; u++) {
                    const uint unit = unit0 + u * WG;
                    if (unit >= NU) break;
                    for (uint i = 0u; i < NQ; i++) {
                        if (i >= NQ_MAX) break;
                        for (uint ch = 0u; ch < CPI; ch++) {
                            const uint o = i * D_V + unit * CPI + ch;
                            const float a = acc[(u * NQ + i) * CPI + ch];
                            qo[o] = s2 == 0u ? a : qo[o] + a;
                        }
                    }
                }
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
    }

    // The softmax factor f = e^(m - M) / (l e^(m - M) + e^(σ - M)), M = max(m, σ), of vector i (0 when l == 0).
    float final_factor(uint head, float m, float l) const {
        float f = 0.0f;
        if (l > 0.0f) {
            const bool has_sink = pc.sink_w != NONE;
            const float sigma = has_sink ? in_f(in, pc.sink_w + head) : NEG;
            const float M = max(m, sigma);
            const float w = exp(m - M);
            f = w / (l * w + (has_sink ? exp(sigma - M) : 0.0f));
        }
        return f;
    }

    // ---- finalize into down: out = o / (l + e^(σ - m)), zeros when nothing was visible ----
    void finalize(thread const attend_item &it, uint lid) {
        for (uint x = lid; x < it.nq * D_V; x += WG) {
            const uint i = x / D_V, c = x % D_V, head = it.head0 + i % it.nheads;
            const float f = final_factor(head, st_m[i], st_l[i]);
            down[((it.qrow0 + i / it.nheads) * pc.n_heads_q + head) * D_V + c] = as_type<uint>(qo[x] * f);
        }
        if (MASS != 0u) // prob_t = e^(s_t - m) f
            for (uint i = lid; i < it.nq; i += WG) {
                const uint head = it.head0 + i % it.nheads;
                const uint w = pc.stats_w + 2u * ((it.qrow0 + i / it.nheads) * pc.n_heads_q + head);
                scratch[w] = as_type<uint>(st_m[i]);
                scratch[w + 1u] = as_type<uint>(final_factor(head, st_m[i], st_l[i]));
            }
    }

    // ---- or write the partial (m, l, o[D_V]) for reduce.metal (which reads no o of a chunk with l == 0) ----
    void write_partial(thread const attend_item &it, uint lid, bool saw) {
        const uint base = pc.part_w + it.part;
        for (uint x = lid; saw && x < it.nq * D_V; x += WG) {
            const uint i = x / D_V, c = x % D_V;
            scratch[base + i * (D_V + 2u) + 2u + c] = as_type<uint>(qo[x]);
        }
        for (uint i = lid; i < it.nq; i += WG) {
            scratch[base + i * (D_V + 2u)] = as_type<uint>(st_m[i]);
            scratch[base + i * (D_V + 2u) + 1u] = as_type<uint>(st_l[i]);
        }
    }
};

// The engine's constants and views for one kernel: the pool (or, kv_in_scratch, the f32 copy at the start of
// scratch), the push constants, the inputs; threadgroup memory carved as attend_layout_of, or (queries_only:
// mass_keys) just the queries and their group sums.
template <uint NQ, uint CPI, uint UPI>
static inline void attend_setup(thread attend_engine<NQ, CPI, UPI> &e, device uint *pages, device uint *rings,
                                device uint *up, device uint *scratch, device uint *down, constant uint *push_words,
                                constant uint *spec, threadgroup uint *tg, bool kv_in_scratch, bool queries_only) {
    e.kv = kv_pool_of(kv_in_scratch ? scratch : pages, rings, spec);
    e.pc = *(constant attend_push *)push_words;
    e.in = inputs_of(up, scratch, spec, e.pc.in_base);
    e.scratch = scratch;
    e.down = down;
    e.WG = e.kv.WG_SIZE;
    e.NQ_MAX = spec[GPU_SPEC_OP0];
    e.NSG = spec[GPU_SPEC_OP2];
    e.MASS = spec[GPU_SPEC_OP4];
    e.D_K = e.kv.D_K;
    e.D_V = e.kv.D_V;
    e.GQ = e.kv.GROUP > 0u ? e.kv.GROUP : 1u; // GROUP, safe to divide by in f32/f16 pipelines
    e.NU = e.D_V / CPI;
    e.TS = e.NU >= e.WG ? 1u : e.WG / e.NU;
    e.q4_groups = e.kv.FORMAT == FMT_Q4 ? e.D_K / e.GQ : 0u;
    const attend_layout a = attend_layout_of(e.NQ_MAX, e.WG, e.NSG, e.D_K, queries_only ? 0u : e.D_V, e.q4_groups);
    threadgroup float *tf = (threadgroup float *)tg;
    e.qo = tf + a.qo;
    if (queries_only) {
        e.qsum = tf + e.NQ_MAX * e.D_K;
        return;
    }
    e.pw = tf + a.pw;
    e.red_m = tf + a.red_m;
    e.red_l = tf + a.red_l;
    e.st_m = tf + a.st_m;
    e.st_l = tf + a.st_l;
    e.st_c = tf + a.st_c;
    e.tok_page = (threadgroup int *)(tg + a.tok_page);
    e.tok_slot = tg + a.tok_slot;
    e.live_sg = tg + a.live_sg;
    e.qsum = tf + a.qsum;
}

// The attention of one work item (attend, baseline_attend).
template <uint NQ, uint CPI, uint UPI>
static inline void attend_main(device uint *pages, device uint *rings, device uint *up, device uint *scratch,
                               device uint *down, constant uint *push_words, constant uint *spec,
                               threadgroup uint *tg, uint item, uint lid, uint sg, uint n_sg, uint lane,
                               bool kv_in_scratch) {
    attend_engine<NQ, CPI, UPI> e;
    attend_setup(e, pages, rings, up, scratch, down, push_words, spec, tg, kv_in_scratch, false);
    if (item >= e.pc.n_items) return;
    const attend_item it = e.load_item(item);
    e.init_item(it, lid);
    // this thread's share of phase C
    const uint slice = e.NU >= e.WG ? 0u : lid / e.NU;
    const uint unit0 = e.NU >= e.WG ? lid : lid % e.NU;
    const bool c_active = slice < e.TS;
    const bool elect = lane == 0u;
    const bool masked = it.mask_w != NONE;
    if (masked) { // whether any of the item's tokens is in its kv head's mask: each thread a share of the words
        const uint live_here = simd_max(e.item_any(it, 0u, it.n_vis, lid, e.WG) ? 1u : 0u);
        if (elect) e.live_sg[sg] = live_here;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    uint n_blocks = (it.n_vis + e.WG - 1u) / e.WG;
    if (masked && !(e.MASS != 0u && it.score_w != NONE)) {
        uint live = 0u;
        for (uint g = 0u; g < n_sg; g++) live |= e.live_sg[g];
        if (live == 0u) n_blocks = 0u;
    }
    uint done = 0u; // blocks walked; the tok_* buffers alternate by it
    for (uint blk = 0u; blk < n_blocks; blk++) {
        if (masked && !e.item_any(it, blk * e.WG, min(blk * e.WG + e.WG, it.n_vis), 0u, 1u)) {
            if (e.MASS != 0u) e.mass_skip(it, blk, lid);
            continue; // uniform: every thread read the same words
        }
        const uint tb = (done & 1u) * e.WG; // tok_* buffer of this block
        e.phase_a(it, blk, lid, tb, elect, sg);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        e.phase_b_max(done, lid, n_sg);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        e.phase_b_weights(lid, elect, sg);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (c_active) e.phase_c(it.kvh, it.rs, tb, slice, unit0);
        done++;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    e.sum_slices(done, lid, slice, unit0, c_active, n_sg);
    if (it.part == NONE)
        e.finalize(it, lid);
    else
        e.write_partial(it, lid, done > 0u);
}

#endif
