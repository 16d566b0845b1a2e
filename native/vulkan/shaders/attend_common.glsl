// attend_common.glsl: fused decode / prefill attention straight from the compressed pages
// (docs/architecture.md §5), the body of attend.comp (reads the pool) and baseline_attend.comp (reads the f32
// copy the baseline materialized in the scratch buffer: define ATTEND_KV_IN_SCRATCH before including this
// file).
//
// One workgroup runs one work item of the host's plan (native/gpu/gpu_attend.c): one kv head of one sequence, nq =
// nrows x nheads query vectors (query rows [qrow0, qrow0 + nrows), heads [head0, head0 + nheads) of the
// kv head's group), and the visible tokens [a0, a1) then [b0, b1) (a chunk of the sink range + window
// range). It walks those tokens in blocks of WG_SIZE, with the online softmax state (m, l) of every query
// vector in shared memory and the output accumulators in registers:
//   A  token-parallel: invocation k takes token k of the block, works out which query vectors see it
//      (causal, window / sink tokens, released page, validity mask), decodes its key once, and scores it
//      against every query vector (queries, pre-scaled by α, in shared memory); subgroupMax + shared
//      memory give each vector's block maximum.
//   B  one invocation per vector: m_new = max(m, block max), corr = e^(m - m_new), l *= corr; then
//      token-parallel again: p = e^(s - m_new) into shared memory, subgroupAdd for the sum (folded into l
//      at the next block).
//   C  channel-parallel: each invocation owns CPI consecutive value channels (a "unit") of UPI units and
//      a token slice (when there are fewer units than invocations, TS slices of the block run side by
//      side); it rescales its accumulators by corr and adds p · v for every query vector, decoding each
//      value element once (consecutive invocations read consecutive words of a value row).
// At the end the slices are summed through shared memory and the item either finalizes into `down`
// (out = o / (l + e^(σ - m)), zeros when nothing was visible) or writes its partial (m, l, o[D_V]) to
// `scratch` for reduce.comp. Nothing dequantized is ever stored: keys and values are decoded in registers.
//
// Attention mass (MASS, GPU_SPEC_OP4; a separate pipeline, so the plain one is unchanged): phase A also
// stores the scores s = α q·k of the counted query rows (the sequence's rows from mass_row0 on) for every
// token of the item's ranges, NEG where the row does not see the token, at scratch word
// score_w + ((row - mass_row0) * n_heads_q + head) * kv_len + t; finalize stores each row's softmax factors
// (a, b), prob_t = e^(s_t - a) b, at stats_w + 2 (row * n_heads_q + head) (reduce_mass.comp for split
// rows), and mass.comp sums the probabilities per kv head and token. A sequence with many counted rows
// (score_w NONE) keeps no scores: mass_keys.comp computes them again.
//
// Validity masks are per sequence, or per kv head (the host sets the sequence's mask_head_w to the words
// of one kv head's mask): kv head h reads its mask at mask_w + h * mask_head_w. What a mask hides is never
// read, and costs little: an item whose ranges hold no set bit of its kv head's mask skips its blocks (one
// barrier to agree), and a block with no set bit is skipped whole, decided uniformly from the block's few
// mask words before phase A (MASS still stores its NEG scores). Skipping changes no result: a block that
// sees nothing leaves m, l and o as they were. That is what makes Quest's and H2O's / SnapKV's masks cheap.
//
// Loops over the register arrays (score, acc, xv: trip counts are specialization constants) are marked
// [[unroll]] so that the arrays stay in registers.
//
// The subgroup size is never assumed: reductions go through subgroup operations inside each subgroup and
// shared memory across gl_NumSubgroups subgroups (NSG_MAX, set by the host from the smallest subgroup
// size the device may use).
//
// Specialization constants of this op (GPU_SPEC_OP0..3): NQ_MAX query vectors per item, CPI value
// channels per unit, NSG_MAX subgroups per workgroup at most, INPUTS_STAGED (attend_inputs.glsl).

#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require

layout(constant_id = 30) const uint NQ_MAX = 4;
layout(constant_id = 31) const uint CPI = 4;
layout(constant_id = 32) const uint NSG_MAX = 64;
layout(constant_id = 35) const uint MASS = 0;   // store scores and softmax factors for mass.comp

const uint NONE = 0xffffffffu;
const float NEG = -3.0e38;               // score of an invisible token, m of a vector that saw nothing
const int NO_TOKEN = -1, RING_TOKEN = -2; // tok_page of a token nobody sees / of a KIVI ring token
const uint DMAX = D_K > D_V ? D_K : D_V;
const uint DK4 = D_K / 4u;
const uint GQ = GROUP > 0u ? GROUP : 1u;       // GROUP, safe to divide by in f32/f16 pipelines
const uint NU = D_V / CPI;                              // value units of a row
const uint UPI = (NU + WG_SIZE - 1u) / WG_SIZE;         // units per invocation
const uint TS = NU >= WG_SIZE ? 1u : WG_SIZE / NU;      // token slices of phase C
const uint ITEM_WORDS = 12u, SEQ_WORDS = 11u;

#include "gpu_push.h"
PUSH_BLOCK(GOKV_PUSH_ATTEND); // the fields: gpu_push.h

#include "attend_inputs.glsl"

// KVW: a word of the K/V storage; KV4: four words, for plain (untiled) key rows, which start on 16 bytes
// (K_ROW_W % 4 == 0: every page, section and head offset is a multiple of 64 bytes): one load per
// invocation instead of four.
#ifdef ATTEND_KV_IN_SCRATCH
layout(std430, set = 0, binding = 3) readonly buffer ScratchVec { uvec4 scratch4[]; };
#define KVW(i) scratch[i]
#define KV4(i) scratch4[i]
#else
layout(std430, set = 0, binding = 0) readonly buffer PagesVec { uvec4 pages4[]; };
#define KVW(i) pages[i]
#define KV4(i) pages4[i]
#endif
const bool K_ROW_VEC4 = K_ROW_W % 4u == 0u;

// Words 4 i4 .. 4 i4 + 3 of the per-token key row whose word 0 is KVW(w0) (key_word): one 16-byte load
// from a plain row (K_ROW_VEC4); from a tiled one four loads K_WORD_STEP apart, in which the invocations
// of neighbouring tokens (phase A) load neighbouring words.
uvec4 key_words4(uint w0, uint i4) {
    if (K_TILED == 0u) return KV4(w0 / 4u + i4);
    uint w = w0 + 4u * i4 * K_WORD_STEP;
    return uvec4(KVW(w), KVW(w + K_WORD_STEP), KVW(w + 2u * K_WORD_STEP), KVW(w + 3u * K_WORD_STEP));
}

// fp16 -> f32 for the finite halves pools hold (values, scales and biases are validated finite on write):
// equal to common.glsl's half_to_float there, in fewer operations (normal: rebias the exponent;
// subnormal: man * 2^-24, exact; no reliance on the driver keeping f32 denormals).
float half_finite(uint h) {
    uint a = h & 0x7fffu;
    float f = a < 0x400u ? float(a) * 5.9604644775390625e-8 : uintBitsToFloat((a << 13) + 0x38000000u);
    return (h & 0x8000u) != 0u ? -f : f;
}
float kv_half(uint i) { return half_finite((KVW(i >> 1) >> ((i & 1u) * 16u)) & 0xffffu); }
vec2 unpack_half2(uint x) { return vec2(half_finite(x & 0xffffu), half_finite(x >> 16)); }

shared vec4 qo[NQ_MAX * DMAX / 4u];       // queries (scaled), then the item's output o[i][c]
shared float pw[NQ_MAX * WG_SIZE];       // softmax weights p[i][k] of the block
shared float red_m[NQ_MAX * NSG_MAX];    // per subgroup block maxima
shared float red_l[NQ_MAX * NSG_MAX];    // per subgroup block sums of p
shared float st_m[NQ_MAX], st_l[NQ_MAX], st_c[NQ_MAX]; // running max, running sum, rescale factor
shared int tok_page[2 * WG_SIZE];        // by block parity: page of token k, RING_TOKEN or NO_TOKEN
shared uint tok_slot[2 * WG_SIZE];       // slot in the page (ring tokens: the position)
shared uint live_sg[NSG_MAX];            // per subgroup: whether its share of the item's mask words has a bit

float score[NQ_MAX];             // scores of this invocation's token
float acc[UPI * NQ_MAX * CPI];   // output accumulators: [unit][vector][channel]
float xv[CPI];                   // one decoded value unit

// ---- phase A: keys ----

// Whether a query at position p sees token t (given t is stored, valid and its page not released).
bool sees(uint p, uint t) {
    return t <= p && (pc.window == 0 || p - t < uint(pc.window) || t < uint(pc.n_sink_tokens));
}

void dot4(uint c4, vec4 x) {
    [[unroll]] for (uint i = 0u; i < NQ_MAX; i++) score[i] += dot(qo[i * DK4 + c4], x);
}

// Per-token key row whose word 0 is KVW(w0) (key_word; its words are K_WORD_STEP apart); sh0 / bh0: half
// index of its group-0 scale / bias.
void score_key_row(uint w0, uint sh0, uint bh0) {
    if (FORMAT == FMT_F32) {
        for (uint c4 = 0u; c4 < DK4; c4++) dot4(c4, uintBitsToFloat(KV4(w0 / 4u + c4)));
    } else if (FORMAT == FMT_F16) {
        if (K_ROW_VEC4) {
            for (uint c8 = 0u; c8 < D_K / 8u; c8++) {
                uvec4 u = KV4(w0 / 4u + c8);
                dot4(2u * c8, vec4(unpack_half2(u.x), unpack_half2(u.y)));
                dot4(2u * c8 + 1u, vec4(unpack_half2(u.z), unpack_half2(u.w)));
            }
        } else {
            for (uint c4 = 0u; c4 < DK4; c4++)
                dot4(c4, vec4(unpack_half2(KVW(w0 + 2u * c4)), unpack_half2(KVW(w0 + 2u * c4 + 1u))));
        }
    } else { // q8, q4: a group of GROUP channels is GROUP * BITS / 128 uvec4 (GROUP >= 32)
        const uint EPW = 32u / BITS, V4G = GQ * BITS / 128u; // codes per word, uvec4 per group
        for (uint j = 0u; j < D_K / GQ; j++) {
            float sc = kv_half(sh0 + j), bi = kv_half(bh0 + j);
            for (uint v = 0u; v < V4G; v++) {
                uvec4 u = key_words4(w0, j * V4G + v);
                [[unroll]] for (uint wi = 0u; wi < 4u; wi++)
                    [[unroll]] for (uint e = 0u; e < EPW; e += 4u) {
                        uvec4 code = (uvec4(u[wi]) >> (uvec4(e, e + 1u, e + 2u, e + 3u) * BITS)) & CODE_MASK;
                        dot4((j * GQ + (4u * v + wi) * EPW + e) / 4u, vec4(code) * sc + bi);
                    }
            }
        }
    }
}

// KIVI key of the token at (page, slot): per channel codes packed along the g tokens of its group.
void score_kivi_key(uint page, uint head, uint slot) {
    const uint WPC = GQ * BITS / 32u; // words of one channel in a token group
    uint jg = slot / GQ, tg = slot % GQ;
    uint w0 = page * PAGE_WORDS + K_CODES_W + head * K_CODES_HEAD_W + jg * K_ROW_W + (tg * BITS) / 32u;
    uint sh = (tg * BITS) % 32u;
    uint hs = page * PAGE_WORDS * 2u + head * K_SB_HEAD_H + jg * D_K; // even: scale pairs share a word
    for (uint c4 = 0u; c4 < DK4; c4++) {
        uint c = 4u * c4, w = w0 + c * WPC;
        uvec4 code = (uvec4(KVW(w), KVW(w + WPC), KVW(w + 2u * WPC), KVW(w + 3u * WPC)) >> sh) & CODE_MASK;
        uint ws = (hs + K_SCALE_H + c) >> 1, wb = (hs + K_BIAS_H + c) >> 1;
        vec4 sc = vec4(unpack_half2(KVW(ws)), unpack_half2(KVW(ws + 1u)));
        vec4 bi = vec4(unpack_half2(KVW(wb)), unpack_half2(KVW(wb + 1u)));
        dot4(c4, vec4(code) * sc + bi);
    }
}

// KIVI residual ring key (fp16 row) of position t.
void score_ring_key(uint rs, uint t, uint head) {
    uint w0 = ring_k_half(rs, t, head, 0u) >> 1; // rows start on even halves (D_K % 4 == 0)
    for (uint c4 = 0u; c4 < DK4; c4++)
        dot4(c4, vec4(unpack_half2(rings[w0 + 2u * c4]), unpack_half2(rings[w0 + 2u * c4 + 1u])));
}

// ---- phase C: values ----

// Decodes value channels [c0, c0 + CPI) of a token into xv.
void load_value_unit(int pg, uint slot, uint head, uint rs, uint c0) {
    if (KIVI != 0u && pg == RING_TOKEN) {
        uint h = ring_v_half(rs, slot, head, c0);
        [[unroll]] for (uint ch = 0u; ch < CPI; ch++)
            xv[ch] = half_finite((rings[(h + ch) >> 1] >> (((h + ch) & 1u) * 16u)) & 0xffffu);
        return;
    }
    uint page = uint(pg);
    if (KIVI != 0u && V_IS_K_PREFIX != 0u) { // MLA over KIVI: values are the per-channel keys' prefix
        [[unroll]] for (uint ch = 0u; ch < CPI; ch++) xv[ch] = kivi_key_elem(page, head, slot, c0 + ch);
        return;
    }
    const bool IS_V = V_IS_K_PREFIX == 0u;
    uint w0 = row_word(page, head, slot, IS_V);
    if (FORMAT == FMT_F32) {
        [[unroll]] for (uint ch = 0u; ch < CPI; ch++) xv[ch] = uintBitsToFloat(KVW(w0 + c0 + ch));
    } else if (FORMAT == FMT_F16) {
        [[unroll]] for (uint ch = 0u; ch < CPI; ch++) xv[ch] = kv_half(2u * w0 + c0 + ch);
    } else {
        const uint EPW = 32u / BITS;
        uint j = c0 / GQ;
        float sc = kv_half(row_scale_half(page, head, slot, j, IS_V));
        float bi = kv_half(row_bias_half(page, head, slot, j, IS_V));
        if (CPI >= EPW) {
            [[unroll]] for (uint wi = 0u; wi < CPI / EPW; wi++) {
                uint word = KVW(w0 + c0 / EPW + wi);
                [[unroll]] for (uint e = 0u; e < EPW; e++)
                    xv[wi * EPW + e] = float((word >> (e * BITS)) & CODE_MASK) * sc + bi;
            }
        } else {
            uint word = KVW(w0 + c0 / EPW) >> ((c0 % EPW) * BITS);
            [[unroll]] for (uint e = 0u; e < CPI; e++) xv[e] = float((word >> (e * BITS)) & CODE_MASK) * sc + bi;
        }
    }
}

// ---- the work item ----

// One work item of the host's plan (native/gpu/gpu_attend.c: ITEM_WORDS words in the item table, SEQ_WORDS per
// sequence), and what follows from it.
struct Item {
    uint kvh, qrow0, nrows, head0, nheads, pos0; // kv head, query rows and heads, position of row qrow0
    uint a0, a1, b0, b1;                         // visible tokens [a0, a1) then [b0, b1)
    uint part;                                   // its split-K partial's offset, or NONE: finalize
    uint n_quant, page_w, mask_w, rs;            // the sequence: tokens in pages, page table, mask, ring slot
    uint nq, len_a, n_vis;                       // query vectors, tokens of [a0, a1), visible tokens
    uint kv_len, mass_row0, score_w;             // MASS: the sequence's length, first counted row, scores
};

Item load_item(uint item) {
    Item it;
    const uint iw = pc.item_w + item * ITEM_WORDS;
    const uint seq = in_u(iw);
    it.kvh = in_u(iw + 1u);
    it.qrow0 = in_u(iw + 2u);
    it.nrows = in_u(iw + 3u);
    it.head0 = in_u(iw + 4u);
    it.nheads = in_u(iw + 5u);
    it.pos0 = in_u(iw + 6u);
    it.a0 = in_u(iw + 7u);
    it.a1 = in_u(iw + 8u);
    it.b0 = in_u(iw + 9u);
    it.b1 = in_u(iw + 10u);
    it.part = in_u(iw + 11u);
    const uint sw = pc.seq_w + seq * SEQ_WORDS;
    it.n_quant = in_u(sw + 1u);
    it.page_w = in_u(sw + 2u);
    it.mask_w = in_u(sw + 3u);
    if (it.mask_w != NONE) it.mask_w += it.kvh * in_u(sw + 5u); // this kv head's mask
    it.rs = in_u(sw + 4u);
    if (MASS != 0u) {
        it.kv_len = in_u(sw);
        it.mass_row0 = in_u(sw + 6u);
        it.score_w = in_u(sw + 9u);
    }
    it.nq = it.nrows * it.nheads;
    it.len_a = it.a1 - it.a0;
    it.n_vis = it.len_a + (it.b1 - it.b0);
    return it;
}

// Queries, scaled (vectors past nq are zero), into qo; the softmax state; the accumulators.
void init_item(Item it, uint lid) {
    for (uint x = lid; x < NQ_MAX * DK4; x += WG_SIZE) {
        uint i = x / DK4, c4 = x % DK4;
        vec4 q = vec4(0.0);
        if (i < it.nq) {
            uint w = pc.q_w + ((it.qrow0 + i / it.nheads) * pc.n_heads_q + it.head0 + i % it.nheads) * D_K + 4u * c4;
            q = uintBitsToFloat(uvec4(in_u(w), in_u(w + 1u), in_u(w + 2u), in_u(w + 3u))) * pc.scale;
        }
        qo[x] = q;
    }
    for (uint i = lid; i < NQ_MAX; i += WG_SIZE) {
        st_m[i] = NEG;
        st_l[i] = 0.0;
    }
    [[unroll]] for (uint x = 0u; x < UPI * NQ_MAX * CPI; x++) acc[x] = 0.0;
}

// ---- masks: whether tokens [lo, hi) have a set bit in the mask at mask_w, looking at the words
// first, first + step, ... of the range (every invocation: 0, 1; one share each: lid, WG_SIZE) ----
bool mask_any(uint mask_w, uint lo, uint hi, uint first, uint step) {
    if (lo >= hi) return false;
    const uint w0 = lo >> 5, w1 = (hi - 1u) >> 5;
    for (uint w = w0 + first; w <= w1; w += step) {
        uint bits = in_u(mask_w + w);
        if (w == w0) bits &= ~0u << (lo & 31u);
        if (w == w1 && (hi & 31u) != 0u) bits &= ~(~0u << (hi & 31u));
        if (bits != 0u) return true;
    }
    return false;
}

// The tokens of visible-range indices [v0, v1) of the item: [a0, a1) then [b0, b1) laid end to end.
bool item_any(Item it, uint v0, uint v1, uint first, uint step) {
    bool any = false;
    if (v0 < it.len_a) any = mask_any(it.mask_w, it.a0 + v0, it.a0 + min(v1, it.len_a), first, step);
    if (v1 > it.len_a)
        any = any || mask_any(it.mask_w, it.b0 + (max(v0, it.len_a) - it.len_a), it.b0 + (v1 - it.len_a), first, step);
    return any;
}

// MASS: a skipped block's tokens still get their NEG scores (mass.comp reads every token of the ranges).
void mass_skip(Item it, uint blk, uint lid) {
    uint v = blk * WG_SIZE + lid;
    if (v >= it.n_vis || it.score_w == NONE) return;
    uint t = v < it.len_a ? it.a0 + v : it.b0 + (v - it.len_a);
    [[unroll]] for (uint i = 0u; i < NQ_MAX; i++) {
        uint row = it.qrow0 + i / it.nheads;
        if (i < it.nq && row >= it.mass_row0)
            scratch[it.score_w + ((row - it.mass_row0) * pc.n_heads_q + it.head0 + i % it.nheads) * it.kv_len + t] =
                floatBitsToUint(NEG);
    }
}

// ---- A: visibility and scores of token lid of block blk; its page and slot into tok_* (buffer tb), the
// subgroup maxima into red_m ----
void phase_a(Item it, uint blk, uint lid, uint tb, bool elect, uint sg) {
    [[unroll]] for (uint i = 0u; i < NQ_MAX; i++) score[i] = NEG;
    int pg = NO_TOKEN;
    uint slot = 0u;
    uint v = blk * WG_SIZE + lid;
    if (v < it.n_vis) {
        uint t = v < it.len_a ? it.a0 + v : it.b0 + (v - it.len_a);
        int id = int(in_u(it.page_w + t / PAGE_SIZE));
        bool ok = id >= 0;
        if (ok && it.mask_w != NONE) ok = ((in_u(it.mask_w + (t >> 5)) >> (t & 31u)) & 1u) != 0u;
        // some row sees t iff the first row at or after t does (the window only moves away from t)
        uint p_first = max(t, it.pos0);
        bool any_vis = ok && p_first < it.pos0 + it.nrows && sees(p_first, t);
        if (any_vis) {
            bool ring = KIVI != 0u && t >= it.n_quant;
            [[unroll]] for (uint i = 0u; i < NQ_MAX; i++) score[i] = 0.0;
            if (ring) {
                score_ring_key(it.rs, t, it.kvh);
            } else if (KIVI != 0u) {
                score_kivi_key(uint(id), it.kvh, t % PAGE_SIZE);
            } else {
                uint sl = t % PAGE_SIZE;
                score_key_row(key_word(uint(id), it.kvh, sl, 0u), row_scale_half(uint(id), it.kvh, sl, 0u, false),
                              row_bias_half(uint(id), it.kvh, sl, 0u, false));
            }
            [[unroll]] for (uint i = 0u; i < NQ_MAX; i++) {
                if (i >= it.nq || !sees(it.pos0 + i / it.nheads, t)) score[i] = NEG;
            }
            pg = ring ? RING_TOKEN : id;
            slot = ring ? t : t % PAGE_SIZE;
        }
        if (MASS != 0u && it.score_w != NONE) // every token of the ranges, NEG where the row does not see it
            [[unroll]] for (uint i = 0u; i < NQ_MAX; i++) {
                uint row = it.qrow0 + i / it.nheads;
                if (i < it.nq && row >= it.mass_row0)
                    scratch[it.score_w + ((row - it.mass_row0) * pc.n_heads_q + it.head0 + i % it.nheads) * it.kv_len + t] =
                        floatBitsToUint(score[i]);
            }
    }
    tok_page[tb + lid] = pg;
    tok_slot[tb + lid] = slot;
    [[unroll]] for (uint i = 0u; i < NQ_MAX; i++) {
        float mx = subgroupMax(score[i]);
        if (elect) red_m[i * NSG_MAX + sg] = mx;
    }
}

// ---- B, first half: new running maxima; fold the previous walked block's sum into l (done: blocks walked) ----
void phase_b_max(uint done, uint lid) {
    for (uint i = lid; i < NQ_MAX; i += WG_SIZE) {
        float mb = NEG, l = st_l[i];
        for (uint g = 0u; g < gl_NumSubgroups; g++) {
            mb = max(mb, red_m[i * NSG_MAX + g]);
            if (done > 0u) l += red_l[i * NSG_MAX + g];
        }
        float mo = st_m[i], mn = max(mo, mb);
        float corr = mo == NEG ? 0.0 : exp(mo - mn);
        st_m[i] = mn;
        st_l[i] = l * corr;
        st_c[i] = corr;
    }
}

// ---- B, second half: p = e^(s - m_new) of token lid into pw, the subgroup sums into red_l ----
void phase_b_weights(uint lid, bool elect, uint sg) {
    [[unroll]] for (uint i = 0u; i < NQ_MAX; i++) {
        float p = score[i] == NEG ? 0.0 : exp(score[i] - st_m[i]);
        pw[i * WG_SIZE + lid] = p;
        float sum = subgroupAdd(p);
        if (elect) red_l[i * NSG_MAX + sg] = sum;
    }
}

// ---- C: rescale and accumulate p · v over this invocation's units (from unit0) and token slice ----
void phase_c(uint kvh, uint rs, uint tb, uint slice, uint unit0) {
    [[unroll]] for (uint x = 0u; x < UPI * NQ_MAX * CPI; x++) acc[x] *= st_c[(x / CPI) % NQ_MAX];
    for (uint k = slice; k < WG_SIZE; k += TS) {
        int tp = tok_page[tb + k];
        if (tp == NO_TOKEN) continue;
        uint ts = tok_slot[tb + k];
        [[unroll]] for (uint u = 0u; u < UPI; u++) {
            uint unit = unit0 + u * WG_SIZE;
            if (unit >= NU) break;
            load_value_unit(tp, ts, kvh, rs, unit * CPI);
            [[unroll]] for (uint i = 0u; i < NQ_MAX; i++) {
                float p = pw[i * WG_SIZE + k];
                [[unroll]] for (uint ch = 0u; ch < CPI; ch++) acc[(u * NQ_MAX + i) * CPI + ch] += p * xv[ch];
            }
        }
    }
}

// ---- the end: the last walked block's sum; the slices summed into qo (now free) as o[i][c] ----
void sum_slices(uint done, uint lid, uint slice, uint unit0, bool c_active) {
    if (done > 0u)
        for (uint i = lid; i < NQ_MAX; i += WG_SIZE)
            for (uint g = 0u; g < gl_NumSubgroups; g++) st_l[i] += red_l[i * NSG_MAX + g];
    for (uint s2 = 0u; s2 < TS; s2++) {
        if (c_active && slice == s2)
            [[unroll]] for (uint u = 0u; u < UPI; u++) {
                uint unit = unit0 + u * WG_SIZE;
                if (unit >= NU) break;
                [[unroll]] for (uint i = 0u; i < NQ_MAX; i++)
                    [[unroll]] for (uint ch = 0u; ch < CPI; ch++) {
                        uint o = i * D_V + unit * CPI + ch;
                        float a = acc[(u * NQ_MAX + i) * CPI + ch];
                        qo[o / 4u][o % 4u] = s2 == 0u ? a : qo[o / 4u][o % 4u] + a;
                    }
            }
        barrier();
    }
}

// ---- finalize into down: out = o / (l + e^(σ - m)), zeros when nothing was visible ----
void finalize(Item it, uint lid) {
    for (uint x = lid; x < it.nq * D_V; x += WG_SIZE) {
        uint i = x / D_V, c = x % D_V, head = it.head0 + i % it.nheads;
        float m = st_m[i], l = st_l[i], f = 0.0;
        if (l > 0.0) {
            bool has_sink = pc.sink_w != NONE;
            float sigma = has_sink ? in_f(pc.sink_w + head) : NEG;
            float M = max(m, sigma);
            float w = exp(m - M);
            f = w / (l * w + (has_sink ? exp(sigma - M) : 0.0));
        }
        down[((it.qrow0 + i / it.nheads) * pc.n_heads_q + head) * D_V + c] = floatBitsToUint(qo[x / 4u][x % 4u] * f);
    }
    if (MASS != 0u) // prob_t = e^(s_t - m) f
        for (uint i = lid; i < it.nq; i += WG_SIZE) {
            uint head = it.head0 + i % it.nheads, w = pc.stats_w + 2u * ((it.qrow0 + i / it.nheads) * pc.n_heads_q + head);
            float m = st_m[i], l = st_l[i], f = 0.0;
            if (l > 0.0) {
                bool has_sink = pc.sink_w != NONE;
                float sigma = has_sink ? in_f(pc.sink_w + head) : NEG;
                float M = max(m, sigma);
                float wm = exp(m - M);
                f = wm / (l * wm + (has_sink ? exp(sigma - M) : 0.0));
            }
            scratch[w] = floatBitsToUint(m);
            scratch[w + 1u] = floatBitsToUint(f);
        }
}

// ---- or write the partial (m, l, o[D_V]) for reduce.comp (which reads no o of a chunk with l == 0) ----
void write_partial(Item it, uint lid, bool saw) {
    uint base = pc.part_w + it.part;
    for (uint x = lid; saw && x < it.nq * D_V; x += WG_SIZE) {
        uint i = x / D_V, c = x % D_V;
        scratch[base + i * (D_V + 2u) + 2u + c] = floatBitsToUint(qo[x / 4u][x % 4u]);
    }
    for (uint i = lid; i < it.nq; i += WG_SIZE) {
        scratch[base + i * (D_V + 2u)] = floatBitsToUint(st_m[i]);
        scratch[base + i * (D_V + 2u) + 1u] = floatBitsToUint(st_l[i]);
    }
}

void attend_main() {
    const uint lid = gl_LocalInvocationID.x;
    const uint item = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (item >= pc.n_items) return;
    const Item it = load_item(item);
    init_item(it, lid);
    // this invocation's share of phase C
    const uint slice = NU >= WG_SIZE ? 0u : lid / NU;
    const uint unit0 = NU >= WG_SIZE ? lid : lid % NU;
    const bool c_active = slice < TS;
    const bool elect = subgroupElect();
    const uint sg = gl_SubgroupID;
    const bool masked = it.mask_w != NONE;
    if (masked) { // whether any of the item's tokens is in its kv head's mask: each invocation a share of the words
        uint any = subgroupMax(item_any(it, 0u, it.n_vis, lid, WG_SIZE) ? 1u : 0u);
        if (elect) live_sg[sg] = any;
    }
    barrier();

    uint n_blocks = (it.n_vis + WG_SIZE - 1u) / WG_SIZE;
    if (masked && !(MASS != 0u && it.score_w != NONE)) {
        uint live = 0u;
        for (uint g = 0u; g < gl_NumSubgroups; g++) live |= live_sg[g];
        if (live == 0u) n_blocks = 0u;
    }
    uint done = 0u; // blocks walked; the tok_* buffers alternate by it
    for (uint blk = 0u; blk < n_blocks; blk++) {
        if (masked && !item_any(it, blk * WG_SIZE, min(blk * WG_SIZE + WG_SIZE, it.n_vis), 0u, 1u)) {
            if (MASS != 0u) mass_skip(it, blk, lid);
            continue; // uniform: every invocation read the same words
        }
        const uint tb = (done & 1u) * WG_SIZE; // tok_* buffer of this block
        phase_a(it, blk, lid, tb, elect, sg);
        barrier();
        phase_b_max(done, lid);
        barrier();
        phase_b_weights(lid, elect, sg);
        barrier();
        if (c_active) phase_c(it.kvh, it.rs, tb, slice, unit0);
        done++;
    }
    barrier();

    sum_slices(done, lid, slice, unit0, c_active);
    if (it.part == NONE)
        finalize(it, lid);
    else
        write_partial(it, lid, done > 0u);
}
