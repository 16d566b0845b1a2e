// store_ring.metal: stores new KIVI tokens in their sequence's fp16 residual ring (docs/architecture.md §4), row
// t % RING_ROWS, as native/cpu/store.c's ring_store. The host sends only the tokens that are the last of
// this write to land on their row (t >= n1 - RING_ROWS), so the ring ends as the CPU's sequential loop
// leaves it, and dispatches this after the flush kernels have read the rows it overwrites. A port of
// native/vulkan/shaders/store_ring.comp (same push constants, inputs and thread order).
//
// One thread per word (two channels) of a token's ring row (keys of every head, then values).
// up: 3 words per token at meta_w: ring slot, position, row in the input k (floats
//     [rows][N_KV_HEADS][D_K] at k_w) and v (at v_w).
#include "mtl_kernel.h"
#include "store_common.h"

struct store_ring_push {
    GOKV_PUSH_STORE_RING(PUSH_FIELD)
};

// One instance: every constant is read from the spec words at run time (a template only because the
// instance list names the kernel as one).
template <typename = void>
kernel void store_ring(MTL_KERNEL_PARAMS) {
    constant store_ring_push &pc = *(constant store_ring_push *)push_words;
    const kv_pool kv = kv_pool_of(pages, rings, spec);
    const uint K_WORDS = kv.N_KV_HEADS * kv.D_K / 2u;
    const uint V_WORDS = kv.V_IS_K_PREFIX != 0u ? 0u : kv.N_KV_HEADS * kv.D_V / 2u;

    const uint item = store_item(group_id, n_groups, lid, wg_dims);
    if (item >= pc.n_items) return;
    const uint tok = item / (K_WORDS + V_WORDS), u = item % (K_WORDS + V_WORDS);
    const uint m = pc.meta_w + 3u * tok;
    const uint ring_slot = up[m], pos = up[m + 1u], row = up[m + 2u];
    // a token's ring row holds all heads contiguously, like its input row
    const bool is_v = u >= K_WORDS;
    const uint dst = is_v ? ring_v_half(kv, ring_slot, pos, 0u, 0u) / 2u + (u - K_WORDS)
                          : ring_k_half(kv, ring_slot, pos, 0u, 0u) / 2u + u;
    const uint src = is_v ? pc.v_w + row * (2u * V_WORDS) + 2u * (u - K_WORDS) : pc.k_w + row * (2u * K_WORDS) + 2u * u;
    rings[dst] = float_to_half(as_type<float>(up[src])) | (float_to_half(as_type<float>(up[src + 1u])) << 16);
}

#define MTL_INSTANCES_STORE_RING(X) X(store_ring, store_ring)
MTL_INSTANCES_STORE_RING(MTL_INSTANTIATE)
