// store_read.metal: dequantize-on-read (gokv_pool_read, docs/architecture.md §4), as native/cpu/store.c's
// cpu_read_sequence: each output element is q * s + b (or the f32/f16 value) of the token's page slot, its
// KIVI ring row when the position is not quantized yet, or 0 for a released page. With V_IS_K_PREFIX the
// values are the first D_V channels of the keys (pages and ring alike). A port of
// native/vulkan/shaders/store_read.comp (same push constants, inputs and thread order).
//
// One thread per output float: items [0, n_k_items) are k_out ([rows][N_KV_HEADS][D_K] at k_out_w in
// down), the rest v_out ([rows][N_KV_HEADS][D_V] at v_out_w).
// up: 4 words per row at meta_w: page (~0u: released), slot in the page, ring slot (~0u: read the page),
//     position.
#include "mtl_kernel.h"
#include "store_common.h"

struct store_read_push {
    GOKV_PUSH_STORE_READ(PUSH_FIELD)
};

// One instance: every constant is read from the spec words at run time (a template only because the
// instance list names the kernel as one).
template <typename = void>
kernel void store_read(MTL_KERNEL_PARAMS) {
    constant store_read_push &pc = *(constant store_read_push *)push_words;
    const kv_pool kv = kv_pool_of(pages, rings, spec);

    const uint item = store_item(group_id, n_groups, lid, wg_dims);
    if (item >= pc.n_items) return;
    const bool is_v = item >= pc.n_k_items;
    const uint e = is_v ? item - pc.n_k_items : item;
    const uint d = is_v ? kv.D_V : kv.D_K;
    const uint row = e / (kv.N_KV_HEADS * d), head = e % (kv.N_KV_HEADS * d) / d, c = e % d;
    const uint m = pc.meta_w + 4u * row;
    const uint page = up[m], slot = up[m + 1u], ring_slot = up[m + 2u], pos = up[m + 3u];
    // common.h's readers: MLA values are the keys' first D_V channels, q·s + b rounds as on the CPU
    float x = 0.0f;
    if (page == ~0u) {
        x = 0.0f;
    } else if (ring_slot != ~0u) {
        x = is_v ? ring_value(kv, ring_slot, pos, head, c) : ring_key(kv, ring_slot, pos, head, c);
    } else {
        x = is_v ? value_elem(kv, page, head, slot, c) : key_elem(kv, page, head, slot, c);
    }
    down[(is_v ? pc.v_out_w : pc.k_out_w) + e] = as_type<uint>(x);
}

#define MTL_INSTANCES_STORE_READ(X) X(store_read, store_read)
MTL_INSTANCES_STORE_READ(MTL_INSTANTIATE)
