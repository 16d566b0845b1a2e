// common.hpp: what every gokv SYCL kernel shares; the port of native/metal/kernels/common.h (itself the port of
// native/vulkan/shaders/common.glsl): the same function names and results. fp16 conversions that agree bit for
// bit with bridge/gokv_half.h, element access for the page layout of bridge/gokv_layout.h (docs/architecture.md
// §3, §4), and where the attention-family kernels read their inputs (attend_inputs.glsl). SYCL 2020 only; the
// same source compiles with icpx -fsycl and with g++ against the emulator's shim (sycl_kernel.hpp has the
// rules).
//
// How a kernel uses it. Everything lives in namespace gokv_sycl. A kernel builds one kv_pool from its args at
// its start and passes it to every helper as the first argument (the Metal signatures, `thread const kv_pool &`
// becoming `const kv_pool &`); its members keep the GLSL specialization constants' names:
//
//     template <uint32_t N> struct store_rows_kernel {
//         args a;
//         local_words tg;
//         void operator()(sycl::nd_item<3> it) const {
//             const kv_pool kv = kv_pool_of(a.pages, a.rings, a.spec);   // kv.FORMAT, kv.D_K, ...
//             const store_rows_push pc = push_of<store_rows_push>(a);
//             uint32_t *in = inputs_of(a.up, a.scratch, a.spec, pc.in_base);   // in_u(i) of GLSL: in[i]
//             float x = row_elem(kv, page, head, slot, c, false);
//             page_store_half(kv, half_index, float_to_half(x));
//         }
//     };
//
// Signatures (GLSL name, then this one):
//     half_to_float(h), float_to_half(f)                      unchanged (no pool)
//     page_half(i), ring_half(i)                              page_half(kv, i), ring_half(kv, i)
//     page_store_half(i, h), ring_store_half(i, h)            page_store_half(kv, i, h), ring_store_half(kv, i, h)
//     page_code(w, c)                                         page_code(kv, w, c)
//     row_word, key_word, row_scale_half, row_bias_half       (kv, page, head, slot, ...) as in GLSL
//     dequant(code, s, b)                                     unchanged (rounds as the CPU's, see below)
//     row_elem, kivi_key_elem, key_elem, value_elem           (kv, page, head, slot, c[, is_v]) as in GLSL
//     ring_k_half, ring_v_half, ring_key, ring_value          (kv, rs, t, head, c) as in GLSL
//     up_f(w), up_i(w)                                        up_f(up, w), up_i(up, w)
//     in_u(i), in_f(i) (attend_inputs.glsl)                   in[i], in_f(in, i) with in = inputs_of(...)
//     FMT_*, KEY_TILE                                         unchanged (constants)
//     FORMAT, BITS, ..., K_TILED, QUANTIZED, CODE_MASK,       kv.FORMAT, kv.BITS, ... (kv_pool's members)
//     K_WORD_STEP
//     as_type<float>(u), as_type<uint>(f) (Metal)             sycl::bit_cast<float>(u), sycl::bit_cast<uint32_t>(f)
//     constant <op>_push &pc = *(constant <op>_push *)push    const <op>_push pc = push_of<<op>_push>(a)
// Specialization ids: GPU_SPEC_* of native/gpu/gpu_spec.h (spec[GPU_SPEC_OP2] for the op's own constants).
// The store helpers write through device atomics (atomic_ref fetch_and / fetch_or), so two threads may own the
// two halves of one word, as in GLSL. kv.pages / kv.rings may be repointed (baseline_attend reads its f32 copy
// in scratch through the same helpers).
#ifndef GOKV_SYCL_COMMON_HPP
#define GOKV_SYCL_COMMON_HPP

#include "sycl_kernel.hpp"

#include <cstdint>
#include <cstring>

namespace gokv_sycl {

constexpr uint32_t FMT_F32 = 0u, FMT_F16 = 1u, FMT_Q8 = 2u, FMT_Q4 = 3u, FMT_KIVI2 = 4u, FMT_KIVI4 = 5u;
constexpr uint32_t KEY_TILE = 16u; // GOKV_KEY_TILE

// The kernel's push constant block (a struct of gpu_push.h's PUSH_FIELD list: 4-byte scalars, no padding),
// copied out of the push words of its args.
template <class P> inline P push_of(const args &a) {
    static_assert(sizeof(P) <= sizeof(a.push), "push block larger than the push words");
    P p;
    std::memcpy(&p, a.push, sizeof(P));
    return p;
}

// The plan's workgroup index of the work-group running `it` (gy * groups in x + gx; sycl_kernel.hpp's nd_range
// layout puts the plan's x in dimension 2): an attention item, a reduce entry, a store page, ...
inline uint32_t plan_workgroup(const sycl::nd_item<3> &it) {
    return uint32_t(it.get_group(1) * it.get_group_range(2) + it.get_group(2));
}

// The pool's buffers and the layout's constants (the GLSL specialization constants, same names).
struct kv_pool {
    uint32_t *pages;
    uint32_t *rings;
    uint32_t FORMAT, BITS, GROUP, PAGE_SIZE, N_KV_HEADS, D_K, D_V, V_IS_K_PREFIX, KIVI, RING_ROWS, PAGE_WORDS;
    uint32_t K_CODES_W, K_SCALE_H, K_BIAS_H, V_CODES_W, V_SCALE_H, V_BIAS_H;
    uint32_t K_CODES_HEAD_W, K_SB_HEAD_H, V_CODES_HEAD_W, V_SB_HEAD_H, K_ROW_W, V_ROW_W, K_GROUPS, V_GROUPS;
    uint32_t RING_K_H, RING_V_H, RING_HALVES, WG_SIZE, SUBGROUP_SIZE, K_TILED;
    uint32_t CODE_MASK;   // (1 << BITS) - 1, all ones for f32
    uint32_t K_WORD_STEP; // words between consecutive words of one key row (see key_word)
    bool QUANTIZED;
};

inline kv_pool kv_pool_of(uint32_t *pages, uint32_t *rings, const uint32_t *spec) {
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
inline float half_to_float(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (e == 0u) {
        // subnormal or zero: man * 2^-24 is exact in f32
        float f = float(man) * 5.9604644775390625e-8f;
        return sign != 0u ? -f : f;
    }
    if (e == 31u) return sycl::bit_cast<float>(sign | 0x7f800000u | (man << 13));
    return sycl::bit_cast<float>(sign | ((e + 112u) << 23) | (man << 13));
}

inline uint32_t float_to_half(float f) {
    uint32_t x = sycl::bit_cast<uint32_t>(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u);
    if (absx >= 0x477ff000u) return sign | 0x7c00u;
    if (absx < 0x38800000u) {
        if (absx < 0x33000000u) return sign;
        uint32_t e = absx >> 23;
        uint32_t man = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;
        uint32_t half_man = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (half_man & 1u) != 0u)) half_man++;
        return sign | half_man;
    }
    uint32_t r = absx + 0xfffu + ((absx >> 13) & 1u) - (112u << 23);
    return sign | (r >> 13);
}

// The fp16 at half index i of a buffer.
inline float page_half(const kv_pool &kv, uint32_t i) {
    return half_to_float((kv.pages[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu);
}
inline float ring_half(const kv_pool &kv, uint32_t i) {
    return half_to_float((kv.rings[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu);
}

// Stores the fp16 bits h at half index i without disturbing the other half of the word (two threads may own
// the two halves of one word: the and/or pairs commute).
inline void half_store_atomic(uint32_t *buf, uint32_t i, uint32_t h) {
    uint32_t sh = (i & 1u) * 16u;
    sycl::atomic_ref<uint32_t, sycl::memory_order::relaxed, sycl::memory_scope::device,
                     sycl::access::address_space::global_space>
        w(buf[i >> 1]);
    w.fetch_and(~(0xffffu << sh));
    w.fetch_or((h & 0xffffu) << sh);
}
inline void page_store_half(const kv_pool &kv, uint32_t i, uint32_t h) { half_store_atomic(kv.pages, i, h); }
inline void ring_store_half(const kv_pool &kv, uint32_t i, uint32_t h) { half_store_atomic(kv.rings, i, h); }

// The c-th packed code of BITS bits in the run of words starting at word w (BITS < 32).
inline uint32_t page_code(const kv_pool &kv, uint32_t w, uint32_t c) {
    uint32_t bit = c * kv.BITS;
    return (kv.pages[w + (bit >> 5)] >> (bit & 31u)) & kv.CODE_MASK;
}

// ---- element access (what the kernels see: dequantized, never materialized) ----

// Word where kv head `head`'s per-token row `slot` of the K (is_v = false) or V section starts in page; a
// key row is one run of words only when K_TILED == 0 (else see key_word).
inline uint32_t row_word(const kv_pool &kv, uint32_t page, uint32_t head, uint32_t slot, bool is_v) {
    return is_v ? page * kv.PAGE_WORDS + kv.V_CODES_W + head * kv.V_CODES_HEAD_W + slot * kv.V_ROW_W
                : page * kv.PAGE_WORDS + kv.K_CODES_W + head * kv.K_CODES_HEAD_W + slot * kv.K_ROW_W;
}
// Word j of kv head `head`'s per-token key row `slot`. Tiled keys (K_TILED, bridge/gokv_layout.h: q4 without
// v_is_k_prefix) lie in tiles of KEY_TILE tokens, dword-column-major: word j of slot t at tile t / KEY_TILE,
// column j, lane t % KEY_TILE; consecutive words of one row are K_WORD_STEP apart, and threads that take
// neighbouring tokens read neighbouring words.
inline uint32_t key_word(const kv_pool &kv, uint32_t page, uint32_t head, uint32_t slot, uint32_t j) {
    uint32_t base = page * kv.PAGE_WORDS + kv.K_CODES_W + head * kv.K_CODES_HEAD_W;
    return kv.K_TILED != 0u ? base + (slot / KEY_TILE) * (KEY_TILE * kv.K_ROW_W) + j * KEY_TILE + slot % KEY_TILE
                            : base + slot * kv.K_ROW_W + j;
}
// Half index of the scale (bias) of group j of a per-token row.
inline uint32_t row_scale_half(const kv_pool &kv, uint32_t page, uint32_t head, uint32_t slot, uint32_t j,
                               bool is_v) {
    return is_v ? page * kv.PAGE_WORDS * 2u + kv.V_SCALE_H + head * kv.V_SB_HEAD_H + slot * kv.V_GROUPS + j
                : page * kv.PAGE_WORDS * 2u + kv.K_SCALE_H + head * kv.K_SB_HEAD_H + slot * kv.K_GROUPS + j;
}
inline uint32_t row_bias_half(const kv_pool &kv, uint32_t page, uint32_t head, uint32_t slot, uint32_t j,
                              bool is_v) {
    return is_v ? page * kv.PAGE_WORDS * 2u + kv.V_BIAS_H + head * kv.V_SB_HEAD_H + slot * kv.V_GROUPS + j
                : page * kv.PAGE_WORDS * 2u + kv.K_BIAS_H + head * kv.K_SB_HEAD_H + slot * kv.K_GROUPS + j;
}

// x̂ = q·s + b, rounded as the CPU's dequantization rounds it (pool reads are bit-identical across backends)
// under every compiler and contraction setting, with no pragma: a code has at most 8 significant bits (q8, q4,
// KIVI 4/2) and a scale is an fp16 (11), so q·s has at most 19 significant bits and no under- or overflow and
// is exact in f32. The only rounding is that of the sum, whether a compiler contracts the two into an fma or
// not. (g++ builds with -ffp-contract=off anyway; icpx may contract.)
inline float dequant(uint32_t code, float s, float b) {
    float p = float(code) * s;
    return p + b;
}

// Element c of a per-token row (f32, f16, q8, q4, and KIVI values).
inline float row_elem(const kv_pool &kv, uint32_t page, uint32_t head, uint32_t slot, uint32_t c, bool is_v) {
    uint32_t w = row_word(kv, page, head, slot, is_v);
    if (kv.FORMAT == FMT_F32) return sycl::bit_cast<float>(kv.pages[w + c]);
    if (kv.FORMAT == FMT_F16) return half_to_float((kv.pages[w + (c >> 1)] >> ((c & 1u) * 16u)) & 0xffffu);
    uint32_t j = c / kv.GROUP;
    float s = page_half(kv, row_scale_half(kv, page, head, slot, j, is_v));
    float b = page_half(kv, row_bias_half(kv, page, head, slot, j, is_v));
    if (!is_v && kv.K_TILED != 0u) { // the code's word of a tiled key row
        uint32_t bit = c * kv.BITS;
        return dequant((kv.pages[key_word(kv, page, head, slot, bit >> 5)] >> (bit & 31u)) & kv.CODE_MASK, s, b);
    }
    return dequant(page_code(kv, w, c), s, b);
}

// KIVI keys: channel c of the token at `slot`, packed per channel along g tokens.
inline float kivi_key_elem(const kv_pool &kv, uint32_t page, uint32_t head, uint32_t slot, uint32_t c) {
    uint32_t j = slot / kv.GROUP, t = slot % kv.GROUP;
    uint32_t w = page * kv.PAGE_WORDS + kv.K_CODES_W + head * kv.K_CODES_HEAD_W + j * kv.K_ROW_W +
                 c * (kv.GROUP * kv.BITS / 32u);
    uint32_t hs = page * kv.PAGE_WORDS * 2u + head * kv.K_SB_HEAD_H + j * kv.D_K + c;
    return dequant(page_code(kv, w, t), page_half(kv, hs + kv.K_SCALE_H), page_half(kv, hs + kv.K_BIAS_H));
}

// Key / value element c of the token at (page, slot) as stored in pages.
inline float key_elem(const kv_pool &kv, uint32_t page, uint32_t head, uint32_t slot, uint32_t c) {
    return kv.KIVI != 0u ? kivi_key_elem(kv, page, head, slot, c) : row_elem(kv, page, head, slot, c, false);
}
inline float value_elem(const kv_pool &kv, uint32_t page, uint32_t head, uint32_t slot, uint32_t c) {
    return kv.V_IS_K_PREFIX != 0u ? key_elem(kv, page, head, slot, c) : row_elem(kv, page, head, slot, c, true);
}

// KIVI residual ring of slot `rs`: element c of position t (row t % RING_ROWS).
inline uint32_t ring_k_half(const kv_pool &kv, uint32_t rs, uint32_t t, uint32_t head, uint32_t c) {
    return rs * kv.RING_HALVES + kv.RING_K_H + ((t % kv.RING_ROWS) * kv.N_KV_HEADS + head) * kv.D_K + c;
}
inline uint32_t ring_v_half(const kv_pool &kv, uint32_t rs, uint32_t t, uint32_t head, uint32_t c) {
    return kv.V_IS_K_PREFIX != 0u
               ? ring_k_half(kv, rs, t, head, c)
               : rs * kv.RING_HALVES + kv.RING_V_H + ((t % kv.RING_ROWS) * kv.N_KV_HEADS + head) * kv.D_V + c;
}
inline float ring_key(const kv_pool &kv, uint32_t rs, uint32_t t, uint32_t head, uint32_t c) {
    return ring_half(kv, ring_k_half(kv, rs, t, head, c));
}
inline float ring_value(const kv_pool &kv, uint32_t rs, uint32_t t, uint32_t head, uint32_t c) {
    return ring_half(kv, ring_v_half(kv, rs, t, head, c));
}

// Inputs from the up buffer.
inline float up_f(const uint32_t *up, uint32_t w) { return sycl::bit_cast<float>(up[w]); }
inline int32_t up_i(const uint32_t *up, uint32_t w) { return int32_t(up[w]); }

// attend_inputs.glsl: the attention-family inputs (queries, page tables, masks, work tables) lie in up, or,
// staged (spec[GPU_SPEC_OP3] != 0: a device whose up buffer is host memory, and every Quest call), copied into
// scratch at word in_base; word offsets inside them are the same either way. in_u(i) of GLSL is in[i].
inline uint32_t *inputs_of(uint32_t *up, uint32_t *scratch, const uint32_t *spec, uint32_t in_base) {
    return spec[GPU_SPEC_OP3] != 0u ? scratch + in_base : up;
}
inline float in_f(const uint32_t *in, uint32_t i) { return sycl::bit_cast<float>(in[i]); }

} // namespace gokv_sycl

#endif
