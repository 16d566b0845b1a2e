// store_common.hpp: what the store and Quest kernels share (store_rows, store_kivi_keys, store_ring, store_read,
// store_bounds, quest_score, quest_select), built on common.hpp: the flat thread index of a 2D grid, a
// correctly rounded division, and the quantization of one group exactly as native/cpu/store.c does it
// (docs/architecture.md §4). A port of native/metal/kernels/store_common.h (itself the port of
// native/vulkan/shaders/store_common.glsl), line for line where the languages allow, so that every GPU module
// stores the same bytes as the CPU.
//
// Bit-exactness with the CPU: the kernels are built without fast math, so add, sub and mul round correctly,
// but a device's float division need not (SYCL 2020 allows 2.5 ulp for float division unless a build flag
// asks for IEEE division), so divisions go through div_rn, an exact integer long division. The quantization
// has no product followed by a sum that a compiler could fuse into an fma (quest_score.hpp keeps its own in
// separate statements; common.hpp's dequant is exact either way).
#ifndef GOKV_SYCL_STORE_COMMON_HPP
#define GOKV_SYCL_STORE_COMMON_HPP

#include "common.hpp"

namespace gokv_sycl {

// The work-item's index in a grid of work-groups of get_local_range(2) work-items, taken in the plan's
// workgroup order (common.hpp's plan_workgroup: the plan splits large grids into 2D to keep each count
// <= 65535, gpu_dispatch_linear).
inline uint32_t store_item(const sycl::nd_item<3> &it) {
    return plan_workgroup(it) * uint32_t(it.get_local_range(2)) + uint32_t(it.get_local_id(2));
}

// a / b rounded to nearest even, as IEEE division does on the CPU, for finite a and a normal b > 0.
// Quotients outside the normal float range use the plain division: here they only come from numerators
// below 2^-102, and round to fp16 zero and quantize to code 0 whatever their last bits are.
inline float div_rn(float a, float b) {
    const uint32_t ua = sycl::bit_cast<uint32_t>(a), ub = sycl::bit_cast<uint32_t>(b);
    const uint32_t ea = (ua >> 23) & 0xffu, eb = (ub >> 23) & 0xffu;
    if (ea == 0u) return a / b; // zero or subnormal numerator
    uint32_t ma = (ua & 0x7fffffu) | 0x800000u, mb = (ub & 0x7fffffu) | 0x800000u;
    int e = int(ea) - int(eb) + 127;
    if (ma < mb) { // bring the mantissa quotient into [1, 2)
        ma <<= 1;
        e -= 1;
    }
    // 24 quotient bits by shift-and-subtract; the remainder stays below 2 * mb < 2^25
    uint32_t q = 0u, r = ma;
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
    return sycl::bit_cast<float>(((ua ^ ub) & 0x80000000u) | (uint32_t(e) << 23) | (q & 0x7fffffu));
}

// Quantizes the group values src.at(kv, 0 .. GROUP - 1) to BITS-bit codes against their fp16 scale and bias,
// exactly as store.c's quantize_group + pack_codes: s = fp16((hi - lo) / qmax), b = fp16(lo),
// q = clamp(floor((x - b) / s + 1/2), 0, qmax) (0 when s == 0). Codes go to the GROUP * BITS / 32 words
// from pages[code_word], code_stride apart (1, or a tiled key row's K_WORD_STEP; code i at bit i * BITS of
// the run: the thread owns these words); scale and bias to page halves scale_half and bias_half (they may
// share a word with another thread's: page_store_half's atomic and/or). Src is the kernel's source of
// values (a struct with float at(kv, i) const), what the GLSL's quant_src(src, i) is.
template <typename Src>
inline void quantize_group(const kv_pool &kv, const Src &src, uint32_t code_word, uint32_t code_stride,
                                  uint32_t scale_half, uint32_t bias_half) {
    float lo = src.at(kv, 0u);
    float hi = lo;
    for (uint32_t i = 1u; i < kv.GROUP; i++) {
        const float v = src.at(kv, i);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    const float qmax = float(kv.CODE_MASK);
    const float range = hi - lo;
    const uint32_t s16 = float_to_half(div_rn(range, qmax));
    const uint32_t b16 = float_to_half(lo);
    page_store_half(kv, scale_half, s16);
    page_store_half(kv, bias_half, b16);
    const float s = half_to_float(s16), b = half_to_float(b16);

    uint32_t word = 0u;
    for (uint32_t i = 0u; i < kv.GROUP; i++) {
        float code = 0.0f;
        if (s > 0.0f) {
            const float d = src.at(kv, i) - b;
            const float scaled = div_rn(d, s);
            code = sycl::floor(scaled + 0.5f);
        }
        code = code < 0.0f ? 0.0f : (code > qmax ? qmax : code);
        const uint32_t bit = i * kv.BITS;
        word |= uint32_t(code) << (bit & 31u);
        if (((bit + kv.BITS) & 31u) == 0u) {
            kv.pages[code_word + (bit >> 5) * code_stride] = word;
            word = 0u;
        }
    }
}

} // namespace gokv_sycl

#endif
