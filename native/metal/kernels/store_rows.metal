// store_rows.metal: stores per-token rows in their page slots (docs/architecture.md §4, bridge/gokv_layout.h),
// as native/cpu/store.c's store_row: f32 bits, fp16, or q8/q4 groups of GROUP channels with fp16 scale and
// bias. In KIVI pools it stores the value rows of the token groups being quantized (their keys, per
// channel, are store_kivi_keys.metal's), from fp16 values as the CPU quantizes them from its ring. A port of
// native/vulkan/shaders/store_rows.comp (same push constants, inputs and thread order).
//
// One thread per unit of a row, items ordered (row, K then V, head, unit): a unit is a quantization group
// (it owns the group's code words; scale and bias halves may share a word with a neighbour's), or 4
// channels of an f32/f16 row (whole words). Tiled keys (K_TILED, common.h's key_word) put all key items
// first, ordered (head, unit, row), then the values' (row, head, unit): neighbouring threads then quantize
// one group of neighbouring rows, in a prefill neighbouring slots, whose code words are neighbours in their
// tile (a row-major order would write one word every KEY_TILE words).
//
// up: 4 words per row at meta_w: page, slot, source, ring slot.
//   ring slot == ~0u: source is a row of the input k (floats [rows][N_KV_HEADS][D_K] at k_w) and v (at
//                     v_w); KIVI rounds it to fp16 first.
//   otherwise:        source is a position of the sequence held in that residual ring (KIVI values).
#include "mtl_kernel.h"
#include "store_common.h"

struct store_rows_push {
    GOKV_PUSH_STORE_ROWS(PUSH_FIELD)
};

// Value i of the group a thread quantizes: from its ring (ring != 0: half index first + i of rings) or
// from the input floats (word first + i of up), rounded to fp16 first in KIVI pools.
struct store_rows_source {
    device const uint *up;
    uint first, ring;
    float at(thread const kv_pool &kv, uint i) const {
        if (ring != 0u) return ring_half(kv, first + i);
        const float x = as_type<float>(up[first + i]);
        return kv.KIVI != 0u ? half_to_float(float_to_half(x)) : x;
    }
};

// One instance: every constant is read from the spec words at run time (a template only because the
// instance list names the kernel as one).
template <typename = void>
kernel void store_rows(MTL_KERNEL_PARAMS) {
    constant store_rows_push &pc = *(constant store_rows_push *)push_words;
    const kv_pool kv = kv_pool_of(pages, rings, spec);
    const uint UNIT = kv.QUANTIZED ? kv.GROUP : 4u;
    const uint K_UNITS = kv.KIVI != 0u ? 0u : kv.N_KV_HEADS * (kv.D_K / UNIT); // KIVI keys are stored per channel
    const uint V_UNITS = kv.V_IS_K_PREFIX != 0u ? 0u : kv.N_KV_HEADS * (kv.D_V / UNIT);

    const uint item = store_item(group_id, n_groups, lid, wg_dims);
    if (item >= pc.n_items) return;
    uint row, u;
    bool is_v;
    if (kv.K_TILED == 0u) {
        row = item / (K_UNITS + V_UNITS);
        u = item % (K_UNITS + V_UNITS);
        is_v = u >= K_UNITS;
        if (is_v) u -= K_UNITS;
    } else {
        const uint rows = pc.n_items / (K_UNITS + V_UNITS);
        if (item < rows * K_UNITS) {
            row = item % rows;
            u = item / rows;
            is_v = false;
        } else {
            row = (item - rows * K_UNITS) / V_UNITS;
            u = (item - rows * K_UNITS) % V_UNITS;
            is_v = true;
        }
    }
    const uint d = is_v ? kv.D_V : kv.D_K;
    const uint head = u / (d / UNIT), c0 = u % (d / UNIT) * UNIT;
    const uint m = pc.meta_w + 4u * row;
    const uint page = up[m], slot = up[m + 1u], source = up[m + 2u], ring_slot = up[m + 3u];
    const uint w = row_word(kv, page, head, slot, is_v);

    const store_rows_source src = ring_slot == ~0u
        ? store_rows_source{up, (is_v ? pc.v_w : pc.k_w) + (source * kv.N_KV_HEADS + head) * d + c0, 0u}
        : store_rows_source{up, ring_v_half(kv, ring_slot, source, head, c0), 1u};
    if (kv.FORMAT == FMT_F32) {
        for (uint i = 0u; i < 4u; i++) pages[w + c0 + i] = up[src.first + i];
    } else if (kv.FORMAT == FMT_F16) {
        for (uint i = 0u; i < 2u; i++)
            pages[w + c0 / 2u + i] = float_to_half(as_type<float>(up[src.first + 2u * i])) |
                                     (float_to_half(as_type<float>(up[src.first + 2u * i + 1u])) << 16);
    } else {
        const uint j = c0 / kv.GROUP;
        const uint code_word = is_v ? w + c0 * kv.BITS / 32u : key_word(kv, page, head, slot, c0 * kv.BITS / 32u);
        quantize_group(kv, src, code_word, is_v ? 1u : kv.K_WORD_STEP, row_scale_half(kv, page, head, slot, j, is_v),
                       row_bias_half(kv, page, head, slot, j, is_v));
    }
}

#define MTL_INSTANCES_STORE_ROWS(X) X(store_rows, store_rows)
MTL_INSTANCES_STORE_ROWS(MTL_INSTANTIATE)
