// attend_common.hpp: fused decode / prefill attention straight from the compressed pages (docs/architecture.md
// §5), the body of attend.hpp (reads the pool), baseline_attend.hpp (reads the f32 copy that baseline_dequant.hpp
// wrote at the start of scratch) and, for its key decoding, mass_keys.hpp. A port of
// native/metal/kernels/attend.h (itself the port of native/vulkan/shaders/attend_common.glsl): the same work
// items, inputs, phases, local memory arrays and results; the host's plan (native/gpu/gpu_attend.c) cannot tell
// the modules apart.
//
// One work-group runs one work item of the plan: one kv head of one sequence, nq = nrows x nheads query
// vectors (query rows [qrow0, qrow0 + nrows), heads [head0, head0 + nheads) of the kv head's group), and the
// visible tokens [a0, a1) then [b0, b1) (a chunk of the sink range + window range). It walks those tokens in
// blocks of WG_SIZE, with the online softmax state (m, l) of every query vector in local memory and the output
// accumulators in registers:
//   A  token-parallel: thread k takes token k of the block, works out which query vectors see it (causal,
//      window / sink tokens, released page, validity mask), decodes its key once and scores it against every
//      query vector (queries, pre-scaled by α, in local memory); a sub-group maximum (reduce_over_group) and
//      local memory give each vector's block maximum.
//   B  one thread per vector: m_new = max(m, block max), corr = e^(m - m_new), l *= corr; then token-parallel
//      again: p = e^(s - m_new) into local memory, a sub-group sum for the block's sum (folded into l at the
//      next block).
//   C  channel-parallel: each thread owns CPI consecutive value channels (a "unit") of UPI units and a token
//      slice (with fewer units than threads, TS slices of the block run side by side); it rescales its
//      accumulators by corr and adds p · v for every query vector, decoding each value element once.
// At the end the slices are summed through local memory and the item either finalizes into `down`
// (out = o / (l + e^(σ - m)), zeros when nothing was visible) or writes its partial (m, l, o[D_V]) to scratch
// for reduce.hpp. Nothing dequantized is ever stored. MASS (spec OP4), validity masks (per sequence or per kv
// head, with block and item skipping), Quest's masks (among the staged inputs), KIVI rings, MLA
// (v_is_k_prefix), learned sinks, sink tokens and windows: all as attend_common.glsl describes them.
//
// Templates and spec words. Only what sizes a register array is a template parameter: NQ >= the plan's NQ_MAX
// (spec OP0, rounded up to a power of two) for the scores, CPI (spec OP1) for a value unit, UPI >= the units
// per thread (ceil(D_V / CPI / WG_SIZE), rounded up to a power of two) for the accumulators
// [UPI][NQ][CPI]. Everything else, the format included, is a runtime word of the spec, read once into
// kv_pool / attend_engine; a branch on it is uniform across the grid. Loops over the register arrays run to the
// template bound and stop at the runtime one, so a compiler unrolls them and keeps the arrays in registers,
// and local memory is laid out for the spec's NQ_MAX, not the template's (tg_words in
// native/gpu/gpu_variants.c, which must agree with attend_layout below).
//
// q4 keys: the pre-divided query of Open-TQ-Metal. A packed word holds 8 codes, code e at bits 4e; for each
// 16-bit half h, (h & 0x000F, h & 0x00F0, h & 0x0F00, h & 0xF000) are the codes times 16^e, so a query stored
// pre-divided, q_pre[c] = α q[c] / 16^(c % 4) (exact: powers of two), gives Σ q_pre (h & mask) = Σ α q · code
// with no shift per code, and each group adds s · Σ q·code + b · Σ_{c∈g} α q_c (the per-group sums of the
// query, computed once per item into qsum), the identity of docs/architecture.md §5. Against the Vulkan
// shader's per-element q·(code·s + b) this only regroups the rounding of the score (a few ulp of the group's
// terms; the conformance suite's 1e-4 of the output's scale is orders of magnitude wider). q8 keys, values,
// KIVI and the ring keep the plain per-element decode, code·s + b, which rounds the same contracted or not
// (common.hpp's dequant says why).
//
// Sub-groups: reductions go through reduce_over_group inside each sub-group and local memory across the
// work-group's n_sg sub-groups (NSG_MAX = spec OP2 entries reserved, the plan's bound for the smallest
// sub-group size the device supports). The sub-group size is never assumed; every group algorithm and barrier
// sits in control flow uniform over its group (loops over the register arrays stop at NQ_MAX, a spec word).
#ifndef GOKV_SYCL_ATTEND_COMMON_HPP
#define GOKV_SYCL_ATTEND_COMMON_HPP

#include "common.hpp"

namespace gokv_sycl {

struct attend_push {
    GOKV_PUSH_ATTEND(PUSH_FIELD)
};

constexpr uint32_t NONE = 0xffffffffu;
constexpr float NEG = -3.0e38f;                  // score of an invisible token, m of a vector that saw nothing
constexpr int NO_TOKEN = -1, RING_TOKEN = -2;    // tok_page of a token nobody sees / of a KIVI ring token
constexpr uint32_t ITEM_WORDS = 12u, SEQ_WORDS = 11u; // item and sequence tables (gpu_attend.c)
constexpr uint32_t MASS_ITEM_WORDS = 3u;             // mass and mass_keys items

// fp16 -> f32 for the finite halves pools hold (values, scales and biases are validated finite on write):
// equal to common.hpp's half_to_float there, in fewer operations.
inline float half_finite(uint32_t h) {
    uint32_t a = h & 0x7fffu;
    float f = a < 0x400u ? float(a) * 5.9604644775390625e-8f : sycl::bit_cast<float>((a << 13) + 0x38000000u);
    return (h & 0x8000u) != 0u ? -f : f;
}

// Whether a query at position p sees token t (given t is stored, valid and its page not released).
inline bool sees(int window, int n_sink_tokens, uint32_t p, uint32_t t) {
    return t <= p && (window == 0 || p - t < uint32_t(window) || t < uint32_t(n_sink_tokens));
}

// One work item of the plan (ITEM_WORDS words in the item table, SEQ_WORDS per sequence), and what follows.
struct attend_item {
    uint32_t kvh, qrow0, nrows, head0, nheads, pos0; // kv head, query rows and heads, position of row qrow0
    uint32_t a0, a1, b0, b1;                         // visible tokens [a0, a1) then [b0, b1)
    uint32_t part;                                   // its split-K partial's offset, or NONE: finalize
    uint32_t n_quant, page_w, mask_w, rs;            // the sequence: tokens in pages, page table, mask, ring slot
    uint32_t nq, len_a, n_vis;                       // query vectors, tokens of [a0, a1), visible tokens
    uint32_t kv_len, mass_row0, score_w;             // MASS: the sequence's length, first counted row, scores
};

// Local memory of attend (words), for the spec's NQ_MAX (not the template's): what
// native/gpu/gpu_variants.c reserves. Offsets in the order the arrays are carved.
struct attend_layout {
    uint32_t qo, pw, red_m, red_l, st_m, st_l, st_c, tok_page, tok_slot, live_sg, qsum, words;
};
inline attend_layout attend_layout_of(uint32_t nq_max, uint32_t wg, uint32_t nsg, uint32_t d_k, uint32_t d_v,
                                      uint32_t q4_groups) {
    attend_layout a;
    const uint32_t dmax = d_k > d_v ? d_k : d_v;
    a.qo = 0u;                               // queries (scaled), then the item's output o[i][c]
    a.pw = a.qo + nq_max * dmax;             // softmax weights p[i][k] of the block
    a.red_m = a.pw + nq_max * wg;            // per sub-group block maxima
    a.red_l = a.red_m + nq_max * nsg;        // per sub-group block sums of p
    a.st_m = a.red_l + nq_max * nsg;         // running max, running sum, rescale factor
    a.st_l = a.st_m + nq_max;
    a.st_c = a.st_l + nq_max;
    a.tok_page = a.st_c + nq_max;            // by block parity: page of token k, RING_TOKEN or NO_TOKEN
    a.tok_slot = a.tok_page + 2u * wg;       // slot in the page (ring tokens: the position)
    a.live_sg = a.tok_slot + 2u * wg;        // per sub-group: whether its share of the item's mask words has a bit
    a.qsum = a.live_sg + nsg;                // q4 keys: Σ of each query vector's channels per group
    a.words = a.qsum + nq_max * q4_groups;
    return a;
}

template <uint32_t NQ, uint32_t CPI, uint32_t UPI> struct attend_engine {
    kv_pool kv;         // pages: the pool, or (baseline_attend) the f32 copy in scratch
    attend_push pc;
    uint32_t *in;    // the inputs (attend_inputs.glsl)
    uint32_t *scratch;
    uint32_t *down;
    uint32_t WG, NSG, NQ_MAX, D_K, D_V, GQ, NU, TS, MASS;
    uint32_t q4_groups;     // q4 keys (pre-divided query): groups per key row; 0 otherwise
    float *qo, *pw, *red_m, *red_l, *st_m, *st_l, *st_c, *qsum;
    int32_t *tok_page;
    uint32_t *tok_slot, *live_sg;
    float score[NQ];             // scores of this thread's token
    float acc[UPI * NQ * CPI];   // output accumulators: [unit][vector][channel]
    float xv[CPI];               // one decoded value unit

    float kv_half(uint32_t i) const { return half_finite((kv.pages[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu); }
    float ring_half_finite(uint32_t i) const { return half_finite((kv.rings[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu); }
    bool sees_pos(uint32_t p, uint32_t t) const { return sees(pc.window, pc.n_sink_tokens, p, t); }

    // ---- phase A: keys ----

    void dot1(uint32_t c, float x) {
        for (uint32_t i = 0u; i < NQ; i++) {
            if (i >= NQ_MAX) break;
            score[i] += qo[i * D_K + c] * x;
        }
    }

    // q4: the four codes of the 16-bit half h, channels c .. c + 3, against the pre-divided query.
    void nibbles(float *g, uint32_t c, uint32_t h) {
        const float f0 = float(h & 0x000Fu), f1 = float(h & 0x00F0u), f2 = float(h & 0x0F00u), f3 = float(h & 0xF000u);
        for (uint32_t i = 0u; i < NQ; i++) {
            if (i >= NQ_MAX) break;
            const float *q = qo + i * D_K + c;
            g[i] += q[0] * f0 + q[1] * f1 + q[2] * f2 + q[3] * f3;
        }
    }

    // Per-token key row whose word 0 is kv.pages[w0] (key_word; its words are K_WORD_STEP apart); sh0 / bh0:
    // half index of its group-0 scale / bias.
    void score_key_row(uint32_t w0, uint32_t sh0, uint32_t bh0) {
        const uint32_t step = kv.K_WORD_STEP;
        if (kv.FORMAT == FMT_F32) {
            for (uint32_t c = 0u; c < D_K; c++) dot1(c, sycl::bit_cast<float>(kv.pages[w0 + c]));
        } else if (kv.FORMAT == FMT_F16) {
            for (uint32_t c2 = 0u; c2 < D_K / 2u; c2++) {
                const uint32_t u = kv.pages[w0 + c2];
                dot1(2u * c2, half_finite(u & 0xffffu));
                dot1(2u * c2 + 1u, half_finite(u >> 16));
            }
        } else if (q4_groups != 0u) { // q4, pre-divided query: s · Σ q·code + b · Σ q per group
            const uint32_t wpg = GQ / 8u; // words per group
            for (uint32_t j = 0u; j < q4_groups; j++) {
                const float sc = kv_half(sh0 + j), bi = kv_half(bh0 + j);
                float g[NQ];
                for (uint32_t i = 0u; i < NQ; i++) g[i] = 0.0f;
                for (uint32_t k = 0u; k < wpg; k++) {
                    const uint32_t u = kv.pages[w0 + (j * wpg + k) * step];
                    const uint32_t c = j * GQ + 8u * k;
                    nibbles(g, c, u & 0xffffu);
                    nibbles(g, c + 4u, u >> 16);
                }
                for (uint32_t i = 0u; i < NQ; i++) {
                    if (i >= NQ_MAX) break;
                    score[i] += sc * g[i] + bi * qsum[i * q4_groups + j];
                }
            }
        } else { // q8: x = code·s + b per element (the Vulkan shader's decode, also right for any BITS)
            const uint32_t bits = kv.BITS, mask = kv.CODE_MASK, epw = 32u / bits, wpg = GQ / epw;
            for (uint32_t j = 0u; j < D_K / GQ; j++) {
                const float sc = kv_half(sh0 + j), bi = kv_half(bh0 + j);
                for (uint32_t k = 0u; k < wpg; k++) {
                    const uint32_t u = kv.pages[w0 + (j * wpg + k) * step];
                    for (uint32_t e = 0u; e < epw; e++)
                        dot1(j * GQ + k * epw + e, float((u >> (e * bits)) & mask) * sc + bi);
                }
            }
        }
    }

    // KIVI key of the token at (page, slot): per channel codes packed along the g tokens of its group.
    void score_kivi_key(uint32_t page, uint32_t head, uint32_t slot) {
        const uint32_t bits = kv.BITS, wpc = GQ * bits / 32u; // words of one channel in a token group
        const uint32_t jg = slot / GQ, tg = slot % GQ;
        const uint32_t w0 =
            page * kv.PAGE_WORDS + kv.K_CODES_W + head * kv.K_CODES_HEAD_W + jg * kv.K_ROW_W + (tg * bits) / 32u;
        const uint32_t sh = (tg * bits) % 32u;
        const uint32_t hs = page * kv.PAGE_WORDS * 2u + head * kv.K_SB_HEAD_H + jg * D_K;
        for (uint32_t c = 0u; c < D_K; c++) {
            const uint32_t code = (kv.pages[w0 + c * wpc] >> sh) & kv.CODE_MASK;
            dot1(c, float(code) * kv_half(hs + kv.K_SCALE_H + c) + kv_half(hs + kv.K_BIAS_H + c));
        }
    }

    // KIVI residual ring key (fp16 row) of position t.
    void score_ring_key(uint32_t rs, uint32_t t, uint32_t head) {
        const uint32_t h0 = ring_k_half(kv, rs, t, head, 0u);
        for (uint32_t c = 0u; c < D_K; c++) dot1(c, ring_half_finite(h0 + c));
    }

    // Scores token t of the sequence (page id, or the ring) into score[] (from 0).
    void score_token(int id, uint32_t t, uint32_t n_quant, uint32_t rs, uint32_t kvh) {
        for (uint32_t i = 0u; i < NQ; i++) score[i] = 0.0f;
        if (kv.KIVI != 0u && t >= n_quant) {
            score_ring_key(rs, t, kvh);
        } else if (kv.KIVI != 0u) {
            score_kivi_key(uint32_t(id), kvh, t % kv.PAGE_SIZE);
        } else {
            const uint32_t sl = t % kv.PAGE_SIZE;
            score_key_row(key_word(kv, uint32_t(id), kvh, sl, 0u), row_scale_half(kv, uint32_t(id), kvh, sl, 0u, false),
                          row_bias_half(kv, uint32_t(id), kvh, sl, 0u, false));
        }
    }

    // ---- phase C: values ----

    // Decodes value channels [c0, c0 + CPI) of a token into xv.
    void load_value_unit(int pg, uint32_t slot, uint32_t head, uint32_t rs, uint32_t c0) {
        if (kv.KIVI != 0u && pg == RING_TOKEN) {
            const uint32_t h = ring_v_half(kv, rs, slot, head, c0);
            for (uint32_t ch = 0u; ch < CPI; ch++) xv[ch] = ring_half_finite(h + ch);
            return;
        }
        const uint32_t page = uint32_t(pg);
        if (kv.KIVI != 0u && kv.V_IS_K_PREFIX != 0u) { // MLA over KIVI: values are the per-channel keys' prefix
            for (uint32_t ch = 0u; ch < CPI; ch++) xv[ch] = kivi_key_elem(kv, page, head, slot, c0 + ch);
            return;
        }
        const bool is_v = kv.V_IS_K_PREFIX == 0u;
        const uint32_t w0 = row_word(kv, page, head, slot, is_v);
        if (kv.FORMAT == FMT_F32) {
            for (uint32_t ch = 0u; ch < CPI; ch++) xv[ch] = sycl::bit_cast<float>(kv.pages[w0 + c0 + ch]);
        } else if (kv.FORMAT == FMT_F16) {
            for (uint32_t ch = 0u; ch < CPI; ch++) xv[ch] = kv_half(2u * w0 + c0 + ch);
        } else {
            const uint32_t bits = kv.BITS, mask = kv.CODE_MASK, epw = 32u / bits;
            const uint32_t j = c0 / GQ;
            const float sc = kv_half(row_scale_half(kv, page, head, slot, j, is_v));
            const float bi = kv_half(row_bias_half(kv, page, head, slot, j, is_v));
            if (CPI >= epw) {
                for (uint32_t wi = 0u; wi < CPI / epw; wi++) {
                    const uint32_t word = kv.pages[w0 + c0 / epw + wi];
                    for (uint32_t e = 0u; e < epw; e++) xv[wi * epw + e] = float((word >> (e * bits)) & mask) * sc + bi;
                }
            } else {
                const uint32_t word = kv.pages[w0 + c0 / epw] >> ((c0 % epw) * bits);
                for (uint32_t e = 0u; e < CPI; e++) xv[e] = float((word >> (e * bits)) & mask) * sc + bi;
            }
        }
    }

    // ---- the work item ----

    attend_item load_item(uint32_t item) const {
        attend_item it;
        const uint32_t iw = pc.item_w + item * ITEM_WORDS;
        const uint32_t seq = in[iw];
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
        const uint32_t sw = pc.seq_w + seq * SEQ_WORDS;
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
    void load_queries(uint32_t lid, uint32_t first, uint32_t n_valid, uint32_t row0, uint32_t head0, uint32_t nheads) {
        for (uint32_t x = lid; x < NQ_MAX * D_K; x += WG) {
            const uint32_t i = x / D_K, c = x % D_K, v = first + i;
            float q = 0.0f;
            if (v < n_valid)
                q = sycl::bit_cast<float>(
                        in[pc.q_w + ((row0 + v / nheads) * pc.n_heads_q + head0 + v % nheads) * D_K + c]) *
                    pc.scale;
            if (q4_groups != 0u) // 1 / 16^(c % 4)
                q *= (c & 3u) == 0u ? 1.0f : (c & 3u) == 1u ? 0.0625f : (c & 3u) == 2u ? 0.00390625f : 0.000244140625f;
            qo[x] = q;
        }
        for (uint32_t x = lid; x < NQ_MAX * q4_groups; x += WG) {
            const uint32_t i = x / q4_groups, j = x % q4_groups, v = first + i;
            float s = 0.0f;
            if (v < n_valid) {
                const uint32_t w = pc.q_w + ((row0 + v / nheads) * pc.n_heads_q + head0 + v % nheads) * D_K + j * GQ;
                for (uint32_t c = 0u; c < GQ; c++) s += sycl::bit_cast<float>(in[w + c]) * pc.scale;
            }
            qsum[x] = s;
        }
    }

    // Queries, the softmax state, the accumulators.
    void init_item(const attend_item &it, uint32_t lid) {
        load_queries(lid, 0u, it.nq, it.qrow0, it.head0, it.nheads);
        for (uint32_t i = lid; i < NQ_MAX; i += WG) {
            st_m[i] = NEG;
            st_l[i] = 0.0f;
        }
        for (uint32_t x = 0u; x < UPI * NQ * CPI; x++) acc[x] = 0.0f;
    }

    // ---- masks: whether tokens [lo, hi) have a set bit in the mask at mask_w, looking at the words first,
    // first + step, ... of the range (every thread: 0, 1; one share each: lid, WG) ----
    bool mask_any(uint32_t mask_w, uint32_t lo, uint32_t hi, uint32_t first, uint32_t step) const {
        if (lo >= hi) return false;
        const uint32_t w0 = lo >> 5, w1 = (hi - 1u) >> 5;
        for (uint32_t w = w0 + first; w <= w1; w += step) {
            uint32_t bits = in[mask_w + w];
            if (w == w0) bits &= ~0u << (lo & 31u);
            if (w == w1 && (hi & 31u) != 0u) bits &= ~(~0u << (hi & 31u));
            if (bits != 0u) return true;
        }
        return false;
    }

    // The tokens of visible-range indices [v0, v1) of the item: [a0, a1) then [b0, b1) laid end to end.
    bool item_any(const attend_item &it, uint32_t v0, uint32_t v1, uint32_t first, uint32_t step) const {
        bool found = false;
        if (v0 < it.len_a) found = mask_any(it.mask_w, it.a0 + v0, it.a0 + sycl::min(v1, it.len_a), first, step);
        if (v1 > it.len_a)
            found = found ||
                    mask_any(it.mask_w, it.b0 + (sycl::max(v0, it.len_a) - it.len_a), it.b0 + (v1 - it.len_a), first,
                             step);
        return found;
    }

    // MASS: where row `row` stores its score of token t for head `head`.
    uint32_t score_word(const attend_item &it, uint32_t row, uint32_t head, uint32_t t) const {
        return it.score_w + ((row - it.mass_row0) * pc.n_heads_q + head) * it.kv_len + t;
    }

    // MASS: a skipped block's tokens still get their NEG scores (mass.hpp reads every token of the ranges).
    void mass_skip(const attend_item &it, uint32_t blk, uint32_t lid) {
        const uint32_t v = blk * WG + lid;
        if (v >= it.n_vis || it.score_w == NONE) return;
        const uint32_t t = v < it.len_a ? it.a0 + v : it.b0 + (v - it.len_a);
        for (uint32_t i = 0u; i < NQ; i++) {
            if (i >= NQ_MAX) break;
            const uint32_t row = it.qrow0 + i / it.nheads;
            if (i < it.nq && row >= it.mass_row0)
                scratch[score_word(it, row, it.head0 + i % it.nheads, t)] = sycl::bit_cast<uint32_t>(NEG);
        }
    }

    // ---- A: visibility and scores of token lid of block blk; its page and slot into tok_* (buffer tb), the
    // sub-group maxima into red_m ----
    void phase_a(const attend_item &it, uint32_t blk, uint32_t lid, uint32_t tb, const sycl::sub_group &sgr, bool elect,
                 uint32_t sg) {
        for (uint32_t i = 0u; i < NQ; i++) score[i] = NEG;
        int pg = NO_TOKEN;
        uint32_t slot = 0u;
        const uint32_t v = blk * WG + lid;
        if (v < it.n_vis) {
            const uint32_t t = v < it.len_a ? it.a0 + v : it.b0 + (v - it.len_a);
            const int id = int(in[it.page_w + t / kv.PAGE_SIZE]);
            bool ok = id >= 0;
            if (ok && it.mask_w != NONE) ok = ((in[it.mask_w + (t >> 5)] >> (t & 31u)) & 1u) != 0u;
            // some row sees t iff the first row at or after t does (the window only moves away from t)
            const uint32_t p_first = sycl::max(t, it.pos0);
            const bool any_vis = ok && p_first < it.pos0 + it.nrows && sees_pos(p_first, t);
            if (any_vis) {
                const bool ring = kv.KIVI != 0u && t >= it.n_quant;
                score_token(id, t, it.n_quant, it.rs, it.kvh);
                for (uint32_t i = 0u; i < NQ; i++)
                    if (i >= it.nq || !sees_pos(it.pos0 + i / it.nheads, t)) score[i] = NEG;
                pg = ring ? RING_TOKEN : id;
                slot = ring ? t : t % kv.PAGE_SIZE;
            }
            if (MASS != 0u && it.score_w != NONE) // every token of the ranges, NEG where the row does not see it
                for (uint32_t i = 0u; i < NQ; i++) {
                    if (i >= NQ_MAX) break;
                    const uint32_t row = it.qrow0 + i / it.nheads;
                    if (i < it.nq && row >= it.mass_row0)
                        scratch[score_word(it, row, it.head0 + i % it.nheads, t)] = sycl::bit_cast<uint32_t>(score[i]);
                }
        }
        tok_page[tb + lid] = pg;
        tok_slot[tb + lid] = slot;
        for (uint32_t i = 0u; i < NQ; i++) {
            if (i >= NQ_MAX) break;
            const float mx = sycl::reduce_over_group(sgr, score[i], sycl::maximum<float>());
            if (elect) red_m[i * NSG + sg] = mx;
        }
    }

    // ---- B, first half: new running maxima; fold the previous walked block's sum into l (done: blocks walked) ----
    void phase_b_max(uint32_t done, uint32_t lid, uint32_t n_sg) {
        for (uint32_t i = lid; i < NQ_MAX; i += WG) {
            float mb = NEG, l = st_l[i];
            for (uint32_t g = 0u; g < n_sg; g++) {
                mb = sycl::fmax(mb, red_m[i * NSG + g]);
                if (done > 0u) l += red_l[i * NSG + g];
            }
            const float mo = st_m[i], mn = sycl::fmax(mo, mb);
            const float corr = mo == NEG ? 0.0f : sycl::exp(mo - mn);
            st_m[i] = mn;
            st_l[i] = l * corr;
            st_c[i] = corr;
        }
    }

    // ---- B, second half: p = e^(s - m_new) of token lid into pw, the sub-group sums into red_l ----
    void phase_b_weights(uint32_t lid, const sycl::sub_group &sgr, bool elect, uint32_t sg) {
        for (uint32_t i = 0u; i < NQ; i++) {
            if (i >= NQ_MAX) break;
            const float p = score[i] == NEG ? 0.0f : sycl::exp(score[i] - st_m[i]);
            pw[i * WG + lid] = p;
            const float sum = sycl::reduce_over_group(sgr, p, sycl::plus<float>());
            if (elect) red_l[i * NSG + sg] = sum;
        }
    }

    // ---- C: rescale and accumulate p · v over this thread's units (from unit0) and token slice ----
    void phase_c(uint32_t kvh, uint32_t rs, uint32_t tb, uint32_t slice, uint32_t unit0) {
        for (uint32_t u = 0u; u < UPI; u++)
            for (uint32_t i = 0u; i < NQ; i++) {
                if (i >= NQ_MAX) break;
                const float corr = st_c[i];
                for (uint32_t ch = 0u; ch < CPI; ch++) acc[(u * NQ + i) * CPI + ch] *= corr;
            }
        for (uint32_t k = slice; k < WG; k += TS) {
            const int tp = tok_page[tb + k];
            if (tp == NO_TOKEN) continue;
            const uint32_t ts = tok_slot[tb + k];
            for (uint32_t u = 0u; u < UPI; u++) {
                const uint32_t unit = unit0 + u * WG;
                if (unit >= NU) break;
                load_value_unit(tp, ts, kvh, rs, unit * CPI);
                for (uint32_t i = 0u; i < NQ; i++) {
                    if (i >= NQ_MAX) break;
                    const float p = pw[i * WG + k];
                    for (uint32_t ch = 0u; ch < CPI; ch++) acc[(u * NQ + i) * CPI + ch] += p * xv[ch];
                }
            }
        }
    }

    // ---- the end: the last walked block's sum; the slices summed into qo (now free) as o[i][c] ----
    void sum_slices(const sycl::group<3> &grp, uint32_t done, uint32_t lid, uint32_t slice, uint32_t unit0,
                    bool c_active, uint32_t n_sg) {
        if (done > 0u)
            for (uint32_t i = lid; i < NQ_MAX; i += WG)
                for (uint32_t g = 0u; g < n_sg; g++) st_l[i] += red_l[i * NSG + g];
        for (uint32_t s2 = 0u; s2 < TS; s2++) {
            if (c_active && slice == s2)
                for (uint32_t u = 0u; u < UPI; u++) {
                    const uint32_t unit = unit0 + u * WG;
                    if (unit >= NU) break;
                    for (uint32_t i = 0u; i < NQ; i++) {
                        if (i >= NQ_MAX) break;
                        for (uint32_t ch = 0u; ch < CPI; ch++) {
                            const uint32_t o = i * D_V + unit * CPI + ch;
                            const float a = acc[(u * NQ + i) * CPI + ch];
                            qo[o] = s2 == 0u ? a : qo[o] + a;
                        }
                    }
                }
            sycl::group_barrier(grp);
        }
    }

    // The softmax factor f = e^(m - M) / (l e^(m - M) + e^(σ - M)), M = max(m, σ), of vector i (0 when l == 0).
    float final_factor(uint32_t head, float m, float l) const {
        float f = 0.0f;
        if (l > 0.0f) {
            const bool has_sink = pc.sink_w != NONE;
            const float sigma = has_sink ? in_f(in, pc.sink_w + head) : NEG;
            const float M = sycl::fmax(m, sigma);
            const float w = sycl::exp(m - M);
            f = w / (l * w + (has_sink ? sycl::exp(sigma - M) : 0.0f));
        }
        return f;
    }

    // ---- finalize into down: out = o / (l + e^(σ - m)), zeros when nothing was visible ----
    void finalize(const attend_item &it, uint32_t lid) {
        for (uint32_t x = lid; x < it.nq * D_V; x += WG) {
            const uint32_t i = x / D_V, c = x % D_V, head = it.head0 + i % it.nheads;
            const float f = final_factor(head, st_m[i], st_l[i]);
            down[((it.qrow0 + i / it.nheads) * pc.n_heads_q + head) * D_V + c] = sycl::bit_cast<uint32_t>(qo[x] * f);
        }
        if (MASS != 0u) // prob_t = e^(s_t - m) f
            for (uint32_t i = lid; i < it.nq; i += WG) {
                const uint32_t head = it.head0 + i % it.nheads;
                const uint32_t w = pc.stats_w + 2u * ((it.qrow0 + i / it.nheads) * pc.n_heads_q + head);
                scratch[w] = sycl::bit_cast<uint32_t>(st_m[i]);
                scratch[w + 1u] = sycl::bit_cast<uint32_t>(final_factor(head, st_m[i], st_l[i]));
            }
    }

    // ---- or write the partial (m, l, o[D_V]) for reduce.hpp (which reads no o of a chunk with l == 0) ----
    void write_partial(const attend_item &it, uint32_t lid, bool saw) {
        const uint32_t base = pc.part_w + it.part;
        for (uint32_t x = lid; saw && x < it.nq * D_V; x += WG) {
            const uint32_t i = x / D_V, c = x % D_V;
            scratch[base + i * (D_V + 2u) + 2u + c] = sycl::bit_cast<uint32_t>(qo[x]);
        }
        for (uint32_t i = lid; i < it.nq; i += WG) {
            scratch[base + i * (D_V + 2u)] = sycl::bit_cast<uint32_t>(st_m[i]);
            scratch[base + i * (D_V + 2u) + 1u] = sycl::bit_cast<uint32_t>(st_l[i]);
        }
    }
};

// The engine's constants and views for one kernel: the pool (or, kv_in_scratch, the f32 copy at the start of
// scratch), the push constants, the inputs; local memory carved as attend_layout_of, or (queries_only:
// mass_keys) just the queries and their group sums.
template <uint32_t NQ, uint32_t CPI, uint32_t UPI>
inline void attend_setup(attend_engine<NQ, CPI, UPI> &e, const args &a, uint32_t *tg, bool kv_in_scratch,
                         bool queries_only) {
    uint32_t *const scratch = a.scratch;
    const uint32_t *const spec = a.spec;
    e.kv = kv_pool_of(kv_in_scratch ? scratch : a.pages, a.rings, spec);
    e.pc = push_of<attend_push>(a);
    e.in = inputs_of(a.up, scratch, spec, e.pc.in_base);
    e.scratch = scratch;
    e.down = a.down;
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
    const attend_layout l = attend_layout_of(e.NQ_MAX, e.WG, e.NSG, e.D_K, queries_only ? 0u : e.D_V, e.q4_groups);
    float *tf = reinterpret_cast<float *>(tg);
    e.qo = tf + l.qo;
    if (queries_only) {
        e.qsum = tf + e.NQ_MAX * e.D_K;
        return;
    }
    e.pw = tf + l.pw;
    e.red_m = tf + l.red_m;
    e.red_l = tf + l.red_l;
    e.st_m = tf + l.st_m;
    e.st_l = tf + l.st_l;
    e.st_c = tf + l.st_c;
    e.tok_page = reinterpret_cast<int32_t *>(tg + l.tok_page);
    e.tok_slot = tg + l.tok_slot;
    e.live_sg = tg + l.live_sg;
    e.qsum = tf + l.qsum;
}

// The attention of one work item (attend, baseline_attend): the plan's workgroup (x, y) is the item.
template <uint32_t NQ, uint32_t CPI, uint32_t UPI>
inline void attend_main(const args &a, uint32_t *tg, const sycl::nd_item<3> &ndi, bool kv_in_scratch) {
    const sycl::group<3> grp = ndi.get_group();
    const sycl::sub_group sgr = ndi.get_sub_group();
    const uint32_t item = plan_workgroup(ndi), lid = uint32_t(ndi.get_local_linear_id());
    const uint32_t sg = uint32_t(sgr.get_group_linear_id()), n_sg = uint32_t(sgr.get_group_linear_range());
    const uint32_t lane = uint32_t(sgr.get_local_linear_id());
    attend_engine<NQ, CPI, UPI> e;
    attend_setup(e, a, tg, kv_in_scratch, false);
    if (item >= e.pc.n_items) return;
    const attend_item it = e.load_item(item);
    e.init_item(it, lid);
    // this thread's share of phase C
    const uint32_t slice = e.NU >= e.WG ? 0u : lid / e.NU;
    const uint32_t unit0 = e.NU >= e.WG ? lid : lid % e.NU;
    const bool c_active = slice < e.TS;
    const bool elect = lane == 0u;
    const bool masked = it.mask_w != NONE;
    if (masked) { // whether any of the item's tokens is in its kv head's mask: each thread a share of the words
        const uint32_t any_here = e.item_any(it, 0u, it.n_vis, lid, e.WG) ? 1u : 0u;
        const uint32_t live_here = sycl::reduce_over_group(sgr, any_here, sycl::maximum<uint32_t>());
        if (elect) e.live_sg[sg] = live_here;
    }
    sycl::group_barrier(grp);

    uint32_t n_blocks = (it.n_vis + e.WG - 1u) / e.WG;
    if (masked && !(e.MASS != 0u && it.score_w != NONE)) {
        uint32_t live = 0u;
        for (uint32_t g = 0u; g < n_sg; g++) live |= e.live_sg[g];
        if (live == 0u) n_blocks = 0u;
    }
    uint32_t done = 0u; // blocks walked; the tok_* buffers alternate by it
    for (uint32_t blk = 0u; blk < n_blocks; blk++) {
        if (masked && !e.item_any(it, blk * e.WG, sycl::min(blk * e.WG + e.WG, it.n_vis), 0u, 1u)) {
            if (e.MASS != 0u) e.mass_skip(it, blk, lid);
            continue; // uniform: every thread read the same words
        }
        const uint32_t tb = (done & 1u) * e.WG; // tok_* buffer of this block
        e.phase_a(it, blk, lid, tb, sgr, elect, sg);
        sycl::group_barrier(grp);
        e.phase_b_max(done, lid, n_sg);
        sycl::group_barrier(grp);
        e.phase_b_weights(lid, sgr, elect, sg);
        sycl::group_barrier(grp);
        if (c_active) e.phase_c(it.kvh, it.rs, tb, slice, unit0);
        done++;
    }
    sycl::group_barrier(grp);

    e.sum_slices(grp, done, lid, slice, unit0, c_active, n_sg);
    if (it.part == NONE)
        e.finalize(it, lid);
    else
        e.write_partial(it, lid, done > 0u);
}

} // namespace gokv_sycl

#endif
