// store_ring.hpp: stores new KIVI tokens in their sequence's fp16 residual ring (docs/architecture.md §4), row
// t % RING_ROWS, as native/cpu/store.c's ring_store. The host sends only the tokens that are the last of
// this write to land on their row (t >= n1 - RING_ROWS), so the ring ends as the CPU's sequential loop
// leaves it, and dispatches this after the flush kernels have read the rows it overwrites. A port of
// native/metal/kernels/store_ring.metal (same push constants, inputs and thread order as the Vulkan shader).
//
// One work-item per word (two channels) of a token's ring row (keys of every head, then values).
// up: 3 words per token at meta_w: ring slot, position, row in the input k (floats
//     [rows][N_KV_HEADS][D_K] at k_w) and v (at v_w).
#ifndef GOKV_SYCL_STORE_RING_HPP
#define GOKV_SYCL_STORE_RING_HPP

#include "store_common.hpp"

namespace gokv_sycl {

struct store_ring_push {
    GOKV_PUSH_STORE_RING(PUSH_FIELD)
};

// One instance: every constant is read from the spec words at run time.
struct store_ring {
    args a;
    local_words tg;

    void operator()(sycl::nd_item<3> it) const {
        const store_ring_push pc = push_of<store_ring_push>(a);
        const kv_pool kv = kv_pool_of(a.pages, a.rings, a.spec);
        const uint32_t *up = a.up;
        const uint32_t K_WORDS = kv.N_KV_HEADS * kv.D_K / 2u;
        const uint32_t V_WORDS = kv.V_IS_K_PREFIX != 0u ? 0u : kv.N_KV_HEADS * kv.D_V / 2u;

        const uint32_t item = store_item(it);
        if (item >= pc.n_items) return;
        const uint32_t tok = item / (K_WORDS + V_WORDS), u = item % (K_WORDS + V_WORDS);
        const uint32_t m = pc.meta_w + 3u * tok;
        const uint32_t ring_slot = up[m], pos = up[m + 1u], row = up[m + 2u];
        // a token's ring row holds all heads contiguously, like its input row
        const bool is_v = u >= K_WORDS;
        const uint32_t dst = is_v ? ring_v_half(kv, ring_slot, pos, 0u, 0u) / 2u + (u - K_WORDS)
                                  : ring_k_half(kv, ring_slot, pos, 0u, 0u) / 2u + u;
        const uint32_t src =
            is_v ? pc.v_w + row * (2u * V_WORDS) + 2u * (u - K_WORDS) : pc.k_w + row * (2u * K_WORDS) + 2u * u;
        a.rings[dst] = float_to_half(sycl::bit_cast<float>(up[src])) |
                       (float_to_half(sycl::bit_cast<float>(up[src + 1u])) << 16);
    }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_STORE_RING(X) X(store_ring, gokv_sycl::store_ring)
GOKV_SYCL_INSTANCES_STORE_RING(GOKV_SYCL_DECLARE_INSTANCE)

#endif
