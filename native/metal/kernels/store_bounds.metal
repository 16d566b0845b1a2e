// store_bounds.metal: Quest's key bounds (bridge/gokv_layout.h): per page and kv head, the per-channel min and
// max of the page's keys as stored (key_elem: the dequantized values attention reads), the min rounded to
// the largest fp16 <= it and the max to the smallest fp16 >= it, as native/cpu/store.c keeps them. The
// bounds lie after the pool's pages in the pages buffer, [page][N_KV_HEADS][2][D_K] fp16 from bounds_w. A
// port of native/vulkan/shaders/store_bounds.comp (same push constants, inputs and thread order).
//
// The host runs this after the kernels that stored the keys (behind a barrier), with one record per page a
// write filled: slots [s0, s1) of that page. A record with s0 == 0 starts the bounds afresh (min = +inf,
// max = -inf), otherwise they are widened. One thread per (record, head, pair of channels): it owns the two
// words of its channels' min and max, and a write never lists one page twice (sequences of one call write
// distinct pages), so there are no races.
// up: 3 words per record at meta_w: page, s0, s1 (all_pages: none, record r resets page r).
#include "mtl_kernel.h"
#include "store_common.h"

struct store_bounds_push {
    GOKV_PUSH_STORE_BOUNDS(PUSH_FIELD)
};

static inline uint half_down(float x) { // the largest fp16 <= x
    const uint h = float_to_half(x);
    if (!(half_to_float(h) > x)) return h;
    return (h & 0x7fffu) == 0u ? 0x8001u : ((h & 0x8000u) != 0u ? h + 1u : h - 1u);
}
static inline uint half_up(float x) { // the smallest fp16 >= x
    const uint h = float_to_half(x);
    if (!(half_to_float(h) < x)) return h;
    return (h & 0x7fffu) == 0u ? 0x0001u : ((h & 0x8000u) != 0u ? h - 1u : h + 1u);
}

// One instance: every constant is read from the spec words at run time (a template only because the
// instance list names the kernel as one).
template <typename = void>
kernel void store_bounds(MTL_KERNEL_PARAMS) {
    constant store_bounds_push &pc = *(constant store_bounds_push *)push_words;
    const kv_pool kv = kv_pool_of(pages, rings, spec);
    const uint N_KV_HEADS = kv.N_KV_HEADS, D_K = kv.D_K, PAIRS = D_K / 2u;

    const uint item = store_item(group_id, n_groups, lid, wg_dims);
    if (item >= pc.n_items) return;
    const uint rec = item / (N_KV_HEADS * PAIRS), head = item % (N_KV_HEADS * PAIRS) / PAIRS, pair = item % PAIRS;
    uint page = rec, s0 = 0u, s1 = 0u;
    if (pc.all_pages == 0u) {
        const uint m = pc.meta_w + 3u * rec;
        page = up[m];
        s0 = up[m + 1u];
        s1 = up[m + 2u];
    }
    const uint lo_w = pc.bounds_w + (page * N_KV_HEADS + head) * D_K + pair; // min row: D_K halves = PAIRS words
    const uint hi_w = lo_w + PAIRS;
    uint lo_word = s0 == 0u ? 0x7c007c00u : pages[lo_w];
    uint hi_word = s0 == 0u ? 0xfc00fc00u : pages[hi_w];
    for (uint i = 0u; i < 2u; i++) {
        const uint c = 2u * pair + i, sh = 16u * i;
        uint lo16 = (lo_word >> sh) & 0xffffu, hi16 = (hi_word >> sh) & 0xffffu;
        const float mn = half_to_float(lo16), mx = half_to_float(hi16);
        float kmn = as_type<float>(0x7f800000u), kmx = as_type<float>(0xff800000u); // +inf, -inf
        for (uint s = s0; s < s1; s++) {
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

#define MTL_INSTANCES_STORE_BOUNDS(X) X(store_bounds, store_bounds)
MTL_INSTANCES_STORE_BOUNDS(MTL_INSTANTIATE)
