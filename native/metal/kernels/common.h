// common.h: what every gokv Metal kernel shares; the port of native/vulkan/shaders/common.glsl (same function
// names, same results): fp16 conversions that agree bit for bit with bridge/gokv_half.h, and element access for
// the page layout of bridge/gokv_layout.h (docs/architecture.md §3, §4), plus where the attention-family kernels
// read their inputs (attend_inputs.glsl). Metal Shading Language, also compiled as C++17 against the emulator's
// shim (native/metal/kernels/mtl_kernel.h has the rules).
//
// How a kernel uses it. GLSL reads the specialization constants and the buffers as globals; Metal gets the
// constants as runtime words (buffer 6) and the buffers as kernel parameters, so a kernel builds one kv_pool
// at its start and passes it to every helper as the first argument. Its members keep the GLSL names:
//
//     #include "mtl_kernel.h"
//     #include "common.h"
//     struct store_rows_push { GOKV_PUSH_STORE_ROWS(PUSH_FIELD) };
//     template <uint N> kernel void store_rows(MTL_KERNEL_PARAMS) {
//         const kv_pool kv = kv_pool_of(pages, rings, spec);   // kv.FORMAT, kv.D_K, kv.CODE_MASK, ...
//         constant store_rows_push &pc = *(constant store_rows_push *)push_words;
//         device uint *in = inputs_of(up, scratch, spec, pc.in_base);   // attend_inputs.glsl's in_u(i): in[i]
//         float x = row_elem(kv, page, head, slot, c, false);
//         page_store_half(kv, half_index, float_to_half(x));
//         uint w = key_word(kv, page, head, slot, j);   kv.pages[w] = ...;
//     }
//
// Signatures (GLSL name, then the Metal one):
//     half_to_float(h), float_to_half(f)                      unchanged (no pool)
//     page_half(i), ring_half(i)                              page_half(kv, i), ring_half(kv, i)
//     page_store_half(i, h), ring_store_half(i, h)            page_store_half(kv, i, h), ring_store_half(kv, i, h)
//     page_code(w, c)                                         page_code(kv, w, c)
//     row_word, key_word, row_scale_half, row_bias_half       (kv, page, head, slot, ...) as in GLSL
//     dequant(code, s, b)                                     unchanged (never fused into an fma)
//     row_elem, kivi_key_elem, key_elem, value_elem           (kv, page, head, slot, c[, is_v]) as in GLSL
//     ring_k_half, ring_v_half, ring_key, ring_value          (kv, rs, t, head, c) as in GLSL
//     up_f(w), up_i(w)                                        up_f(up, w), up_i(up, w)
//     in_u(i), in_f(i) (attend_inputs.glsl)                   in[i], in_f(in, i) with in = inputs_of(...)
//     FMT_*, KEY_TILE                                         unchanged (constants)
//     FORMAT, BITS, ..., K_TILED, QUANTIZED, CODE_MASK,       kv.FORMAT, kv.BITS, ... (kv_pool's members)
//     K_WORD_STEP
// Specialization ids: GPU_SPEC_* of native/gpu/gpu_spec.h (spec[GPU_SPEC_OP2] for the op's own constants).
// The store helpers write through device atomics (atomic_fetch_and/or on atomic_uint), so two threads may
// own the two halves of one word, as in GLSL. kv.pages / kv.rings may be repointed (baseline_attend reads its
// f32 copy in scratch through the same helpers).
#ifndef GOKV_MTL_COMMON_H
#define GOKV_MTL_COMMON_H

#include <metal_stdlib>
using namespace metal;

#include "gpu_push.h"

#include "gpu_spec.h" // GPU_SPEC_*: the specialization ids, shared with the plan

constant constexpr uint FMT_F32 = 0u, FMT_F16 = 1u, FMT_Q8 = 2u, FMT_Q4 = 3u, FMT_KIVI2 = 4u, FMT_KIVI4 = 5u;
constant constexpr uint KEY_TILE = 16u; // GOKV_KEY_TILE

// The pool's buffers and the layout's constants (the GLSL specialization constants, same names).
struct kv_pool {
    device uint *pages;
    device uint *rings;
    uint FORMAT, BITS, GROUP, PAGE_SIZE, N_KV_HEADS, D_K, D_V, V_IS_K_PREFIX, KIVI, RING_ROWS, PAGE_WORDS;
    uint K_CODES_W, K_SCALE_H, K_BIAS_H, V_CODES_W, V_SCALE_H, V_BIAS_H;
    uint K_CODES_HEAD_W, K_SB_HEAD_H, V_CODES_HEAD_W, V_SB_HEAD_H, K_ROW_W, V_ROW_W, K_GROUPS, V_GROUPS;
    uint RING_K_H, RING_V_H, RING_HALVES, WG_SIZE, SUBGROUP_SIZE, K_TILED;
    uint CODE_MASK;   // (1 << BITS) - 1, all ones for f32
    uint K_WORD_STEP; // words between consecutive words of one key row (see key_word)
    bool QUANTIZED;
};

static inline kv_pool kv_pool_of(device uint *pages, device uint *rings, constant uint *spec) {
    kv_pool kv;
    kv.pages = pages;
    kv.rings = rings;
    kv.FORMAT = spec[GPU_SPEC_FORMAT];
    kv.BITS = spec[GPU_SPEC_BITS];
    kv.GROUP = spec[GPU_SPEC_GROUP];
    kv.PAGE_SIZE = spec[GPU_SPEC_PAGE_SIZE];
    kv.N_KV_HEADS = spec[GPU_SPEC_N_KV_HEADS];
    kv.D_K = spec[GPU_SPEC_D_K];
    kv.D_V = spec[GPU_SPEC_D_V];
    kv.V_IS_K_PREFIX = spec[GPU_SPEC_V_IS_K_PREFIX];
    kv.KIVI = spec[GPU_SPEC_KIVI];
    kv.RING_ROWS = spec[GPU_SPEC_RING_ROWS];
    kv.PAGE_WORDS = spec[GPU_SPEC_PAGE_WORDS];
    kv.K_CODES_W = spec[GPU_SPEC_K_CODES_W];
    kv.K_SCALE_H = spec[GPU_SPEC_K_SCALE_H];
    kv.K_BIAS_H = spec[GPU_SPEC_K_BIAS_H];
    kv.V_CODES_W = spec[GPU_SPEC_V_CODES_W];
    kv.V_SCALE_H = spec[GPU_SPEC_V_SCALE_H];
    kv.V_BIAS_H = spec[GPU_SPEC_V_BIAS_H];
    kv.K_CODES_HEAD_W = spec[GPU_SPEC_K_CODES_HEAD_W];
    kv.K_SB_HEAD_H = spec[GPU_SPEC_K_SB_HEAD_H];
    kv.V_CODES_HEAD_W = spec[GPU_SPEC_V_CODES_HEAD_W];
    kv.V_SB_HEAD_H = spec[GPU_SPEC_V_SB_HEAD_H];
    kv.K_ROW_W = spec[GPU_SPEC_K_ROW_W];
    kv.V_ROW_W = spec[GPU_SPEC_V_ROW_W];
    kv.K_GROUPS = spec[GPU_SPEC_K_GROUPS];
    kv.V_GROUPS = spec[GPU_SPEC_V_GROUPS];
    kv.RING_K_H = spec[GPU_SPEC_RING_K_H];
    kv.RING_V_H = spec[GPU_SPEC_RING_V_H];
    kv.RING_HALVES = spec[GPU_SPEC_RING_HALVES];
    kv.WG_SIZE = spec[GPU_SPEC_WG_SIZE];
    kv.SUBGROUP_SIZE = spec[GPU_SPEC_SUBGROUP_SIZE];
    kv.K_TILED = spec[GPU_SPEC_K_TILED];
    kv.CODE_MASK = kv.BITS >= 32u ? 0xffffffffu : ((1u << kv.BITS) - 1u);
    kv.K_WORD_STEP = kv.K_TILED != 0u ? KEY_TILE : 1u;
    kv.QUANTIZED = kv.FORMAT >= FMT_Q8;
    return kv;
}

// ---- fp16, exactly as bridge/gokv_half.h (round to nearest even, subnormals, inf, NaN); integer work only,
// never the hardware's conversion ----
static inline float half_to_float(uint h) {
    uint sign = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1fu;
    uint man = h & 0x3ffu;
    if (e == 0u) {
        // subnormal or zero: man * 2^-24 is exact in f32
        float f = float(man) * 5.9604644775390625e-8f;
        return sign != 0u ? -f : f;
    }
    if (e == 31u) return as_type<float>(sign | 0x7f800000u | (man << 13));
    return as_type<float>(sign | ((e + 112u) << 23) | (man << 13));
}

static inline uint float_to_half(float f) {
    uint x = as_type<uint>(f);
    uint sign = (x >> 16) & 0x8000u;
    uint absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u);
    if (absx >= 0x477ff000u) return sign | 0x7c00u;
    if (absx < 0x38800000u) {
        if (absx < 0x33000000u) return sign;
        uint e = absx >> 23;
        uint man = (absx & 0x7fffffu) | 0x800000u;
        uint shift = 126u - e;
        uint half_man = man >> shift;
        uint rem = man & ((1u << shift) - 1u);
        uint halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (half_man & 1u) != 0u)) half_man++;
        return sign | half_man;
    }
    uint r = absx + 0xfffu + ((absx >> 13) & 1u) - (112u << 23);
    return sign | (r >> 13);
}

// The fp16 at half index i of a buffer.
static inline float page_half(thread const kv_pool &kv, uint i) {
    return half_to_float((kv.pages[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu);
}
static inline float ring_half(thread const kv_pool &kv, uint i) {
    return half_to_float((kv.rings[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu);
}

// Stores the fp16 bits h at half index i without disturbing the other half of the word (two threads may own
// the two halves of one word: the and/or pairs commute).
static inline void half_store_atomic(device uint *buf, uint i, uint h) {
    uint sh = (i & 1u) * 16u;
    device atomic_uint *w = (device atomic_uint *)(buf + (i >> 1));
    atomic_fetch_and_explicit(w, ~(0xffffu << sh), memory_order_relaxed);
    atomic_fetch_or_explicit(w, (h & 0xffffu) << sh, memory_order_relaxed);
}
static inline void page_store_half(thread const kv_pool &kv, uint i, uint h) { half_store_atomic(kv.pages, i, h); }
static inline void ring_store_half(thread const kv_pool &kv, uint i, uint h) { half_store_atomic(kv.rings, i, h); }

// The c-th packed code of BITS bits in the run of words starting at word w (BITS < 32).
static inline uint page_code(thread const kv_pool &kv, uint w, uint c) {
    uint bit = c * kv.BITS;
    return (kv.pages[w + (bit >> 5)] >> (bit & 31u)) & kv.CODE_MASK;
}

// ---- element access (what the kernels see: dequantized, never materialized) ----

// Word where kv head `head`'s per-token row `slot` of the K (is_v = false) or V section starts in page; a
// key row is one run of words only when K_TILED == 0 (else see key_word).
static inline uint row_word(thread const kv_pool &kv, uint page, uint head, uint slot, bool is_v) {
    return is_v ? page * kv.PAGE_WORDS + kv.V_CODES_W + head * kv.V_CODES_HEAD_W + slot * kv.V_ROW_W
                : page * kv.PAGE_WORDS + kv.K_CODES_W + head * kv.K_CODES_HEAD_W + slot * kv.K_ROW_W;
}
// Word j of kv head `head`'s per-token key row `slot`. Tiled keys (K_TILED, bridge/gokv_layout.h: q4 without
// v_is_k_prefix) lie in tiles of KEY_TILE tokens, dword-column-major: word j of slot t at tile t / KEY_TILE,
// column j, lane t % KEY_TILE; consecutive words of one row are K_WORD_STEP apart, and threads that take
// neighbouring tokens read neighbouring words.
static inline uint key_word(thread const kv_pool &kv, uint page, uint head, uint slot, uint j) {
    uint base = page * kv.PAGE_WORDS + kv.K_CODES_W + head * kv.K_CODES_HEAD_W;
    return kv.K_TILED != 0u ? base + (slot / KEY_TILE) * (KEY_TILE * kv.K_ROW_W) + j * KEY_TILE + slot % KEY_TILE
                            : base + slot * kv.K_ROW_W + j;
}
// Half index of the scale (bias) of group j of a per-token row.
static inline uint row_scale_half(thread const kv_pool &kv, uint page, uint head, uint slot, uint j, bool is_v) {
    return is_v ? page * kv.PAGE_WORDS * 2u + kv.V_SCALE_H + head * kv.V_SB_HEAD_H + slot * kv.V_GROUPS + j
                : page * kv.PAGE_WORDS * 2u + kv.K_SCALE_H + head * kv.K_SB_HEAD_H + slot * kv.K_GROUPS + j;
}
static inline uint row_bias_half(thread const kv_pool &kv, uint page, uint head, uint slot, uint j, bool is_v) {
    return is_v ? page * kv.PAGE_WORDS * 2u + kv.V_BIAS_H + head * kv.V_SB_HEAD_H + slot * kv.V_GROUPS + j
                : page * kv.PAGE_WORDS * 2u + kv.K_BIAS_H + head * kv.K_SB_HEAD_H + slot * kv.K_GROUPS + j;
}

// x̂ = q·s + b, kept unfused so that it rounds as the CPU's dequantization does: pool reads are bit-identical
// across backends. Metal compiles with fast math off (no contraction across statements), and the pragma keeps
// this product and sum apart even where a build turns contraction on; the emulator's C++ build runs with
// -ffp-contract=off (GCC's default in ISO C++ mode).
static inline float dequant(uint code, float s, float b) {
#if defined(__METAL_VERSION__)
#pragma clang fp contract(off)
#endif
    float p = float(code) * s;
    return p + b;
}

// Element c of a per-token row (f32, f16, q8, q4, and KIVI values).
static inline float row_elem(thread const kv_pool &kv, uint page, uint head, uint slot, uint c, bool is_v) {
    uint w = row_word(kv, page, head, slot, is_v);
    if (kv.FORMAT == FMT_F32) return as_type<float>(kv.pages[w + c]);
    if (kv.FORMAT == FMT_F16) return half_to_float((kv.pages[w + (c >> 1)] >> ((c & 1u) * 16u)) & 0xffffu);
    uint j = c / kv.GROUP;
    float s = page_half(kv, row_scale_half(kv, page, head, slot, j, is_v));
    float b = page_half(kv, row_bias_half(kv, page, head, slot, j, is_v));
    if (!is_v && kv.K_TILED != 0u) { // the code's word of a tiled key row
        uint bit = c * kv.BITS;
        return dequant((kv.pages[key_word(kv, page, head, slot, bit >> 5)] >> (bit & 31u)) & kv.CODE_MASK, s, b);
    }
    return dequant(page_code(kv, w, c), s, b);
}

// KIVI keys: channel c of the token at `slot`, packed per channel along g tokens.
static inline float kivi_key_elem(thread const kv_pool &kv, uint page, uint head, uint slot, uint c) {
    uint j = slot / kv.GROUP, t = slot % kv.GROUP;
    uint w = page * kv.PAGE_WORDS + kv.K_CODES_W + head * kv.K_CODES_HEAD_W + j * kv.K_ROW_W +
             c * (kv.GROUP * kv.BITS / 32u);
    uint hs = page * kv.PAGE_WORDS * 2u + head * kv.K_SB_HEAD_H + j * kv.D_K + c;
    return dequant(page_code(kv, w, t), page_half(kv, hs + kv.K_SCALE_H), page_half(kv, hs + kv.K_BIAS_H));
}

// Key / value element c of the token at (page, slot) as stored in pages.
static inline float key_elem(thread const kv_pool &kv, uint page, uint head, uint slot, uint c) {
    return kv.KIVI != 0u ? kivi_key_elem(kv, page, head, slot, c) : row_elem(kv, page, head, slot, c, false);
}
static inline float value_elem(thread const kv_pool &kv, uint page, uint head, uint slot, uint c) {
    return kv.V_IS_K_PREFIX != 0u ? key_elem(kv, page, head, slot, c) : row_elem(kv, page, head, slot, c, true);
}

// KIVI residual ring of slot `rs`: element c of position t (row t % RING_ROWS).
static inline uint ring_k_half(thread const kv_pool &kv, uint rs, uint t, uint head, uint c) {
    return rs * kv.RING_HALVES + kv.RING_K_H + ((t % kv.RING_ROWS) * kv.N_KV_HEADS + head) * kv.D_K + c;
}
static inline uint ring_v_half(thread const kv_pool &kv, uint rs, uint t, uint head, uint c) {
    return kv.V_IS_K_PREFIX != 0u
               ? ring_k_half(kv, rs, t, head, c)
               : rs * kv.RING_HALVES + kv.RING_V_H + ((t % kv.RING_ROWS) * kv.N_KV_HEADS + head) * kv.D_V + c;
}
static inline float ring_key(thread const kv_pool &kv, uint rs, uint t, uint head, uint c) {
    return ring_half(kv, ring_k_half(kv, rs, t, head, c));
}
static inline float ring_value(thread const kv_pool &kv, uint rs, uint t, uint head, uint c) {
    return ring_half(kv, ring_v_half(kv, rs, t, head, c));
}

// Inputs from the up buffer.
static inline float up_f(device uint *up, uint w) { return as_type<float>(up[w]); }
static inline int up_i(device uint *up, uint w) { return int(up[w]); }

// attend_inputs.glsl: the attention-family inputs (queries, page tables, masks, work tables) lie in up, or,
// staged (spec[GPU_SPEC_OP3] != 0: a device whose up buffer is host memory, and every Quest call), copied into
// scratch at word in_base; word offsets inside them are the same either way. in_u(i) of GLSL is in[i].
static inline device uint *inputs_of(device uint *up, device uint *scratch, constant uint *spec, uint in_base) {
    return spec[GPU_SPEC_OP3] != 0u ? scratch + in_base : up;
}
static inline float in_f(device uint *in, uint i) { return as_type<float>(in[i]); }

#endif
