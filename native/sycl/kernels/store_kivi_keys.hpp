// store_kivi_keys.hpp: quantizes the keys of KIVI token groups per channel (docs/architecture.md §4), as the
// key half of native/cpu/store.c's kivi_flush_group: for each kv head and channel, the g tokens of the group
// form one quantization group, its codes packed along the tokens (channel c's run of GROUP * BITS / 8 bytes
// in the page's key group j), its fp16 scale and bias at [head][j][c]. KIVI 2-bit: [1, 2, 3, 4] stores
// scale 1, bias 1 and the byte 0b11100100 (228), and reads back exactly. A port of
// native/metal/kernels/store_kivi_keys.metal (same push constants, inputs and thread order as the Vulkan
// shader).
//
// The CPU quantizes a group from its fp16 ring copies; here each token comes from the ring if it was
// there before this write (t < n0) or from the new input rows, rounded to fp16 (t >= n0). The host puts a
// barrier between this and store_ring.hpp, which overwrites ring rows.
//
// One work-item per (group, head, channel): it owns the channel's code words.
// up: 6 words per group at meta_w: page, j (key group in the page), ring slot, t0 (first position),
//     n0 (the sequence's length before the write), row of position n0 in the input k (floats
//     [rows][N_KV_HEADS][D_K] at k_w).
#ifndef GOKV_SYCL_STORE_KIVI_KEYS_HPP
#define GOKV_SYCL_STORE_KIVI_KEYS_HPP

#include "store_common.hpp"

namespace gokv_sycl {

struct store_kivi_keys_push {
    GOKV_PUSH_STORE_KIVI_KEYS(PUSH_FIELD)
};

// Token t0 + i of one (head, channel): ring half ring0 + (t % RING_ROWS) * stride while t < n0, else input
// word in0 + (t - n0) * stride rounded to fp16 (stride = N_KV_HEADS * D_K: between consecutive tokens, in
// ring halves and input words alike).
struct kivi_key_source {
    const uint32_t *up;
    uint32_t ring0, in0, t0, n0, stride;
    float at(const kv_pool &kv, uint32_t i) const {
        const uint32_t t = t0 + i;
        if (t < n0) return ring_half(kv, ring0 + t % kv.RING_ROWS * stride);
        return half_to_float(float_to_half(sycl::bit_cast<float>(up[in0 + (t - n0) * stride])));
    }
};

// One instance: every constant is read from the spec words at run time.
struct store_kivi_keys {
    args a;
    local_words tg;

    void operator()(sycl::nd_item<3> it) const {
        const store_kivi_keys_push pc = push_of<store_kivi_keys_push>(a);
        const kv_pool kv = kv_pool_of(a.pages, a.rings, a.spec);
        const uint32_t *up = a.up;
        const uint32_t TOKEN_STRIDE = kv.N_KV_HEADS * kv.D_K;

        const uint32_t item = store_item(it);
        if (item >= pc.n_items) return;
        const uint32_t group = item / TOKEN_STRIDE, head = item % TOKEN_STRIDE / kv.D_K, c = item % kv.D_K;
        const uint32_t m = pc.meta_w + 6u * group;
        const uint32_t page = up[m], j = up[m + 1u], ring_slot = up[m + 2u], t0 = up[m + 3u], n0 = up[m + 4u],
                       row = up[m + 5u];

        const kivi_key_source src = {up, ring_k_half(kv, ring_slot, 0u, head, c),
                                     pc.k_w + (row * kv.N_KV_HEADS + head) * kv.D_K + c, t0, n0, TOKEN_STRIDE};
        const uint32_t code_word = page * kv.PAGE_WORDS + kv.K_CODES_W + head * kv.K_CODES_HEAD_W + j * kv.K_ROW_W +
                                   c * (kv.GROUP * kv.BITS / 32u);
        const uint32_t sb = page * kv.PAGE_WORDS * 2u + head * kv.K_SB_HEAD_H + j * kv.D_K + c;
        quantize_group(kv, src, code_word, 1u, sb + kv.K_SCALE_H, sb + kv.K_BIAS_H);
    }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_STORE_KIVI_KEYS(X) X(store_kivi_keys, gokv_sycl::store_kivi_keys)
GOKV_SYCL_INSTANCES_STORE_KIVI_KEYS(GOKV_SYCL_DECLARE_INSTANCE)

#endif
