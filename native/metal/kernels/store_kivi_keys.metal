// store_kivi_keys.metal: quantizes the keys of KIVI token groups per channel (docs/architecture.md §4), as the
// key half of native/cpu/store.c's kivi_flush_group: for each kv head and channel, the g tokens of the group
// form one quantization group, its codes packed along the tokens (channel c's run of GROUP * BITS / 8 bytes
// in the page's key group j), its fp16 scale and bias at [head][j][c]. A port of
// native/vulkan/shaders/store_kivi_keys.comp (same push constants, inputs and thread order).
//
// The CPU quantizes a group from its fp16 ring copies; here each token comes from the ring if it was
// there before this write (t < n0) or from the new input rows, rounded to fp16 (t >= n0). The host puts a
// barrier between this and store_ring.metal, which overwrites ring rows.
//
// One thread per (group, head, channel): it owns the channel's code words.
// up: 6 words per group at meta_w: page, j (key group in the page), ring slot, t0 (first position),
//     n0 (the sequence's length before the write), row of position n0 in the input k (floats
//     [rows][N_KV_HEADS][D_K] at k_w).
#include "mtl_kernel.h"
#include "store_common.h"

struct store_kivi_keys_push {
    GOKV_PUSH_STORE_KIVI_KEYS(PUSH_FIELD)
};

// Token t0 + i of one (head, channel): ring half ring0 + (t % RING_ROWS) * stride while t < n0, else input
// word in0 + (t - n0) * stride rounded to fp16 (stride = N_KV_HEADS * D_K: between consecutive tokens, in
// ring halves and input words alike).
struct kivi_key_source {
    device const uint *up;
    uint ring0, in0, t0, n0, stride;
    float at(thread const kv_pool &kv, uint i) const {
        const uint t = t0 + i;
        if (t < n0) return ring_half(kv, ring0 + t % kv.RING_ROWS * stride);
        return half_to_float(float_to_half(as_type<float>(up[in0 + (t - n0) * stride])));
    }
};

// One instance: every constant is read from the spec words at run time (a template only because the
// instance list names the kernel as one).
template <typename = void>
kernel void store_kivi_keys(MTL_KERNEL_PARAMS) {
    constant store_kivi_keys_push &pc = *(constant store_kivi_keys_push *)push_words;
    const kv_pool kv = kv_pool_of(pages, rings, spec);
    const uint TOKEN_STRIDE = kv.N_KV_HEADS * kv.D_K;

    const uint item = store_item(group_id, n_groups, lid, wg_dims);
    if (item >= pc.n_items) return;
    const uint group = item / TOKEN_STRIDE, head = item % TOKEN_STRIDE / kv.D_K, c = item % kv.D_K;
    const uint m = pc.meta_w + 6u * group;
    const uint page = up[m], j = up[m + 1u], ring_slot = up[m + 2u], t0 = up[m + 3u], n0 = up[m + 4u],
               row = up[m + 5u];

    const kivi_key_source src = {up, ring_k_half(kv, ring_slot, 0u, head, c),
                                 pc.k_w + (row * kv.N_KV_HEADS + head) * kv.D_K + c, t0, n0, TOKEN_STRIDE};
    const uint code_word = page * kv.PAGE_WORDS + kv.K_CODES_W + head * kv.K_CODES_HEAD_W + j * kv.K_ROW_W +
                           c * (kv.GROUP * kv.BITS / 32u);
    const uint sb = page * kv.PAGE_WORDS * 2u + head * kv.K_SB_HEAD_H + j * kv.D_K + c;
    quantize_group(kv, src, code_word, 1u, sb + kv.K_SCALE_H, sb + kv.K_BIAS_H);
}

#define MTL_INSTANCES_STORE_KIVI_KEYS(X) X(store_kivi_keys, store_kivi_keys)
MTL_INSTANCES_STORE_KIVI_KEYS(MTL_INSTANTIATE)
