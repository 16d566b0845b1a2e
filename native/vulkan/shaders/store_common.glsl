// store_common.glsl: what the store shaders (store_rows, store_kivi_keys, store_ring, store_read) share,
// included after common.glsl: the flat invocation index of a 2D grid, a correctly rounded division, and (with
// STORE_QUANTIZE) the quantization of one group exactly as native/cpu/store.c does it (docs/architecture.md
// §4).
//
// Bit-exactness with the CPU: Vulkan guarantees correctly rounded add, sub and mul, but allows 2.5 ulp for
// division and lets the driver fuse a*b+c into an fma. So every arithmetic result here is `precise` (no
// contraction), and divisions go through div_rn, an exact integer long division.

// The invocation's index in a grid of gl_NumWorkGroups.x * gl_NumWorkGroups.y workgroups of WG_SIZE
// (the host splits large grids into 2D to keep each count <= 65535).
uint store_item() {
    return (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * WG_SIZE + gl_LocalInvocationID.x;
}

// a / b rounded to nearest even, as IEEE division does on the CPU, for finite a and a normal b > 0.
// Quotients outside the normal float range use the plain division: here they only come from numerators
// below 2^-102, and round to fp16 zero and quantize to code 0 whatever their last bits are.
float div_rn(float a, float b) {
    uint ua = floatBitsToUint(a), ub = floatBitsToUint(b);
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
    return uintBitsToFloat(((ua ^ ub) & 0x80000000u) | (uint(e) << 23) | (q & 0x7fffffu));
}

#ifdef STORE_QUANTIZE
// A shader that quantizes defines STORE_QUANTIZE before the include, and quant_src: value i
// (0 <= i < GROUP) of the group that `src` describes.
float quant_src(uvec4 src, uint i);

// Quantizes the GROUP values of quant_src(src, .) to BITS-bit codes against their fp16 scale and bias,
// exactly as store.c's quantize_group + pack_codes: s = fp16((hi - lo) / qmax), b = fp16(lo),
// q = clamp(floor((x - b) / s + 1/2), 0, qmax) (0 when s == 0). Codes go to the GROUP * BITS / 32 words
// from pages[code_word], code_stride apart (1, or a tiled key row's K_WORD_STEP; code i at bit i * BITS of
// the run: the invocation owns these words); scale and bias to page halves scale_half and bias_half (they
// may share a word with another invocation's).
void quantize_group(uvec4 src, uint code_word, uint code_stride, uint scale_half, uint bias_half) {
    precise float lo = quant_src(src, 0u);
    precise float hi = lo;
    for (uint i = 1u; i < GROUP; i++) {
        float v = quant_src(src, i);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    float qmax = float(CODE_MASK);
    precise float range = hi - lo;
    uint s16 = float_to_half(div_rn(range, qmax));
    uint b16 = float_to_half(lo);
    page_store_half(scale_half, s16);
    page_store_half(bias_half, b16);
    float s = half_to_float(s16), b = half_to_float(b16);

    uint word = 0u;
    for (uint i = 0u; i < GROUP; i++) {
        precise float code = 0.0;
        if (s > 0.0) {
            precise float d = quant_src(src, i) - b;
            code = floor(div_rn(d, s) + 0.5);
        }
        code = code < 0.0 ? 0.0 : (code > qmax ? qmax : code);
        uint bit = i * BITS;
        word |= uint(code) << (bit & 31u);
        if (((bit + BITS) & 31u) == 0u) {
            pages[code_word + (bit >> 5) * code_stride] = word;
            word = 0u;
        }
    }
}
#endif
