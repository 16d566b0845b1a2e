// store_bounds.hpp: Quest's key bounds (bridge/gokv_layout.h): per page and kv head, the per-channel min and
// max of the page's keys as stored (key_elem: the dequantized values attention reads), the min rounded to
// the largest fp16 <= it and the max to the smallest fp16 >= it, as native/cpu/store.c keeps them. The
// bounds lie after the pool's pages in the pages buffer, [page][N_KV_HEADS][2][D_K] fp16 from bounds_w. A
// port of native/metal/kernels/store_bounds.metal (same push constants, inputs and thread order as the Vulkan
// shader).
//
// The host runs this after the kernels that stored the keys (behind a barrier), with one record per page a
// write filled: slots [s0, s1) of that page. A record with s0 == 0 starts the bounds afresh (min = +inf,
// max = -inf), otherwise they are widened. One work-item per (record, head, pair of channels): it owns the
// two words of its channels' min and max, and a write never lists one page twice (sequences of one call
// write distinct pages), so there are no races.
// up: 3 words per record at meta_w: page, s0, s1 (all_pages: none, record r resets page r).
#ifndef GOKV_SYCL_STORE_BOUNDS_HPP
#define GOKV_SYCL_STORE_BOUNDS_HPP

#include "store_common.hpp"

namespace gokv_sycl {

struct store_bounds_push {
    GOKV_PUSH_STORE_BOUNDS(PUSH_FIELD)
};

inline uint32_t half_down(float x) { // the largest fp16 <= x
    const uint32_t h = float_to_half(x);
    if (!(half_to_float(h) > x)) return h;
    return (h & 0x7fffu) == 0u ? 0x8001u : ((h & 0x8000u) != 0u ? h + 1u : h - 1u);
}
inline uint32_t half_up(float x) { // the smallest fp16 >= x
    const uint32_t h = float_to_half(x);
    if (!(half_to_float(h) < x)) return h;
    return (h & 0x7fffu) == 0u ? 0x0001u : ((h & 0x8000u) != 0u ? h - 1u : h + 1u);
}

// One instance: every constant is read from the spec words at run time.
struct store_bounds {
    args a;
    local_words tg;

    void operator()(sycl::nd_item<3> it) const {
        const store_bounds_push pc = push_of<store_bounds_push>(a);
        const kv_pool kv = kv_pool_of(a.pages, a.rings, a.spec);
        const uint32_t N_KV_HEADS = kv.N_KV_HEADS, D_K = kv.D_K, PAIRS = D_K / 2u;
        uint32_t *pages = a.pages;

        const uint32_t item = store_item(it);
        if (item >= pc.n_items) return;
        const uint32_t rec = item / (N_KV_HEADS * PAIRS), head = item % (N_KV_HEADS * PAIRS) / PAIRS,
                       pair = item % PAIRS;
        uint32_t page = rec, s0 = 0u, s1 = 0u;
        if (pc.all_pages == 0u) {
            const uint32_t m = pc.meta_w + 3u * rec;
            page = a.up[m];
            s0 = a.up[m + 1u];
            s1 = a.up[m + 2u];
        }
        const uint32_t lo_w = pc.bounds_w + (page * N_KV_HEADS + head) * D_K + pair; // min row: D_K halves
        const uint32_t hi_w = lo_w + PAIRS;
        uint32_t lo_word = s0 == 0u ? 0x7c007c00u : pages[lo_w];
        uint32_t hi_word = s0 == 0u ? 0xfc00fc00u : pages[hi_w];
        for (uint32_t i = 0u; i < 2u; i++) {
            const uint32_t c = 2u * pair + i, sh = 16u * i;
            uint32_t lo16 = (lo_word >> sh) & 0xffffu, hi16 = (hi_word >> sh) & 0xffffu;
            const float mn = half_to_float(lo16), mx = half_to_float(hi16);
            float kmn = sycl::bit_cast<float>(0x7f800000u), kmx = sycl::bit_cast<float>(0xff800000u); // +inf, -inf
            for (uint32_t s = s0; s < s1; s++) {
                const float x = key_elem(kv, page, head, s, c);
                kmn = x < kmn ? x : kmn;
                kmx = x > kmx ? x : kmx;
            }
            if (kmn < mn) lo16 = half_down(kmn);
            if (kmx > mx) hi16 = half_up(kmx);
            lo_word = (lo_word & ~(0xffffu << sh)) | (lo16 << sh);
            hi_word = (hi_word & ~(0xffffu << sh)) | (hi16 << sh);
        }
        pages[lo_w] = lo_word;
        pages[hi_w] = hi_word;
    }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_STORE_BOUNDS(X) X(store_bounds, gokv_sycl::store_bounds)
GOKV_SYCL_INSTANCES_STORE_BOUNDS(GOKV_SYCL_DECLARE_INSTANCE)

#endif
