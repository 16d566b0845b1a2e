// common.glsl: what every gokv compute shader shares (include it after #version 450 and
// "#extension GL_GOOGLE_include_directive : require"). Mirrors native/gpu/gpu_plan.h:
// specialization constants (GPU_SPEC_*), the five storage buffers of set 0, fp16 conversions that agree
// bit for bit with bridge/gokv_half.h, and element access for the page layout of bridge/gokv_layout.h.
//
// Before including, a shader that only reads the pool defines GOKV_READ_ONLY_POOL (pages and rings
// become readonly and the store helpers disappear); it may also define UP_QUAL / SCRATCH_QUAL / DOWN_QUAL
// (e.g. "readonly") to qualify the other buffers.

#ifdef GOKV_READ_ONLY_POOL
#define PAGES_QUAL readonly
#define RINGS_QUAL readonly
#else
#define PAGES_QUAL
#define RINGS_QUAL
#endif
#ifndef UP_QUAL
#define UP_QUAL
#endif
#ifndef SCRATCH_QUAL
#define SCRATCH_QUAL
#endif
#ifndef DOWN_QUAL
#define DOWN_QUAL
#endif

// ---- specialization constants (ids = GPU_SPEC_*) ----
layout(constant_id = 0) const uint FORMAT = 0;        // 0 f32, 1 f16, 2 q8, 3 q4, 4 kivi2, 5 kivi4
layout(constant_id = 1) const uint BITS = 32;
layout(constant_id = 2) const uint GROUP = 32;
layout(constant_id = 3) const uint PAGE_SIZE = 64;
layout(constant_id = 4) const uint N_KV_HEADS = 1;
layout(constant_id = 5) const uint D_K = 64;
layout(constant_id = 6) const uint D_V = 64;
layout(constant_id = 7) const uint V_IS_K_PREFIX = 0;
layout(constant_id = 8) const uint KIVI = 0;
layout(constant_id = 9) const uint RING_ROWS = 0;
layout(constant_id = 10) const uint PAGE_WORDS = 1;
layout(constant_id = 11) const uint K_CODES_W = 0;
layout(constant_id = 12) const uint K_SCALE_H = 0;
layout(constant_id = 13) const uint K_BIAS_H = 0;
layout(constant_id = 14) const uint V_CODES_W = 0;
layout(constant_id = 15) const uint V_SCALE_H = 0;
layout(constant_id = 16) const uint V_BIAS_H = 0;
layout(constant_id = 17) const uint K_CODES_HEAD_W = 0;
layout(constant_id = 18) const uint K_SB_HEAD_H = 0;
layout(constant_id = 19) const uint V_CODES_HEAD_W = 0;
layout(constant_id = 20) const uint V_SB_HEAD_H = 0;
layout(constant_id = 21) const uint K_ROW_W = 0;
layout(constant_id = 22) const uint V_ROW_W = 0;
layout(constant_id = 23) const uint K_GROUPS = 0;
layout(constant_id = 24) const uint V_GROUPS = 0;
layout(constant_id = 25) const uint RING_K_H = 0;
layout(constant_id = 26) const uint RING_V_H = 0;
layout(constant_id = 27) const uint RING_HALVES = 0;
layout(constant_id = 28) const uint WG_SIZE = 64;     // also local_size_x (layout(local_size_x_id = 28) in;)
layout(constant_id = 29) const uint SUBGROUP_SIZE = 32;
// ids 30..33 (GPU_SPEC_OP0..3) are declared by the shaders that use them.
layout(constant_id = 34) const uint K_TILED = 0;      // the layout's k_tiled (q4 keys; see key_word)

const uint FMT_F32 = 0u, FMT_F16 = 1u, FMT_Q8 = 2u, FMT_Q4 = 3u, FMT_KIVI2 = 4u, FMT_KIVI4 = 5u;
const uint KEY_TILE = 16u;                            // GOKV_KEY_TILE
const bool QUANTIZED = FORMAT >= FMT_Q8;
const uint CODE_MASK = BITS >= 32u ? 0xffffffffu : ((1u << BITS) - 1u);

// ---- buffers (set 0) ----
layout(std430, set = 0, binding = 0) PAGES_QUAL buffer PagesBuf { uint pages[]; };
layout(std430, set = 0, binding = 1) RINGS_QUAL buffer RingsBuf { uint rings[]; };
layout(std430, set = 0, binding = 2) UP_QUAL buffer UpBuf { uint up[]; };
layout(std430, set = 0, binding = 3) SCRATCH_QUAL buffer ScratchBuf { uint scratch[]; };
layout(std430, set = 0, binding = 4) DOWN_QUAL buffer DownBuf { uint down[]; };

// ---- fp16, exactly as bridge/gokv_half.h (round to nearest even, subnormals, inf, NaN) ----
float half_to_float(uint h) {
    uint sign = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1fu;
    uint man = h & 0x3ffu;
    if (e == 0u) {
        // subnormal or zero: man * 2^-24 is exact in f32
        float f = float(man) * 5.9604644775390625e-8;
        return sign != 0u ? -f : f;
    }
    if (e == 31u) return uintBitsToFloat(sign | 0x7f800000u | (man << 13));
    return uintBitsToFloat(sign | ((e + 112u) << 23) | (man << 13));
}

uint float_to_half(float f) {
    uint x = floatBitsToUint(f);
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
float page_half(uint i) { return half_to_float((pages[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu); }
float ring_half(uint i) { return half_to_float((rings[i >> 1] >> ((i & 1u) * 16u)) & 0xffffu); }

#ifndef GOKV_READ_ONLY_POOL
// Stores the fp16 bits h at half index i without disturbing the other half of the word (two invocations
// may own the two halves of one word: the and/or pairs commute).
void page_store_half(uint i, uint h) {
    uint sh = (i & 1u) * 16u;
    atomicAnd(pages[i >> 1], ~(0xffffu << sh));
    atomicOr(pages[i >> 1], (h & 0xffffu) << sh);
}
void ring_store_half(uint i, uint h) {
    uint sh = (i & 1u) * 16u;
    atomicAnd(rings[i >> 1], ~(0xffffu << sh));
    atomicOr(rings[i >> 1], (h & 0xffffu) << sh);
}
#endif

// The c-th packed code of BITS bits in the run of words starting at word w (BITS < 32).
uint page_code(uint w, uint c) {
    uint bit = c * BITS;
    return (pages[w + (bit >> 5)] >> (bit & 31u)) & CODE_MASK;
}

// ---- element access (what the kernels see: dequantized, never materialized) ----

// Word where kv head `head`'s per-token row `slot` of the K (is_v = false) or V section starts in page; a
// key row is one run of words only when K_TILED == 0 (else see key_word).
uint row_word(uint page, uint head, uint slot, bool is_v) {
    return is_v ? page * PAGE_WORDS + V_CODES_W + head * V_CODES_HEAD_W + slot * V_ROW_W
                : page * PAGE_WORDS + K_CODES_W + head * K_CODES_HEAD_W + slot * K_ROW_W;
}
// Word j of kv head `head`'s per-token key row `slot`. Tiled keys (K_TILED, bridge/gokv_layout.h: q4
// without v_is_k_prefix) lie in tiles of KEY_TILE tokens, dword-column-major: word j of slot t at tile
// t / KEY_TILE, column j, lane t % KEY_TILE. Consecutive words of one row are K_WORD_STEP apart, and
// invocations that take neighbouring tokens read neighbouring words: word j of KEY_TILE tokens is one
// 64-byte line (of plain rows, KEY_TILE lines).
const uint K_WORD_STEP = K_TILED != 0u ? KEY_TILE : 1u;
uint key_word(uint page, uint head, uint slot, uint j) {
    uint base = page * PAGE_WORDS + K_CODES_W + head * K_CODES_HEAD_W;
    return K_TILED != 0u ? base + (slot / KEY_TILE) * (KEY_TILE * K_ROW_W) + j * KEY_TILE + slot % KEY_TILE
                         : base + slot * K_ROW_W + j;
}
// Half index of the scale (bias: + bias_minus_scale) of group j of a per-token row.
uint row_scale_half(uint page, uint head, uint slot, uint j, bool is_v) {
    return is_v ? page * PAGE_WORDS * 2u + V_SCALE_H + head * V_SB_HEAD_H + slot * V_GROUPS + j
                : page * PAGE_WORDS * 2u + K_SCALE_H + head * K_SB_HEAD_H + slot * K_GROUPS + j;
}
uint row_bias_half(uint page, uint head, uint slot, uint j, bool is_v) {
    return is_v ? page * PAGE_WORDS * 2u + V_BIAS_H + head * V_SB_HEAD_H + slot * V_GROUPS + j
                : page * PAGE_WORDS * 2u + K_BIAS_H + head * K_SB_HEAD_H + slot * K_GROUPS + j;
}

// x̂ = q·s + b, kept unfused (`precise`) so that it rounds as the CPU's dequantization does (a GPU
// compiler may otherwise fuse it into an fma): pool reads are bit-identical across backends.
float dequant(uint code, float s, float b) {
    precise float x = float(code) * s + b;
    return x;
}

// Element c of a per-token row (f32, f16, q8, q4, and KIVI values).
float row_elem(uint page, uint head, uint slot, uint c, bool is_v) {
    uint w = row_word(page, head, slot, is_v);
    if (FORMAT == FMT_F32) return uintBitsToFloat(pages[w + c]);
    if (FORMAT == FMT_F16) return half_to_float((pages[w + (c >> 1)] >> ((c & 1u) * 16u)) & 0xffffu);
    uint j = c / GROUP;
    float s = page_half(row_scale_half(page, head, slot, j, is_v));
    float b = page_half(row_bias_half(page, head, slot, j, is_v));
    if (!is_v && K_TILED != 0u) { // the code's word of a tiled key row
        uint bit = c * BITS;
        return dequant((pages[key_word(page, head, slot, bit >> 5)] >> (bit & 31u)) & CODE_MASK, s, b);
    }
    return dequant(page_code(w, c), s, b);
}

// KIVI keys: channel c of the token at `slot`, packed per channel along g tokens.
float kivi_key_elem(uint page, uint head, uint slot, uint c) {
    uint j = slot / GROUP, t = slot % GROUP;
    uint w = page * PAGE_WORDS + K_CODES_W + head * K_CODES_HEAD_W + j * K_ROW_W + c * (GROUP * BITS / 32u);
    uint hs = page * PAGE_WORDS * 2u + head * K_SB_HEAD_H + j * D_K + c;
    return dequant(page_code(w, t), page_half(hs + K_SCALE_H), page_half(hs + K_BIAS_H));
}

// Key / value element c of the token at (page, slot) as stored in pages.
float key_elem(uint page, uint head, uint slot, uint c) {
    return KIVI != 0u ? kivi_key_elem(page, head, slot, c) : row_elem(page, head, slot, c, false);
}
float value_elem(uint page, uint head, uint slot, uint c) {
    return V_IS_K_PREFIX != 0u ? key_elem(page, head, slot, c) : row_elem(page, head, slot, c, true);
}

// KIVI residual ring of slot `rs`: element c of position t (row t % RING_ROWS).
uint ring_k_half(uint rs, uint t, uint head, uint c) {
    return rs * RING_HALVES + RING_K_H + ((t % RING_ROWS) * N_KV_HEADS + head) * D_K + c;
}
uint ring_v_half(uint rs, uint t, uint head, uint c) {
    return V_IS_K_PREFIX != 0u ? ring_k_half(rs, t, head, c)
                               : rs * RING_HALVES + RING_V_H + ((t % RING_ROWS) * N_KV_HEADS + head) * D_V + c;
}
float ring_key(uint rs, uint t, uint head, uint c) { return ring_half(ring_k_half(rs, t, head, c)); }
float ring_value(uint rs, uint t, uint head, uint c) { return ring_half(ring_v_half(rs, t, head, c)); }

// Inputs from the up buffer.
float up_f(uint w) { return uintBitsToFloat(up[w]); }
int up_i(uint w) { return int(up[w]); }
