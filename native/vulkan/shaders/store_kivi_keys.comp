// store_kivi_keys.comp: quantizes the keys of KIVI token groups per channel (docs/architecture.md §4), as the
// key half of native/cpu/store.c's kivi_flush_group: for each kv head and channel, the g tokens of the group
// form one quantization group, its codes packed along the tokens (channel c's run of GROUP * BITS / 8 bytes
// in the page's key group j), its fp16 scale and bias at [head][j][c].
//
// The CPU quantizes a group from its fp16 ring copies; here each token comes from the ring if it was
// there before this write (t < n0) or from the new input rows, rounded to fp16 (t >= n0). The host puts a
// barrier between this and store_ring.comp, which overwrites ring rows.
//
// One invocation per (group, head, channel): it owns the channel's code words.
// up: 6 words per group at meta_w: page, j (key group in the page), ring slot, t0 (first position),
//     n0 (the sequence's length before the write), row of position n0 in the input k (floats
//     [rows][N_KV_HEADS][D_K] at k_w).
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;

#define UP_QUAL readonly
#define STORE_QUANTIZE
#include "common.glsl"
#include "store_common.glsl"

#include "gpu_push.h"
PUSH_BLOCK(GOKV_PUSH_STORE_KIVI_KEYS); // the fields: gpu_push.h

const uint TOKEN_STRIDE = N_KV_HEADS * D_K; // between consecutive tokens, in ring halves and input words

// src: x = ring half of (head, channel) in ring row 0, y = input word of (head, channel) at position n0,
// z = t0, w = n0.
float quant_src(uvec4 src, uint i) {
    uint t = src.z + i;
    if (t < src.w) return ring_half(src.x + t % RING_ROWS * TOKEN_STRIDE);
    return half_to_float(float_to_half(up_f(src.y + (t - src.w) * TOKEN_STRIDE)));
}

void main() {
    uint item = store_item();
    if (item >= pc.n_items) return;
    uint group = item / TOKEN_STRIDE, head = item % TOKEN_STRIDE / D_K, c = item % D_K;
    uint m = pc.meta_w + 6u * group;
    uint page = up[m], j = up[m + 1u], ring_slot = up[m + 2u], t0 = up[m + 3u], n0 = up[m + 4u], row = up[m + 5u];

    uvec4 src = uvec4(ring_k_half(ring_slot, 0u, head, c), pc.k_w + (row * N_KV_HEADS + head) * D_K + c, t0, n0);
    uint code_word = page * PAGE_WORDS + K_CODES_W + head * K_CODES_HEAD_W + j * K_ROW_W + c * (GROUP * BITS / 32u);
    uint sb = page * PAGE_WORDS * 2u + head * K_SB_HEAD_H + j * D_K + c;
    quantize_group(src, code_word, 1u, sb + K_SCALE_H, sb + K_BIAS_H);
}
