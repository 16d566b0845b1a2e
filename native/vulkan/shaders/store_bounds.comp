// store_bounds.comp: Quest's key bounds (bridge/gokv_layout.h): per page and kv head, the per-channel min and
// max of the page's keys as stored (key_elem: the dequantized values attention reads), the min rounded to
// the largest fp16 <= it and the max to the smallest fp16 >= it, as native/cpu/store.c keeps them. The
// bounds lie after the pool's pages in the pages buffer, [page][N_KV_HEADS][2][D_K] fp16 from bounds_w.
//
// The host runs this after the shaders that stored the keys (behind a barrier), with one record per page a
// write filled: slots [s0, s1) of that page. A record with s0 == 0 starts the bounds afresh (min = +inf,
// max = -inf), otherwise they are widened. One invocation per (record, head, pair of channels): it owns
// the two words of its channels' min and max, and a write never lists one page twice (sequences of one
// call write distinct pages), so there are no races.
// up: 3 words per record at meta_w: page, s0, s1 (all_pages: none, record r resets page r).
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 28) in;

#define UP_QUAL readonly
#include "common.glsl"
#include "store_common.glsl"

#include "gpu_push.h"
PUSH_BLOCK(GOKV_PUSH_STORE_BOUNDS); // the fields: gpu_push.h

const uint PAIRS = D_K / 2u;

uint half_down(float x) { // the largest fp16 <= x
    uint h = float_to_half(x);
    if (!(half_to_float(h) > x)) return h;
    return (h & 0x7fffu) == 0u ? 0x8001u : ((h & 0x8000u) != 0u ? h + 1u : h - 1u);
}
uint half_up(float x) { // the smallest fp16 >= x
    uint h = float_to_half(x);
    if (!(half_to_float(h) < x)) return h;
    return (h & 0x7fffu) == 0u ? 0x0001u : ((h & 0x8000u) != 0u ? h - 1u : h + 1u);
}

void main() {
    uint item = store_item();
    if (item >= pc.n_items) return;
    uint rec = item / (N_KV_HEADS * PAIRS), head = item % (N_KV_HEADS * PAIRS) / PAIRS, pair = item % PAIRS;
    uint page = rec, s0 = 0u, s1 = 0u;
    if (pc.all_pages == 0u) {
        uint m = pc.meta_w + 3u * rec;
        page = up[m];
        s0 = up[m + 1u];
        s1 = up[m + 2u];
    }
    uint lo_w = pc.bounds_w + (page * N_KV_HEADS + head) * D_K + pair; // min row: D_K halves = PAIRS words
    uint hi_w = lo_w + PAIRS;
    uint lo_word = s0 == 0u ? 0x7c007c00u : pages[lo_w];
    uint hi_word = s0 == 0u ? 0xfc00fc00u : pages[hi_w];
    for (uint i = 0u; i < 2u; i++) {
        uint c = 2u * pair + i, sh = 16u * i;
        uint lo16 = (lo_word >> sh) & 0xffffu, hi16 = (hi_word >> sh) & 0xffffu;
        float mn = half_to_float(lo16), mx = half_to_float(hi16);
        float kmn = 1.0 / 0.0, kmx = -1.0 / 0.0;
        for (uint s = s0; s < s1; s++) {
            float x = key_elem(page, head, s, c);
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
