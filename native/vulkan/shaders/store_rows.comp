// store_rows.comp: stores per-token rows in their page slots (docs/architecture.md §4, bridge/gokv_layout.h), as
// native/cpu/store.c's store_row: f32 bits, fp16, or q8/q4 groups of GROUP channels with fp16 scale and
// bias. In KIVI pools it stores the value rows of the token groups being quantized (their keys, per
// channel, are store_kivi_keys.comp's), from fp16 values as the CPU quantizes them from its ring.
//
// One invocation per unit of a row, items ordered (row, K then V, head, unit): a unit is a quantization
// group (it owns the group's code words; scale and bias halves may share a word with a neighbour's), or
// 4 channels of an f32/f16 row (whole words). Tiled keys (K_TILED, common.glsl's key_word) put all key
// items first, ordered (head, unit, row), then the values' (row, head, unit): neighbouring invocations
// then quantize one group of neighbouring rows, in a prefill neighbouring slots, whose code words are
// neighbours in their tile (a row-major order would write one word every KEY_TILE words).
//
// up: 4 words per row at meta_w: page, slot, source, ring slot.
//   ring slot == ~0u: source is a row of the input k (floats [rows][N_KV_HEADS][D_K] at k_w) and v (at
//                     v_w); KIVI rounds it to fp16 first.
//   otherwise:        source is a position of the sequence held in that residual ring (KIVI values).
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;

#define UP_QUAL readonly
#define STORE_QUANTIZE
#include "common.glsl"
#include "store_common.glsl"

#include "gpu_push.h"
PUSH_BLOCK(GOKV_PUSH_STORE_ROWS); // the fields: gpu_push.h

const uint UNIT = QUANTIZED ? GROUP : 4u;
const uint K_UNITS = KIVI != 0u ? 0u : N_KV_HEADS * (D_K / UNIT); // KIVI keys are stored per channel
const uint V_UNITS = V_IS_K_PREFIX != 0u ? 0u : N_KV_HEADS * (D_V / UNIT);

// src: x = first element (a word of up, or a half of rings), y = 1 for a ring source.
float quant_src(uvec4 src, uint i) {
    if (src.y != 0u) return ring_half(src.x + i);
    float x = up_f(src.x + i);
    return KIVI != 0u ? half_to_float(float_to_half(x)) : x;
}

void main() {
    uint item = store_item();
    if (item >= pc.n_items) return;
    const uint rows = pc.n_items / (K_UNITS + V_UNITS);
    uint row, u;
    bool is_v;
    if (K_TILED == 0u) {
        row = item / (K_UNITS + V_UNITS);
        u = item % (K_UNITS + V_UNITS);
        is_v = u >= K_UNITS;
        if (is_v) u -= K_UNITS;
    } else if (item < rows * K_UNITS) {
        row = item % rows;
        u = item / rows;
        is_v = false;
    } else {
        row = (item - rows * K_UNITS) / V_UNITS;
        u = (item - rows * K_UNITS) % V_UNITS;
        is_v = true;
    }
    uint d = is_v ? D_V : D_K;
    uint head = u / (d / UNIT), c0 = u % (d / UNIT) * UNIT;
    uint m = pc.meta_w + 4u * row;
    uint page = up[m], slot = up[m + 1u], source = up[m + 2u], ring_slot = up[m + 3u];
    uint w = row_word(page, head, slot, is_v);

    uvec4 src = ring_slot == ~0u
        ? uvec4((is_v ? pc.v_w : pc.k_w) + (source * N_KV_HEADS + head) * d + c0, 0u, 0u, 0u)
        : uvec4(ring_v_half(ring_slot, source, head, c0), 1u, 0u, 0u);
    if (FORMAT == FMT_F32) {
        for (uint i = 0u; i < 4u; i++) pages[w + c0 + i] = up[src.x + i];
    } else if (FORMAT == FMT_F16) {
        for (uint i = 0u; i < 2u; i++)
            pages[w + c0 / 2u + i] = float_to_half(up_f(src.x + 2u * i)) | (float_to_half(up_f(src.x + 2u * i + 1u)) << 16);
    } else {
        uint j = c0 / GROUP;
        uint code_word = is_v ? w + c0 * BITS / 32u : key_word(page, head, slot, c0 * BITS / 32u);
        quantize_group(src, code_word, is_v ? 1u : K_WORD_STEP, row_scale_half(page, head, slot, j, is_v),
                       row_bias_half(page, head, slot, j, is_v));
    }
}
