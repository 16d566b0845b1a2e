// store_common.h: what the store and Quest kernels share (store_rows, store_kivi_keys, store_ring, store_read,
// store_bounds, quest_score, quest_select), included after common.h: the flat thread index of a 2D grid, a
// correctly rounded division, and the quantization of one group exactly as native/cpu/store.c does it
// (docs/architecture.md §4). A port of native/vulkan/shaders/store_common.glsl, line for line where the
// languages allow, so that the two GPU modules store the same bytes as the CPU.
//
// Bit-exactness with the CPU: the kernels are built without fast-math, so add, sub and mul round
// correctly, but Metal's float division need not (and a compiler may fuse a*b+c into an fma: the
// quantization has no such pair, quest_score.metal keeps its own apart as common.h's dequant does). So
// divisions go through div_rn, an exact integer long division.
#ifndef GOKV_MTL_STORE_COMMON_H
#define GOKV_MTL_STORE_COMMON_H

#include "common.h"

// The thread's index in a grid of n_groups.x * n_groups.y threadgroups of wg_dims.x threads (the host
// splits large grids into 2D to keep each count <= 65535: gpu_dispatch_linear).
static inline uint store_item(uint3 group_id, uint3 n_groups, uint lid, uint3 wg_dims) {
    return (group_id.y * n_groups.x + group_id.x) * wg_dims.x + lid;
}

// a / b rounded to nearest even, as IEEE division does on the CPU, for finite a and a normal b > 0.
// Quotients outside the normal float range use the plain division: here they only come from numerators
// below 2^-102, and round to fp16 zero and quantize to code 0 whatever their last bits are.
static inline float div_rn(float a, float b) {
    uint ua = as_type<uint>(a), ub = as_type<uint>(b);
    uint ea = (ua >> 23) & 0xffu, eb = (ub >> 23) & 0xffu;
    if (ea == 0u) return a / b; // zero or subnormal numerator
    uint ma = (ua & 0x7fffffu) | 0x800000u, mb = (ub & 0x7fffffu) | 0x800000u;
    int e = int(ea) - int(eb) + 127;
    if (ma < mb) { // bring the mantissa quotient into [1, 2)
        ma <<= 1;
        e -= 1;
    }
    // 24 quotient bits by shift-and-subtract; the remainder stays below 2 * mb < 2^25
    uint q = 0u, r = ma;
    for (int i = 0; i < 24; i++) {
        q <<= 1;
        if (r >= mb) {
            r -= mb;
            q |= 1u;
        }
        r <<= 1;
    }
    // r is twice the final remainder: compare it with mb to round half to even
    if (r > mb || (r == mb && (q & 1u) != 0u)) q += 1u;
    if (q == 0x1000000u) {
        q >>= 1;
        e += 1;
    }
    if (e <= 0 || e >= 255) return a / b;
    return as_type<float>(((ua ^ ub) & 0x80000000u) | (uint(e) << 23) | (q & 0x7fffffu));
}

// Quantizes the group values src.at(kv, 0 .. GROUP - 1) to BITS-bit codes against their fp16 scale and bias,
// exactly as store.c's quantize_group + pack_codes: s = fp16((hi - lo) / qmax), b = fp16(lo),
// q = clamp(floor((x - b) / s + 1/2), 0, qmax) (0 when s == 0). Codes go to the GROUP * BITS / 32 words
// from pages[code_word], code_stride apart (1, or a tiled key row's K_WORD_STEP; code i at bit i * BITS of
// the run: the thread owns these words); scale and bias to page halves scale_half and bias_half (they may
// share a word with another thread's: page_store_half's atomic and/or). Src is the kernel's source of
// values (a struct with float at(kv, i) const), what the GLSL's quant_src(src, i) is.
template <typename Src>
static inline void quantize_group(thread const kv_pool &kv, thread const Src &src, uint code_word, uint code_stride,
                                  uint scale_half, uint bias_half) {
    float lo = src.at(kv, 0u);
    float hi = lo;
    for (uint i = 1u; i < kv.GROUP; i++) {
        const float v = src.at(kv, i);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    const float qmax = float(kv.CODE_MASK);
    const float range = hi - lo;
    const uint s16 = float_to_half(div_rn(range, qmax));
    const uint b16 = float_to_half(lo);
    page_store_half(kv, scale_half, s16);
    page_store_half(kv, bias_half, b16);
    const float s = half_to_float(s16), b = half_to_float(b16);

    uint word = 0u;
    for (uint i = 0u; i < kv.GROUP; i++) {
        float code = 0.0f;
        if (s > 0.0f) {
            const float d = src.at(kv, i) - b;
            const float scaled = div_rn(d, s);
            code = floor(scaled + 0.5f);
        }
        code = code < 0.0f ? 0.0f : (code > qmax ? qmax : code);
        const uint bit = i * kv.BITS;
        word |= uint(code) << (bit & 31u);
        if (((bit + kv.BITS) & 31u) == 0u) {
            kv.pages[code_word + (bit >> 5) * code_stride] = word;
            word = 0u;
        }
    }
}

#endif
