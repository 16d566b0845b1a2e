// store_ring.comp: stores new KIVI tokens in their sequence's fp16 residual ring (docs/architecture.md §4), row
// t % RING_ROWS, as native/cpu/store.c's ring_store. The host sends only the tokens that are the last of
// this write to land on their row (t >= n1 - RING_ROWS), so the ring ends as the CPU's sequential loop
// leaves it, and dispatches this after the flush shaders have read the rows it overwrites.
//
// One invocation per word (two channels) of a token's ring row (keys of every head, then values).
// up: 3 words per token at meta_w: ring slot, position, row in the input k (floats
//     [rows][N_KV_HEADS][D_K] at k_w) and v (at v_w).
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;

#define UP_QUAL readonly
#include "common.glsl"
#include "store_common.glsl"

#include "gpu_push.h"
PUSH_BLOCK(GOKV_PUSH_STORE_RING); // the fields: gpu_push.h

const uint K_WORDS = N_KV_HEADS * D_K / 2u;
const uint V_WORDS = V_IS_K_PREFIX != 0u ? 0u : N_KV_HEADS * D_V / 2u;

void main() {
    uint item = store_item();
    if (item >= pc.n_items) return;
    uint tok = item / (K_WORDS + V_WORDS), u = item % (K_WORDS + V_WORDS);
    uint m = pc.meta_w + 3u * tok;
    uint ring_slot = up[m], pos = up[m + 1u], row = up[m + 2u];
    // a token's ring row holds all heads contiguously, like its input row
    bool is_v = u >= K_WORDS;
    uint dst = is_v ? ring_v_half(ring_slot, pos, 0u, 0u) / 2u + (u - K_WORDS) : ring_k_half(ring_slot, pos, 0u, 0u) / 2u + u;
    uint src = is_v ? pc.v_w + row * (2u * V_WORDS) + 2u * (u - K_WORDS) : pc.k_w + row * (2u * K_WORDS) + 2u * u;
    rings[dst] = float_to_half(up_f(src)) | (float_to_half(up_f(src + 1u)) << 16);
}
