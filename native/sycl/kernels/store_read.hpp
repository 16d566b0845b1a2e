// store_read.hpp: dequantize-on-read (gokv_pool_read, docs/architecture.md §4), as native/cpu/store.c's
// cpu_read_sequence: each output element is q * s + b (or the f32/f16 value) of the token's page slot, its
// KIVI ring row when the position is not quantized yet, or 0 for a released page. With V_IS_K_PREFIX the
// values are the first D_V channels of the keys (pages and ring alike). A port of
// native/metal/kernels/store_read.metal (same push constants, inputs and thread order as the Vulkan shader).
//
// One work-item per output float: items [0, n_k_items) are k_out ([rows][N_KV_HEADS][D_K] at k_out_w in
// down), the rest v_out ([rows][N_KV_HEADS][D_V] at v_out_w).
// up: 4 words per row at meta_w: page (~0u: released), slot in the page, ring slot (~0u: read the page),
//     position.
#ifndef GOKV_SYCL_STORE_READ_HPP
#define GOKV_SYCL_STORE_READ_HPP

#include "store_common.hpp"

namespace gokv_sycl {

struct store_read_push {
    GOKV_PUSH_STORE_READ(PUSH_FIELD)
};

// One instance: every constant is read from the spec words at run time.
struct store_read {
    args a;
    local_words tg;

    void operator()(sycl::nd_item<3> it) const {
        const store_read_push pc = push_of<store_read_push>(a);
        const kv_pool kv = kv_pool_of(a.pages, a.rings, a.spec);
        const uint32_t *up = a.up;

        const uint32_t item = store_item(it);
        if (item >= pc.n_items) return;
        const bool is_v = item >= pc.n_k_items;
        const uint32_t e = is_v ? item - pc.n_k_items : item;
        const uint32_t d = is_v ? kv.D_V : kv.D_K;
        const uint32_t row = e / (kv.N_KV_HEADS * d), head = e % (kv.N_KV_HEADS * d) / d, c = e % d;
        const uint32_t m = pc.meta_w + 4u * row;
        const uint32_t page = up[m], slot = up[m + 1u], ring_slot = up[m + 2u], pos = up[m + 3u];
        // common.hpp's readers: MLA values are the keys' first D_V channels, q·s + b rounds as on the CPU
        float x = 0.0f;
        if (page == ~0u) {
            x = 0.0f;
        } else if (ring_slot != ~0u) {
            x = is_v ? ring_value(kv, ring_slot, pos, head, c) : ring_key(kv, ring_slot, pos, head, c);
        } else {
            x = is_v ? value_elem(kv, page, head, slot, c) : key_elem(kv, page, head, slot, c);
        }
        a.down[(is_v ? pc.v_out_w : pc.k_out_w) + e] = sycl::bit_cast<uint32_t>(x);
    }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_STORE_READ(X) X(store_read, gokv_sycl::store_read)
GOKV_SYCL_INSTANCES_STORE_READ(GOKV_SYCL_DECLARE_INSTANCE)

#endif
