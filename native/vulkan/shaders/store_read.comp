// store_read.comp: dequantize-on-read (gokv_pool_read, DESIGN.md §4), as native/cpu/store.c's
// cpu_read_sequence: each output element is q * s + b (or the f32/f16 value) of the token's page slot, its
// KIVI ring row when the position is not quantized yet, or 0 for a released page. With V_IS_K_PREFIX the
// values are the first D_V channels of the keys (pages and ring alike).
//
// One invocation per output float: items [0, n_k_items) are k_out ([rows][N_KV_HEADS][D_K] at k_out_w in
// down), the rest v_out ([rows][N_KV_HEADS][D_V] at v_out_w).
// up: 4 words per row at meta_w: page (~0u: released), slot in the page, ring slot (~0u: read the page),
//     position.
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;

#define GOKV_READ_ONLY_POOL
#define UP_QUAL readonly
#include "common.glsl"
#include "store_common.glsl"

layout(push_constant) uniform Push {
    uint meta_w;    // word offset in up
    uint k_out_w;   // word offsets in down
    uint v_out_w;
    uint n_k_items; // rows * N_KV_HEADS * D_K
    uint n_items;   // n_k_items + (v_out ? rows * N_KV_HEADS * D_V : 0)
} pc;

// q * s + b kept unfused (`precise`), so it rounds as the CPU's does. common.glsl's row_elem and
// kivi_key_elem compute the same without that guarantee (a GPU compiler may fuse them into an fma).
float dequant(uint code, float s, float b) {
    precise float x = float(code) * s + b;
    return x;
}

// Element c of a per-token row: store_rows' formats.
float row_value(uint page, uint head, uint slot, uint c, bool is_v) {
    uint w = row_word(page, head, slot, is_v);
    if (FORMAT == FMT_F32) return uintBitsToFloat(pages[w + c]);
    if (FORMAT == FMT_F16) return half_to_float((pages[w + (c >> 1)] >> ((c & 1u) * 16u)) & 0xffffu);
    uint j = c / GROUP;
    return dequant(page_code(w, c), page_half(row_scale_half(page, head, slot, j, is_v)),
                   page_half(row_bias_half(page, head, slot, j, is_v)));
}

// KIVI key channel c of the token at slot: store_kivi_keys' layout.
float kivi_key(uint page, uint head, uint slot, uint c) {
    uint j = slot / GROUP;
    uint w = page * PAGE_WORDS + K_CODES_W + head * K_CODES_HEAD_W + j * K_ROW_W + c * (GROUP * BITS / 32u);
    uint sb = page * PAGE_WORDS * 2u + head * K_SB_HEAD_H + j * D_K + c;
    return dequant(page_code(w, slot % GROUP), page_half(sb + K_SCALE_H), page_half(sb + K_BIAS_H));
}

void main() {
    uint item = store_item();
    if (item >= pc.n_items) return;
    bool is_v = item >= pc.n_k_items;
    uint e = is_v ? item - pc.n_k_items : item;
    uint d = is_v ? D_V : D_K;
    uint row = e / (N_KV_HEADS * d), head = e % (N_KV_HEADS * d) / d, c = e % d;
    uint m = pc.meta_w + 4u * row;
    uint page = up[m], slot = up[m + 1u], ring_slot = up[m + 2u], pos = up[m + 3u];
    bool key = !is_v || V_IS_K_PREFIX != 0u; // MLA values are the keys' first D_V channels
    float x = 0.0;
    if (page == ~0u) {
        x = 0.0;
    } else if (ring_slot != ~0u) {
        x = key ? ring_key(ring_slot, pos, head, c) : ring_value(ring_slot, pos, head, c);
    } else {
        x = key ? (KIVI != 0u ? kivi_key(page, head, slot, c) : row_value(page, head, slot, c, false))
                : row_value(page, head, slot, c, true);
    }
    down[(is_v ? pc.v_out_w : pc.k_out_w) + e] = floatBitsToUint(x);
}
