// store_read.comp: dequantize-on-read (gokv_pool_read, docs/architecture.md §4), as native/cpu/store.c's
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

#include "gpu_push.h"
PUSH_BLOCK(GOKV_PUSH_STORE_READ); // the fields: gpu_push.h

void main() {
    uint item = store_item();
    if (item >= pc.n_items) return;
    bool is_v = item >= pc.n_k_items;
    uint e = is_v ? item - pc.n_k_items : item;
    uint d = is_v ? D_V : D_K;
    uint row = e / (N_KV_HEADS * d), head = e % (N_KV_HEADS * d) / d, c = e % d;
    uint m = pc.meta_w + 4u * row;
    uint page = up[m], slot = up[m + 1u], ring_slot = up[m + 2u], pos = up[m + 3u];
    // common.glsl's readers: MLA values are the keys' first D_V channels, q·s + b rounds as on the CPU
    float x = 0.0;
    if (page == ~0u) {
        x = 0.0;
    } else if (ring_slot != ~0u) {
        x = is_v ? ring_value(ring_slot, pos, head, c) : ring_key(ring_slot, pos, head, c);
    } else {
        x = is_v ? value_elem(page, head, slot, c) : key_elem(page, head, slot, c);
    }
    down[(is_v ? pc.v_out_w : pc.k_out_w) + e] = floatBitsToUint(x);
}
